"""The test kit's cluster nodes: a bus port taken between choosing it and the start (by a
process of another test) is chosen again (CI saw "Could not create server TCP listening
socket ... (cluster)" fail a cluster fixture when tests ran beside other work)."""

from __future__ import annotations

import socket

from fencelock.testing import ClusterNode


def test_a_node_whose_bus_port_was_taken_starts_on_another(fencelock_server_binary: str) -> None:
    node = ClusterNode(fencelock_server_binary, node_timeout_ms=1000)
    squatter = socket.socket()
    try:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        taken = squatter.getsockname()[1]
        args = list(node._extra_args)
        args[args.index("--cluster-port") + 1] = str(taken)
        node._extra_args = tuple(args)
        node.bus_port = taken
        node.start(timeout=10.0)
        try:
            assert node.bus_port != taken
            with node.client() as client:
                assert client.ping()
                assert client.info("cluster")["cluster_enabled"] == 1
        finally:
            node.stop()
    finally:
        squatter.close()

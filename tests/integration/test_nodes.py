"""The node shells' own connections: many dropped connections must not exhaust anything.

A chaos run found this: connections made through the redis-py pool were counted against its
``max_connections`` (100) and never given back when a failure made us drop them, so after about
a hundred timeouts a server could no longer be asked at all.
"""

from __future__ import annotations

import asyncio

from fencelock._async.node import AsyncNode
from fencelock._scripts import EXTEND
from fencelock._sync.node import Node
from fencelock.servers import Server

KEYS = ("fencelock:{n}", "fencelock:{n}:holder")
ARGS = ("no-such-token", 1000)


def test_sync_node_survives_hundreds_of_dropped_connections(fencelock_server: Server) -> None:
    node = Node(fencelock_server.url, 1.0)
    for _ in range(250):
        conn = node.checkout()
        node.send(conn, EXTEND, KEYS, ARGS)
        node.discard(conn)  # as after a timeout: the connection's state is unknown
    assert node.run(EXTEND, KEYS, ARGS) == 0
    node.close()


def test_async_node_survives_hundreds_of_dropped_connections(fencelock_server: Server) -> None:
    async def main() -> object:
        node = AsyncNode(fencelock_server.url, 1.0)
        for _ in range(250):
            conn = node._new_connection()
            await conn.connect()
            await conn.disconnect()
        try:
            return await node.run(EXTEND, KEYS, ARGS)
        finally:
            await node.aclose()

    assert asyncio.run(main()) == 0

"""What a blocked client pays to be woken by its reply, on this machine (issue 24).

Sends ``PING`` to an embedded server (``$FENCELOCK_SERVER_BIN`` or the test kit's default
binary) over one plain socket, ``--pings`` times per mode, and prints the wall time and the
client CPU per round trip in µs for two ways of waiting for the reply:

- ``block``: a blocking ``recv`` (what every client does, redis-py and fencelock alike): the
  process sleeps until the reply arrives, so its CPU may go idle and must be woken;
- ``spin``: a non-blocking ``recv`` repeated until the reply is there: the CPU never idles.

The difference is the cost of waking an idle CPU (on a virtual machine whose guest does not
poll before it halts, a trip through the host), which a client that blocks sooner pays more
often. It is a figure about the machine, not about fencelock: fencelock blocks, as it must on
a shared machine (see docs/benchmarks.md).

Usage: ``python benchmarks/wake_latency.py [--pings N] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import socket
import time
from urllib.parse import urlsplit

from fencelock.testing import ServerGroup

PING = b"*1\r\n$4\r\nPING\r\n"
PONG = b"+PONG\r\n"
REPLY_TIMEOUT_S = 5.0


def _bulk(text: str) -> bytes:
    data = text.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _auth(sock: socket.socket, user: str, password: str) -> None:
    sock.settimeout(REPLY_TIMEOUT_S)
    sock.sendall(b"*3\r\n" + _bulk("AUTH") + _bulk(user) + _bulk(password))
    if sock.recv(64) != b"+OK\r\n":
        raise RuntimeError("AUTH refused")


def _block(sock: socket.socket, pings: int) -> None:
    sock.settimeout(REPLY_TIMEOUT_S)
    for _ in range(pings):
        sock.sendall(PING)
        if sock.recv(64) != PONG:
            raise RuntimeError("unexpected reply")


def _spin(sock: socket.socket, pings: int) -> None:
    sock.setblocking(False)
    for _ in range(pings):
        sock.sendall(PING)
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            try:
                reply = sock.recv(64)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError("no reply") from None
        if reply != PONG:
            raise RuntimeError("unexpected reply")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pings", type=int, default=20_000, help="round trips per mode and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds of both modes")
    args = parser.parse_args()
    with ServerGroup(1) as group:
        where = urlsplit(group.urls[0])
        assert where.hostname is not None and where.port is not None
        with socket.create_connection((where.hostname, where.port), timeout=5.0) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if where.password:
                _auth(sock, where.username or "default", where.password)
            _block(sock, 1000)  # warm up
            print(f"{'mode':<6}{'wall us':>10}{'CPU us':>10}  per PING round trip")
            for _ in range(args.rounds):
                for name, mode in (("block", _block), ("spin", _spin)):
                    wall, cpu = time.perf_counter(), time.process_time()
                    mode(sock, args.pings)
                    wall = (time.perf_counter() - wall) / args.pings * 1e6
                    cpu = (time.process_time() - cpu) / args.pings * 1e6
                    print(f"{name:<6}{wall:>10.1f}{cpu:>10.1f}")


if __name__ == "__main__":
    main()

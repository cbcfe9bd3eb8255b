"""What the fence costs by itself on the one-server path (issue 24's "what it would take").

Dev tool (not part of the package). Three cycles, interleaved on one embedded server, each on
one reused connection:

- ``raw``: the bench's baseline, ``SET NX PX`` then a compare-and-delete ``EVALSHA``;
- ``raw fenced``: raw redis-py again, but its acquire is the least a fenced grant runs on the
  server (one ``EVALSHA``: ``TIME``, ``SET NX PX``, ``SET F floor GET`` and the comparison;
  the fence register as fencelock keeps it), and the same compare-and-delete;
- ``fencelock``: a reused ``fencelock.Lock``, ``acquire(wait=0)`` then ``release()``;
- ``bare socket, raw fenced``: the ``raw fenced`` requests, encoded by hand and written to a
  plain blocking socket (no client library): the floor of a fenced cycle's client;
- ``bare socket, fencelock's scripts``: fencelock's own acquire and release scripts with the
  keys and arguments a ``Lock`` sends (its token, holder info, waiter fields), on the bare
  socket: what fencelock's server side costs without its Python.

``fencelock ÷ raw fenced`` is what the library costs beyond a hand-written fenced lock on
redis-py; ``raw fenced ÷ raw`` is what the fence costs by itself (one script instead of a
native ``SET`` for the acquire); the bare-socket cases show how much of a cycle is a client
library's Python at all. Prints ops/s and client CPU per cycle, medians of the rounds.

    .venv/bin/python benchmarks/fence_floor.py [--rounds N] [--batch-s S]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import redis

import fencelock
from fencelock._core.release import release_args
from fencelock._frontend.holder import holder_info, new_token
from fencelock._scripts import ACQUIRE
from fencelock._scripts import RELEASE as LOCK_RELEASE
from fencelock.testing import ServerGroup

RELEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)
#: The least a fenced grant runs: the TIME floor, the lock, the register's swap, the compare.
FENCED_ACQUIRE = """
local now = redis.call('TIME')
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
local floor = now[1] .. string.sub('00000' .. now[2], -6)
local old = redis.call('SET', KEYS[2], floor, 'GET')
if old and (#old > #floor or #old == #floor and old >= floor) then
  local fence = tostring(tonumber(old) + 1)
  redis.call('SET', KEYS[2], fence)
  return fence
end
return floor
"""
TTL_MS = 10_000


def _command(*parts: str | int | bytes) -> bytes:
    """One RESP request."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _bare(url: str) -> Callable[[bytes], bytes]:
    """A blocking plain socket to ``url``: send one request, return its (one-packet) reply."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), 5.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if parts.password:
        user = parts.username or "default"
        sock.sendall(_command("AUTH", user, parts.password))
        if not sock.recv(1024).startswith(b"+OK"):
            raise RuntimeError("AUTH refused")

    def call(request: bytes) -> bytes:
        sock.sendall(request)
        return sock.recv(65536)

    return call


def _timed(cycle: Callable[[], None], batch_s: float) -> tuple[float, float]:
    """ops/s and client CPU µs per cycle over about ``batch_s`` seconds."""
    n = 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    end = t0 + batch_s
    while True:
        for _ in range(50):
            cycle()
        n += 50
        if time.perf_counter() >= end:
            break
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return n / wall, cpu / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batch-s", type=float, default=1.0)
    args = parser.parse_args()
    with ServerGroup(1) as group:
        url = group.urls[0]
        client = redis.Redis.from_url(url)
        release = client.script_load(RELEASE)
        fenced = client.script_load(FENCED_ACQUIRE)
        lock = fencelock.Lock(url, "floor:lock", ttl=TTL_MS / 1000)

        def raw() -> None:
            token = new_token()
            if not client.set("floor:raw", token, nx=True, px=TTL_MS):
                raise RuntimeError("raw key held")
            client.evalsha(release, 1, "floor:raw", token)

        def raw_fenced() -> None:
            token = new_token()
            if not client.evalsha(fenced, 2, "floor:fenced", "floor:fenced:F", token, TTL_MS):
                raise RuntimeError("fenced key held")
            client.evalsha(release, 1, "floor:fenced", token)

        def ours() -> None:
            lock.acquire(wait=0).release()

        bare = _bare(url)

        def bare_fenced() -> None:
            token = new_token()
            if bare(_command("EVALSHA", fenced, 2, "floor:bare", "floor:bare:F", token, TTL_MS))[
                :2
            ] in (b":0", b"$-"):
                raise RuntimeError("bare key held")
            bare(_command("EVALSHA", release, 1, "floor:bare", token))

        plan = lock._definition.plan  # what the Lock sends, on a lock of its own
        keys = tuple(k.replace("{floor:lock}", "{floor:ours}") for k in plan.acquire_keys)
        rkeys = tuple(k.replace("{floor:lock}", "{floor:ours}") for k in plan.release_keys)
        client.script_load(ACQUIRE.source)
        client.script_load(LOCK_RELEASE.source)

        def bare_ours() -> None:
            token = new_token()
            args = (token, plan.ttl_ms, holder_info(None), "0", "-", 0, plan.fence_retention_ms, 0)
            reply = bare(_command("EVALSHA", ACQUIRE.sha, len(keys), *keys, *args))
            if not reply.startswith(b"*2\r\n:1"):
                raise RuntimeError(f"fencelock's acquire script: {reply!r}")
            next_token = "h" + new_token()
            rargs = release_args(plan, token, next_token=next_token)
            bare(_command("EVALSHA", LOCK_RELEASE.sha, len(rkeys), *rkeys, *rargs))

        cases = {
            "raw": raw,
            "raw fenced": raw_fenced,
            "fencelock": ours,
            "bare socket, raw fenced": bare_fenced,
            "bare socket, fencelock's scripts": bare_ours,
        }
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        try:
            for cycle in cases.values():
                _timed(cycle, 0.3)  # connect, load, warm up
            names = list(cases)
            for index in range(args.rounds):
                order = names[index % len(names) :] + names[: index % len(names)]
                for name in order:
                    results[name].append(_timed(cases[name], args.batch_s))
        finally:
            lock.close()
            client.close()
    ops = {name: statistics.median(r[0] for r in rs) for name, rs in results.items()}
    cpu = {name: statistics.median(r[1] for r in rs) for name, rs in results.items()}
    print("| cycle | ops/s | client CPU µs per cycle | ÷ raw | ÷ raw fenced |")
    print("|---|---|---|---|---|")
    for name in cases:
        print(
            f"| {name} | {ops[name]:,.0f} | {cpu[name]:.0f} | {ops[name] / ops['raw']:.2f} "
            f"| {ops[name] / ops['raw fenced']:.2f} |"
        )


if __name__ == "__main__":
    main()

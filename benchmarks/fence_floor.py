"""What the fence costs by itself on the one-server path (issue 24's "what it would take").

Dev tool (not part of the package). Five cycles, interleaved on one embedded server, each on
one reused connection:

- ``raw``: the bench's baseline, ``SET NX PX`` then a compare-and-delete ``EVALSHA``;
- ``raw fenced``: raw redis-py again, but its acquire is the least a fenced grant runs on the
  server (one ``EVALSHA``: ``TIME``, ``SET NX PX``, ``SET F floor GET`` and the comparison;
  the fence register as fencelock keeps it), and the same compare-and-delete;
- ``fencelock``: a reused ``fencelock.Lock``, ``acquire(wait=0)`` then ``release()``;
- ``bare socket, raw fenced``: the ``raw fenced`` requests, encoded as RESP and written to a
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import fencelock
from fencelock._core.fencing import floor_step_us
from fencelock._core.handover import offered_token
from fencelock._core.release import release_args
from fencelock._engine.resp import command
from fencelock._frontend.holder import holder_info, new_token
from fencelock._scripts import ACQUIRE
from fencelock._scripts import RELEASE as LOCK_RELEASE
from fencelock.cli.bench import Batch, _RawLock, _rotated, _timed
from fencelock.testing import ServerGroup

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


@contextmanager
def _bare(url: str) -> Iterator[Callable[[bytes], bytes]]:
    """A blocking plain socket to ``url`` (closed on exit): send one request, return its
    (one-packet) reply."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), 5.0) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def call(request: bytes) -> bytes:
            sock.sendall(request)
            return sock.recv(65536)

        if parts.password and not call(
            command("AUTH", parts.username or "default", parts.password)
        ).startswith(b"+OK"):
            raise RuntimeError("AUTH refused")
        yield call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batch-s", type=float, default=1.0)
    args = parser.parse_args()
    with ServerGroup(1) as group:
        url = group.urls[0]
        base = _RawLock(url, "floor:raw")  # the bench's raw baseline, its client and script
        client, release = base.client, base.sha
        fenced = client.script_load(FENCED_ACQUIRE)
        lock = fencelock.Lock(url, "floor:lock", ttl=TTL_MS / 1000)

        def raw_fenced() -> None:
            token = new_token()
            if not client.evalsha(fenced, 2, "floor:fenced", "floor:fenced:F", token, TTL_MS):
                raise RuntimeError("fenced key held")
            client.evalsha(release, 1, "floor:fenced", token)

        def ours() -> None:
            lock.acquire(wait=0).release()

        plan = lock._definition.plan  # what the Lock sends, on a lock of its own
        keys = tuple(k.replace("{floor:lock}", "{floor:ours}") for k in plan.acquire_keys)
        rkeys = tuple(k.replace("{floor:lock}", "{floor:ours}") for k in plan.release_keys)
        step = floor_step_us(plan.n, plan.restart_delay)
        client.script_load(ACQUIRE.source)
        client.script_load(LOCK_RELEASE.source)
        results: dict[str, list[Batch]] = {}
        try:
            with _bare(url) as bare:

                def bare_fenced() -> None:
                    token = new_token()
                    keys_args = ("floor:bare", "floor:bare:F", token, TTL_MS)
                    if bare(command("EVALSHA", fenced, 2, *keys_args))[:2] in (b":0", b"$-"):
                        raise RuntimeError("bare key held")
                    bare(command("EVALSHA", release, 1, "floor:bare", token))

                def bare_ours() -> None:
                    # the arguments attempt() sends for acquire(wait=0), and the release's
                    token = new_token()
                    args = (token, plan.ttl_ms, holder_info(None), "0", "-", 0,
                            plan.fence_retention_ms, step)  # fmt: skip
                    reply = bare(command("EVALSHA", ACQUIRE.sha, len(keys), *keys, *args))
                    if not reply.startswith(b"*2\r\n:1"):
                        raise RuntimeError(f"fencelock's acquire script: {reply!r}")
                    rargs = release_args(plan, token, next_token=offered_token(plan, new_token))
                    bare(command("EVALSHA", LOCK_RELEASE.sha, len(rkeys), *rkeys, *rargs))

                cases = {
                    "raw": base.cycle,
                    "raw fenced": raw_fenced,
                    "fencelock": ours,
                    "bare socket, raw fenced": bare_fenced,
                    "bare socket, fencelock's scripts": bare_ours,
                }
                results = {name: [] for name in cases}
                for cycle in cases.values():
                    _timed(cycle, 0.3)  # connect, load, warm up
                for index in range(args.rounds):
                    for name in _rotated(list(cases), index):
                        results[name].append(_timed(cases[name], args.batch_s))
        finally:
            lock.close()
            base.close()
    ops = {name: statistics.median(b.ops_per_s for b in rs) for name, rs in results.items()}
    cpu = {name: statistics.median(b.cpu_us_per_op for b in rs) for name, rs in results.items()}
    print("| cycle | ops/s | client CPU µs per cycle | ÷ raw | ÷ raw fenced |")
    print("|---|---|---|---|---|")
    for name in results:
        print(
            f"| {name} | {ops[name]:,.0f} | {cpu[name]:.0f} | {ops[name] / ops['raw']:.2f} "
            f"| {ops[name] / ops['raw fenced']:.2f} |"
        )


if __name__ == "__main__":
    main()

"""The server's execution time of one uncontended acquire and release script (issue 24).

Loads ``acquire.lua`` and ``release.lua`` (with their includes) as they are in the working
tree and, with ``--rev``, as they were at each named git revision, on one embedded server
(``$FENCELOCK_SERVER_BIN`` or the test kit's default binary). Each round pipelines
``--cycles`` acquires of free locks (one key per cycle, a fence register each), then their
releases (nobody waits), and reads ``INFO commandstats``: the ``EVALSHA`` time per call, in
µs, which includes the scripts' own commands. Rounds alternate between the versions; the
median of ``--rounds`` is printed. Pipelining leaves out the request and reply I/O, the same
for every version, so small differences in the scripts show.

Usage: ``python benchmarks/script_exec.py [--rev REV]... [--cycles N] [--rounds N]``
(from the repository root, for ``git show``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess

import redis

from fencelock._core.keys import lock_keys
from fencelock._core.plan import lock_wiring, release_keys
from fencelock._frontend.holder import new_token
from fencelock._scripts import assemble
from fencelock.testing import ServerGroup

INFO = '{"host":"bench","pid":1,"acquired_at":1796600259.805}'
TTL_MS, RETENTION_MS, HANDOFF_MS, WAKE_MS = 10_000, 604_800_000, 50, 5_000


def _source(name: str, rev: str | None) -> bytes:
    """Script ``name``'s source as the package has it, or as it was at git revision ``rev``."""
    if rev is None:
        return assemble(name)

    def at_rev(file: str) -> bytes:
        where = f"{rev}:src/fencelock/_scripts/{file}"
        return subprocess.run(
            ["git", "show", where], check=True, capture_output=True, timeout=30
        ).stdout

    return assemble(name, at_rev)


def _round(client: redis.Redis, acquire: str, release: str, cycles: int) -> tuple[float, float]:
    """µs per acquire and per release call, for ``cycles`` fresh keys."""
    tokens = [new_token() for _ in range(cycles)]
    keys = [lock_keys(f"script-exec:{i}") for i in range(cycles)]
    figures = []
    for phase in ("acquire", "release"):
        client.config_resetstat()
        pipe = client.pipeline(transaction=False)
        for token, k in zip(tokens, keys, strict=True):
            if phase == "acquire":
                args = (token, TTL_MS, INFO, 0, "-", 0, RETENTION_MS, 0)
                pipe.evalsha(acquire, 7, *lock_wiring(k).acquire_keys, *args)
            else:
                args = (token, HANDOFF_MS, WAKE_MS, "h" + token, TTL_MS, "-", RETENTION_MS)
                pipe.evalsha(release, 7, *release_keys(k), *args)
        replies = pipe.execute()
        granted = (
            all(r == 1 for r in replies) if phase == "release" else all(r[0] == 1 for r in replies)
        )
        if not granted:
            raise RuntimeError(f"a {phase} was refused: the keys were not free")
        figures.append(float(client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]))
    return figures[0], figures[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", action="append", default=[], help="a git revision to compare")
    parser.add_argument("--cycles", type=int, default=3000, help="cycles per round")
    parser.add_argument("--rounds", type=int, default=8, help="rounds per version")
    args = parser.parse_args()
    versions: list[str | None] = [*args.rev, None]
    with ServerGroup(1) as group:
        client = redis.Redis.from_url(group.urls[0], socket_timeout=30.0)
        try:
            shas = {
                v: (
                    client.script_load(_source("acquire", v)),
                    client.script_load(_source("release", v)),
                )
                for v in versions
            }
            times: dict[str | None, list[tuple[float, float]]] = {v: [] for v in versions}
            for _ in range(args.rounds):
                for v in versions:
                    times[v].append(_round(client, *shas[v], args.cycles))
        finally:
            client.close()
    print(f"{'version':<14}{'acquire us':>12}{'release us':>12}  (median of {args.rounds} rounds)")
    for v in versions:
        acquire = statistics.median(t[0] for t in times[v])
        release = statistics.median(t[1] for t in times[v])
        print(f"{v or 'working tree':<14}{acquire:>12.2f}{release:>12.2f}")


if __name__ == "__main__":
    main()

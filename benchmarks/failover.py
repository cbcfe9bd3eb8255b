"""Double grants across a Sentinel failover, with and without ``replicas=1``.

One trial: a primary with two replicas and three sentinels (``fencelock.testing.ReplicaSet``);
client A acquires a lock through the ``redis+sentinel://`` URL; the primary is SIGKILLed right
after the grant; the sentinels promote a replica; client B then tries the same lock through the
same URL. A *double grant* is B granted while A's lease is still valid. Each double grant is
then checked against a fence (``RedisFence`` on a separate server): B writes with its
fence, then A (the stale holder) writes with its own, which must be refused.

Two ways of killing the primary:

- ``stalled``: the replicas are SIGSTOPped before A's acquire and resumed after the kill, so
  the grant is never replicated (the window a real failover hits when replication lags);
- ``natural``: nothing is paused; the kill comes right after the grant, racing replication.

Run: ``FENCELOCK_SERVER_BIN=... .venv/bin/python benchmarks/failover.py [--trials 20]``
"""

from __future__ import annotations

import argparse
import contextlib
import time
import uuid
from dataclasses import dataclass

import fencelock
from fencelock.fence import RedisFence
from fencelock.testing import ReplicaSet, Server, ServerError

#: A's and B's lease (s): long enough that A is still valid when B is asked.
TTL_S = 30.0
#: How long B waits for the lock after the failover (s).
B_WAIT_S = 15.0


@dataclass(frozen=True)
class Trial:
    a_granted: bool
    b_granted: bool
    double_grant: bool  # B granted while A's lease was still valid
    stale_refused: bool | None  # after a double grant: was A's write refused (None: no test)


def cut_replication(primary: Server, replicas: list[Server]) -> None:
    """Freeze the replicas (SIGSTOP) and close their links on the primary, so that nothing
    written from now on reaches them: a frozen replica alone would still find the stream in
    its socket buffer when resumed. Sentinels resume them after the primary is killed."""
    for node in replicas:
        node.pause()
    conn = primary.client()
    try:
        conn.client_kill_filter(_type="replica")
    finally:
        conn.close()


def acquire_unless_held(lock: fencelock.Lock) -> fencelock.Lease | None:
    """The lease, or None as soon as the lock is found held; outages (the new primary
    still gathering replicas) are retried for ``B_WAIT_S``."""
    deadline = time.monotonic() + B_WAIT_S
    while True:
        try:
            return lock.acquire(wait=0)
        except fencelock.NotAcquired:
            return None
        except fencelock.Unavailable:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)


def trial(topology: ReplicaSet, store: RedisFence, replicas: int, stalled: bool) -> Trial:
    """One kill-the-primary-after-the-grant trial (the killed node stays down: see Rig.heal)."""
    key = f"failover:{uuid.uuid4().hex[:12]}"
    url = topology.sentinel_url
    old = topology.wait_whole(30.0)
    followers = [node for node in topology.nodes if node is not old]
    lease_a = None
    try:
        if stalled:
            cut_replication(old, followers)
        try:
            lease_a = fencelock.Lock(url, key, ttl=TTL_S, replicas=replicas).acquire(wait=0)
        except fencelock.Unavailable:
            lease_a = None  # replicas=k: nobody acknowledged, so the grant was not handed out
        old.kill()
    finally:
        for node in followers:
            node.resume()
    topology.wait_new_primary(old, 30.0)
    lease_b = acquire_unless_held(fencelock.Lock(url, key, ttl=TTL_S, replicas=replicas))
    double = lease_a is not None and lease_b is not None and lease_a.valid
    refused: bool | None = None
    if double:
        assert lease_a is not None and lease_b is not None
        store.write(key, lease_b.fence, b"B")
        try:
            store.write(key, lease_a.fence, b"A")
        except fencelock.StaleFence:
            refused = True
        else:
            refused = False
    for lease in (lease_b, lease_a):
        if lease is not None:
            with contextlib.suppress(fencelock.FencelockError):
                lease.release()
    return Trial(lease_a is not None, lease_b is not None, double, refused)


class Rig:
    """The topology the trials run on, and the fence store (a separate server)."""

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary
        self.fence_server = Server(binary).start()
        self.store = RedisFence(self.fence_server.url)
        self.topology = self._fresh()
        self.rebuilt = 0

    def _fresh(self) -> ReplicaSet:
        return ReplicaSet(2, sentinels=3, binary=self.binary).start(timeout=30.0)

    def heal(self) -> None:
        """Bring the killed node back as a replica; when the sentinels are still moving the
        primary around (they sometimes fail over twice), start a fresh topology instead."""
        topology = self.topology
        dead = [node for node in topology.nodes if not node.is_running]
        try:
            for node in dead:
                topology.rejoin(node, 30.0)
        except ServerError:
            topology.stop()
            self.topology = self._fresh()
            self.rebuilt += 1

    def close(self) -> None:
        self.store.close()
        self.topology.stop()
        self.fence_server.stop()


def run(trials: int, replicas: int, stalled: bool, rig: Rig) -> list[Trial]:
    results = []
    for _ in range(trials):
        results.append(trial(rig.topology, rig.store, replicas, stalled))
        rig.heal()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--kill", choices=("stalled", "natural", "both"), default="both")
    parser.add_argument("--replicas", choices=("0", "1", "both"), default="both")
    args = parser.parse_args()
    kills = [True, False] if args.kill == "both" else [args.kill == "stalled"]
    counts = [0, 1] if args.replicas == "both" else [int(args.replicas)]
    rig = Rig()
    engine = rig.fence_server.engine
    print(f"{engine.name} {engine.version}, {args.trials} trials per row")
    print(
        f"{'kill':8} {'replicas':>8} {'A granted':>10} {'B granted':>10} {'double':>8} "
        f"{'fence refused A':>16} {'s/trial':>8}"
    )
    try:
        for stalled in kills:
            for replicas in counts:
                started = time.monotonic()
                results = run(args.trials, replicas, stalled, rig)
                per = (time.monotonic() - started) / args.trials
                doubles = [r for r in results if r.double_grant]
                refused = sum(1 for r in doubles if r.stale_refused)
                print(
                    f"{'stalled' if stalled else 'natural':8} {replicas:>8} "
                    f"{sum(r.a_granted for r in results):>5}/{args.trials:<4} "
                    f"{sum(r.b_granted for r in results):>5}/{args.trials:<4} "
                    f"{len(doubles):>3}/{args.trials:<4} {refused:>8}/{len(doubles):<7} {per:8.1f}",
                    flush=True,
                )
        if rig.rebuilt:
            print(f"(the topology was rebuilt {rig.rebuilt} times after a double failover)")
    finally:
        rig.close()


if __name__ == "__main__":
    main()

"""Everything a flow needs to know about one lock, derived once from its options (pure)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .effects import Wait
from .keys import LockKeys, lock_keys
from .timing import drift_ms, seconds_to_ms


@dataclass(frozen=True, slots=True)
class Wiring:
    """Which script each flow of a plan runs, and on which keys (their ARGV are fixed by the
    flows: acquire ``token, ttl_ms, info, woken, waiter, patience_ms, fence_retention_ms``;
    commit ``token, fence, fence_retention_ms``; release ``token, handoff_ms, wake_ms, ...``;
    extend ``token, ttl_ms``). A plain lock, a semaphore's slot, a reader and a writer differ
    only here."""

    acquire: str
    acquire_keys: tuple[str, ...]
    commit: str
    commit_keys: tuple[str, ...]
    release: str
    release_keys: tuple[str, ...]
    extend: str
    extend_keys: tuple[str, ...]


def release_keys(k: LockKeys) -> tuple[str, ...]:
    """The keys ``release.lua`` is called with."""
    return (k.lock, k.holder, k.waiters, k.wake, k.handoff, k.fence, k.claimed)


def lock_wiring(k: LockKeys) -> Wiring:
    """The scripts and keys of an ordinary lock (or of one semaphore slot)."""
    return Wiring(
        acquire="acquire",
        acquire_keys=(k.lock, k.fence, k.holder, k.waiters, k.handoff, k.wake, k.claimed),
        commit="fence_commit",
        commit_keys=(k.lock, k.fence),
        release="release",
        release_keys=release_keys(k),
        extend="extend",
        extend_keys=(k.lock,),
    )


#: ``LockPlan.everyone`` for the usual server counts, built once.
_EVERYONE_CACHED = 32
_EVERYONE = tuple(tuple(range(n)) for n in range(_EVERYONE_CACHED))


@dataclass(frozen=True, slots=True)
class LockPlan:
    """Wire units (ms) and key names of one lock over ``n`` servers.

    - ``ttl_ms``: lease length; ``drift_factor`` / ``drift_min_ms``: the clock-drift allowance
      ``ttl * factor + min`` taken off every validity;
    - ``budget_s``: the longest a round may take (connect, handshake and reply together);
    - ``handoff_ms`` / ``wake_ms``: the release script's hand-off window and wake lifetime;
    - ``restart_delay``: a server seen restarting (its run_id changed) less than ``ttl_ms`` ago
      does not vote in an acquire (see ``verdicts.restarting``);
    - ``wait``: what the grant, commit and extend rounds ask each server's replicas to
      acknowledge (``WAIT``) before its vote counts; None: nothing (``replicas=0``);
    - ``hands_over``: a release that finds a waiter grants the lock to it in the same script
      (one round trip per hand-off; see :func:`hands_over`); False for the plans
      :meth:`rewired` to other scripts and keys;
    - ``fence_retention_ms``: how long the fence register outlives its last write (0: for
      ever), passed to every script that writes it (see ``fence_math.lua``);
    - ``tokens_reused``: a token may be granted again after it was released or refused (the
      compat layer's tokens, which its caller chooses and keeps: python-redis-lock's ``id``,
      redis-py's ``token=``). Nothing that carries the token is then sent after its round is
      over (no repeated or late release, no cleanup release to a server that did not answer):
      it could delete a later grant of the same token, the lock held by nobody while its
      holder's lease is valid. A grant that lands late stays until its TTL instead.
    """

    key: str
    names: tuple[str, ...]
    keys: LockKeys
    ttl_ms: int
    drift_factor: float
    drift_min_ms: float
    budget_s: float
    retry_base_s: float
    retry_cap_s: float
    handoff_ms: int
    wake_ms: int
    wiring: Wiring
    restart_delay: bool = False
    wait: Wait | None = None
    hands_over: bool = False
    fence_retention_ms: int = 0
    tokens_reused: bool = False

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def everyone(self) -> tuple[int, ...]:
        """Every server's index, in order (the same tuple every time)."""
        n = len(self.names)
        return _EVERYONE[n] if n < _EVERYONE_CACHED else tuple(range(n))

    def drift_ms(self, ttl_ms: float) -> float:
        return drift_ms(ttl_ms, self.drift_factor, self.drift_min_ms)

    def grant_tag(self, fence: int) -> str:
        """What a lease's extends and releases carry to name its grant (``""``: nothing): for
        a token that is granted again (``tokens_reused``, the compat layer's, one server), the
        grant's fence, which the scripts compare with the fence register, so that a request of
        an earlier grant that lands after the same token's next grant is refused there."""
        return str(fence) if self.tokens_reused and len(self.names) == 1 else ""

    @property
    def acquire_keys(self) -> tuple[str, ...]:
        return self.wiring.acquire_keys

    @property
    def release_keys(self) -> tuple[str, ...]:
        return self.wiring.release_keys

    @property
    def extend_keys(self) -> tuple[str, ...]:
        return self.wiring.extend_keys

    @property
    def election_keys(self) -> tuple[str, ...]:
        k = self.keys
        return (k.lock, k.holder, k.observers)

    @property
    def commit_keys(self) -> tuple[str, ...]:
        return self.wiring.commit_keys

    def rewired(self, keys: LockKeys, wiring: Wiring) -> LockPlan:
        """The same lock timing over other keys and scripts (a slot, a reader, a writer)."""
        return replace(self, keys=keys, wiring=wiring, hands_over=False)


def make_plan(
    key: str,
    names: tuple[str, ...],
    *,
    ttl_s: float,
    drift_factor: float,
    drift_min_s: float,
    server_timeout_s: float,
    retry_base_s: float,
    retry_cap_s: float,
    handoff_window_s: float,
    wake_lifetime_s: float,
    restart_delay: bool = False,
    replicas: int = 0,
    fence_retention_s: float | None = None,
) -> LockPlan:
    """A plan from validated options (seconds); raises nothing."""
    keys = lock_keys(key)
    ttl_ms = seconds_to_ms(ttl_s)
    handoff_ms = seconds_to_ms(handoff_window_s) if handoff_window_s else 1
    wait = replica_wait(replicas, server_timeout_s)
    return LockPlan(
        key=key,
        names=names,
        keys=keys,
        ttl_ms=ttl_ms,
        drift_factor=drift_factor,
        drift_min_ms=drift_min_s * 1000.0,
        # connect, handshake and reply are one step of the parallel round, under one timeout;
        # the margin covers scheduling
        budget_s=server_timeout_s + 0.01,
        retry_base_s=retry_base_s,
        retry_cap_s=retry_cap_s,
        handoff_ms=handoff_ms,
        wake_ms=seconds_to_ms(wake_lifetime_s),
        wiring=lock_wiring(keys),
        restart_delay=restart_delay,
        wait=wait,
        hands_over=hands_over(len(names), ttl_ms, handoff_ms, wait),
        fence_retention_ms=seconds_to_ms(fence_retention_s) if fence_retention_s else 0,
    )


def hands_over(n: int, ttl_ms: int, handoff_ms: int, wait: Wait | None) -> bool:
    """Whether a release grants the lock to a waiter itself (one round trip per hand-off).

    Only over one server (over N, a waiter needs a majority of grants, which no single
    release can give) and without ``replicas=k`` (a grant made by a release would count
    before ``WAIT`` confirmed it). The claimer counts its lease from before it blocked, less
    the claim window (``handoff_ms``: the grant may have waited that long for it), so the
    window must be small against the lease: at most a quarter of it.
    """
    return n == 1 and wait is None and handoff_ms * 4 <= ttl_ms


def replica_wait(replicas: int, server_timeout_s: float) -> Wait | None:
    """The ``WAIT`` of ``replicas`` acknowledgements within the server timeout: its first
    three quarters (the script and the network take the rest of the round), 1 ms at the least
    (``WAIT k 0`` would block forever)."""
    if replicas <= 0:
        return None
    return Wait(replicas, max(1, int(server_timeout_s * 1000.0 * WAIT_SHARE)))


#: The share of the server timeout a ``WAIT`` may block for.
WAIT_SHARE = 0.75

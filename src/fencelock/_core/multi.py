"""A multi-key lock, written once: all keys or none, taken in sorted key order.

Two multilocks over overlapping keys take their common keys in the same order, so neither can
hold one while waiting for a key the other holds and waits behind (no deadlock). The wait is
one budget shared by every key; when a key is not granted in time, the keys already taken are
released (in reverse order) before the error is raised.

While a later key is awaited the keys already taken are not yet renewed by anybody, so the
wait for the next key is cut at the point where the earliest of them is due for renewal (a
third of its lease before its deadline); they are extended there, and the wait goes on. A key
whose extend is not confirmed ends the attempt (all released). So ``acquire()`` never returns
a set with a key that ran out while another was awaited.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ..errors import ConfigError, LockLost, NotAcquired
from .acquire import Grant, acquire
from .effects import NOW, Flow
from .extend import ExtendOutcome, extend
from .plan import LockPlan
from .release import release


def check_keys(keys: object) -> tuple[str, ...]:
    """The keys of a multilock, sorted: a non-empty sequence of distinct non-empty strs."""
    if isinstance(keys, str) or not isinstance(keys, Sequence | set | frozenset):
        raise ConfigError("keys must be a sequence of str (not a single str)")
    names = list(keys)
    if not names:
        raise ConfigError("a multilock needs at least one key")
    for name in names:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"every key must be a non-empty str, not {name!r}")
    if len(set(names)) != len(names):
        raise ConfigError(f"duplicate keys in {names!r}")
    return tuple(sorted(names))


def acquire_all(
    plans: Sequence[LockPlan],
    wait_s: float,
    *,
    new_token: Callable[[], str],
    holder_info: Callable[[], str],
    rand: Callable[[], float],
) -> Flow[tuple[Grant, ...]]:
    """Acquire every plan's lock in the given (sorted) order within one wait of ``wait_s``;
    raises the failing key's NotAcquired / Unavailable after releasing the others."""
    begin: float = yield NOW
    deadline = begin + wait_s
    grants: list[Grant] = []
    try:
        for plan in plans:
            while True:
                now: float = yield NOW
                until = min(deadline, _renew_by(grants)) if grants else deadline
                try:
                    grant = yield from acquire(
                        plan,
                        max(0.0, until - now),
                        new_token=new_token,
                        holder_info=holder_info,
                        rand=rand,
                    )
                    break
                except NotAcquired:
                    if (yield NOW) >= deadline or not grants:
                        raise
                grants = yield from _refresh(plans, grants)
            grants.append(grant)
        now = yield NOW
        for plan, grant in zip(plans, grants, strict=True):
            if grant.deadline <= now:  # a round outlasted an earlier key's lease
                raise LockLost(plan.key, f"{plan.key!r}: ran out while the other keys were taken")
    except GeneratorExit:
        raise
    except BaseException:
        for plan, grant in reversed(list(zip(plans, grants, strict=False))):
            # as its holder: a claimed hand-over's waiter id leaves with it, and the key
            # goes to the next waiter as a lease's release would hand it
            yield from release(
                plan, grant.token, expired=False, waiter=grant.waiter, new_token=new_token
            )
        raise
    return tuple(grants)


def _renew_by(grants: Sequence[Grant]) -> float:
    """When the earliest of ``grants`` is due for renewal: a third of its lease before its
    deadline (monotonic s)."""
    return min(g.deadline - (g.deadline - g.start) / 3.0 for g in grants)


def _refresh(plans: Sequence[LockPlan], grants: list[Grant]) -> Flow[list[Grant]]:
    """Extend every grant to a full lease; raises the extend's error (LockLost or
    Unavailable) when one is not confirmed (the caller releases them all)."""
    refreshed: list[Grant] = []
    for plan, grant in zip(plans, grants, strict=False):
        start: float = yield NOW
        result = yield from extend(plan, grant.token, plan.ttl_ms, grant.deadline)
        if result.outcome is not ExtendOutcome.CONFIRMED:
            assert result.error is not None
            raise result.error
        refreshed.append(replace(grant, start=start, deadline=result.deadline))
    return refreshed


def try_acquire_all(
    plans: Sequence[LockPlan],
    *,
    new_token: Callable[[], str],
    holder_info: Callable[[], str],
    rand: Callable[[], float],
) -> Flow[tuple[Grant, ...] | None]:
    """One attempt per key: every grant, or None (all released) when one key is held."""
    try:
        return (
            yield from acquire_all(
                plans, 0.0, new_token=new_token, holder_info=holder_info, rand=rand
            )
        )
    except NotAcquired:
        return None

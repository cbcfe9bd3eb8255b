"""Fencing numbers that only grow, over one server or a majority of N.

Each server keeps a register ``F`` beside the lock key. On a grant the server itself computes
``bump(F, now_us) = max(F + 1, now_us)`` (in the acquire script, one round trip) and stores it.

- One server: the bumped value is the fence. ``F + 1`` makes it grow while the server lives;
  the ``now_us`` floor (the server's ``TIME`` in microseconds) keeps it growing after a restart
  that lost ``F``, as long as the server's clock moved forward.
- Exact: fences are integers end to end. The scripts compute them as decimal strings (a Lua
  number is a double, which past 2^53 cannot tell ``F`` from ``F + 1``) and return them as
  strings; here they are Python ints. The largest fence is :data:`FENCE_MAX` = 2^63 - 1 (a
  fence always fits a signed 64-bit column): a register at it issues no fence (the script
  answers an error) rather than a repeated or wrapped one.
- N servers: the fence is ``merge(bumped values of the granting majority)`` = their maximum, and
  it is written back (``commit``) to a majority, checked to still hold our token, before the lease
  is handed out. A later holder's majority intersects that commit majority, so it reads some
  ``F >= fence`` and bumps past it. (The maximum of one majority alone is NOT monotonic: two
  majorities can see different maxima.)
- The commit is skipped when a majority already holds the merged fence: each granting server
  stored the value it returned, in the same script as its grant, so when a majority returned
  the maximum itself (:func:`committed_by_grant`) the commit would change nothing there. For
  that to happen the servers must agree on the value, which a microsecond ``TIME`` floor never
  lets them: over N > 1 servers with ``restart_delay`` the floor is ``TIME`` rounded up to a
  multiple of :data:`FLOOR_STEP_US` (:func:`floor_step_us`), so servers whose clocks agree within
  it, granting over the same ``F``, return the same fence. The floor then runs ahead of ``TIME``
  by less than a step (10 ms): a server restarted empty within that could issue a fence below
  one it issued before, which ``restart_delay`` rules out (such a server's grants do not count
  for a ``ttl``); without it the floor stays ``TIME`` itself.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The largest fence a script issues (2^63 - 1): past it, grants fail with an error.
FENCE_MAX = 2**63 - 1


#: The fence's ``TIME`` floor step over N > 1 servers with ``restart_delay`` (µs; a divisor of
#: 1,000,000, as ``fence_step_up`` in ``fence_math.lua`` requires).
FLOOR_STEP_US = 10_000


def floor_step_us(n_servers: int, restart_delay: bool) -> int:
    """The floor step an acquire sends (``0``: the exact ``TIME``); see the module docstring."""
    return FLOOR_STEP_US if n_servers > 1 and restart_delay else 0


def bump(register: int, now_us: int, step_us: int = 0) -> int:
    """What the acquire script stores and returns on a grant (mirrors ``fence_math.lua``):
    ``max(register + 1, now_us)``, ``now_us`` rounded up to a multiple of ``step_us`` first
    when that is a divisor of 1,000,000 from 2 up.

    Raises ``ValueError`` when ``register`` is at (or past) :data:`FENCE_MAX`.
    """
    if register >= FENCE_MAX:
        raise ValueError(f"fence register at {register}: no fence above 2^63 - 1")
    if 2 <= step_us <= 1_000_000 and 1_000_000 % step_us == 0:
        now_us = -(-now_us // step_us) * step_us
    return max(register + 1, now_us)


def merge(bumped: Iterable[int]) -> int:
    """The fence of an N-server grant: the largest value any granting server returned."""
    values = list(bumped)
    if not values:
        raise ValueError("merge needs at least one granting server")
    return max(values)


def commit(register: int, fence: int) -> int:
    """What the fence-commit script leaves in a register (mirrors ``fence_commit.lua``)."""
    return max(register, fence)


def needs_commit(n_servers: int) -> bool:
    """Only N > 1 needs the second round: with one server the bump already is the commit."""
    return n_servers > 1


def committed_by_grant(fences: Iterable[int], fence: int, needed: int) -> bool:
    """Whether the merged ``fence`` is already on a majority: at least ``needed`` of the
    granting servers' bumped values (``fences``, one per server) are ``fence`` itself."""
    return sum(1 for value in fences if value == fence) >= needed

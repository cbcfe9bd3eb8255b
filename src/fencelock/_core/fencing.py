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
"""

from __future__ import annotations

from collections.abc import Iterable

#: The largest fence a script issues (2^63 - 1): past it, grants fail with an error.
FENCE_MAX = 2**63 - 1


def bump(register: int, now_us: int) -> int:
    """What the acquire script stores and returns on a grant (mirrors ``fence_math.lua``).

    Raises ``ValueError`` when ``register`` is at (or past) :data:`FENCE_MAX`.
    """
    if register >= FENCE_MAX:
        raise ValueError(f"fence register at {register}: no fence above 2^63 - 1")
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

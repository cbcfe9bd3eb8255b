"""How long a waiter sleeps before its next attempt.

Waiters are normally woken by the release signal long before this delay ends; the delay is the
upper bound when no signal comes (holder crashed, signal server down, split vote).
"""

from __future__ import annotations


def retry_delay_s(
    *,
    attempt: int,
    remaining_s: float,
    holder_pttl_ms: int | None,
    base_s: float,
    cap_s: float,
    rand: float,
) -> float:
    """Seconds to wait before attempt ``attempt + 1`` (``attempt`` counts from 0).

    - ``remaining_s``: time left until the caller's deadline; the result never exceeds it.
    - ``holder_pttl_ms``: the longest remaining lease another holder reported, if any; a
      waiter need not come back before that key can expire (plus a little jitter), because a
      release wakes it earlier.
    - otherwise exponential backoff from ``base_s`` up to ``cap_s`` with "equal jitter"
      (half fixed, half random), so that contenders of a split vote spread out.
    - ``rand`` is a number in [0, 1) supplied by the caller (kept pure and testable).
    """
    if remaining_s <= 0.0:
        return 0.0
    if holder_pttl_ms is not None and holder_pttl_ms > 0:
        delay = holder_pttl_ms / 1000.0 + rand * base_s
    else:
        ceiling = min(cap_s, base_s * (2.0 ** min(attempt, 30)))
        delay = ceiling * (0.5 + 0.5 * rand)
    return min(delay, remaining_s)

"""Lease validity arithmetic. Public API in seconds, wire in integer milliseconds."""

from __future__ import annotations


def seconds_to_ms(seconds: float) -> int:
    """Round a positive duration in seconds to whole milliseconds, never below 1 ms."""
    return max(1, round(seconds * 1000.0))


def drift_ms(ttl_ms: float, drift_factor: float, drift_min_ms: float) -> float:
    """Clock-drift allowance for a lease of ``ttl_ms``: ``ttl * factor + minimum`` (ms).

    The minimum covers the granularity of server-side expiry; the factor covers servers whose
    clocks run a little fast relative to ours.
    """
    return ttl_ms * drift_factor + drift_min_ms


def validity_ms(ttl_ms: float, elapsed_ms: float, drift: float) -> float:
    """How long a lease granted ``elapsed_ms`` after the round started is still safe to use (ms).

    The clock started *before* the first request was sent, so the servers' keys cannot expire
    before ``start + validity`` unless a server's clock runs faster than ``drift`` allows.
    A result <= 0 means the round took too long and the lease must not be used.
    """
    return ttl_ms - elapsed_ms - drift

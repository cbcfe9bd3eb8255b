"""OpenTelemetry metrics and spans for every lock of the process (extra ``otel``).

::

    from fencelock.integrations import otel
    otel.instrument()                 # the global meter and tracer providers, or pass your own
    ...
    otel.uninstrument()

Metrics (instrumentation scope ``fencelock``):

- ``fencelock.acquire.duration`` (histogram, unit ``s``): how long each ``acquire()`` /
  ``try_acquire()`` took, waiting included; attribute ``outcome``: ``granted``,
  ``contention`` (NotAcquired, or ``None`` from a try), ``unavailable`` (too few servers
  answered) or ``error`` (anything else: cancellation, a closed client...).
- ``fencelock.contention`` (counter): acquisitions that found the lock held, counted once per
  acquisition whether or not it got the lock later (so a lock that makes 64 threads queue
  shows up here even when every one of them is granted in the end).
- ``fencelock.lease.lost`` (counter): leases known lost (expired, taken, renewal impossible).
- ``fencelock.renewal.failures`` (counter): renewals (watchdog extends) not confirmed by a
  majority; a lease usually survives a few (it retries until its deadline).

Spans: ``fencelock.acquire`` and ``fencelock.release`` (kind CLIENT, children of the caller's
current span), with attribute ``outcome``; release outcomes are ``released``, ``lost``,
``unavailable`` or ``error``. Spans whose outcome is ``unavailable`` or ``error`` have status
ERROR; contention is not an error.

Every metric and span carries ``fencelock.servers`` (the number of servers of the lock); the
lock name as ``fencelock.key`` only with ``instrument(key_attribute=True)``: keys built per
order or per user would give a time series each, so it is off by default.

Not instrumented, nothing is wrapped: the lock's hot path tests one empty list.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from .. import __version__
from .._frontend import hooks as _hooks

__all__ = ["instrument", "uninstrument"]

_SCOPE = "fencelock"
_FAILED = frozenset({_hooks.UNAVAILABLE, _hooks.ERROR})

#: The counters, in the order ``_Observer`` keeps them: (name, unit, description).
_COUNTERS = (
    (
        "fencelock.contention",
        "{acquisition}",
        "Acquisitions that found the lock held by another",
    ),
    ("fencelock.lease.lost", "{lease}", "Leases known lost (expired, taken, or not renewable)"),
    (
        "fencelock.renewal.failures",
        "{renewal}",
        "Watchdog renewals not confirmed by a majority of servers",
    ),
)

_installed: _Observer | None = None


class _Observer:
    """Turns the lock's hooks into OpenTelemetry instruments and spans."""

    def __init__(self, meter: metrics.Meter, tracer: trace.Tracer, key_attribute: bool) -> None:
        self._tracer = tracer
        self._key_attribute = key_attribute
        self._duration = meter.create_histogram(
            "fencelock.acquire.duration",
            unit="s",
            description="Time taken by each acquire() / try_acquire(), waiting included",
        )
        self._contention, self._lost, self._renewal_failures = (
            meter.create_counter(name, unit=unit, description=description)
            for name, unit, description in _COUNTERS
        )

    def _attributes(self, key: str, servers: int) -> dict[str, Any]:
        if self._key_attribute:
            return {"fencelock.servers": servers, "fencelock.key": key}
        return {"fencelock.servers": servers}

    def _start(self, name: str, key: str, servers: int) -> tuple[float, dict[str, Any], Any]:
        attributes = self._attributes(key, servers)
        span = self._tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)
        return time.perf_counter(), attributes, span

    @staticmethod
    def _end_span(span: Any, outcome: str) -> None:
        span.set_attribute("outcome", outcome)
        if outcome in _FAILED:
            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end()

    def acquire_started(self, key: str, servers: int) -> Any:
        return self._start("fencelock.acquire", key, servers)

    def acquire_contended(self, started: Any) -> None:
        _, attributes, span = started
        self._contention.add(1, attributes)
        span.add_event("contention")

    def acquire_ended(self, started: Any, outcome: str) -> None:
        began, attributes, span = started
        self._duration.record(time.perf_counter() - began, {**attributes, "outcome": outcome})
        self._end_span(span, outcome)

    def release_started(self, key: str, servers: int) -> Any:
        return self._start("fencelock.release", key, servers)

    def release_ended(self, started: Any, outcome: str) -> None:
        self._end_span(started[2], outcome)

    def lease_lost(self, key: str, servers: int, reason: str) -> None:
        self._lost.add(1, self._attributes(key, servers))

    def renewal_failed(self, key: str, servers: int) -> None:
        self._renewal_failures.add(1, self._attributes(key, servers))


def instrument(
    meter_provider: metrics.MeterProvider | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    *,
    key_attribute: bool = False,
) -> None:
    """Report every lock of this process (both front ends) to OpenTelemetry.

    - ``meter_provider`` / ``tracer_provider``: where to report (default: the global ones,
      as set by ``opentelemetry.metrics.set_meter_provider`` / ``trace.set_tracer_provider``).
    - ``key_attribute``: add the lock name as attribute ``fencelock.key`` (one time series per
      key: leave it off for keys built per request).

    Calling it again replaces the previous instrumentation. Raises nothing of its own.
    """
    global _installed
    meter = metrics.get_meter(_SCOPE, __version__, meter_provider=meter_provider)
    tracer = trace.get_tracer(_SCOPE, __version__, tracer_provider=tracer_provider)
    observer = _Observer(meter, tracer, key_attribute)
    uninstrument()
    _installed = observer
    _hooks.observers.append(observer)


def uninstrument() -> None:
    """Stop reporting (a no-op when not instrumented); operations already started finish
    reporting to the instruments they began with."""
    global _installed
    observer, _installed = _installed, None
    if observer is not None and observer in _hooks.observers:
        _hooks.observers.remove(observer)

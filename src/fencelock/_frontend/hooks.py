"""Observers of lock operations (what ``fencelock.integrations.otel`` plugs into).

The hot path pays one truth test of :data:`observers` (an empty list by default) and nothing
else. With observers registered, the acquire and release flows are wrapped by
:func:`observe_acquire` / :func:`observe_release`, which tell every observer when the flow
starts and how it ended; losses and failed renewals are reported by the lease state. Both front
ends go through the same code (``_front.py``, ``_lease.py``), so sync and asyncio report alike.

An observer's exception is logged and never reaches the caller: metrics must not break locks.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from .._core.effects import Flow, Pause
from ..errors import NotAcquired, Unavailable

log = logging.getLogger("fencelock.hooks")

#: Outcomes of an acquisition, as reported to :meth:`Observer.acquire_ended`.
GRANTED, CONTENTION, UNAVAILABLE, ERROR = "granted", "contention", "unavailable", "error"
#: Outcomes of a release (``lost``: it had already expired or been taken).
RELEASED, LOST = "released", "lost"


class Observer(Protocol):
    """What an observer implements. ``servers`` is the number of servers of the lock.

    ``*_started`` return a value (a span, a start time...) handed back to ``*_ended``.
    """

    def acquire_started(self, key: str, servers: int) -> Any: ...

    def acquire_contended(self, started: Any) -> None:
        """The acquisition found the lock held and waits (reported once per acquisition)."""

    def acquire_ended(self, started: Any, outcome: str) -> None: ...

    def release_started(self, key: str, servers: int) -> Any: ...

    def release_ended(self, started: Any, outcome: str) -> None: ...

    def lease_lost(self, key: str, servers: int, reason: str) -> None: ...

    def renewal_failed(self, key: str, servers: int) -> None: ...


#: The registered observers; empty (and so free) unless an integration is enabled.
observers: list[Observer] = []


def _safely(method: str, *args: Any) -> list[tuple[Observer, Any]]:
    """Call ``method(*args)`` on every observer; (observer, result) of those that did not fail."""
    results = []
    for observer in tuple(observers):
        try:
            results.append((observer, getattr(observer, method)(*args)))
        except Exception:
            log.exception("fencelock observer %r failed in %s", observer, method)
    return results


def _each(started: list[tuple[Observer, Any]], method: str, *args: Any) -> None:
    for observer, value in started:
        try:
            getattr(observer, method)(value, *args)
        except Exception:
            log.exception("fencelock observer %r failed in %s", observer, method)


def _outcome(exc: BaseException) -> str:
    if isinstance(exc, NotAcquired):
        return CONTENTION
    if isinstance(exc, Unavailable):
        return UNAVAILABLE
    return ERROR


def observe_acquire(flow: Flow[Any], key: str, servers: int) -> Flow[Any]:
    """``flow`` (an acquire or try-acquire flow), reported to the observers: started when the
    driver first runs it, contended at its first pause on a holder's wake list, ended with
    ``granted``, ``contention`` (NotAcquired, or ``None`` from a try), ``unavailable`` or
    ``error`` (anything else, cancellation included)."""
    started = _safely("acquire_started", key, servers)
    outcome = ERROR
    contended = False
    try:
        effect = next(flow)
        while True:
            if not contended and isinstance(effect, Pause) and effect.wake is not None:
                contended = True
                _each(started, "acquire_contended")
            try:
                answer = yield effect
            except BaseException as exc:  # thrown in by the driver: the flow cleans up
                effect = flow.throw(exc)
            else:
                effect = flow.send(answer)
    except StopIteration as stop:
        outcome = CONTENTION if stop.value is None else GRANTED
        if outcome == CONTENTION and not contended:
            _each(started, "acquire_contended")
        return stop.value
    except BaseException as exc:
        outcome = _outcome(exc)
        if outcome == CONTENTION and not contended:
            _each(started, "acquire_contended")
        raise
    finally:
        _each(started, "acquire_ended", outcome)


def observe_release(flow: Flow[Any], key: str, servers: int) -> Flow[Any]:
    """``flow`` (a release flow), reported to the observers: ended with ``released``,
    ``lost`` (the verdict's LockLost), ``unavailable`` or ``error``."""
    started = _safely("release_started", key, servers)
    outcome = ERROR
    try:
        verdict = yield from flow
    except BaseException:
        _each(started, "release_ended", ERROR)
        raise
    error = verdict.error
    if error is None:
        outcome = RELEASED
    elif isinstance(error, Unavailable):
        outcome = UNAVAILABLE
    else:
        outcome = LOST
    _each(started, "release_ended", outcome)
    return verdict


def lease_lost(key: str, servers: int, reason: str) -> None:
    _safely("lease_lost", key, servers, reason)


def renewal_failed(key: str, servers: int) -> None:
    _safely("renewal_failed", key, servers)

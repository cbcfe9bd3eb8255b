"""OpenTelemetry metrics and spans, read back with the SDK's in-memory reader and exporter, for
locks on real servers (both front ends)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import fencelock
import fencelock.asyncio
from fencelock import NotAcquired, Unavailable, admin
from fencelock._frontend import hooks as _hooks
from fencelock._frontend.definition import UNSET
from fencelock.integrations import otel


def eventually(check: Callable[[], bool], within_s: float = 5.0) -> bool:
    """Poll ``check`` every 10 ms for at most ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@dataclass
class Telemetry:
    reader: InMemoryMetricReader
    spans: InMemorySpanExporter
    meters: MeterProvider
    tracers: TracerProvider

    def points(self, name: str, key: str | None = None) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, data point) of metric ``name``, only those of ``key`` if given."""
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        attributes = dict(point.attributes or {})
                        if key is None or attributes.get("fencelock.key") == key:
                            found.append((attributes, point))
        return found

    def total(self, name: str, key: str) -> int:
        return sum(int(point.value) for _, point in self.points(name, key))

    def outcomes(self, key: str) -> dict[str, int]:
        """Acquisitions of ``key`` recorded by the duration histogram, by outcome."""
        return {
            attributes["outcome"]: int(point.count)
            for attributes, point in self.points("fencelock.acquire.duration", key)
        }

    def finished(self, name: str, key: str) -> list[ReadableSpan]:
        return [
            span
            for span in self.spans.get_finished_spans()
            if span.name == name and (span.attributes or {}).get("fencelock.key") == key
        ]


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    spans = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    otel.instrument(meters, tracers, key_attribute=True)
    try:
        yield Telemetry(reader, spans, meters, tracers)
    finally:
        otel.uninstrument()
        meters.shutdown()
        tracers.shutdown()


@pytest.fixture(params=[1, 3], ids=["1-server", "3-servers"])
def urls(request: pytest.FixtureRequest, topologies: Any) -> list[str]:
    n: int = request.param
    return topologies.urls(n)


def test_a_granted_acquire_and_its_release_are_measured_and_traced(
    telemetry: Telemetry, urls: list[str], key: str
) -> None:
    fencelock.Lock(urls, key, ttl=5).acquire().release()

    async def run_async() -> None:
        lease = await fencelock.asyncio.Lock(urls, key, ttl=5).acquire()
        await lease.release()

    asyncio.run(run_async())

    [(attributes, point)] = telemetry.points("fencelock.acquire.duration", key)
    assert attributes == {
        "fencelock.servers": len(urls),
        "fencelock.key": key,
        "outcome": "granted",
    }
    assert point.count == 2
    assert 0.0 < point.sum < 5.0  # seconds, not milliseconds: well under the ttl
    acquires = telemetry.finished("fencelock.acquire", key)
    releases = telemetry.finished("fencelock.release", key)
    assert len(acquires) == 2 and len(releases) == 2
    for span in acquires + releases:
        assert span.attributes is not None
        assert span.attributes["fencelock.servers"] == len(urls)
        assert span.status.status_code is not StatusCode.ERROR
    assert {s.attributes["outcome"] for s in acquires if s.attributes} == {"granted"}
    assert {s.attributes["outcome"] for s in releases if s.attributes} == {"released"}
    assert telemetry.total("fencelock.contention", key) == 0


def test_an_acquire_span_is_a_child_of_the_callers_span(
    telemetry: Telemetry, topologies: Any, key: str
) -> None:
    tracer = telemetry.tracers.get_tracer("test")
    with tracer.start_as_current_span("handler") as parent:
        fencelock.Lock(topologies.urls(1), key, ttl=5).acquire().release()
    [span] = telemetry.finished("fencelock.acquire", key)
    assert span.parent is not None
    assert span.parent.span_id == parent.get_span_context().span_id


def test_contention_is_counted_even_when_the_waiter_gets_the_lock_in_the_end(
    telemetry: Telemetry, urls: list[str], key: str
) -> None:
    lock = fencelock.Lock(urls, key, ttl=5)
    holder = lock.acquire()
    with pytest.raises(NotAcquired):
        lock.acquire(wait=0.2)
    assert lock.try_acquire() is None
    timer = threading.Timer(0.3, holder.release)
    timer.start()
    try:
        lock.acquire(wait=10).release()  # waits, woken by the release
    finally:
        timer.join()
    assert telemetry.outcomes(key) == {"granted": 2, "contention": 2}
    assert telemetry.total("fencelock.contention", key) == 3
    contention_spans = [
        s
        for s in telemetry.finished("fencelock.acquire", key)
        if s.attributes and s.attributes["outcome"] == "contention"
    ]
    assert len(contention_spans) == 2
    assert all(s.status.status_code is not StatusCode.ERROR for s in contention_spans)


def test_unavailable_servers_are_an_error_outcome_not_contention(
    telemetry: Telemetry, fencelock_server: Any, key: str
) -> None:
    url = fencelock_server.url
    fencelock_server.stop()
    with pytest.raises(Unavailable):
        fencelock.Lock(url, key, ttl=1).acquire(wait=0)

    async def run_async() -> None:
        with pytest.raises(Unavailable):
            await fencelock.asyncio.Lock(url, key, ttl=1).try_acquire()

    asyncio.run(run_async())
    assert telemetry.outcomes(key) == {"unavailable": 2}
    assert telemetry.total("fencelock.contention", key) == 0
    spans = telemetry.finished("fencelock.acquire", key)
    assert [s.status.status_code for s in spans] == [StatusCode.ERROR, StatusCode.ERROR]


def test_a_lease_taken_away_counts_a_renewal_failure_and_a_loss(
    telemetry: Telemetry, topologies: Any, key: str
) -> None:
    urls = topologies.urls(1)
    lock = fencelock.Lock(urls, key, ttl=0.9)
    with pytest.raises(fencelock.LockLost), lock.hold(renew=True) as lease:
        admin.force_release(urls, key)
        assert lease.lost.wait(5.0)

    async def run_async() -> None:
        with pytest.raises(fencelock.LockLost):
            async with fencelock.asyncio.Lock(urls, key, ttl=0.9).hold(renew=True):
                admin.force_release(urls, key)
                await asyncio.sleep(5.0)  # cancelled by the loss

    asyncio.run(run_async())
    assert telemetry.total("fencelock.lease.lost", key) == 2
    assert telemetry.total("fencelock.renewal.failures", key) == 2
    releases = telemetry.finished("fencelock.release", key)
    assert len(releases) == 2


def test_renewals_that_a_majority_cannot_confirm_are_counted_before_the_loss(
    telemetry: Telemetry, fencelock_servers: Any, key: str
) -> None:
    group = fencelock_servers(3)
    lease = fencelock.Lock(group.urls, key, ttl=0.9).acquire()
    lease.keep_alive()
    group.servers[1].stop()
    group.servers[2].stop()
    assert lease.lost.wait(5.0)
    # the loss is reported right after ``lost`` is set, on the thread that set it
    assert eventually(lambda: telemetry.total("fencelock.lease.lost", key) == 1)
    assert telemetry.total("fencelock.renewal.failures", key) >= 1


def test_the_key_is_left_out_unless_asked_for(topologies: Any, key: str) -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    spans = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    otel.instrument(meters, tracers)
    try:
        fencelock.Lock(topologies.urls(3), key, ttl=5).acquire().release()
    finally:
        otel.uninstrument()
    found = Telemetry(reader, spans, meters, tracers).points("fencelock.acquire.duration")
    assert found and all("fencelock.key" not in attributes for attributes, _ in found)
    assert {attributes["fencelock.servers"] for attributes, _ in found} == {3}
    assert spans.get_finished_spans()
    assert all(key not in str(span.attributes) for span in spans.get_finished_spans())
    meters.shutdown()
    tracers.shutdown()


def test_uninstrumented_locks_run_their_flows_unwrapped(topologies: Any, key: str) -> None:
    assert _hooks.observers == []
    lock = fencelock.Lock(topologies.urls(1), key, ttl=5)
    flow = lock._acquire_flow(UNSET)
    assert flow.gi_code.co_name == "acquire"  # type: ignore[attr-defined]
    flow.close()
    lease = lock.acquire()
    release_flow = lease._release_flow()
    assert release_flow is not None
    assert release_flow.gi_code.co_name == "release"  # type: ignore[attr-defined]
    release_flow.close()


def test_after_uninstrument_nothing_more_is_recorded(
    telemetry: Telemetry, topologies: Any, key: str
) -> None:
    lock = fencelock.Lock(topologies.urls(1), key, ttl=5)
    lock.acquire().release()
    otel.uninstrument()
    assert _hooks.observers == []
    lock.acquire().release()
    assert telemetry.outcomes(key) == {"granted": 1}


class _Broken:
    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any) -> Any:
            raise RuntimeError(f"observer bug in {name}")

        return fail


def test_a_failing_observer_never_breaks_a_lock(topologies: Any, key: str) -> None:
    broken: Any = _Broken()
    _hooks.observers.append(broken)
    try:
        lock = fencelock.Lock(topologies.urls(1), key, ttl=5)
        lease = lock.acquire()
        assert lock.try_acquire() is None
        lease.release()
        assert lock.try_acquire() is not None
    finally:
        _hooks.observers.remove(broken)

"""The Celery app of tests/integration/test_celery.py, imported by the test and by the real
worker process it starts (``celery -A celery_app worker``).

Broker, result backend and lock server are one real server, named by ``$FENCELOCK_TEST_REDIS``.
Each task run appends a JSON record to the list ``$key:events`` on that server, so the test
sees what ran, where (pid), when, and with which fence.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from fencelock.integrations.celery import SingletonTask

URL = os.environ.get("FENCELOCK_TEST_REDIS", "redis://127.0.0.1:1/0")

app = Celery("fencelock_test", broker=URL, backend=URL)
app.conf.update(
    fencelock_servers=URL,
    task_acks_late=False,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
)


def record(events: str, **fields: Any) -> None:
    client = redis.Redis.from_url(URL)
    try:
        client.rpush(events, json.dumps({"pid": os.getpid(), "at": time.time(), **fields}))
    finally:
        client.close()


@app.task(base=SingletonTask, bind=True, lock_ttl=1.0, lock_key_args=("name",))
def hold_for(self: SingletonTask, name: str, seconds: float, events: str, tag: str = "") -> int:
    """Run ``seconds`` under the lock of ``name``; returns the fence (the lease outlives the
    ttl only if it is renewed)."""
    lease = self.lease
    assert lease is not None
    record(events, event="start", name=name, tag=tag, fence=lease.fence, task=self.request.id)
    time.sleep(seconds)
    record(events, event="end", name=name, tag=tag, fence=lease.fence, lost=lease.lost.is_set())
    return lease.fence


@app.task(base=SingletonTask, bind=True, lock_ttl=30.0, lock_key_args=("name",))
def hold_long(self: SingletonTask, name: str, seconds: float, events: str) -> None:
    """Like ``hold_for`` with a long ttl: only a release (or a kill) frees it early."""
    lease = self.lease
    assert lease is not None
    record(events, event="start", name=name, fence=lease.fence, task=self.request.id)
    time.sleep(seconds)


@app.task(base=SingletonTask, bind=True, lock_ttl=3.0, lock_key_args=("name",))
def hold_short(self: SingletonTask, name: str, seconds: float, events: str) -> None:
    """Like ``hold_long`` with a 3 s ttl, for the SIGKILL test."""
    lease = self.lease
    assert lease is not None
    record(events, event="start", name=name, fence=lease.fence, task=self.request.id)
    time.sleep(seconds)


@app.task(base=SingletonTask, bind=True, lock_ttl=30.0, lock_key_args=("name",))
def fail(self: SingletonTask, name: str, events: str) -> None:
    record(events, event="fail", name=name, fence=self.lease.fence if self.lease else None)
    raise RuntimeError("task failed on purpose")


@app.task(base=SingletonTask, bind=True, lock_ttl=30.0, lock_key_args=("name",), max_retries=3)
def retry_once(self: SingletonTask, name: str, events: str) -> int:
    lease = self.lease
    assert lease is not None
    record(events, event="try", name=name, fence=lease.fence, retries=self.request.retries)
    if self.request.retries == 0:
        raise self.retry(countdown=0.2)
    return lease.fence


@app.task(base=SingletonTask, bind=True, lock_key_args=(), lock_busy="raise")
def busy_raises(self: SingletonTask, n: int) -> int:
    return n


@app.task(
    base=SingletonTask,
    bind=True,
    lock_key_args=(),
    lock_busy="retry",
    lock_retry_countdown=0.01,
    max_retries=2,
)
def busy_retries(self: SingletonTask, n: int) -> int:
    return n

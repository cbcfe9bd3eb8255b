"""SingletonTask with a real Celery worker process (prefork pool) on a real broker: the test's
own server is broker, result backend and lock server at once."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

import fencelock
from fencelock.testing import Server

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
START_S = 30.0  # liveness bound for a worker to come up (seconds), never a speed assertion
RESULT_S = 20.0


def eventually(check: Callable[[], bool], within_s: float) -> bool:
    """Poll ``check`` every 20 ms for at most ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    log: Path
    known_children: set[int]

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL; every child we know of is stopped too."""
        self.known_children.update(children(self.process.pid))
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        for pid in self.known_children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def start_worker(server: Server, tmp: Path, concurrency: int, queue: str = "celery") -> Worker:
    log = tmp / f"worker-{server.port}-{time.monotonic_ns()}.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)]),
        "FENCELOCK_TEST_REDIS": server.url,
    }
    command = [
        sys.executable, "-m", "celery", "-A", "celery_app", "worker",
        "--pool=prefork", f"--concurrency={concurrency}", "--loglevel=INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-n", f"fencelock-{server.port}-{time.monotonic_ns()}@localhost", "-Q", queue,
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=HERE, env=env, stdout=out, stderr=out)
    worker = Worker(process, log, set())
    ready = eventually(lambda: process.poll() is not None or b"ready." in log.read_bytes(), START_S)
    if not ready or process.poll() is not None:
        worker.stop()
        pytest.fail(f"the celery worker did not start:\n{log.read_text()[-3000:]}")
    worker.known_children.update(children(process.pid))
    return worker


@pytest.fixture(scope="module")
def broker(fencelock_server_binary: str) -> Iterator[Server]:
    server = Server(binary=fencelock_server_binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tasks(broker: Server) -> ModuleType:
    """The test's side of ``celery_app`` (sends tasks, reads results) on this broker."""
    os.environ["FENCELOCK_TEST_REDIS"] = broker.url
    sys.path.insert(0, str(HERE))
    module = importlib.reload(importlib.import_module("celery_app"))
    return module


@pytest.fixture(scope="module")
def worker(
    broker: Server, tasks: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    running = start_worker(broker, tmp_path_factory.mktemp("celery"), concurrency=3)
    try:
        yield running
    finally:
        running.stop()


class Events:
    """The records tasks append to ``<name>:events`` on the broker."""

    def __init__(self, url: str, name: str) -> None:
        self.name = f"{name}:events"
        self._client = redis.Redis.from_url(url)

    def all(self) -> list[dict[str, Any]]:
        return [json.loads(item) for item in self._client.lrange(self.name, 0, -1)]

    def of(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.all() if e["event"] == event]

    def wait_for(self, event: str, count: int = 1, within_s: float = RESULT_S) -> bool:
        return eventually(lambda: len(self.of(event)) >= count, within_s)


def is_free(url: str, key: str) -> bool:
    lease = fencelock.Lock(url, key, ttl=5).try_acquire()
    if lease is None:
        return False
    lease.release()
    return True


def test_one_instance_per_arguments_runs_renewed_and_a_twin_is_skipped(
    worker: Worker, tasks: ModuleType, broker: Server, key: str
) -> None:
    events = Events(broker.url, key)
    first = tasks.hold_for.delay("a", 3.0, events.name, tag="first")  # 3 x its 1 s ttl
    assert events.wait_for("start")
    twin = tasks.hold_for.delay("a", 0.1, events.name, tag="twin")
    other = tasks.hold_for.delay("b", 0.1, events.name, tag="other")
    assert twin.get(timeout=RESULT_S) is None  # skipped: "a" was running
    fence_b = other.get(timeout=RESULT_S)
    assert isinstance(fence_b, int)  # other arguments run at the same time
    lock_key = tasks.hold_for.lock_key(("a", 3.0, events.name), {})
    assert not is_free(broker.url, lock_key)  # past the 1 s ttl: renewed
    fence_a = first.get(timeout=RESULT_S)
    assert is_free(broker.url, lock_key)  # released on success
    starts = events.of("start")
    assert [e["tag"] for e in starts if e["name"] == "a"] == ["first"]
    [end] = [e for e in events.of("end") if e["tag"] == "first"]
    assert end["lost"] is False and end["fence"] == fence_a
    assert isinstance(fence_a, int) and fence_a > 0


def test_the_key_is_made_of_the_selected_arguments_only(tasks: ModuleType) -> None:
    a = tasks.hold_for.lock_key(("x", 1.0, "ev1"), {"tag": "t"})
    b = tasks.hold_for.lock_key((), {"name": "x", "seconds": 9.0, "events": "ev2"})
    c = tasks.hold_for.lock_key(("y", 1.0, "ev1"), {})
    assert a == b == 'celery:celery_app.hold_for:{"name":"x"}'
    assert c != a
    with pytest.raises(TypeError):
        tasks.hold_for.lock_key((), {"nonsense": 1})


def test_a_failed_task_releases_its_lock(
    worker: Worker, tasks: ModuleType, broker: Server, key: str
) -> None:
    events = Events(broker.url, key)
    result = tasks.fail.delay("f", events.name)
    with pytest.raises(RuntimeError, match="on purpose"):
        result.get(timeout=RESULT_S)
    assert events.of("fail")[0]["fence"] > 0
    # ttl is 30 s: only the release can have freed it
    assert is_free(broker.url, tasks.fail.lock_key(("f", events.name), {}))


def test_a_retrying_task_releases_and_takes_the_lock_again_with_a_larger_fence(
    worker: Worker, tasks: ModuleType, broker: Server, key: str
) -> None:
    events = Events(broker.url, key)
    fence = tasks.retry_once.delay("r", events.name).get(timeout=RESULT_S)
    tries = events.of("try")
    assert [t["retries"] for t in tries] == [0, 1]
    assert tries[0]["fence"] < tries[1]["fence"] == fence
    assert is_free(broker.url, tasks.retry_once.lock_key(("r", events.name), {}))


def test_a_task_revoked_with_terminate_releases_before_its_process_dies(
    worker: Worker, tasks: ModuleType, broker: Server, key: str
) -> None:
    events = Events(broker.url, key)
    result = tasks.hold_long.delay("v", 20.0, events.name)
    assert events.wait_for("start")
    [start] = events.of("start")
    worker.known_children.add(start["pid"])
    lock_key = tasks.hold_long.lock_key(("v", 20.0, events.name), {})
    assert not is_free(broker.url, lock_key)
    tasks.app.control.revoke(result.id, terminate=True)
    # ttl is 30 s: freed within seconds only by the release before the child's death
    assert eventually(lambda: is_free(broker.url, lock_key), 10.0)
    assert eventually(lambda: not alive(start["pid"]), 10.0)  # it still died of the SIGTERM


def test_a_worker_killed_with_sigkill_frees_the_key_within_its_ttl(
    broker: Server, tasks: ModuleType, tmp_path: Path, key: str
) -> None:
    # a queue of its own: the module's worker must not take this task
    killed = start_worker(broker, tmp_path, concurrency=1, queue="to-be-killed")
    try:
        events = Events(broker.url, key)
        tasks.hold_short.apply_async(("k", 30.0, events.name), queue="to-be-killed")
        assert events.wait_for("start")
        [start] = events.of("start")
        killed.known_children.add(start["pid"])
        lock_key = tasks.hold_short.lock_key(("k", 30.0, events.name), {})
        killed.process.send_signal(signal.SIGKILL)
        killed.process.wait(10)
        # the pool child dies with its parent (celery sets PDEATHSIG), nothing is released
        assert eventually(lambda: not alive(start["pid"]), 5.0)
        assert not is_free(broker.url, lock_key)
        began = time.monotonic()
        assert eventually(lambda: is_free(broker.url, lock_key), 3.0 + 5.0)  # ttl 3 s
        assert time.monotonic() - began < 3.0 + 5.0
    finally:
        killed.stop()


def test_a_busy_task_can_fail_or_retry_instead_of_skipping(
    tasks: ModuleType, broker: Server
) -> None:
    # run in this process (apply), against the real server: only the busy policy differs
    for task in (tasks.busy_raises, tasks.busy_retries):
        holder = fencelock.Lock(broker.url, task.lock_key((1,), {}), ttl=10).acquire()
        try:
            result = task.apply((1,))
            assert result.failed()
            assert isinstance(result.result, fencelock.NotAcquired)
        finally:
            holder.release()
        assert task.apply((2,)).get() == 2
    retried = tasks.busy_retries.apply((3,))
    assert retried.get() == 3

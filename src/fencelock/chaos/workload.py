"""The workload: W worker *processes* looping acquire -> read -> work -> write -> release.

Each worker is a separate process (the ``spawn`` context), so a ``SIGSTOP`` pauses exactly one
client, like a GC pause. Workers talk to the controller only through one-way OS pipes
(``multiprocessing.Pipe(duplex=False)``), never through a lock, queue or event shared with the
controller (a stopped process holding such a lock would deadlock the controller). Messages are
small, so each is one atomic pipe write.

One iteration of worker ``w``:

1. ``acquire`` the lock (through the proxies);
2. fenced register on the storage server (:class:`fencelock.fence.RedisFence`, not behind a
   proxy): ``advance`` to the lease's fence (claim the resource: every older holder's write is
   refused from now on), ``read`` the count;
3. the unfenced canary: plain ``GET`` of its count; then the worker tells the controller it
   holds the lock and has read (``("acq", w, iteration, fence, until_ns)``), so the nemesis
   can pause it right there;
4. ``work``: sleep ``work_s`` seconds (where pauses land);
5. ``canary-write`` count + 1 (plain ``SET``) and fenced ``write`` count + 1 with the fence;
6. ``release``.

``primitive`` picks what step 1 acquires: ``"lock"`` (a :class:`fencelock.Lock`),
``"semaphore"`` (a permit of a :class:`fencelock.Semaphore` of ``limit`` permits: up to
``limit`` workers hold one at once, and the fenced register still refuses every write but the
newest holder's) or ``"rwlock"`` (a :class:`fencelock.RWLock`: with probability
``read_share`` a *reader*, which only reads (steps 2-3 without ``advance``, no writes), else a
*writer*, which does the whole iteration). The granted ``acquire`` record says which in its
``info`` (``"permit"``, ``"read"``, ``"write"``; empty for a lock).

Every operation is recorded as a :class:`~fencelock.chaos.checkers.Op` (invoke and completion
times from ``time.monotonic_ns()``); the records of one iteration are sent after it ends.
Values are stored as ``"count|worker|iteration|fence"`` so the last writer can be seen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, cast

from .checkers import Op

__all__ = [
    "CANARY_KEY",
    "PRIMITIVES",
    "RESOURCE",
    "WorkerConfig",
    "decode_count",
    "encode_value",
    "worker_main",
]

RESOURCE = "chaos:register"  # fenced register resource name (RedisFence prefix added)
CANARY_KEY = "chaos:canary"  # unfenced canary register (plain string key)
_STORAGE_TIMEOUT = 5.0  # seconds per storage call; the storage server is never faulted
PRIMITIVES = ("lock", "semaphore", "rwlock")  # what ``fencelock chaos --primitive`` runs


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker process needs (picklable). Durations in seconds.

    ``deadline_s`` is a ``time.monotonic()`` value after which the worker stops by itself even
    if the controller never says so (a bound on every run).
    """

    worker: int
    lock_urls: tuple[str, ...]
    storage_url: str
    key: str
    ttl: float
    wait: float
    work_s: float
    seed: int
    deadline_s: float
    server_timeout: float | None = None
    fenced: bool = True
    canary: bool = True
    max_iterations: int = 1_000_000
    unavailable_sleep: float = 0.05
    primitive: str = "lock"
    limit: int = 2  # semaphore permits
    read_share: float = 0.7  # rwlock: the fraction of iterations that read


def encode_value(count: int, worker: int, iteration: int, fence: int) -> str:
    """The stored form of a register value: ``"count|worker|iteration|fence"``."""
    return f"{count}|{worker}|{iteration}|{fence}"


def decode_count(raw: bytes | str | None) -> int:
    """The count in a stored register value (0 when never written)."""
    if raw is None:
        return 0
    text = raw.decode() if isinstance(raw, bytes) else raw
    return int(text.split("|", 1)[0] or 0)


def _op_tuple(op: Op) -> tuple[Any, ...]:
    return dataclasses.astuple(op)


def op_from_tuple(data: tuple[Any, ...]) -> Op:
    """Inverse of the wire form used between workers and the controller."""
    return Op(*data)


class _Recorder:
    def __init__(self, worker: int) -> None:
        self.worker = worker
        self.iteration = 0
        self.ops: list[Op] = []

    def add(
        self,
        kind: str,
        status: str,
        invoke_ns: int,
        *,
        done: bool = True,
        fence: int | None = None,
        value: int | None = None,
        until_ns: int | None = None,
        info: str = "",
    ) -> None:
        self.ops.append(
            Op(
                self.worker,
                self.iteration,
                kind,
                status,  # type: ignore[arg-type]
                invoke_ns,
                time.monotonic_ns() if done else None,
                fence,
                value,
                until_ns,
                info,
            )
        )


def worker_main(cfg: WorkerConfig, out: Connection, control: Connection) -> None:
    """Run one worker until the controller sends ``"stop"`` (or closes its pipe), the
    deadline passes or ``max_iterations`` is reached. Sends ``("ops", [...])`` batches and
    ``("acq", ...)`` notices on ``out``, then ``("done", worker)``."""
    import redis

    from fencelock import LockLost, NotAcquired, StaleFence, Unavailable
    from fencelock.fence import RedisFence

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: stacks
    rng = random.Random(cfg.seed)
    lock, acquire = _primitive(cfg, rng)
    store = RedisFence(cfg.storage_url, timeout=_STORAGE_TIMEOUT)
    canary = redis.Redis.from_url(
        cfg.storage_url, socket_timeout=_STORAGE_TIMEOUT, socket_connect_timeout=_STORAGE_TIMEOUT
    )
    rec = _Recorder(cfg.worker)
    out.send(("ready", cfg.worker, os.getpid()))

    def stop_requested() -> bool:
        try:
            if control.poll():
                return True  # any message (or EOF) means stop
        except (EOFError, OSError):
            return True
        return False

    try:
        while (
            rec.iteration < cfg.max_iterations
            and time.monotonic() < cfg.deadline_s
            and not stop_requested()
        ):
            rec.iteration += 1
            rec.ops = []
            _iteration(
                cfg,
                rng,
                rec,
                acquire,
                store,
                canary,
                out,
                (LockLost, NotAcquired, StaleFence, Unavailable),
            )
            out.send(("ops", [_op_tuple(op) for op in rec.ops]))
    finally:
        with contextlib.suppress(Exception):
            out.send(("done", cfg.worker, rec.iteration))
        with contextlib.suppress(Exception):
            lock.close()
        with contextlib.suppress(Exception):
            store.close()
        with contextlib.suppress(Exception):
            canary.close()


#: Acquires with a wait in seconds; returns (lease, mode): the ``info`` of the acquire record.
Acquire = Callable[[float], tuple[Any, str]]


def _primitive(cfg: WorkerConfig, rng: random.Random) -> tuple[Any, Acquire]:
    """The object to close and a callable giving (lease, mode) for ``cfg.primitive``."""
    from fencelock import Client, Lock

    options: dict[str, Any] = {
        "ttl": cfg.ttl,
        "wait": cfg.wait,
        "server_timeout": cfg.server_timeout,
        "holder_info": False,
    }
    urls = list(cfg.lock_urls)
    if cfg.primitive == "semaphore":
        client = Client(urls, **options)
        sem = client.semaphore(cfg.key, cfg.limit)
        return client, lambda wait: (sem.acquire(wait=wait), "permit")
    if cfg.primitive == "rwlock":
        client = Client(urls, **options)
        rw = client.rwlock(cfg.key)

        def either(wait: float) -> tuple[Any, str]:
            if rng.random() < cfg.read_share:
                return rw.acquire_read(wait=wait), "read"
            return rw.acquire_write(wait=wait), "write"

        return client, either
    lock = Lock(urls, cfg.key, **options)
    return lock, lambda wait: (lock.acquire(wait=wait), "")


def _iteration(
    cfg: WorkerConfig,
    rng: random.Random,
    rec: _Recorder,
    acquire: Acquire,
    store: Any,
    canary: Any,
    out: Connection,
    errors: tuple[type[BaseException], ...],
) -> None:
    lock_lost, not_acquired, stale_fence, unavailable = errors
    t = time.monotonic_ns()
    try:
        lease, mode = acquire(cfg.wait)
    except not_acquired:
        rec.add("acquire", "fail", t, info="contention")
        return
    except unavailable:
        rec.add("acquire", "fail", t, info="unavailable")
        time.sleep(cfg.unavailable_sleep * (0.5 + rng.random()))
        return
    except Exception as exc:
        rec.add("acquire", "unknown", t, info=type(exc).__name__)
        time.sleep(cfg.unavailable_sleep)
        return
    now = time.monotonic_ns()
    until = now + int(lease.remaining() * 1e9)
    rec.ops.append(
        Op(rec.worker, rec.iteration, "acquire", "ok", t, now, lease.fence, None, until, mode)
    )
    writes = mode != "read"  # a reader only reads
    fenced_ok = cfg.fenced
    count = 0
    if cfg.fenced and writes:
        t = time.monotonic_ns()
        try:
            store.advance(RESOURCE, lease.fence)
            rec.add("advance", "ok", t, fence=lease.fence)
        except stale_fence:
            rec.add("advance", "fail", t, fence=lease.fence, info="stale")
            fenced_ok = False
        except Exception as exc:
            rec.add("advance", "unknown", t, fence=lease.fence, info=type(exc).__name__)
            fenced_ok = False
    if fenced_ok:
        t = time.monotonic_ns()
        try:
            raw, _ = store.read(RESOURCE)
            count = decode_count(raw)
            rec.add("read", "ok", t, fence=lease.fence, value=count)
        except Exception as exc:
            rec.add("read", "fail", t, info=type(exc).__name__)
            fenced_ok = False
    canary_ok = cfg.canary
    canary_count = 0
    if cfg.canary:
        t = time.monotonic_ns()
        try:
            canary_count = decode_count(canary.get(CANARY_KEY))
            rec.add("canary-read", "ok", t, fence=lease.fence, value=canary_count)
        except Exception as exc:
            rec.add("canary-read", "fail", t, info=type(exc).__name__)
            canary_ok = False
    # tell the controller now, between the reads and the writes: a pause of the process here
    # is the classic lease-lock failure (it writes what it read before the pause)
    out.send(("acq", rec.worker, rec.iteration, lease.fence, until))
    # the work
    time.sleep(cfg.work_s * (0.5 + rng.random()))
    if canary_ok and writes:
        t = time.monotonic_ns()
        new = canary_count + 1
        try:
            canary.set(CANARY_KEY, encode_value(new, rec.worker, rec.iteration, lease.fence))
            rec.add("canary-write", "ok", t, fence=lease.fence, value=new)
        except Exception as exc:
            rec.add(
                "canary-write", "unknown", t, fence=lease.fence, value=new, info=type(exc).__name__
            )
    if fenced_ok and writes:
        t = time.monotonic_ns()
        new = count + 1
        try:
            store.write(
                RESOURCE, lease.fence, encode_value(new, rec.worker, rec.iteration, lease.fence)
            )
            rec.add("write", "ok", t, fence=lease.fence, value=new)
        except stale_fence:
            rec.add("write", "fail", t, fence=lease.fence, value=new, info="stale")
        except Exception as exc:
            rec.add("write", "unknown", t, fence=lease.fence, value=new, info=type(exc).__name__)
    t = time.monotonic_ns()
    try:
        lease.release()
        rec.add("release", "ok", t, fence=lease.fence)
    except lock_lost:
        rec.add("release", "fail", t, fence=lease.fence, info="lost")
    except Exception as exc:
        rec.add("release", "unknown", t, fence=lease.fence, info=type(exc).__name__)


# --------------------------------------------------------------------------------------------
# controller side


class WorkerPool:
    """Starts the worker processes (spawn context), collects their histories in a thread, and
    pauses/resumes/stops them by PID.

    Raises:
        RuntimeError: from :meth:`start` if the workers did not report ready within ``timeout``.
    """

    def __init__(self, configs: list[WorkerConfig]) -> None:
        import multiprocessing

        self.configs = configs
        self._ctx = multiprocessing.get_context("spawn")
        self._procs: dict[int, Any] = {}
        self._pids: dict[int, int] = {}
        self._readers: dict[int, Connection] = {}
        self._controls: dict[int, Connection] = {}
        self._done: set[int] = set()
        self._paused: set[int] = set()
        self.ops: list[Op] = []
        self.acquisitions = 0
        self._last_acq: tuple[int, int, int] | None = None  # (received ns, worker, seq)
        self._finished: dict[int, int] = {}  # worker -> last iteration whose ops arrived
        self._cond = threading.Condition()
        self._collector: threading.Thread | None = None
        self._closing = False

    def start(self, timeout: float = 60.0) -> WorkerPool:
        try:
            for cfg in self.configs:
                out_r, out_w = self._ctx.Pipe(duplex=False)
                ctl_r, ctl_w = self._ctx.Pipe(duplex=False)
                proc = self._ctx.Process(
                    target=worker_main,
                    args=(cfg, out_w, ctl_r),
                    name=f"fencelock-chaos-worker-{cfg.worker}",
                    daemon=True,
                )
                proc.start()
                out_w.close()
                ctl_r.close()
                self._procs[cfg.worker] = proc
                self._readers[cfg.worker] = out_r
                self._controls[cfg.worker] = ctl_w
            self._collector = threading.Thread(
                target=self._collect, name="chaos-collector", daemon=True
            )
            self._collector.start()
            deadline = time.monotonic() + timeout
            with self._cond:
                while len(self._pids) < len(self.configs):
                    dead = [
                        w
                        for w, p in self._procs.items()
                        if not p.is_alive() and w not in self._pids
                    ]
                    if dead:
                        raise RuntimeError(f"workers {dead} exited before they were ready")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RuntimeError(
                            f"only {len(self._pids)}/{len(self.configs)} workers ready in "
                            f"{timeout} s"
                        )
                    self._cond.wait(min(left, 0.5))
        except BaseException:
            self.stop(timeout=5.0)
            raise
        return self

    def _collect(self) -> None:
        from multiprocessing.connection import wait

        while True:
            live = [c for w, c in self._readers.items() if w not in self._done]
            if not live:
                return
            for ready in wait(live, timeout=0.2):
                conn = cast(Connection, ready)
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    worker = next(w for w, c in self._readers.items() if c is conn)
                    with self._cond:
                        self._done.add(worker)
                        self._cond.notify_all()
                    continue
                self._handle(msg)
            if self._closing and all(not p.is_alive() for p in self._procs.values()):
                # drain what is left, then stop
                for w, c in self._readers.items():
                    while w not in self._done and c.poll():
                        try:
                            self._handle(c.recv())
                        except (EOFError, OSError):
                            break
                return

    def _handle(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        with self._cond:
            if kind == "ops":
                batch = [op_from_tuple(t) for t in msg[1]]
                self.ops.extend(batch)
                if batch:
                    self._finished[batch[0].worker] = batch[0].iteration
            elif kind == "acq":
                self.acquisitions += 1
                self._last_acq = (time.monotonic_ns(), msg[1], msg[2])
            elif kind == "ready":
                self._pids[msg[1]] = msg[2]
            elif kind == "done":
                self._done.add(msg[1])
            self._cond.notify_all()

    def pid(self, worker: int) -> int:
        return self._pids[worker]

    def iteration_done(self, worker: int, iteration: int) -> bool:
        """True once the operations of ``worker``'s ``iteration`` have arrived."""
        with self._cond:
            return self._finished.get(worker, 0) >= iteration

    def holder_after(self, after_ns: int, timeout_s: float) -> tuple[int, int, int] | None:
        """(worker, pid, iteration) of a worker whose acquisition notice arrived after
        ``after_ns``, waiting up to ``timeout_s`` seconds; ``None`` if none came."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                last = self._last_acq
                if last is not None and last[0] > after_ns and last[1] not in self._paused:
                    return last[1], self._pids[last[1]], last[2]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.1))

    def signal(self, worker: int, stop: bool) -> None:
        """SIGSTOP (``stop``) or SIGCONT one worker, by its PID."""
        pid = self._pids[worker]
        if stop:
            self._paused.add(worker)
            os.kill(pid, signal.SIGSTOP)
        else:
            os.kill(pid, signal.SIGCONT)
            self._paused.discard(worker)

    def kill(self, worker: int) -> None:
        """SIGKILL one worker (its history of the current iteration is lost)."""
        os.kill(self._pids[worker], signal.SIGKILL)

    def stop(self, timeout: float = 30.0) -> None:
        """Resume paused workers, ask all to stop, wait up to ``timeout`` s, SIGKILL any left
        (each by its PID), and wait for the collector. Never raises."""
        for worker in list(self._paused):
            with contextlib.suppress(Exception):
                self.signal(worker, False)
        for conn in self._controls.values():
            with contextlib.suppress(Exception):
                conn.send("stop")
        deadline = time.monotonic() + timeout
        for proc in self._procs.values():
            proc.join(max(deadline - time.monotonic(), 0.1))
        for proc in self._procs.values():
            if proc.is_alive() and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGKILL)
                proc.join(5.0)
        self._closing = True
        if self._collector is not None:
            self._collector.join(10.0)
        for conn in [*self._readers.values(), *self._controls.values()]:
            with contextlib.suppress(Exception):
                conn.close()

    def __enter__(self) -> WorkerPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

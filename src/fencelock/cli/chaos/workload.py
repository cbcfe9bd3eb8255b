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

``primitive`` picks what step 1 acquires: ``"lock"`` (a :class:`fencelock.Lock`), ``"fair"``
(the same lock with ``fair=True``: waiters granted in arrival order, the lock's checks),
``"semaphore"`` (a permit of a :class:`fencelock.Semaphore` of ``limit`` permits: up to
``limit`` workers hold one at once, and the fenced register still refuses every write but the
newest holder's), ``"rwlock"`` (a :class:`fencelock.RWLock`: with probability
``read_share`` a *reader*, which only reads (steps 2-3 without ``advance``, no writes), else a
*writer*, which does the whole iteration), ``"multi"`` (a :class:`fencelock.MultiLock` over
the two keys of :func:`multi_keys`: each key has its own fence, recorded as a ``key-fence``
record per key; the first key's fence guards the register) or ``"election"`` (a
:class:`fencelock.Election`: ``campaign()`` until this worker leads; the term, renewed while
it leads, is the lease and its number the fence; leaving the campaign resigns). The granted
``acquire`` record says which in its ``info`` (``"permit"``, ``"read"``, ``"write"``,
``"multi"``, ``"term"``; empty for a lock).

``front`` picks the API: ``"sync"`` (blocking) or ``"asyncio"`` (the same primitive from
:mod:`fencelock.asyncio`, ``ASYNC_BATCH`` iterations per ``asyncio.run()``, so each batch is a
new event loop and its connections are identified again). An iteration is written once, as a
flow of steps (acquire, work, release) that :func:`drive` or :func:`drive_async` performs; the
storage calls are blocking in both (the storage server is the instrument, never faulted). With
asyncio, a lost term cancels the campaign's body (its writes do not run: a ``work`` record with
``info="cancelled"``) and the release reports the loss.

Every operation is recorded as a :class:`~fencelock.chaos.checkers.Op` (invoke and completion
times from ``time.monotonic_ns()``); the records of one iteration are sent after it ends.
Values are stored as ``"count|worker|iteration|fence"`` so the last writer can be seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import faulthandler
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, TypeVar, cast

from .checkers import Op

_T = TypeVar("_T")

__all__ = [
    "ASYNC_BATCH",
    "CANARY_KEY",
    "FRONTS",
    "PRIMITIVES",
    "PRIMITIVE_ALIASES",
    "RESOURCE",
    "WorkerConfig",
    "decode_count",
    "encode_value",
    "multi_keys",
    "worker_main",
]

RESOURCE = "chaos:register"  # fenced register resource name (RedisFence prefix added)
CANARY_KEY = "chaos:canary"  # unfenced canary register (plain string key)
_STORAGE_TIMEOUT = 5.0  # seconds per storage call; the storage server is never faulted
#: what ``fencelock chaos --primitive`` runs (``rw`` is accepted for ``rwlock``)
PRIMITIVES = ("lock", "fair", "semaphore", "rwlock", "multi", "election")
PRIMITIVE_ALIASES = {"rw": "rwlock"}
FRONTS = ("sync", "asyncio")  # ``--front``: the blocking API or ``fencelock.asyncio``
ASYNC_BATCH = 20  # iterations per ``asyncio.run()`` of an asyncio worker (a new loop each)


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
    front: str = "sync"  # or "asyncio"


def each_quietly(call: Callable[[_T], object], items: Iterable[_T]) -> None:
    """``call(item)`` for every item, whatever each one raises (a cleanup goes on)."""
    for item in items:
        with contextlib.suppress(Exception):
            call(item)


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
    ``("acq", ...)`` notices on ``out``, then ``("done", worker)``.

    With ``cfg.front == "asyncio"`` the iterations run on an event loop, ``ASYNC_BATCH`` per
    ``asyncio.run()``: each batch is a new loop, whose connections must be identified again."""
    import redis

    from fencelock import LockLost, NotAcquired, StaleFence, Unavailable
    from fencelock.fence import RedisFence

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: stacks
    rng = random.Random(cfg.seed)
    front: SyncFront | AsyncFront = (
        AsyncFront(cfg, rng) if cfg.front == "asyncio" else SyncFront(cfg, rng)
    )
    store = RedisFence(cfg.storage_url, timeout=_STORAGE_TIMEOUT)
    canary = redis.Redis.from_url(
        cfg.storage_url, socket_timeout=_STORAGE_TIMEOUT, socket_connect_timeout=_STORAGE_TIMEOUT
    )
    rec = _Recorder(cfg.worker)
    errors = (LockLost, NotAcquired, StaleFence, Unavailable)
    out.send(("ready", cfg.worker, os.getpid()))

    def stop_requested() -> bool:
        try:
            if control.poll():
                return True  # any message (or EOF) means stop
        except (EOFError, OSError):
            return True
        return False

    def next_iteration() -> bool:
        if (
            rec.iteration >= cfg.max_iterations
            or time.monotonic() >= cfg.deadline_s
            or stop_requested()
        ):
            return False
        rec.iteration += 1
        rec.ops = []
        return True

    def flow() -> Flow:
        return _iteration(cfg, rng, rec, store, canary, out, errors)

    def send_ops() -> None:
        out.send(("ops", [_op_tuple(op) for op in rec.ops]))

    async def batch(front: AsyncFront) -> bool:
        for _ in range(ASYNC_BATCH):
            if not next_iteration():
                return False
            await drive_async(flow(), front)
            send_ops()
        return True

    try:
        if isinstance(front, AsyncFront):
            while asyncio.run(batch(front)):
                pass
        else:
            while next_iteration():
                drive(flow(), front)
                send_ops()
    finally:
        with contextlib.suppress(Exception):
            out.send(("done", cfg.worker, rec.iteration))
        with contextlib.suppress(Exception):
            front.close()
        with contextlib.suppress(Exception):
            store.close()
        with contextlib.suppress(Exception):
            canary.close()


# --------------------------------------------------------------------------------------------
# one iteration: a flow of steps, driven by either front end


@dataclass(frozen=True)
class _Acquire:
    wait: float


@dataclass(frozen=True)
class _Work:
    """Sleep ``seconds``; ``held`` is what the worker holds meanwhile (``None``: nothing)."""

    seconds: float
    held: Held | None


@dataclass(frozen=True)
class _Release:
    held: Held


Step = _Acquire | _Work | _Release
#: An iteration: yields steps, is sent each step's result (or has its exception thrown in).
Flow = Generator[Step, Any, None]


class BodyCancelled(Exception):
    """Thrown into an iteration at its work when the asyncio front end cancelled the body
    because a renewed term was lost (``campaign()``'s rule): the rest of the body, its
    writes, does not run."""


@dataclass
class Held:
    """What one acquire gave: its leases (one; a MultiLock's: one per key, in sorted key
    order), the mode recorded as the acquire's ``info``, and for an election the
    ``campaign()`` context whose exit releases the term (``cancelled``: the cancellation the
    asyncio front end took from the body, handed to that exit)."""

    leases: tuple[Any, ...]
    mode: str
    scope: Any = None
    cancelled: BaseException | None = None

    @property
    def fence(self) -> int:
        """The fence that guards the register: the lease's (a MultiLock's: its first key's)."""
        return int(self.leases[0].fence)

    def until_ns(self) -> int:
        """The end of validity now (``time.monotonic_ns()``): the earliest lease deadline
        (renewal of an election's term moves it later)."""
        return int(min(lease.deadline for lease in self.leases) * 1e9)


def multi_keys(key: str) -> tuple[str, str]:
    """The two keys ``--primitive multi`` locks together."""
    return (f"{key}:a", f"{key}:b")


def _build(api: Any, cfg: WorkerConfig) -> tuple[Any, Any]:
    """(client, primitive) of ``cfg.primitive`` from ``api``: ``fencelock`` or
    ``fencelock.asyncio`` (same names, same options)."""
    client = api.Client(
        list(cfg.lock_urls),
        ttl=cfg.ttl,
        wait=cfg.wait,
        server_timeout=cfg.server_timeout,
        holder_info=False,
    )
    kind = cfg.primitive
    if kind == "semaphore":
        return client, client.semaphore(cfg.key, cfg.limit)
    if kind == "rwlock":
        return client, client.rwlock(cfg.key)
    if kind == "multi":
        return client, client.multilock(multi_keys(cfg.key))
    if kind == "election":
        return client, client.election(cfg.key, name=f"worker-{cfg.worker}")
    return client, client.lock(cfg.key, fair=kind == "fair")  # a fair lock: arrival order


def _mode(cfg: WorkerConfig, rng: random.Random) -> str:
    """The next acquire's mode (a read-write lock draws read or write)."""
    if cfg.primitive == "rwlock":
        return "read" if rng.random() < cfg.read_share else "write"
    return {"semaphore": "permit", "multi": "multi", "election": "term"}.get(cfg.primitive, "")


def _acquirer(primitive: Any, mode: str) -> Callable[..., Any]:
    if mode == "read":
        return cast(Callable[..., Any], primitive.acquire_read)
    if mode == "write":
        return cast(Callable[..., Any], primitive.acquire_write)
    return cast(Callable[..., Any], primitive.acquire)


def _leases(granted: Any) -> tuple[Any, ...]:
    return tuple(granted) if isinstance(granted, tuple) else (granted,)


class SyncFront:
    """The blocking front end (``fencelock``) of ``cfg.primitive``."""

    def __init__(self, cfg: WorkerConfig, rng: random.Random) -> None:
        import fencelock

        self.cfg = cfg
        self.rng = rng
        self.client, self.primitive = _build(fencelock, cfg)

    def perform(self, step: Step) -> Any:
        if isinstance(step, _Acquire):
            return self.acquire(step.wait)
        if isinstance(step, _Work):
            time.sleep(step.seconds)
            return None
        return self.release(step.held)

    def acquire(self, wait: float) -> Held:
        mode = _mode(self.cfg, self.rng)
        if self.cfg.primitive == "election":
            scope = self.primitive.campaign(wait=wait)
            return Held((scope.__enter__(),), mode, scope)
        return Held(_leases(_acquirer(self.primitive, mode)(wait=wait)), mode)

    def release(self, held: Held) -> None:
        """Release every lease (all are tried; the first error is raised after)."""
        if held.scope is not None:
            held.scope.__exit__(None, None, None)  # LockLost when the term was lost
            return
        first: Exception | None = None
        for lease in held.leases:
            try:
                lease.release()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first

    def close(self) -> None:
        self.client.close()


class AsyncFront:
    """The asyncio front end (``fencelock.asyncio``) of ``cfg.primitive``; its objects live
    across event loops (one per batch)."""

    def __init__(self, cfg: WorkerConfig, rng: random.Random) -> None:
        import fencelock.asyncio

        self.cfg = cfg
        self.rng = rng
        self.client, self.primitive = _build(fencelock.asyncio, cfg)

    async def perform(self, step: Step) -> Any:
        if isinstance(step, _Acquire):
            return await self.acquire(step.wait)
        if isinstance(step, _Work):
            return await self.work(step.seconds, step.held)
        return await self.release(step.held)

    async def acquire(self, wait: float) -> Held:
        mode = _mode(self.cfg, self.rng)
        if self.cfg.primitive == "election":
            scope = self.primitive.campaign(wait=wait)
            return Held((await scope.__aenter__(),), mode, scope)
        return Held(_leases(await _acquirer(self.primitive, mode)(wait=wait)), mode)

    async def work(self, seconds: float, held: Held | None) -> None:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError as exc:
            if held is None or held.scope is None:
                raise
            held.cancelled = exc  # the term was lost: campaign() cancelled its body
            raise BodyCancelled from None

    async def release(self, held: Held) -> None:
        """Release every lease (all are tried; the first error is raised after)."""
        if held.scope is not None:
            exc = held.cancelled
            if exc is None:
                await held.scope.__aexit__(None, None, None)
            elif not await held.scope.__aexit__(type(exc), exc, exc.__traceback__):
                raise exc  # not turned into LockLost: not the campaign's own cancellation
            return
        first: Exception | None = None
        for lease in held.leases:
            try:
                await lease.release()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first

    def close(self) -> None:
        asyncio.run(self.client.aclose())


_DONE = object()


def _resume(flow: Flow, answer: Any, error: Exception | None) -> Any:
    """The flow's next step after ``answer`` (or ``error``, thrown in); ``_DONE`` once it
    returned (one step of :func:`drive` and :func:`drive_async` alike)."""
    try:
        return flow.throw(error) if error is not None else flow.send(answer)
    except StopIteration:
        return _DONE


def drive(flow: Flow, front: SyncFront) -> None:
    """Run an iteration with the blocking front end."""
    step = _resume(flow, None, None)
    while step is not _DONE:
        try:
            answer, error = front.perform(step), None
        except Exception as exc:
            answer, error = None, exc
        step = _resume(flow, answer, error)


async def drive_async(flow: Flow, front: AsyncFront) -> None:
    """Run an iteration with the asyncio front end (the same flow as :func:`drive`)."""
    step = _resume(flow, None, None)
    while step is not _DONE:
        try:
            answer, error = await front.perform(step), None
        except Exception as exc:
            answer, error = None, exc
        step = _resume(flow, answer, error)


def _iteration(
    cfg: WorkerConfig,
    rng: random.Random,
    rec: _Recorder,
    store: Any,
    canary: Any,
    out: Connection,
    errors: tuple[type[BaseException], ...],
) -> Flow:
    lock_lost, not_acquired, stale_fence, unavailable = errors
    t = time.monotonic_ns()
    try:
        held: Held = yield _Acquire(cfg.wait)
    except not_acquired:
        rec.add("acquire", "fail", t, info="contention")
        return
    except unavailable:
        rec.add("acquire", "fail", t, info="unavailable")
        yield _Work(cfg.unavailable_sleep * (0.5 + rng.random()), None)
        return
    except Exception as exc:
        rec.add("acquire", "unknown", t, info=type(exc).__name__)
        yield _Work(cfg.unavailable_sleep, None)
        return
    now = time.monotonic_ns()
    until = held.until_ns()
    fence = held.fence
    grant = Op(rec.worker, rec.iteration, "acquire", "ok", t, now, fence, None, until, held.mode)
    at = len(rec.ops)
    rec.ops.append(grant)
    if len(held.leases) > 1:  # a MultiLock: each key's own fence, checked per key
        w, it = rec.worker, rec.iteration
        rec.ops += [Op(w, it, "key-fence", "ok", t, now, x.fence, info=x.key) for x in held.leases]
    writes = held.mode != "read"  # a reader only reads
    fenced_ok = cfg.fenced
    count = 0
    if cfg.fenced and writes:
        t = time.monotonic_ns()
        try:
            store.advance(RESOURCE, fence)
            rec.add("advance", "ok", t, fence=fence)
        except stale_fence:
            rec.add("advance", "fail", t, fence=fence, info="stale")
            fenced_ok = False
        except Exception as exc:
            rec.add("advance", "unknown", t, fence=fence, info=type(exc).__name__)
            fenced_ok = False
    if fenced_ok:
        t = time.monotonic_ns()
        try:
            raw, _ = store.read(RESOURCE)
            count = decode_count(raw)
            rec.add("read", "ok", t, fence=fence, value=count)
        except Exception as exc:
            rec.add("read", "fail", t, info=type(exc).__name__)
            fenced_ok = False
    canary_ok = cfg.canary
    canary_count = 0
    if cfg.canary:
        t = time.monotonic_ns()
        try:
            canary_count = decode_count(canary.get(CANARY_KEY))
            rec.add("canary-read", "ok", t, fence=fence, value=canary_count)
        except Exception as exc:
            rec.add("canary-read", "fail", t, info=type(exc).__name__)
            canary_ok = False
    # tell the controller now, between the reads and the writes: a pause of the process here
    # is the classic lease-lock failure (it writes what it read before the pause)
    out.send(("acq", rec.worker, rec.iteration, fence, until))
    # the work
    t = time.monotonic_ns()
    try:
        yield _Work(cfg.work_s * (0.5 + rng.random()), held)
    except BodyCancelled:
        rec.add("work", "fail", t, fence=fence, info="cancelled")
        writes = False  # the asyncio body was cancelled: its writes never run
    if canary_ok and writes:
        t = time.monotonic_ns()
        new = canary_count + 1
        try:
            canary.set(CANARY_KEY, encode_value(new, rec.worker, rec.iteration, fence))
            rec.add("canary-write", "ok", t, fence=fence, value=new)
        except Exception as exc:
            rec.add("canary-write", "unknown", t, fence=fence, value=new, info=type(exc).__name__)
    if fenced_ok and writes:
        t = time.monotonic_ns()
        new = count + 1
        try:
            store.write(RESOURCE, fence, encode_value(new, rec.worker, rec.iteration, fence))
            rec.add("write", "ok", t, fence=fence, value=new)
        except stale_fence:
            rec.add("write", "fail", t, fence=fence, value=new, info="stale")
        except Exception as exc:
            rec.add("write", "unknown", t, fence=fence, value=new, info=type(exc).__name__)
    later = held.until_ns()  # a renewed term's validity ends later than at its grant
    if later > until:
        rec.ops[at] = dataclasses.replace(grant, until_ns=later)
    t = time.monotonic_ns()
    try:
        yield _Release(held)
        rec.add("release", "ok", t, fence=fence)
    except lock_lost:
        rec.add("release", "fail", t, fence=fence, info="lost")
    except Exception as exc:
        rec.add("release", "unknown", t, fence=fence, info=type(exc).__name__)


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
        each_quietly(lambda worker: self.signal(worker, False), list(self._paused))
        each_quietly(lambda conn: conn.send("stop"), self._controls.values())
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
        each_quietly(lambda conn: conn.close(), [*self._readers.values(), *self._controls.values()])

    def __enter__(self) -> WorkerPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""The nemesis: a seeded schedule of faults, and the topology it breaks.

:class:`Topology` starts N lock servers (real processes, ``appendfsync always`` by default) each
behind its own :class:`~fencelock.testing.Proxy`, plus one separate storage server for the
registers (never behind a proxy, never faulted). With the Valkey binary and the Debian package
``faketime`` installed, server 0 runs under libfaketime so its clock can really jump.

:func:`make_schedule` turns a seed into a list of :class:`Fault` (printed on failure, so a run can
be replayed); :class:`Nemesis` plays it in a thread, one fault at a time, healthy periods in
between, and heals everything in ``finally``. Fault names (``--faults``):

=====================  ================================================================  ========
name                   what it does                                                      catalogue
=====================  ================================================================  ========
``pause-holder``       SIGSTOP the worker that just acquired, past its TTL; then SIGCONT  F1
``pause-server``       SIGSTOP a lock server, then SIGCONT                               F13, F4
``kill-restart``       ``kill -9`` a server, restart at once (recovers from its AOF)     F8 (safe)
``kill-wipe-delayed``  ``kill -9``, restart empty after more than the max TTL            F8 (safe)
``kill-wipe``          ``kill -9``, restart empty at once (unsafe for the lock alone)    F8, F17
``partition``          blackhole a minority of servers                                   F11
``partition-majority`` blackhole a majority (acquire must refuse: Unavailable)           F11
``latency``            add latency on some servers' proxies                               F2
``hold``               hold bytes on some proxies past the TTL, then deliver late        F2, F4
``drop-replies``       forward requests, drop the replies on some proxies                F12
``clock-jump``         portable clock jump: ``PEXPIRE fencelock:{K} 1`` on one node of    F5
                       a holder that holds exactly a majority
``faketime-jump``      same, with a real clock jump (libfaketime) on server 0            F5
=====================  ================================================================  ========

Durations are seconds. Every wait has a deadline and every fault is healed in ``finally``.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..._core.keys import lock_keys
from ...testing import (
    Persistence,
    Proxy,
    Server,
    ServerError,
    engine_of,
    find_server_binary,
    wait_trusted,
)
from .workload import CANARY_KEY, each_quietly

__all__ = [
    "ALL_FAULTS",
    "CATEGORY",
    "FAKETIME_LIB",
    "Fault",
    "FaultRecord",
    "Nemesis",
    "Topology",
    "faketime_available",
    "make_schedule",
]

CATEGORY: dict[str, str] = {
    "pause-holder": "pause",
    "pause-server": "pause",
    "kill-restart": "kill",
    "kill-wipe-delayed": "kill",
    "kill-wipe": "kill",
    "partition": "partition",
    "partition-majority": "partition",
    "latency": "network",
    "hold": "network",
    "drop-replies": "network",
    "clock-jump": "clock",
    "faketime-jump": "clock",
}
ALL_FAULTS: tuple[str, ...] = tuple(CATEGORY)
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
_FIRST_ORDER = ("pause", "kill", "partition", "clock", "network")


def faketime_available(binary: str | None = None) -> bool:
    """True if libfaketime is installed and the server binary is Valkey (libfaketime hangs
    Debian's redis-server 7: a jemalloc clash)."""
    if not os.path.exists(FAKETIME_LIB):
        return False
    try:
        return engine_of(binary or find_server_binary()).name == "valkey"
    except ServerError:
        return False


# --------------------------------------------------------------------------------------------
# topology


class Topology:
    """N lock servers behind proxies + one storage server.

    ``persistence`` applies to the lock servers (``"aof-always"`` by default: ``kill-restart``
    is then the mitigated crash, ``kill-wipe`` the unmitigated one). ``faketime=True`` runs
    server 0 under libfaketime (only when :func:`faketime_available`).

    Raises:
        ServerError: a server could not start (all are stopped again).
    """

    def __init__(
        self, n: int, *, persistence: Persistence = "aof-always", faketime: bool = False
    ) -> None:
        if n < 1:
            raise ValueError("a topology needs at least one lock server")
        self.n = n
        self.faketime_file: Path | None = None
        self._faketime_dir: str | None = None
        self.faketime_offset_s = 0.0
        self.servers: list[Server] = []
        for i in range(n):
            env = None
            if i == 0 and faketime:
                self._faketime_dir = tempfile.mkdtemp(prefix="fencelock-faketime-")
                self.faketime_file = Path(self._faketime_dir) / "offset"
                self.faketime_file.write_text("+0\n")
                env = {
                    **os.environ,
                    "LD_PRELOAD": FAKETIME_LIB,
                    "FAKETIME_TIMESTAMP_FILE": str(self.faketime_file),
                    "FAKETIME_NO_CACHE": "1",
                    "FAKETIME_DONT_RESET": "1",
                }
            self.servers.append(Server(persistence=persistence, env=env))
        self.storage = Server(persistence="none")
        self.proxies: list[Proxy] = []

    @property
    def lock_urls(self) -> list[str]:
        """URLs the workers use: the proxies, in server order."""
        return [p.url for p in self.proxies]

    @property
    def direct_urls(self) -> list[str]:
        """URLs of the lock servers themselves (the nemesis' own back door)."""
        return [s.url for s in self.servers]

    def start(self) -> Topology:
        """Start every server and proxy; return ``self``. On failure stop what started."""
        try:
            for s in [*self.servers, self.storage]:
                s.start()
            for i, s in enumerate(self.servers):
                self.proxies.append(
                    Proxy(s.host, s.port, name=f"proxy-{i}", password=s.password).start()
                )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop proxies and servers (each by its own PID); never raises."""
        each_quietly(lambda proxy: proxy.stop(), self.proxies)
        each_quietly(lambda server: server.stop(), [*self.servers, self.storage])
        if self._faketime_dir is not None:
            shutil.rmtree(self._faketime_dir, ignore_errors=True)
            self._faketime_dir = None

    def jump_clock(self, seconds: float) -> None:
        """Move server 0's clock forward by ``seconds`` (libfaketime; cumulative)."""
        if self.faketime_file is None:
            raise ServerError("server 0 does not run under libfaketime")
        self.faketime_offset_s += seconds
        self.faketime_file.write_text(f"+{self.faketime_offset_s:.3f}\n")

    def heal_network(self) -> None:
        each_quietly(lambda proxy: proxy.heal(), self.proxies)

    def wait_trusted(self, indexes: Sequence[int], within_s: float = 5.0) -> bool:
        """:func:`fencelock.testing.wait_trusted` for the lock servers at ``indexes``."""
        return wait_trusted([self.lock_urls[i] for i in indexes], within_s)

    def __enter__(self) -> Topology:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------
# schedule


@dataclass(frozen=True)
class Fault:
    """One planned fault: at ``at_s`` seconds after the run started, for ``duration_s``."""

    at_s: float
    name: str
    duration_s: float
    targets: tuple[int, ...] = ()
    param: float = 0.0

    def __str__(self) -> str:
        extra = f" param={self.param:g}" if self.param else ""
        return (
            f"t={self.at_s:6.2f}s {self.name:<18} for {self.duration_s:.2f}s "
            f"targets={list(self.targets)}{extra}"
        )


def make_schedule(
    seed: int,
    duration_s: float,
    faults: Sequence[str],
    *,
    servers: int,
    ttl: float,
    healthy_s: tuple[float, float] = (1.0, 2.0),
    start_s: float = 1.0,
) -> list[Fault]:
    """A reproducible schedule: healthy ``healthy_s`` seconds, one fault, healthy, ...

    The first faults cover one of each category present (pause, kill, partition, clock,
    network) so even a short run exercises them; then the enabled faults repeat in a seeded
    shuffled order. ``pause-holder`` counts twice in every round. Faults that would not end
    before ``duration_s`` are left out.

    Raises:
        ValueError: an unknown fault name, or ``servers < 1``.
    """
    unknown = [f for f in faults if f not in CATEGORY]
    if unknown:
        raise ValueError(f"unknown faults {unknown}; known: {', '.join(ALL_FAULTS)}")
    if servers < 1:
        raise ValueError("servers must be >= 1")
    rng = random.Random(seed)
    names = list(dict.fromkeys(faults))
    first: list[str] = []
    for category in _FIRST_ORDER:
        members = [f for f in names if CATEGORY[f] == category]
        if "pause-holder" in members:
            members = ["pause-holder"]  # the headline fault comes first
        if members:
            first.append(rng.choice(members))
    if "pause-holder" in names:  # weight 2: pauses are what fencing is for (Jepsen's run)
        first.insert(min(3, len(first)), "pause-holder")
    plan: list[Fault] = []
    t = start_s
    queue = list(first)
    minority = max(servers // 2, 1) if servers > 1 else 1
    majority = servers // 2 + 1
    while True:
        if not queue:
            queue = list(names) + (["pause-holder"] if "pause-holder" in names else [])
            rng.shuffle(queue)
        name = queue.pop(0)
        fault = _plan_one(rng, name, t, servers, ttl, minority, majority)
        if fault.at_s + fault.duration_s + 0.5 > duration_s:
            break
        plan.append(fault)
        t = fault.at_s + fault.duration_s + rng.uniform(*healthy_s)
    return plan


def _plan_one(
    rng: random.Random, name: str, t: float, n: int, ttl: float, minority: int, majority: int
) -> Fault:
    def pick(k: int) -> tuple[int, ...]:
        return tuple(sorted(rng.sample(range(n), min(k, n))))

    if name == "pause-holder":
        return Fault(t, name, ttl * rng.uniform(1.5, 2.5))
    if name == "pause-server":
        return Fault(t, name, ttl * rng.uniform(0.5, 1.5), pick(1))
    if name in ("kill-restart", "kill-wipe"):
        return Fault(t, name, 0.1, pick(1))
    if name == "kill-wipe-delayed":
        return Fault(t, name, ttl * rng.uniform(1.5, 2.0), pick(1))
    if name == "partition":
        return Fault(t, name, ttl * rng.uniform(1.0, 2.0), pick(minority))
    if name == "partition-majority":
        return Fault(t, name, ttl * rng.uniform(1.0, 1.5), pick(majority))
    if name == "latency":
        return Fault(
            t,
            name,
            ttl * rng.uniform(1.0, 2.0),
            pick(rng.randint(1, n)),
            round(rng.uniform(5.0, 40.0), 1),
        )
    if name == "hold":
        return Fault(t, name, ttl * rng.uniform(1.2, 1.8), pick(rng.randint(1, majority)))
    if name == "drop-replies":
        return Fault(t, name, ttl * rng.uniform(0.5, 1.0), pick(rng.randint(1, majority)))
    # clock-jump / faketime-jump: cut the others off so the next holder holds exactly a
    # majority, then let them back and expire the key on one node of that majority
    keep = tuple(range(majority)) if name == "faketime-jump" else pick(majority)
    others = tuple(i for i in range(n) if i not in keep)
    node = 0 if name == "faketime-jump" else rng.choice(keep)
    return Fault(t, name, ttl * rng.uniform(1.0, 1.5), others, float(node))


# --------------------------------------------------------------------------------------------
# playing it


@dataclass
class FaultRecord:
    """What was done: monotonic ns of injection and heal, and a note (e.g. the paused worker)."""

    fault: Fault
    start_ns: int
    heal_ns: int | None = None
    note: str = ""
    error: str = ""

    def __str__(self) -> str:
        status = f" ERROR {self.error}" if self.error else ""
        return f"{self.fault}{(' ' + self.note) if self.note else ''}{status}"


HolderProbe = Callable[[int, float], "tuple[int, int, int] | None"]
"""``probe(after_ns, timeout_s)`` -> ``(worker, pid, iteration)`` of a worker that acquired
after ``after_ns``, waiting up to ``timeout_s``; ``None`` if none did."""
IterationDone = Callable[[int, int], bool]
"""``done(worker, iteration)``: has that worker reported the end of that iteration?"""
Signaller = Callable[[int, bool], None]
"""``signal(worker, stop)``: SIGSTOP (``stop=True``) or SIGCONT a worker process."""


@dataclass
class Nemesis:
    """Plays ``schedule`` against ``topology`` in a background thread.

    ``lock_key`` is the lock name (for ``clock-jump``); ``expire_keys``, when given, the keys
    ``clock-jump`` expires instead of the lock key (a semaphore's slots, a read-write lock's
    writer key and readers); ``holder_probe`` and ``signal_worker`` come from the worker pool
    (for ``pause-holder``). ``records`` grows as faults are played.
    """

    topology: Topology
    schedule: list[Fault]
    lock_key: str
    holder_probe: HolderProbe | None = None
    signal_worker: Signaller | None = None
    iteration_done: IterationDone | None = None
    expire_keys: tuple[str, ...] = ()
    records: list[FaultRecord] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _t0: float = 0.0

    def start(self) -> Nemesis:
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current fault (which is healed); wait up to ``timeout`` s."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def injected(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.records:
            if not r.error:
                counts[r.fault.name] = counts.get(r.fault.name, 0) + 1
        return counts

    def _run(self) -> None:
        for fault in self.schedule:
            wait = self._t0 + fault.at_s - time.monotonic()
            if wait > 0 and self._stop.wait(wait):
                return
            if self._stop.is_set():
                return
            record = FaultRecord(fault, time.monotonic_ns())
            self.records.append(record)
            try:
                self.play(fault, record)
            except Exception as exc:
                record.error = f"{type(exc).__name__}: {exc}"
            finally:
                if record.heal_ns is None:
                    record.heal_ns = time.monotonic_ns()

    # ---- the faults --------------------------------------------------------------------------

    def _sleep(self, seconds: float) -> None:
        # a stop request shortens nothing: a fault is always held for its duration and healed
        time.sleep(max(seconds, 0.0))

    def play(self, fault: Fault, record: FaultRecord) -> None:
        """Inject ``fault``, hold it for its duration, heal it (also when it fails)."""
        topo = self.topology
        name = fault.name
        if name == "pause-holder":
            if self.holder_probe is None or self.signal_worker is None:
                raise RuntimeError("pause-holder needs a worker pool")
            # stop a holder inside its critical section: if the stop came after it finished
            # the iteration, let it go and take the next one (at most 5 tries)
            tries = 0
            for _ in range(5):
                tries += 1
                found = self.holder_probe(time.monotonic_ns(), 3.0)
                if found is None:
                    raise RuntimeError("no worker acquired within 3 s")
                worker, pid, iteration = found
                self.signal_worker(worker, True)
                time.sleep(0.02)  # let a batch already written reach the collector
                if not self._past_its_writes(worker, iteration):
                    break
                self.signal_worker(worker, False)
            else:
                raise RuntimeError("could not stop a holder inside its critical section")
            record.note = f"worker={worker} pid={pid} tries={tries}"
            try:
                self._sleep(fault.duration_s)
            finally:
                self.signal_worker(worker, False)
                record.heal_ns = time.monotonic_ns()
            return
        if name == "pause-server":
            server = topo.servers[fault.targets[0]]
            server.pause()
            try:
                self._sleep(fault.duration_s)
            finally:
                server.resume()
                record.heal_ns = time.monotonic_ns()
            return
        if name in ("kill-restart", "kill-wipe", "kill-wipe-delayed"):
            server = topo.servers[fault.targets[0]]
            server.kill()
            try:
                self._sleep(fault.duration_s)
            finally:
                server.restart(wipe=name != "kill-restart")
                record.heal_ns = time.monotonic_ns()
            return
        if name in ("partition", "partition-majority", "latency", "hold", "drop-replies"):
            proxies = [topo.proxies[i] for i in fault.targets]
            try:
                for p in proxies:
                    if name == "latency":
                        p.latency(fault.param)
                    elif name == "hold":
                        p.hold()
                    elif name == "drop-replies":
                        p.drop_replies()
                    else:
                        p.blackhole()
                self._sleep(fault.duration_s)
            finally:
                for p in proxies:
                    p.heal()
                record.heal_ns = time.monotonic_ns()
            return
        if name in ("clock-jump", "faketime-jump"):
            self._clock_jump(fault, record)
            return
        raise ValueError(f"unknown fault {name!r}")

    def _past_its_writes(self, worker: int, iteration: int) -> bool:
        """Did a (now stopped) worker already write in this iteration? Then a pause proves
        little: the canary register names its last writer (``count|worker|iteration|fence``)."""
        if self.iteration_done is not None and self.iteration_done(worker, iteration):
            return True
        try:
            with self.topology.storage.client(socket_timeout=1.0) as storage:
                raw = storage.get(CANARY_KEY)
        except Exception:
            return False
        if raw is None:
            return False
        parts = raw.decode().split("|")
        return len(parts) >= 3 and parts[1:3] == [str(worker), str(iteration)]

    def _clock_jump(self, fault: Fault, record: FaultRecord) -> None:
        topo = self.topology
        node = int(fault.param)
        cut = [topo.proxies[i] for i in fault.targets]
        hit = False
        try:
            for p in cut:
                p.blackhole()
            found = None
            if self.holder_probe is not None:
                # the next holder can reach only the majority: it holds exactly that
                found = self.holder_probe(time.monotonic_ns() + 20_000_000, 3.0)
        finally:
            for p in cut:
                p.heal()
        if found is not None:
            if fault.name == "faketime-jump":
                with topo.servers[node].client(socket_timeout=1.0) as direct:
                    hit = bool(direct.exists(lock_keys(self.lock_key).lock))
                topo.jump_clock(2.0 * fault.duration_s + 1.0)
            else:
                keys = self.expire_keys or (lock_keys(self.lock_key).lock,)
                with topo.servers[node].client(socket_timeout=1.0) as direct:
                    hit = any([bool(direct.pexpire(k, 1)) for k in keys])
        holder = found[0] if found else None
        record.note = f"node={node} holder={holder} key_expired={hit}"
        record.heal_ns = time.monotonic_ns()
        self._sleep(fault.duration_s)

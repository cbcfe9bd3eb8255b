"""How far this machine's wall clock moves against its monotonic clock while tests run.

The lock servers expire keys by their wall clock (this host's, for every server a test starts);
clients count leases on the monotonic clock. A step of the host's wall clock (a VM's clock
corrected by its host) moves every server's expiries at once: a majority, beyond what a lease
can survive (docs/guarantees.md). :class:`ClockWatch` measures such steps, so that a test can
tell them from the library's faults, and the session reports them (tests/conftest.py)."""

from __future__ import annotations

import threading
import time

#: A sample counts only when its two monotonic readings are this close (s): a thread preempted
#: between them would read a move that is not there.
TIGHT_S = 50e-6
#: A move between two samples larger than this (s) is recorded as a step.
STEP_S = 0.001


class ClockWatch:
    """Samples ``time.time() - time.monotonic()`` every ``every_s`` in a daemon thread for at
    most ``for_s`` seconds; :attr:`moved` is how far it moved (s), :attr:`steps` the moves of
    more than a millisecond between samples, as (monotonic s, size s)."""

    def __init__(self, every_s: float = 0.005, for_s: float = 7200.0) -> None:
        # the offsets seen (lowest, highest, last); None until a first sample counts
        self.low = self.high = self._last = _offset()
        self.steps: list[tuple[float, float]] = []
        self._every_s = every_s
        self._end = time.monotonic() + for_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clock-watch", daemon=True)
        self._thread.start()

    @property
    def moved(self) -> float:
        return 0.0 if self.low is None or self.high is None else self.high - self.low

    def _run(self) -> None:
        while not self._stop.wait(self._every_s) and time.monotonic() < self._end:
            offset = _offset()
            if offset is None:
                continue
            if self._last is None or self.low is None or self.high is None:
                self.low = self.high = offset
            elif abs(offset - self._last) > STEP_S:
                self.steps.append((time.monotonic(), offset - self._last))
            self._last = offset
            self.low, self.high = min(self.low, offset), max(self.high, offset)

    def stop(self) -> float:
        """Stop watching; returns :attr:`moved`."""
        self._stop.set()
        self._thread.join(5.0)
        return self.moved


def _offset() -> float | None:
    before = time.monotonic()
    wall = time.time()
    after = time.monotonic()
    return None if after - before > TIGHT_S else wall - (before + after) / 2

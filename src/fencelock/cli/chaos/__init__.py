"""Fault injection that proves what each protection prevents.

- :mod:`~fencelock.testing.proxy`: a TCP proxy per lock server (latency, blackhole,
  hold-then-deliver, dropped replies);
- :mod:`~fencelock.chaos.nemesis`: the topology (lock servers behind proxies + a storage server)
  and a seeded schedule of faults (pauses, kills, restarts, partitions, clock jumps);
- :mod:`~fencelock.chaos.workload`: worker processes looping acquire -> read -> work -> fenced
  write -> release, next to an unfenced canary register;
- :mod:`~fencelock.chaos.checkers`: pure checkers over the recorded history;
- :mod:`~fencelock.chaos.report`: the result (``fencelock chaos --json``) and its table;
- :mod:`~fencelock.chaos.cli`: :func:`~fencelock.chaos.cli.run`, the ``fencelock chaos`` command.
"""

from .checkers import Op
from .report import ChaosResult

__all__ = ["ChaosResult", "Op"]

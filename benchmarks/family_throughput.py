"""Throughput of each primitive vs a plain Lock in the same run: acquire+release cycles/s,
one thread, embedded servers (1 and 3).

Run: ``FENCELOCK_SERVER_BIN=... PYTHONPATH=src python benchmarks/family_throughput.py``
"""

# ruff: noqa: B023, E741  (the lambdas run inside the loop iteration that made them)

import time

import fencelock
from fencelock.testing import ServerGroup

CYCLES = 1500


def rate(fn):
    fn()
    t = time.perf_counter()
    for _ in range(CYCLES):
        fn()
    return CYCLES / (time.perf_counter() - t)


for n in (1, 3):
    g = ServerGroup(n).start()
    try:
        c = fencelock.Client(g.urls, ttl=60)
        lock, re = c.lock("p"), c.lock("r", reentrant=True)
        sem4, sem64 = c.semaphore("s", limit=4), c.semaphore("s64", limit=64)
        rw, multi = c.rwlock("rw"), c.multilock(["m1", "m2"])
        held = [sem64.acquire(wait=0) for _ in range(63)]  # the last free slot is #63
        cases = {
            "lock": lambda: lock.acquire(wait=0).release(),
            "reentrant (outermost)": lambda: re.acquire(wait=0).release(),
            "semaphore limit=4": lambda: sem4.acquire(wait=0).release(),
            "semaphore limit=64, 63 taken": lambda: sem64.acquire(wait=0).release(),
            "rwlock read": lambda: rw.acquire_read(wait=0).release(),
            "rwlock write": lambda: rw.acquire_write(wait=0).release(),
            "multilock 2 keys": lambda: [l.release() for l in multi.acquire(wait=0)],
            "lock (again, last)": lambda: lock.acquire(wait=0).release(),
        }
        base = None
        for name, fn in cases.items():
            r = rate(fn)
            base = base or r
            print(f"n={n} {name:30s} {r:8.0f}/s  {r / base:5.2f} x lock")
        outer = re.acquire(wait=0)
        r = rate(lambda: re.acquire(wait=0).release())
        print(f"n={n} {'reentrant (inner, no I/O)':30s} {r:8.0f}/s  {r / base:5.2f} x lock")
        outer.release()
        for p in held:
            p._release_quietly()
    finally:
        g.stop()

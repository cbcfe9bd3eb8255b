"""A read-write lock, written once: many readers or one writer, over 1 or N servers.

Readers and the writer are ordinary leases run by the ordinary flows (acquire with its wait
loop, fence commit, extend, renew, release); only their scripts and keys differ (a
:class:`~.plan.Wiring` each):

- a reader is a member of a zset (token -> expiry), so every reader's lease expires on its
  own; it enters only while no writer holds the lock key and no writer waits;
- a writer holds the lock key itself and enters only when no live reader is left; while it
  waits it keeps a short-lived intent marker, which stops NEW readers (no writer starvation);
  a writer that died waiting stops readers at most until its marker expires (its longest
  wait step: the readers' lease left + 1 s);
- both bump ONE fence register per rwlock key, and over N servers both commit the merged
  fence to a majority before the lease is handed out, so a writer's fence is larger than
  every fence, reader's or writer's, issued before on the key.

No upgrade: a reader asking for the write lock is an ordinary contender, and waits for every
reader to leave, itself included (so it fails with NotAcquired after its wait).
"""

from __future__ import annotations

from dataclasses import replace

from .keys import rw_keys
from .plan import LockPlan, Wiring, lock_wiring


def writer_plan(base: LockPlan) -> LockPlan:
    keys = rw_keys(base.key)
    k = keys.writer
    # commit and extend are the plain lock's
    wiring = replace(
        lock_wiring(k),
        acquire="rw_write_acquire",
        acquire_keys=(k.lock, k.fence, k.holder, k.waiters, k.handoff, keys.readers, keys.intent),
        release="rw_write_release",
        release_keys=(k.lock, k.holder, k.waiters, k.wake, keys.intent),
    )
    return base.rewired(k, wiring)


def reader_plan(base: LockPlan) -> LockPlan:
    keys = rw_keys(base.key)
    k = keys.writer
    return base.rewired(
        k,
        Wiring(
            acquire="rw_read_acquire",
            acquire_keys=(k.lock, k.fence, keys.readers, keys.intent, k.waiters, k.wake),
            commit="rw_read_commit",
            commit_keys=(keys.readers, k.fence),
            release="rw_read_release",
            release_keys=(keys.readers, k.waiters, k.wake),
            extend="rw_read_extend",
            extend_keys=(keys.readers,),
        ),
    )

"""What both front ends share, above the drivers and below the public modules.

A lock's definition and the fronts built on it (lock, fair, semaphore, RW, multi), the lease's
state and its renewal rules, reentry, the held-lease context, holder info and tokens, and the
observers' hooks. Nothing here performs I/O: the drivers (``_sync``, ``_async``) do.
"""

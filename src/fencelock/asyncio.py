"""The asyncio front end: ``from fencelock.asyncio import Lock``.

Same shape as the blocking API, awaitable::

    lock = Lock("redis://127.0.0.1:6379/0", "orders:42", ttl=30)
    async with lock.hold(wait=5) as lease:   # renewed; body cancelled + LockLost on loss
        await write(..., fence=lease.fence)
"""

from ._async.family import MultiLock, RWLock, Semaphore
from ._async.lock import Lease, Lock, Permit
from ._core.election import Leader
from .client import AsyncClient as Client
from .election import AsyncElection as Election
from .errors import ConfigError, FencelockError, LockLost, NotAcquired, StaleFence, Unavailable

__all__ = [
    "Client",
    "ConfigError",
    "Election",
    "FencelockError",
    "Leader",
    "Lease",
    "Lock",
    "LockLost",
    "MultiLock",
    "NotAcquired",
    "Permit",
    "RWLock",
    "Semaphore",
    "StaleFence",
    "Unavailable",
]

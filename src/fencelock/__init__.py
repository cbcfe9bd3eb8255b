"""fencelock: distributed locks with fencing tokens on Redis and Valkey.

>>> from fencelock import Client, Lock, NotAcquired   # doctest: +SKIP
"""

from ._core.election import Leader
from ._sync.family import MultiLock, RWLock, Semaphore
from ._sync.lock import Lease, Lock, Permit
from .client import Client
from .decorator import current_lease, locked
from .errors import (
    ConfigError,
    FencelockError,
    LockLost,
    NotAcquired,
    ServerVote,
    StaleFence,
    Unavailable,
)

__version__ = "0.1.0"

__all__ = [
    "Client",
    "ConfigError",
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
    "ServerVote",
    "StaleFence",
    "Unavailable",
    "__version__",
    "current_lease",
    "locked",
]

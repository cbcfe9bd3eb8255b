"""fencelock: distributed locks with fencing tokens on Redis and Valkey.

>>> from fencelock import Client, Lock, NotAcquired

The public names other than the errors are imported on first use, so that ``import fencelock``
loads neither the asyncio front end nor the parts a program does not use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .errors import (
    ConfigError,
    FencelockError,
    InsecureTLSWarning,
    LockLost,
    NotAcquired,
    ServerVote,
    StaleFence,
    Unavailable,
)

if TYPE_CHECKING:
    from ._core.election import Leader
    from ._sync.family import MultiLock, RWLock, Semaphore
    from ._sync.lock import Lease, Lock, Permit
    from .client import Client
    from .decorator import current_lease, locked
    from .election import Election

__version__ = "0.1.0"

#: Public name -> the module it lives in, imported on first use.
_LAZY: dict[str, str] = {
    "Client": ".client",
    "Election": ".election",
    "Leader": "._core.election",
    "Lease": "._sync.lock",
    "Lock": "._sync.lock",
    "MultiLock": "._sync.family",
    "Permit": "._sync.lock",
    "RWLock": "._sync.family",
    "Semaphore": "._sync.family",
    "current_lease": ".decorator",
    "locked": ".decorator",
}


def _lazy_attribute(name: str) -> object:
    """A public name of :data:`_LAZY`, imported from its module now (then kept here)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


if not TYPE_CHECKING:
    # hidden from type checkers, which see every lazy name imported above: a misspelt
    # ``fencelock.Lokc`` stays an error for them instead of a silent ``object``
    __getattr__ = _lazy_attribute


__all__ = [
    "Client",
    "ConfigError",
    "Election",
    "FencelockError",
    "InsecureTLSWarning",
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

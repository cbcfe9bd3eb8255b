"""What a connection to one server is apart from its I/O (shared by the blocking and the
asyncio connection): the address it goes to, the :class:`~.handshake.Identity` its handshake
found, when it was last used, its ``CLIENT ID``, the process that opened it, and whether a
request has completed on it yet. The drivers' pools read these; only the connection sets them.
"""

from __future__ import annotations

from .address import Address
from .handshake import Identity


class LinkState:
    """The non-I/O state of one connection."""

    def __init__(self, address: Address, identify: bool, owner_pid: int) -> None:
        self.address = address
        self.identify = identify  # the handshake asks INFO/ROLE (see handshake.prelude)
        self.identity: Identity | None = None
        self.last_used = 0.0  # time.monotonic() of the last completed request
        self.client_id: int | None = None  # CLIENT ID, asked before a claiming wait
        self.owner_pid = owner_pid
        self._fresh = True

    @property
    def fresh(self) -> bool:
        """True until the first request completed (never used before)."""
        return self._fresh

"""Who we are: random tokens, and the holder info other processes see in ``fencelock status``."""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from typing import Any

TOKEN_BYTES = 16  # 128 random bits from the OS CSPRNG (DESIGN.md: at least 128)

_HOST = socket.gethostname()
_prefix: dict[tuple[int, str | None], str] = {}


def new_token() -> str:
    return secrets.token_hex(TOKEN_BYTES)


def holder_info(purpose: str | None) -> str:
    """Host, pid, purpose and wall-clock time as compact JSON; the constant part is encoded once
    per (pid, purpose)."""
    pid = os.getpid()
    prefix = _prefix.get((pid, purpose))
    if prefix is None:
        info: dict[str, Any] = {"host": _HOST, "pid": pid}
        if purpose:
            info["purpose"] = purpose
        prefix = json.dumps(info, separators=(",", ":"))[:-1] + ',"acquired_at":'
        _prefix[(pid, purpose)] = prefix
    return f"{prefix}{time.time():.3f}}}"

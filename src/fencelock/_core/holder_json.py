"""Reading holder info (JSON written by other processes, so untrusted) within bounds (pure).

Anyone who may write a lock's keys can store any text as its holder info; ``fencelock status``
and ``Election.leader()`` must neither crash on it nor spend unbounded time: a text longer
than :data:`MAX_HOLDER_CHARS` or nested deeper than :data:`MAX_HOLDER_DEPTH` is not parsed
(``json.loads`` recurses once per level and raises RecursionError on a deep enough text).
"""

from __future__ import annotations

import json
from typing import Any, Final

__all__ = [
    "LOCK_VALUE_SEPARATOR",
    "LOCK_VALUE_WAITERS_SEPARATOR",
    "MAX_HOLDER_CHARS",
    "MAX_HOLDER_DEPTH",
    "lock_token",
    "parse_holder",
    "split_lock_value",
]

#: Longest holder info parsed (characters); fencelock's own is well under 1 KiB.
MAX_HOLDER_CHARS: Final = 65_536
#: Deepest nesting of arrays and objects parsed; fencelock's own holder info has depth 1.
MAX_HOLDER_DEPTH: Final = 16
#: What separates the token from the holder info in a lock key's value (``lock_value.lua``):
#: byte 255, which no UTF-8 text (so no token) holds.
LOCK_VALUE_SEPARATOR: Final = b"\xff"
#: The separator once a caller registered as a waiter while the value's holder held the lock
#: (byte 254, in no UTF-8 text either): its release looks for waiters to wake.
LOCK_VALUE_WAITERS_SEPARATOR: Final = b"\xfe"


def split_lock_value(value: bytes) -> tuple[bytes, bytes | None]:
    """A lock key's value as (token, holder info); the info is None when the value has none
    (written without holder info, handed over by a release, or by fencelock 0.3 and older,
    which kept it in a key of its own)."""
    found = (value.find(LOCK_VALUE_SEPARATOR), value.find(LOCK_VALUE_WAITERS_SEPARATOR))
    cuts = [at for at in found if at >= 0]
    if not cuts:
        return value, None
    cut = min(cuts)
    return value[:cut], value[cut + 1 :]


def lock_token(value: bytes | None) -> bytes | None:
    """The token in a lock key's value (a GET of it; None when there is none)."""
    return None if value is None else split_lock_value(value)[0]


def _depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` outside strings (a scan, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def parse_holder(text: str) -> dict[str, Any] | None:
    """The JSON object ``text`` holds, or None: not JSON, not an object, longer than
    :data:`MAX_HOLDER_CHARS` or nested deeper than :data:`MAX_HOLDER_DEPTH`. Never raises
    for any ``str``."""
    if len(text) > MAX_HOLDER_CHARS or _depth(text) > MAX_HOLDER_DEPTH:
        return None
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None

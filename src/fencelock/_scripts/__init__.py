"""The Lua scripts, one file each with a KEYS/ARGV/returns header; loaded once at import.

A line ``-- #include fence_math.lua`` is replaced by that file's text (the exact fence
arithmetic, written once); a script's source and SHA are those of the text with it in place.

Run them with EVALSHA and fall back to EVAL on NOSCRIPT (see the node shells); their SHA1s are
pinned by ``tests/integration/test_scripts.py`` against a real server.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Script:
    name: str
    source: bytes
    sha: str
    numkeys: int  # KEYS the header documents (for a variadic script: its fixed leading keys)
    variadic: bool = False  # takes more keys after those (a semaphore's slots): sent as given


#: A script line naming a shared part: the loader puts that file's text in its place.
_INCLUDE = b"-- #include "


def _read(name: str) -> bytes:
    # the loader that found this package reads its files, from a directory or a zip archive
    # alike (as importlib.resources would, without importing zipfile and tempfile: a few ms of
    # every start)
    assert __spec__ is not None and __spec__.loader is not None
    loader: Any = __spec__.loader
    return bytes(loader.get_data(os.path.join(os.path.dirname(__file__), name)))


def assemble(name: str, read: Callable[[str], bytes] = _read) -> bytes:
    """The source of script ``name``: its file with each ``-- #include`` line replaced by
    that file's text (``read``: a file's bytes by file name; default: this package's)."""
    return b"".join(
        read(line[len(_INCLUDE) :].strip().decode()) if line.startswith(_INCLUDE) else line
        for line in read(f"{name}.lua").splitlines(keepends=True)
    )


def _load(name: str, numkeys: int, *, variadic: bool = False) -> Script:
    source = assemble(name)
    return Script(name, source, hashlib.sha1(source).hexdigest(), numkeys, variadic)


ACQUIRE = _load("acquire", 7)
RELEASE = _load("release", 7)
EXTEND = _load("extend", 1, variadic=True)  # (KEYS[2] with a grant's fence)
FENCE_COMMIT = _load("fence_commit", 2)
ELECT_ANNOUNCE = _load("elect_announce", 3)
ELECT_READ = _load("elect_read", 3)
SEM_ACQUIRE = _load("sem_acquire", 2, variadic=True)
SEM_SWEEP = _load("sem_sweep", 2, variadic=True)
SEM_FENCE_COMMIT = _load("sem_fence_commit", 2)
RW_READ_ACQUIRE = _load("rw_read_acquire", 6)
RW_READ_COMMIT = _load("rw_read_commit", 2)
RW_READ_EXTEND = _load("rw_read_extend", 1)
RW_READ_RELEASE = _load("rw_read_release", 3)
RW_WRITE_ACQUIRE = _load("rw_write_acquire", 7)
RW_WRITE_RELEASE = _load("rw_write_release", 5)
FAIR_ACQUIRE = _load("fair_acquire", 6)
FAIR_RELEASE = _load("fair_release", 5)
FAIR_LEAVE = _load("fair_leave", 4)

ALL = (
    ACQUIRE,
    RELEASE,
    EXTEND,
    FENCE_COMMIT,
    ELECT_ANNOUNCE,
    ELECT_READ,
    SEM_ACQUIRE,
    SEM_SWEEP,
    SEM_FENCE_COMMIT,
    RW_READ_ACQUIRE,
    RW_READ_COMMIT,
    RW_READ_EXTEND,
    RW_READ_RELEASE,
    RW_WRITE_ACQUIRE,
    RW_WRITE_RELEASE,
    FAIR_ACQUIRE,
    FAIR_RELEASE,
    FAIR_LEAVE,
)
BY_NAME = {script.name: script for script in ALL}

"""The Lua scripts, one file each with a KEYS/ARGV/returns header; loaded once at import.

Run them with EVALSHA and fall back to EVAL on NOSCRIPT (see the node shells); their SHA1s are
pinned by ``tests/integration/test_scripts.py`` against a real server.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True)
class Script:
    name: str
    source: bytes
    sha: str
    numkeys: int


def _load(name: str, numkeys: int) -> Script:
    source = resources.files(__package__).joinpath(f"{name}.lua").read_bytes()
    return Script(name, source, hashlib.sha1(source).hexdigest(), numkeys)


ACQUIRE = _load("acquire", 5)
RELEASE = _load("release", 5)
EXTEND = _load("extend", 2)
FENCE_COMMIT = _load("fence_commit", 2)
ELECT_ANNOUNCE = _load("elect_announce", 3)
ELECT_READ = _load("elect_read", 3)

ALL = (ACQUIRE, RELEASE, EXTEND, FENCE_COMMIT, ELECT_ANNOUNCE, ELECT_READ)
BY_NAME = {script.name: script for script in ALL}

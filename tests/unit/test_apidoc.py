"""docs/api.md is built from the docstrings offline and is never stale."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_api_reference_builds_offline_and_matches_the_code() -> None:
    # a subprocess with no network configuration of its own: the build imports the public
    # modules and reads their docstrings, nothing else
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "apidoc.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr


def test_the_api_reference_lists_every_public_name() -> None:
    import fencelock
    import fencelock.asyncio

    text = (ROOT / "docs" / "api.md").read_text()
    for module in (fencelock, fencelock.asyncio):
        for name in module.__all__:
            assert f"### `{name}" in text, name

"""``tools/simulate.py`` run as a command, as the simulation tests run it: one place for its
command line, the environment it imports from (a source tree first, the repository's or a
mutated copy, then the repository root for ``tools``) and its time bound."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIMULATE = [sys.executable, str(ROOT / "tools" / "simulate.py")]


def sim_env(src: Path | None = None, **extra: str) -> dict[str, str]:
    """This process's environment with ``src`` (default: the repository's ``src``) and the
    repository root first on ``PYTHONPATH``, and the ``extra`` variables set."""
    env = dict(os.environ, **extra)
    paths = [str(ROOT / "src" if src is None else src), str(ROOT), os.environ.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def simulate(
    *args: str,
    src: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``simulate.py args`` from the repository root, its output captured as text; importing
    ``src`` (see :func:`sim_env`) unless a whole ``env`` is given. Raises
    ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
    return subprocess.run(
        [*SIMULATE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=sim_env(src) if env is None else env,
        cwd=ROOT,
        check=False,
    )

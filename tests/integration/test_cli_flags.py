"""flock(1)'s flags on ``fencelock run`` (DESIGN v0.3 "Where users are"): ``-V/--version``,
``-w`` (= ``--wait``), ``-E`` (= ``--conflict-exit-code``), ``-c "cmd"`` (through ``sh -c``),
``-q/--quiet``, a silent conflict with ``-n`` unless ``-v``; and ``doctor`` exiting 0 on
warnings alone, 1 on a failure, ``--strict`` failing on a warning. Real servers, real
processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import fencelock
from fencelock.testing import Server

BOUND = 60.0  # a liveness bound per command (seconds), never a speed assertion


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCELOCK_")}
    return subprocess.run(
        [sys.executable, "-m", "fencelock", *args],
        capture_output=True,
        text=True,
        timeout=BOUND,
        env=env,
    )


@pytest.fixture
def held(fencelock_session_server: Server, key: str) -> Iterator[str]:
    """The key, held by another holder for the test's duration."""
    lock = fencelock.Lock(fencelock_session_server.url, key, ttl=60)
    lease = lock.acquire(wait=1)
    yield key
    lease.release()
    lock.close()


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version(flag: str) -> None:
    result = cli(flag)
    assert result.returncode == 0
    assert result.stdout.strip() == f"fencelock {fencelock.__version__}"


def test_short_wait_and_conflict_exit_code(fencelock_session_server: Server, held: str) -> None:
    began = time.monotonic()
    result = cli(
        "run", "--key", held, "-w", "0.3", "-E", "3", "--server", fencelock_session_server.url,
        "--", "true",
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert time.monotonic() - began >= 0.3  # it waited (-w), then gave up with -E's code
    assert "not acquired" in result.stderr


def test_nonblock_conflict_is_silent_unless_verbose(
    fencelock_session_server: Server, held: str
) -> None:
    url = fencelock_session_server.url
    quiet = cli("run", "--key", held, "-n", "--server", url, "--", "true")
    assert quiet.returncode == 75 and quiet.stderr == "", quiet.stderr
    told = cli("run", "--key", held, "-n", "-v", "--server", url, "--", "true")
    assert told.returncode == 75 and "not acquired" in told.stderr


def test_quiet_prints_nothing_of_its_own(fencelock_session_server: Server, held: str) -> None:
    url = fencelock_session_server.url
    result = cli("run", "--key", held, "-q", "-w", "0.1", "--server", url, "--", "true")
    assert result.returncode == 75 and result.stderr == "", result.stderr
    loud = cli("run", "--key", held, "-w", "0.1", "--server", url, "--", "true")
    assert loud.returncode == 75 and "not acquired" in loud.stderr


def test_c_runs_the_command_through_sh(
    fencelock_session_server: Server, key: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    script = f'echo "$FENCELOCK_FENCE" > "{out}" && exit 4'
    result = cli("run", "--key", key, "-c", script, "--server", fencelock_session_server.url)
    assert result.returncode == 4, result.stderr
    assert int(out.read_text()) > 0


@pytest.mark.parametrize(
    "args",
    [["-c", "true", "--", "true"], ["-c", " "]],
    ids=["both", "empty"],
)
def test_c_with_a_command_after_dashes_or_empty_is_a_usage_error(key: str, args: list[str]) -> None:
    result = cli("run", "--key", key, "--server", "redis://127.0.0.1:1/0", *args)
    assert result.returncode == 64 and result.stderr.count("\n") == 1, result.stderr


def test_doctor_exits_0_on_warnings_alone_and_1_with_strict(
    fencelock_session_server: Server,
) -> None:
    url = fencelock_session_server.url  # no fsynced AOF: the persistence check warns
    plain = cli("doctor", "--server", url)
    assert "[WARN] persistence" in plain.stdout, plain.stdout
    assert "[FAIL]" not in plain.stdout
    assert plain.returncode == 0, plain.stdout + plain.stderr
    strict = cli("doctor", "--strict", "--server", url)
    assert strict.returncode == 1 and "persistence" in strict.stderr

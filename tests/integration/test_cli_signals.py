"""``fencelock run`` and SIGINT/SIGTERM at each point after the grant, on a real server.

Each case makes the signal land at one exact point without racing a timer: the child command
signals its parent itself (``kill -INT $PPID``), or, for the points inside the CLI, a wrapper
around the public API sends the signal to its own process at that point (``python -c`` running
``fencelock.cli.main``, a real process with real signal delivery). Then: the exit status, the
lock key on the server, and the child process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from fencelock.testing import Server

DEADLINE = 30.0  # generous: the machine is shared
SH = "/bin/sh"
SIGNALS = [signal.SIGINT, signal.SIGTERM]

# ``fencelock.cli.main`` with a signal sent to this very process right after a public call
# returns: ``acquire`` (the grant is back, the command not started) or ``keep_alive`` (the
# command has just been started). The wrapper writes its file first, so a test can tell that
# the point was really reached.
WRAPPER = """
import os, sys
from pathlib import Path
import fencelock
import fencelock.cli as cli
import fencelock.cli.run as cli_run

point, signum, fired = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])

def signal_after(method):
    def wrapped(self, *args, **kwargs):
        result = method(self, *args, **kwargs)
        fired.write_text(point)
        os.kill(os.getpid(), signum)
        return result
    return wrapped

if point == "acquire":
    class SignalledLock(fencelock.Lock):
        acquire = signal_after(fencelock.Lock.acquire)
    cli_run.Lock = SignalledLock
elif point == "keep_alive":
    fencelock.Lease.keep_alive = signal_after(fencelock.Lease.keep_alive)
else:
    raise SystemExit(f"unknown point {point!r}")
sys.exit(cli.main(sys.argv[4:]))
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FENCELOCK_")}


def lock_key(name: str) -> str:
    """The lock key as DESIGN.md fixes it (written out, not taken from the library)."""
    return f"fencelock:{{{name}}}"


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {DEADLINE} s waiting for {what}")
        time.sleep(0.05)


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class Runner:
    """Starts processes; whatever still runs at teardown is killed by its PID."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.child_pids: list[int] = []

    def start(self, argv: list[str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
        )
        self.procs.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen[str]) -> tuple[int, str]:
        _, err = proc.communicate(timeout=DEADLINE * 2)
        return proc.returncode, err

    def cleanup(self) -> None:
        for pid in self.child_pids:
            if not pid_gone(pid):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=DEADLINE)


@pytest.fixture
def runner() -> Iterator[Runner]:
    r = Runner()
    yield r
    r.cleanup()


@pytest.fixture
def key() -> str:
    return f"cli-sig-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def server(fencelock_session_server: Server) -> Server:
    return fencelock_session_server


@pytest.fixture
def client(server: Server) -> Iterator[redis.Redis]:
    c = server.client()
    yield c
    c.close()


def run_argv(server: Server, key: str, *command: str) -> list[str]:
    return ["run", "--key", key, "--ttl", "60", "--server", server.url, "--", *command]


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_as_the_grant_comes_back_releases_the_lock_and_starts_nothing(
    server: Server,
    client: redis.Redis,
    key: str,
    tmp_path: Path,
    runner: Runner,
    sig: signal.Signals,
) -> None:
    marker, fired = tmp_path / "ran", tmp_path / "fired"
    argv = run_argv(server, key, "touch", str(marker))
    proc = runner.start(
        [sys.executable, "-c", WRAPPER, "acquire", str(int(sig)), str(fired), *argv]
    )
    code, err = runner.finish(proc)
    assert fired.read_text() == "acquire"  # the signal really came after a grant
    assert code == 128 + sig, err
    assert "before the command started" in err
    assert not marker.exists()
    # released at once, not left to its 60 s ttl
    assert client.exists(lock_key(key)) == 0, err


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_as_the_command_starts_reaches_the_command_and_the_lock_is_released(
    server: Server,
    client: redis.Redis,
    key: str,
    tmp_path: Path,
    runner: Runner,
    sig: signal.Signals,
) -> None:
    pidfile, fired = tmp_path / "pid", tmp_path / "fired"
    # the command would run 60 s unless the signal reaches it
    script = f'echo $$ > "{pidfile}"; exec sleep 60'
    argv = run_argv(server, key, SH, "-c", script)
    proc = runner.start(
        [sys.executable, "-c", WRAPPER, "keep_alive", str(int(sig)), str(fired), *argv]
    )
    code, err = runner.finish(proc)
    assert fired.read_text() == "keep_alive"
    assert code == 128 + sig, err  # the command died of the forwarded signal
    assert client.exists(lock_key(key)) == 0, err
    written = pidfile.read_text().strip() if pidfile.exists() else ""
    if written.isdigit():  # it may have died before writing its pid
        runner.child_pids.append(int(written))
        assert pid_gone(int(written))


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_command_that_signals_fencelock_at_once_gets_the_signal_and_the_lock_is_released(
    server: Server,
    client: redis.Redis,
    key: str,
    tmp_path: Path,
    runner: Runner,
    sig: signal.Signals,
) -> None:
    pidfile = tmp_path / "pid"
    name = sig.name[3:]
    script = f'echo $$ > "{pidfile}"; kill -{name} $PPID; exec sleep 60'
    proc = runner.start(
        [sys.executable, "-m", "fencelock", *run_argv(server, key, SH, "-c", script)]
    )
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip().isdigit(), "the pid")
    pid = int(pidfile.read_text())
    runner.child_pids.append(pid)
    code, err = runner.finish(proc)
    assert code == 128 + sig, err
    assert client.exists(lock_key(key)) == 0, err
    assert pid_gone(pid)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_while_waiting_for_the_lock_leaves_the_holder_alone(
    server: Server,
    client: redis.Redis,
    key: str,
    tmp_path: Path,
    runner: Runner,
    sig: signal.Signals,
) -> None:
    marker = tmp_path / "ran"
    client.set(lock_key(key), "someone-else", px=60_000)
    proc = runner.start(
        [
            sys.executable, "-m", "fencelock", "run", "--key", key, "--wait", "inf",
            "--server", server.url, "--", "touch", str(marker),
        ]
    )  # fmt: skip
    # really waiting: its refused attempt leaves the waiters hint
    wait_for(lambda: client.exists(lock_key(key) + ":waiters") == 1, "the waiter")
    proc.send_signal(sig)
    code, err = runner.finish(proc)
    assert code == 128 + sig, err
    assert "before the command started" in err
    assert not marker.exists()
    assert client.get(lock_key(key)) == b"someone-else"

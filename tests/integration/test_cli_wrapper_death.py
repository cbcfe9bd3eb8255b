"""``fencelock run``/``elect`` never die leaving their command running unlocked (issue 23 #2,
issue 21 #18), on a real server with real processes and real signals:

- every signal whose default action ends a process (SIGHUP of a dropped SSH session, SIGQUIT,
  SIGUSR1/2, SIGALRM, ...) is forwarded to the command's process group, the command ends, then
  the lock is released and the exit status is the command's;
- a SIGKILLed ``run``/``elect`` (which can catch nothing) takes its command's whole process
  group with it: the command and a grandchild it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from fencelock.testing import Server

BOUND = 30.0  # liveness bound (seconds) of every wait: the machine is shared
SH = "/bin/sh"
# a command that starts a grandchild in its own process group, writes both pids, and waits
FAMILY = """
import os, subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1] + ".tmp", "w").write(f"{os.getpid()} {grandchild.pid}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FENCELOCK_")}


def lock_key(name: str) -> str:
    """The lock key as DESIGN.md fixes it (written out, not taken from the library)."""
    return f"fencelock:{{{name}}}"


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + BOUND
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {BOUND} s waiting for {what}")
        time.sleep(0.02)


def alive(pid: int) -> bool:
    """Running (a zombie not reaped yet by its new parent counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().split(") ")[-1][:1] != "Z"
    except FileNotFoundError:
        return False


class Processes:
    """Starts ``fencelock`` processes; whatever still runs at teardown is killed by its PID."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.pids: list[int] = []

    def start(self, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fencelock", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        self.procs.append(proc)
        return proc

    def cleanup(self) -> None:
        for pid in self.pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=BOUND)


@pytest.fixture
def processes() -> Iterator[Processes]:
    p = Processes()
    yield p
    p.cleanup()


@pytest.fixture
def client(fencelock_session_server: Server) -> Iterator[redis.Redis]:
    c = fencelock_session_server.client()
    yield c
    c.close()


def wrapper_args(command: str, url: str, key: str) -> list[str]:
    extra = ["--name", "host-1"] if command == "elect" else []
    return [command, "--key", key, "--ttl", "60", "--server", url, *extra, "--"]


# SIGINT and SIGTERM are covered by test_cli_signals.py; SIGPIPE is ignored by Python itself
FATAL = [signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM]


@pytest.mark.parametrize("command", ["run", "elect"])
@pytest.mark.parametrize("sig", FATAL, ids=lambda s: s.name)
def test_a_default_fatal_signal_reaches_the_command_before_the_lock_is_released(
    fencelock_session_server: Server,
    client: redis.Redis,
    key: str,
    tmp_path: Path,
    processes: Processes,
    command: str,
    sig: signal.Signals,
) -> None:
    pidfile = tmp_path / "pid"
    # no core file for SIGQUIT; the command runs 120 s unless the signal reaches it
    publish = f'mv "{pidfile}.tmp" "{pidfile}"'
    script = f'ulimit -c 0; echo $$ > "{pidfile}.tmp"; {publish}; exec sleep 120'
    argv = wrapper_args(command, fencelock_session_server.url, key)
    proc = processes.start(*argv, SH, "-c", script)
    wait_for(pidfile.exists, "the command's pid")
    pid = int(pidfile.read_text())
    processes.pids.append(pid)
    assert client.exists(lock_key(key)) == 1
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=BOUND)
    # the wrapper did not die of it: it forwarded it, the command died of it, 128 + N
    assert proc.returncode == 128 + sig, err
    assert not alive(pid), "the command outlived its wrapper"
    assert client.exists(lock_key(key)) == 0, err  # released, not left to its ttl


@pytest.mark.parametrize("command", ["run", "elect"])
def test_a_sigkilled_wrapper_takes_the_command_and_its_whole_process_group_with_it(
    fencelock_session_server: Server,
    key: str,
    tmp_path: Path,
    processes: Processes,
    command: str,
) -> None:
    pidfile = tmp_path / "pids"
    argv = wrapper_args(command, fencelock_session_server.url, key)
    proc = processes.start(*argv, sys.executable, "-c", FAMILY, str(pidfile))
    wait_for(pidfile.exists, "the command's and the grandchild's pids")
    pids = [int(word) for word in pidfile.read_text().split()]
    processes.pids.extend(pids)
    assert all(alive(pid) for pid in pids)
    proc.kill()  # SIGKILL: nothing can be caught
    proc.communicate(timeout=BOUND)
    wait_for(lambda: not any(alive(pid) for pid in pids), "the command and its grandchild to go")


def test_the_command_ending_normally_leaves_its_background_processes_alone(
    fencelock_session_server: Server,
    key: str,
    tmp_path: Path,
    processes: Processes,
) -> None:
    """The watchdog acts only when the wrapper dies: a command's normal end changes nothing
    (what it left running keeps running, as before)."""
    pidfile = tmp_path / "pid"
    publish = f'mv "{pidfile}.tmp" "{pidfile}"'
    script = f'sleep 120 >/dev/null 2>&1 & echo $! > "{pidfile}.tmp"; {publish}'
    argv = wrapper_args("run", fencelock_session_server.url, key)
    proc = processes.start(*argv, SH, "-c", script)
    _, err = proc.communicate(timeout=BOUND)
    assert proc.returncode == 0, err
    pid = int(pidfile.read_text())
    processes.pids.append(pid)
    time.sleep(0.5)  # a watchdog that wrongly fired would have killed it by now
    assert alive(pid)

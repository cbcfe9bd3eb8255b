"""``fencelock elect``, ``run --at-least`` / ``--on-at-risk``, and loss reaching the child's
whole process group (a grandchild must not survive). Real servers, real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fencelock.testing import Server

BOUND = 20.0  # liveness bound (seconds) of every wait, never a speed assertion
GRACE = 0.5
# a child that starts a grandchild (which ignores SIGTERM only if told to), writes its pid, waits
FAMILY = """
import os, subprocess, sys, time
code = "import time; time.sleep(60)"
if sys.argv[2] == "ignore":
    code = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + code
grandchild = subprocess.Popen([sys.executable, "-c", code])
open(sys.argv[1], "w").write(str(grandchild.pid))
time.sleep(60)
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FENCELOCK_")}


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fencelock", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )


def wait_for(predicate: Any, what: str, timeout: float = BOUND) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose (its parent has not reaped it yet)
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z"


def lock_key(name: str) -> str:
    return f"fencelock:{{{name}}}"


@pytest.mark.parametrize("command", ["run", "elect"])
@pytest.mark.parametrize("grandchild", ["plain", "ignore"])
def test_on_loss_the_whole_process_group_is_gone_within_the_grace_period(
    fencelock_session_server: Server, key: str, tmp_path: Path, command: str, grandchild: str
) -> None:
    url = fencelock_session_server.url
    pidfile = tmp_path / "grandchild.pid"
    extra = ["--name", "host-1"] if command == "elect" else []
    proc = start(
        command, "--key", key, "--ttl", "1", "--grace", str(GRACE), "--server", url, *extra,
        "--", sys.executable, "-c", FAMILY, str(pidfile), grandchild,
    )  # fmt: skip
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text(), "the grandchild")
        pid = int(pidfile.read_text())
        assert alive(pid)
        fencelock_session_server.client().delete(lock_key(key))  # taken behind its back
        lost_at = time.monotonic()
        _, stderr = proc.communicate(timeout=BOUND)
        assert proc.returncode == 72, stderr
        # the loss is seen by the next renewal (ttl/3), then SIGTERM, SIGKILL after the grace
        wait_for(lambda: not alive(pid), "the grandchild to go", timeout=1.0 / 3 + GRACE + 1.0)
        assert time.monotonic() - lost_at < BOUND
        assert "process group" in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pidfile.exists() and pidfile.read_text():
            pid = int(pidfile.read_text())
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_run_at_least_keeps_the_lock_after_a_short_command(
    fencelock_session_server: Server, key: str
) -> None:
    url = fencelock_session_server.url
    began = time.monotonic()
    proc = start("run", "--key", key, "--at-least", "1.5", "--server", url, "--", "true")
    try:
        client = fencelock_session_server.client()
        wait_for(lambda: client.exists(lock_key(key)) == 1, "the lock")
        time.sleep(0.5)  # `true` has long ended; the lock is still held
        assert proc.poll() is None and client.exists(lock_key(key)) == 1
        proc.communicate(timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert time.monotonic() - began >= 1.5
    assert fencelock_session_server.client().exists(lock_key(key)) == 0


def test_run_on_at_risk_runs_the_hook_and_logs_the_recovery(
    fencelock_server: Server, key: str, tmp_path: Path
) -> None:
    marker = tmp_path / "at-risk"
    proc = start(
        "run", "--key", key, "--ttl", "3", "--server", fencelock_server.url,
        "--on-at-risk", f"echo $FENCELOCK_KEY > {marker}",
        "--", sys.executable, "-c", "import time; time.sleep(4)",
    )  # fmt: skip
    try:
        wait_for(lambda: fencelock_server.client().exists(lock_key(key)) == 1, "the lock")
        fencelock_server.pause()
        try:
            wait_for(lambda: marker.exists() and marker.read_text().strip() == key, "the hook")
        finally:
            fencelock_server.resume()
        _, stderr = proc.communicate(timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "at risk" in stderr and "no longer at risk" in stderr


def test_elect_runs_one_leader_at_a_time_hands_on_when_it_ends_and_status_names_it(
    fencelock_session_server: Server, key: str, tmp_path: Path
) -> None:
    url = fencelock_session_server.url
    log = tmp_path / "log"
    go = tmp_path / "go"  # a leader's command runs until the test has looked at the status
    body = (
        "import os, sys, time; "
        f"open({str(log)!r}, 'a').write(os.environ['FENCELOCK_LEADER'] + ' ' "
        "+ os.environ['FENCELOCK_FENCE'] + '\\n'); t = time.monotonic(); "
        f'exec("while not os.path.exists({str(go)!r}) and time.monotonic() < t + 30: '
        'time.sleep(0.02)"); sys.exit(3)'
    )
    second: subprocess.Popen[str] | None = None
    first = start("elect", "--key", key, "--name", "a", "--server", url, "--", sys.executable,
                  "-c", body)  # fmt: skip
    try:
        wait_for(lambda: log.exists() and log.read_text().startswith("a "), "the first leader")
        second = start("elect", "--key", key, "--name", "b", "--server", url, "--",
                       sys.executable, "-c", body)  # fmt: skip
        status = subprocess.run(
            [sys.executable, "-m", "fencelock", "status", "--key", key, "--server", url,
             "--json"], capture_output=True, text=True, env=_env(), timeout=BOUND,
        )  # fmt: skip
        assert json.loads(status.stdout)["leader"] == "a"
        text = subprocess.run(
            [sys.executable, "-m", "fencelock", "status", "--key", key, "--server", url],
            capture_output=True, text=True, env=_env(), timeout=BOUND,
        )  # fmt: skip
        assert "leader: a" in text.stdout
        go.touch()  # now the first leader's command ends (and the second's will at once)
        first.communicate(timeout=BOUND)
        ended = time.monotonic()
        assert first.returncode == 3  # the command's own code
        wait_for(lambda: len(log.read_text().splitlines()) == 2, "the second leader")
        assert time.monotonic() - ended < 2.0  # handed on at once, not after the 10 s ttl
        second.communicate(timeout=BOUND)
        assert second.returncode == 3
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
    (a, fa), (b, fb) = (line.split() for line in log.read_text().splitlines())
    assert (a, b) == ("a", "b") and int(fb) > int(fa)


def test_elect_needs_a_name_and_a_command(fencelock_session_server: Server, key: str) -> None:
    url = fencelock_session_server.url
    for argv in (["--key", key, "--", "true"], ["--key", key, "--name", "a"]):
        result = subprocess.run(
            [sys.executable, "-m", "fencelock", "elect", *argv, "--server", url],
            capture_output=True, text=True, env=_env(), timeout=BOUND,
        )  # fmt: skip
        assert result.returncode == 64, result.stderr

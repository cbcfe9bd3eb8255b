"""The ``fencelock`` command on real servers, run as a subprocess (``python -m fencelock``).

Every case checks an outward contract of DESIGN.md / issue 3: exit codes, the child's
environment, the fate of the child process, the lock keys on the server, and the output of
``status`` / ``release``. Deadlines are generous (the machine is shared); nothing asserts speed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from fencelock import Lock, LockLost
from fencelock._core.holder_json import lock_token
from fencelock.testing import Server

# from the test's side, a "generous" deadline for anything to happen
DEADLINE = 30.0
SH = "/bin/sh"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCELOCK_")}
    env.update(extra or {})
    return env


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 90.0) -> Any:
    """Run ``python -m fencelock ARGS`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "fencelock", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(env),
    )


def lock_key(name: str) -> str:
    """The lock key as DESIGN.md fixes it (written out, not taken from the library)."""
    return f"fencelock:{{{name}}}"


def fence_register(client: redis.Redis, name: str) -> int:
    raw = client.get(f"fencelock:{{{name}}}:fence")
    assert isinstance(raw, bytes), raw
    return int(raw)


def wait_for(predicate: Callable[[], bool], what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline} s waiting for {what}")
        time.sleep(0.05)


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def read_pid(path: Path) -> int:
    wait_for(lambda: path.exists() and path.read_text().strip().isdigit(), f"pid in {path}")
    return int(path.read_text().strip())


@pytest.fixture
def key() -> str:
    return f"cli-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def server(fencelock_session_server: Server) -> Server:
    return fencelock_session_server


@pytest.fixture
def client(server: Server) -> Iterator[redis.Redis]:
    c = server.client()
    yield c
    c.close()


@pytest.fixture
def closed_url(fencelock_server_binary: str) -> str:
    """The URL of a server that was started and stopped: nothing listens on its port."""
    stopped = Server(fencelock_server_binary).start()
    url = stopped.url
    stopped.stop()
    return url


class Spawner:
    """Starts ``fencelock`` in the background; whatever is still alive at teardown is killed
    by its PID (and so is a child PID the test recorded, if it still runs)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.child_pids: list[int] = []

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fencelock", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(env),
        )
        self.procs.append(proc)
        return proc

    def cleanup(self) -> None:
        # children first: they hold the pipes that communicate() reads to the end
        for pid in self.child_pids:
            if not pid_gone(pid):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=DEADLINE)


@pytest.fixture
def spawn() -> Iterator[Spawner]:
    spawner = Spawner()
    yield spawner
    spawner.cleanup()


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=DEADLINE * 2)
    return proc.returncode, out, err


# -- run: exit codes --------------------------------------------------------------------------


def test_child_exit_code_is_passed_through_and_lock_released(
    server: Server, client: redis.Redis, key: str
) -> None:
    result = cli("run", "--key", key, "--server", server.url, "--", SH, "-c", "exit 3")
    assert result.returncode == 3, result.stderr
    assert client.exists(lock_key(key)) == 0
    ok = cli("run", "--key", key, "--server", server.url, "--", "true")
    assert ok.returncode == 0, ok.stderr


def test_not_acquired_gives_75_and_the_command_never_runs(
    server: Server, key: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    holder = Lock(server.url, key, ttl=60).acquire()
    try:
        base = ("run", "--key", key, "--server", server.url)
        command = ("--", "touch", str(marker))
        nonblock = cli(*base, "-n", *command)
        assert nonblock.returncode == 75, nonblock.stderr
        assert nonblock.stderr == ""  # flock -n: a conflict is told by the exit status only
        waited = cli(*base, "--wait", "0.5", *command)
        assert waited.returncode == 75, waited.stderr
        assert "not acquired" in waited.stderr
        custom = cli(*base, "--nonblock", "--conflict-exit-code", "9", *command)
        assert custom.returncode == 9, custom.stderr
        assert not marker.exists()
        assert holder.valid  # nobody took it from the holder
    finally:
        holder.release()


def test_unavailable_server_gives_69(closed_url: str, key: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = cli(
        "run", "--key", key, "--wait", "1", "--server", closed_url, "--", "touch", str(marker)
    )
    assert result.returncode == 69, result.stderr
    assert "Unavailable" in result.stderr
    assert not marker.exists()


def test_password_is_never_printed(closed_url: str, key: str) -> None:
    secret_url = closed_url.replace("redis://", "redis://:s3cr3t-pw@")
    for args in (
        ("run", "--key", key, "-n", "--server", secret_url, "--", "true"),
        ("status", "--key", key, "--server", secret_url),
        ("status", "--key", key, "--server", secret_url, "--json"),
        ("release", "--key", key, "--force", "--server", secret_url),
    ):
        result = cli("-vv", *args)
        assert result.returncode == 69, (args, result.stderr)
        assert "s3cr3t" not in result.stdout + result.stderr


# -- run: loss, grace, signals ----------------------------------------------------------------


def test_loss_terminates_the_child_and_exits_72(
    server: Server, client: redis.Redis, key: str, tmp_path: Path, spawn: Spawner
) -> None:
    pidfile = tmp_path / "pid"
    proc = spawn(
        "run", "--key", key, "--ttl", "2", "--server", server.url, "--",
        SH, "-c", f'echo $$ > "{pidfile}"; exec sleep 60',
    )  # fmt: skip
    pid = read_pid(pidfile)
    spawn.child_pids.append(pid)
    assert client.delete(lock_key(key)) == 1  # taken away behind its back
    code, _, err = finish(proc)
    assert code == 72, err
    assert "lost" in err and "SIGTERM" in err
    assert pid_gone(pid)


def test_child_ignoring_sigterm_is_killed_after_the_grace(
    server: Server, client: redis.Redis, key: str, tmp_path: Path, spawn: Spawner
) -> None:
    pidfile = tmp_path / "pid"
    proc = spawn(
        "run", "--key", key, "--ttl", "2", "--grace", "1", "--server", server.url, "--",
        SH, "-c", f"trap '' TERM; echo $$ > \"{pidfile}\"; exec sleep 60",
    )  # fmt: skip
    pid = read_pid(pidfile)
    spawn.child_pids.append(pid)
    assert client.delete(lock_key(key)) == 1
    code, _, err = finish(proc)
    assert code == 72, err
    assert "SIGKILL" in err  # SIGTERM alone did not end it
    assert pid_gone(pid)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_signals_are_forwarded_and_the_lock_released(
    server: Server,
    client: redis.Redis,
    key: str,
    tmp_path: Path,
    spawn: Spawner,
    sig: signal.Signals,
) -> None:
    pidfile, got = tmp_path / "pid", tmp_path / "got"
    name = sig.name[3:]
    script = (
        f'trap \'echo {name} > "{got}"; exit 7\' {name}; echo $$ > "{pidfile}"; '
        "while :; do sleep 0.1; done"
    )
    proc = spawn("run", "--key", key, "--server", server.url, "--", SH, "-c", script)
    pid = read_pid(pidfile)
    spawn.child_pids.append(pid)
    assert client.exists(lock_key(key)) == 1
    proc.send_signal(sig)
    code, _, err = finish(proc)
    assert code == 7, err  # the child's own exit: it received the signal and chose to exit
    assert got.read_text().strip() == name
    assert client.exists(lock_key(key)) == 0
    assert pid_gone(pid)


def test_sigterm_while_waiting_for_the_lock_starts_nothing(
    server: Server, key: str, tmp_path: Path, spawn: Spawner
) -> None:
    marker = tmp_path / "ran"
    holder = Lock(server.url, key, ttl=60).acquire()
    try:
        proc = spawn(
            "run", "--key", key, "--wait", "60", "-v", "--server", server.url, "--",
            "touch", str(marker),
        )  # fmt: skip
        # wait until it is really waiting: its refused attempt leaves the waiters hint
        r = redis.Redis.from_url(server.url)
        wait_for(lambda: r.exists(f"fencelock:{{{key}}}:waiters") == 1, "the waiter")
        r.close()
        proc.send_signal(signal.SIGTERM)
        code, _, err = finish(proc)
        assert code == 128 + signal.SIGTERM, err
        assert "before the command started" in err
        assert not marker.exists()
        assert holder.valid
    finally:
        holder.release()


def test_lock_released_after_the_child_is_killed_from_outside(
    server: Server, client: redis.Redis, key: str, tmp_path: Path, spawn: Spawner
) -> None:
    pidfile = tmp_path / "pid"
    proc = spawn(
        "run", "--key", key, "--server", server.url, "--",
        SH, "-c", f'echo $$ > "{pidfile}"; exec sleep 60',
    )  # fmt: skip
    pid = read_pid(pidfile)
    spawn.child_pids.append(pid)
    os.kill(pid, signal.SIGKILL)
    code, _, err = finish(proc)
    assert code == 128 + signal.SIGKILL, err
    assert client.exists(lock_key(key)) == 0
    other = Lock(server.url, key).try_acquire()
    assert other is not None
    other.release()


# -- run: environment, renewal ----------------------------------------------------------------


def test_child_environment(server: Server, client: redis.Redis, key: str, tmp_path: Path) -> None:
    out = tmp_path / "env"
    before = Lock(server.url, key).acquire()
    before.release()
    script = (
        f'printf "%s\\n%s\\n%s\\n" "$FENCELOCK_FENCE" "$FENCELOCK_TOKEN" "$FENCELOCK_KEY" > "{out}"'
    )
    result = cli("run", "--key", key, "--server", server.url, "--", SH, "-c", script)
    assert result.returncode == 0, result.stderr
    fence, token, seen_key = out.read_text().splitlines()
    assert re.fullmatch(r"[1-9][0-9]*", fence)
    assert int(fence) > before.fence
    assert fence_register(client, key) == int(fence)
    assert re.fullmatch(r"[0-9a-f]{32}", token)
    assert seen_key == key


def test_renewal_keeps_a_short_lease_for_many_ttls(
    server: Server, client: redis.Redis, key: str, tmp_path: Path, spawn: Spawner
) -> None:
    done = tmp_path / "done"
    proc = spawn(
        "run", "--key", key, "--ttl", "1", "--server", server.url, "--",
        SH, "-c", f'sleep 3; touch "{done}"',
    )  # fmt: skip
    wait_for(lambda: client.exists(lock_key(key)) == 1 or proc.poll() is not None, "acquire")
    rival = Lock(server.url, key, ttl=5)
    tries = 0
    try:
        while not done.exists() and proc.poll() is None:
            lease = rival.try_acquire()
            if lease is not None:
                lease.release()
                raise AssertionError("a rival took the lock while `fencelock run` held it")
            tries += 1
            time.sleep(0.1)
    finally:
        rival.close()
    code, _, err = finish(proc)
    assert code == 0, err
    assert tries >= 5  # the rival really tried during the run (3 s = 3 ttls)
    assert client.exists(lock_key(key)) == 0


# -- status -----------------------------------------------------------------------------------


def test_status_json_and_text(server: Server, key: str) -> None:
    lock = Lock(server.url, key, ttl=30, purpose="nightly-report")
    lease = lock.acquire()
    try:
        result = cli("status", "--key", key, "--server", server.url, "--json")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert set(report) == {"key", "servers", "fence", "leader"}
        assert report["key"] == key and report["fence"] == lease.fence
        [row] = report["servers"]
        assert set(row) == {
            "server", "held", "token_prefix", "ttl_s", "holder", "fence", "error",
        }  # fmt: skip
        assert row["server"] == lock.servers[0]
        assert row["held"] is True and row["error"] is None
        assert row["token_prefix"] == lease.token[:8]
        assert 0 < row["ttl_s"] <= 30
        assert row["fence"] == lease.fence
        assert row["holder"]["pid"] == os.getpid()
        assert row["holder"]["purpose"] == "nightly-report"

        text = cli("status", "--key", key, "--server", server.url)
        assert text.returncode == 0, text.stderr
        assert lease.token[:8] in text.stdout
        assert str(lease.fence) in text.stdout
        assert "nightly-report" in text.stdout
        assert lease.token not in text.stdout  # only the prefix is shown
    finally:
        lease.release()
        lock.close()
    after = json.loads(cli("status", "--key", key, "--server", server.url, "--json").stdout)
    assert after["servers"][0]["held"] is False
    assert after["servers"][0]["token_prefix"] is None
    assert after["fence"] == lease.fence  # the register outlives the lease


def test_status_over_three_servers_with_one_down(
    fencelock_servers: Callable[[int], Any], key: str
) -> None:
    group = fencelock_servers(3)
    lock = Lock(group.urls, key, ttl=30)
    lease = lock.acquire()
    try:
        group.servers[2].stop()
        args = ["status", "--key", key, "--json"]
        for url in group.urls:
            args += ["--server", url]
        result = cli(*args)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        rows = report["servers"]
        assert [row["held"] for row in rows] == [True, True, False]
        assert rows[2]["error"] is not None
        assert {row["token_prefix"] for row in rows[:2]} == {lease.token[:8]}
        # the lease's fence was committed to a majority; a server outside the granting majority
        # may hold a later bump of its own, so the register's maximum is at least the fence
        assert report["fence"] == max(row["fence"] for row in rows[:2])
        assert report["fence"] >= lease.fence
    finally:
        lease.release()
        lock.close()


def test_status_with_no_server_answering_gives_69(closed_url: str, key: str) -> None:
    result = cli("status", "--key", key, "--server", closed_url, "--json")
    assert result.returncode == 69
    report = json.loads(result.stdout)
    assert report["servers"][0]["error"]


# -- release ----------------------------------------------------------------------------------


def test_release_by_token(server: Server, client: redis.Redis, key: str) -> None:
    lease = Lock(server.url, key, ttl=60).acquire()
    wrong = cli("release", "--key", key, "--token", "0" * 40, "--server", server.url)
    assert wrong.returncode == 72, wrong.stderr
    assert lock_token(client.get(lock_key(key))) == lease.token.encode()
    right = cli("release", "--key", key, "--token", lease.token, "--server", server.url)
    assert right.returncode == 0, right.stderr
    assert client.exists(lock_key(key), f"fencelock:{{{key}}}:holder") == 0
    with pytest.raises(LockLost):
        lease.release()


def test_release_force_says_what_it_deleted(server: Server, client: redis.Redis, key: str) -> None:
    lock = Lock(server.url, key, ttl=60)
    lease = lock.acquire()
    result = cli("release", "--key", key, "--force", "--server", server.url)
    assert result.returncode == 0, result.stderr
    assert "FORCED" in result.stderr
    assert lease.token[:8] in result.stderr
    assert lock.servers[0] in result.stderr
    assert client.exists(lock_key(key), f"fencelock:{{{key}}}:holder") == 0
    with pytest.raises(LockLost):
        lease.release()
    lock.close()
    again = cli("release", "--key", key, "--force", "--server", server.url)
    assert again.returncode == 0
    assert "nothing deleted" in again.stderr


# -- usage, environment, help -----------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["run", "--", "touch", "{marker}"], id="missing-key"),
        pytest.param(["run", "--key", "k", "--"], id="missing-command"),
        pytest.param(["run", "--key", "k", "touch", "{marker}"], id="command-without-dashes"),
        pytest.param(
            ["run", "--key", "k", "--ttl", "abc", "--", "touch", "{marker}"], id="ttl-abc"
        ),
        pytest.param(["run", "--key", "k", "--ttl", "-1", "--", "touch", "{marker}"], id="ttl-neg"),
        pytest.param(
            ["run", "--key", "k", "--ttl", "nan", "--", "touch", "{marker}"], id="ttl-nan"
        ),
        pytest.param(["run", "--key", "", "--", "touch", "{marker}"], id="empty-key"),
        pytest.param(
            ["run", "--key", "k", "--server", "notaurl", "--", "touch", "{marker}"], id="bad-url"
        ),
        pytest.param(
            ["run", "--key", "k", "-n", "--wait", "1", "--", "touch", "{marker}"], id="n-and-wait"
        ),
        pytest.param(
            ["run", "--key", "k", "--conflict-exit-code", "300", "--", "touch", "{marker}"],
            id="exit-code-range",
        ),
        pytest.param([], id="no-command"),
        pytest.param(["frobnicate"], id="unknown-command"),
        pytest.param(["status"], id="status-missing-key"),
        pytest.param(["release", "--key", "k"], id="release-no-token"),
        pytest.param(["release", "--key", "k", "--token", "t", "--force"], id="token-and-force"),
        pytest.param(["chaos", "--workers", "0"], id="chaos-workers"),
        pytest.param(["chaos", "--html", "/no/such/dir/page.html"], id="chaos-html-no-dir"),
        pytest.param(["bench", "--html", "/"], id="bench-html-a-directory"),
        pytest.param(["demo", "--", "x"], id="dashes-elsewhere"),
    ],
)
def test_malformed_command_line_exits_64_with_one_line(args: list[str], tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    argv = [a.replace("{marker}", str(marker)) for a in args]
    result = cli(*argv, env={"FENCELOCK_SERVERS": "redis://127.0.0.1:1/0"})
    assert result.returncode == 64, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0], result.stderr
    assert not marker.exists()


def test_env_servers_honoured(
    server: Server, client: redis.Redis, key: str, tmp_path: Path
) -> None:
    out = tmp_path / "fence"
    env = {"FENCELOCK_SERVERS": server.url}
    script = f'echo "$FENCELOCK_FENCE" > "{out}"'
    result = cli("run", "--key", key, "--", SH, "-c", script, env=env)
    assert result.returncode == 0, result.stderr
    assert fence_register(client, key) == int(out.read_text())
    status = cli("status", "--key", key, "--json", env=env)
    assert json.loads(status.stdout)["servers"][0]["server"].endswith(f":{server.port}/0")
    # --server wins over the environment
    bad_env = {"FENCELOCK_SERVERS": "redis://127.0.0.1:1/0"}
    wins = cli("run", "--key", key, "--server", server.url, "--", "true", env=bad_env)
    assert wins.returncode == 0, wins.stderr
    malformed = cli("run", "--key", key, "--", "true", env={"FENCELOCK_SERVERS": "nope"})
    assert malformed.returncode == 64
    assert "FENCELOCK_SERVERS" in malformed.stderr


def test_help_exits_0() -> None:
    top = cli("--help")
    assert top.returncode == 0
    assert all(
        name in top.stdout for name in ("run", "status", "release", "demo", "chaos", "bench")
    )
    run = cli("run", "--help")
    assert run.returncode == 0
    assert "--grace" in run.stdout and "--conflict-exit-code" in run.stdout

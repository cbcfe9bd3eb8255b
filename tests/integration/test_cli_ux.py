"""Issue 26 §2, the command line as flock users expect: permanent server errors end
``fencelock run``'s wait at once (exit 69, one line saying why), transient ones are waited out
(with a progress line under ``-v``). Real servers, real ``python -m fencelock`` processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator

import pytest

import fencelock
from fencelock.testing import Server, refused_url, refused_urls

BOUND = 60.0  # a liveness bound per command (seconds), never a speed assertion
FAST = 5.0  # "at once": well under run's --wait 10, generous on a loaded 2-core machine


def cli(*args: str, bound: float = BOUND) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``python -m fencelock ARGS`` (killed after ``bound`` s); its result and wall time."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCELOCK_")}
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "fencelock", *args],
        capture_output=True,
        text=True,
        timeout=bound,
        env=env,
    )
    return result, time.monotonic() - began


def _port(server: Server) -> str:
    return server.address  # HOST:PORT, without the server's password


def _wrong_password(server: Server) -> str:
    with server.client() as client:
        client.config_set("requirepass", "the-right-one")
    return f"redis://:not-the-right-one@{_port(server)}/0"


def _db_99(server: Server) -> str:
    return server.url.removesuffix("/0") + "/99"  # with the server's password


def _unknown_host(server: Server) -> str:
    return "redis://nohost.invalid:6379/0"


def _tls_to_plain(server: Server) -> str:
    return f"rediss://{_port(server)}/0?ssl_cert_reqs=none"


@pytest.mark.parametrize(
    ("make_url", "says"),
    [
        (_wrong_password, "the password was refused"),
        (_db_99, "no such database index"),
        (_unknown_host, "unknown host"),
        (_tls_to_plain, "is this a TLS port?"),
    ],
    ids=["wrong-password", "db-99", "unknown-host", "tls-to-plain-port"],
)
def test_permanent_errors_fail_at_once(
    fencelock_server: Server, key: str, make_url: object, says: str
) -> None:
    url = make_url(fencelock_server)  # type: ignore[operator]
    result, took = cli("run", "--key", key, "--wait", "10", "--server", url, "--", "true")
    assert result.returncode == 69, result.stderr
    assert took < FAST, f"waited {took:.2f} s for a permanent error: {result.stderr}"
    lines = [line for line in result.stderr.splitlines() if line.startswith("fencelock run:")]
    assert len(lines) == 1 and says in lines[0] and "not retried" in lines[0], result.stderr
    assert "not-the-right-one" not in result.stderr


@pytest.mark.parametrize(
    ("make_url", "says"),
    [(_wrong_password, "the password was refused"), (_db_99, "no such database index")],
    ids=["wrong-password", "db-99"],
)
def test_elect_stops_campaigning_on_a_permanent_error(
    fencelock_server: Server, key: str, make_url: object, says: str
) -> None:
    url = make_url(fencelock_server)  # type: ignore[operator]
    args = ("elect", "--key", key, "--name", "host-1", "--server", url, "--", "true")
    result, took = cli(*args, bound=20.0)  # without the fix it campaigns until killed
    assert result.returncode == 69, result.stderr
    assert took < FAST and says in result.stderr, (took, result.stderr)


def test_permanent_errors_on_a_majority_fail_at_once(fencelock_server: Server, key: str) -> None:
    bad = [_db_99(fencelock_server), _unknown_host(fencelock_server)]
    args = ["--server", fencelock_server.url, *(x for url in bad for x in ("--server", url))]
    result, took = cli("run", "--key", key, "--wait", "10", *args, "--", "true")
    assert result.returncode == 69 and took < FAST, (took, result.stderr)
    assert "2 of 3 servers fail for good, a majority needs 2" in result.stderr


def test_transient_refusals_are_waited_out(fencelock_session_server: Server, key: str) -> None:
    urls = [fencelock_session_server.url, *refused_urls(2)]
    args = [x for url in urls for x in ("--server", url)]
    result, took = cli("run", "--key", key, "--wait", "2", "-v", *args, "--", "true")
    assert result.returncode == 69, result.stderr
    assert took >= 2.0, f"gave up after {took:.2f} s on a transient refusal"
    assert "2 of 3 servers failing" in result.stderr and "not retried" not in result.stderr
    assert result.stderr.count("servers failing") == 1  # said once, not every slice


@pytest.fixture
def held_on_two(fencelock_servers: object, key: str) -> Iterator[list[str]]:
    """Two servers on which ``key`` is held by another holder for the test's duration."""
    group = fencelock_servers(2)  # type: ignore[operator]
    with warnings.catch_warnings():  # two servers on purpose: the third is the refused one
        warnings.simplefilter("ignore", UserWarning)
        lock = fencelock.Lock(group.urls, key, ttl=60)
    lease = lock.acquire(wait=5)
    yield group.urls
    lease.release()
    lock.close()


def test_verbose_says_how_many_more_failures_the_lock_survives(
    held_on_two: list[str], key: str
) -> None:
    urls = [*held_on_two, refused_url()]
    args = [x for url in urls for x in ("--server", url)]
    result, _ = cli("run", "--key", key, "--wait", "1", "-v", *args, "--", "true")
    assert result.returncode == 75, result.stderr  # held: contention, waited out
    assert "1 of 3 servers failing" in result.stderr
    assert "one more failure and no lock can be taken" in result.stderr
    quiet, _ = cli("run", "--key", key, "--wait", "0.5", *args, "--", "true")
    assert "servers failing" not in quiet.stderr  # only under -v


# -- clean output: warnings, a closed pipe, one line per loss -------------------------------------


def test_a_python_warning_is_one_clean_line(fencelock_server: Server, key: str) -> None:
    url = f"rediss://{_port(fencelock_server)}/0?ssl_cert_reqs=none"  # InsecureTLSWarning
    result, _ = cli("run", "--key", key, "-n", "--server", url, "--", "true")
    warned = [line for line in result.stderr.splitlines() if "ssl_cert_reqs=none" in line]
    assert len(warned) == 1, result.stderr
    assert warned[0].startswith("fencelock: warning: "), result.stderr
    assert ".py:" not in result.stderr and "InsecureTLSWarning" not in result.stderr
    assert "server = " not in result.stderr  # no source line echoed either


def _broken_pipe_words(stderr: str) -> list[str]:
    return [w for w in ("BrokenPipeError", "Traceback", "Exception ignored") if w in stderr]


def test_top_into_a_closed_pipe_ends_quietly_with_141(
    fencelock_session_server: Server,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCELOCK_")}
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "fencelock", "top", "--iterations", "2000", "--interval",
            "0.01", "--server", fencelock_session_server.url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline()  # it started writing
        proc.stdout.close()  # as `| head -n 1` does
        _, stderr = proc.communicate(timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 141, stderr
    assert _broken_pipe_words(stderr.decode()) == [], stderr.decode()


def test_status_json_into_head_ends_quietly(fencelock_session_server: Server, key: str) -> None:
    line = (
        f"{sys.executable} -m fencelock status --key {key} --json "
        f'--server {fencelock_session_server.url} | head -c 1; echo "${{PIPESTATUS[0]}}" >&2'
    )
    result = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=BOUND)
    assert result.stdout == "{"
    code = result.stderr.strip().splitlines()[-1]
    assert code in ("0", "141"), result.stderr  # 141 when head left before the write
    assert _broken_pipe_words(result.stderr) == [], result.stderr


LOSS_CHILD = "import time; print('up', flush=True); time.sleep(60)"


@pytest.mark.parametrize("command", ["run", "elect"])
def test_a_loss_is_told_once(fencelock_session_server: Server, key: str, command: str) -> None:
    url = fencelock_session_server.url
    extra = ["--name", "host-1"] if command == "elect" else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCELOCK_")}
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "fencelock", command, "--key", key, "--ttl", "1.5",
            "--grace", "5", "--server", url, *extra, "--", sys.executable, "-c", LOSS_CHILD,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        with fencelock_session_server.client() as client:
            assert client.delete(f"fencelock:{{{key}}}") == 1  # taken behind its back
        _, stderr = proc.communicate(timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 72, stderr
    told = [line for line in stderr.splitlines() if "lost" in line]
    assert len(told) == 1, stderr
    assert "sending SIGTERM" in told[0]
    assert stderr.rstrip().endswith("exiting 72"), stderr

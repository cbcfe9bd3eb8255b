"""Absurd durations (issue 21 items 10 and 11, fault F32): bounded with ConfigError before any
I/O, and one failing timer job never stops the timers of the other leases of the process."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from fencelock import ConfigError, Lock
from fencelock._sync.renewal import scheduler
from fencelock.options import MAX_DURATION_S
from fencelock.testing import Server

UNREACHABLE = "redis://127.0.0.1:1"  # nothing may be sent: the check comes first


@pytest.mark.parametrize("ttl", [1e12, 1e20, MAX_DURATION_S * 2])
def test_a_huge_ttl_is_a_config_error_before_any_io(ttl: float) -> None:
    with pytest.raises(ConfigError, match="at most"):
        Lock(UNREACHABLE, "k", ttl=ttl)


@pytest.mark.parametrize(
    "option", ["wait", "server_timeout", "renew_every", "retry_base", "retry_cap", "drift_min"]
)
def test_every_duration_is_bounded(option: str) -> None:
    with pytest.raises(ConfigError, match="at most"):
        Lock(UNREACHABLE, "k", **{option: 1e12})


def test_an_infinite_wait_is_still_allowed_and_a_drift_min_beyond_the_ttl_is_not() -> None:
    Lock(UNREACHABLE, "k", wait=float("inf")).close()
    with pytest.raises(ConfigError, match="drift_min"):
        Lock(UNREACHABLE, "k", ttl=1.0, drift_min=1.0)


def test_the_cli_refuses_a_huge_ttl_as_a_usage_error_at_once() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "fencelock", "run", "--key", "k", "--ttl", "1e20",
         "--server", UNREACHABLE, "--", "true"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 64, done.stderr
    assert "at most" in done.stderr
    assert time.monotonic() - started < 10.0


def test_a_failing_timer_job_does_not_stop_other_leases_renewing(
    fencelock_server: Server,
) -> None:
    def broken() -> None:
        raise RuntimeError("a job of another lease that fails")

    # the shape of the ttl=1e12 failure: a timer so far away that waiting for it overflowed
    # threading.TIMEOUT_MAX, killing the one thread every lease's renewal runs from
    scheduler().at(time.monotonic() + 1e12, lambda: None)
    time.sleep(0.2)  # the timers thread now waits for it
    scheduler().at(time.monotonic(), broken)
    lock = Lock(fencelock_server.url, "durations:renewing", ttl=1.0)
    try:
        with lock.hold(wait=2.0, renew=True) as lease:
            scheduler().at(time.monotonic() + 0.3, broken)
            time.sleep(3.0)  # three TTLs: renewals must have gone on
            assert not lease.lost.is_set(), lease.lost_reason
            assert lease.remaining() > 0.0
    finally:
        lock.close()

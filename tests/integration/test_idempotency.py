"""Idempotency, the other half of "lock + idempotent write": the batch e-mail job of
``examples/batch_email.py`` with a real lock on a real server and SQLite.

The lease of worker A is lost mid-batch; worker B takes over. Without a unique constraint on
(batch_id, recipient) recipients get two e-mails; with it, exactly one each.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("sqlalchemy")

from fencelock.testing import Server

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "batch_email.py"


def _load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fencelock_example_batch_email", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


batch_email = _load_example()


def test_lease_deleted_behind_its_back_without_constraint_sends_duplicates(
    fencelock_session_server: Server,
) -> None:
    out: Any = batch_email.run_batch(
        fencelock_session_server.url, unique=False, recipients=20, pause_after=8, lose="delete"
    )
    a, b = out.workers["A"], out.workers["B"]
    assert b.fence > a.fence
    assert a.lost_at_release and not a.stopped_by_check  # A's local clock still said "valid"
    assert b.sent == 12  # B sent everything not yet recorded
    assert a.sent == 20  # A, resumed, re-sent its whole stale list
    assert out.duplicates == 12
    assert sorted(r for r, n in out.per_recipient.items() if n == 2) == out.recipients[8:]
    assert not out.missed


def test_lease_deleted_behind_its_back_with_constraint_sends_each_once(
    fencelock_session_server: Server,
) -> None:
    out: Any = batch_email.run_batch(
        fencelock_session_server.url, unique=True, recipients=20, pause_after=8, lose="delete"
    )
    a, b = out.workers["A"], out.workers["B"]
    assert a.lost_at_release and not a.stopped_by_check  # same loss as above...
    assert (a.sent, a.skipped, b.sent) == (8, 12, 12)  # ...but A's claims were refused
    assert out.duplicates == 0
    assert set(out.per_recipient.values()) == {1}
    assert sorted(out.per_recipient) == out.recipients
    assert len(out.sent) == 20


@pytest.mark.parametrize("unique", [False, True], ids=["no-constraint", "constraint"])
def test_lease_expired_during_a_pause(fencelock_session_server: Server, unique: bool) -> None:
    """Renewal off, A pauses right after a passing ensure_valid() while its 1 s lease runs out;
    B waits for the expiry and takes over. A's next check stops it, but the e-mail it had
    already checked for goes out twice unless the constraint refuses its claim."""
    out: Any = batch_email.run_batch(
        fencelock_session_server.url, unique=unique, recipients=12, pause_after=5, lose="expire"
    )
    a, b = out.workers["A"], out.workers["B"]
    assert b.fence > a.fence
    assert a.stopped_by_check and a.lost_at_release
    assert b.sent == 7
    assert not out.missed
    if unique:
        assert (a.sent, a.skipped) == (5, 1)
        assert out.duplicates == 0
    else:
        assert a.sent == 6
        assert out.duplicates == 1
        assert out.per_recipient[out.recipients[5]] == 2


def test_example_script_runs_and_reports_ok() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--lose", "delete"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "without UNIQUE(batch_id, recipient): 20 recipients, 32 e-mails sent, 12 dupl" in (
        result.stdout
    )
    assert "with UNIQUE(batch_id, recipient): 20 recipients, 20 e-mails sent, 0 dupl" in (
        result.stdout
    )

"""The ``--html`` pages, pure: what the chaos page marks, for a hand-built history with one
pause (a canary write after a newer holder: red; a fenced write refused: a cross), escaping,
and the bench histograms' bins."""

from __future__ import annotations

import re

from fencelock.cli._html import bin_counts, log_edges
from fencelock.cli.bench import _histogram
from fencelock.cli.chaos.checkers import (
    Op,
    check_fenced_register,
    stale_accepted_writes,
    unfenced_overlap_ops,
    unfenced_overlaps,
)
from fencelock.cli.chaos.nemesis import Fault, FaultRecord
from fencelock.cli.chaos.report import ChaosResult, History, html_report

MS = 1_000_000


def paused_history() -> list[Op]:
    """Worker 0 (fence 1) reads, is paused past its 1 s lease; worker 1 (fence 2) acquires and
    writes; worker 0 resumes: its canary write lands (overlap), its fenced write is refused."""
    return [
        Op(0, 0, "acquire", "ok", 0, 2 * MS, 1, None, 1000 * MS),
        Op(0, 0, "advance", "ok", 3 * MS, 4 * MS, 1),
        Op(0, 0, "read", "ok", 4 * MS, 5 * MS, 1, 0),
        Op(0, 0, "canary-read", "ok", 5 * MS, 6 * MS, 1, 0),
        Op(1, 0, "acquire", "ok", 900 * MS, 1100 * MS, 2, None, 2100 * MS),
        Op(1, 0, "advance", "ok", 1101 * MS, 1102 * MS, 2),
        Op(1, 0, "read", "ok", 1102 * MS, 1103 * MS, 2, 0),
        Op(1, 0, "canary-read", "ok", 1103 * MS, 1104 * MS, 2, 0),
        Op(1, 0, "canary-write", "ok", 1110 * MS, 1111 * MS, 2, 1),
        Op(1, 0, "write", "ok", 1111 * MS, 1112 * MS, 2, 1),
        Op(1, 0, "release", "ok", 1113 * MS, 1114 * MS, 2),
        Op(0, 0, "canary-write", "ok", 1500 * MS, 1501 * MS, 1, 1),
        Op(0, 0, "write", "fail", 1501 * MS, 1502 * MS, 1, 1, None, "stale"),
        Op(0, 0, "release", "fail", 1502 * MS, 1503 * MS, 1, None, None, "lost"),
    ]


def result_for(ops: list[Op]) -> ChaosResult:
    fenced = check_fenced_register(ops, final=1)
    return ChaosResult(
        acquisitions=2,
        fenced_writes_accepted=fenced.acknowledged,
        stale_writes_rejected=fenced.rejected,
        stale_writes_accepted=fenced.stale_accepted,
        lost_updates=fenced.lost_updates,
        unfenced_overlaps=unfenced_overlaps(ops),
        availability=1.0,
        faults={"pause-holder": 1, "partition": 1},
        duration_s=2.0,
        details={"seed": 7, "fault_log": ["<script>alert(1)</script>"]},
    )


def render(ops: list[Op]) -> str:
    records = [
        FaultRecord(Fault(0.01, "pause-holder", 1.4), 10 * MS, 1490 * MS, "worker=0 pid=9 tries=1"),
        FaultRecord(Fault(1.6, "partition", 0.2, (1,)), 1600 * MS, 1800 * MS, "<b>note</b>"),
    ]
    history = History(ops, records, start_ns=0, end_ns=2000 * MS, servers=3, workers=2)
    return html_report(result_for(ops), history)


def test_the_chaos_page_marks_the_overlap_red_and_the_refused_write_with_a_cross() -> None:
    ops = paused_history()
    page = render(ops)
    assert unfenced_overlaps(ops) == 1
    assert page.count('class="violation"') == 1
    assert page.count('class="write refused"') == 1
    assert page.count('class="write accepted"') == 1
    assert page.count('class="lease"') == 2
    assert page.count('class="outlived"') == 1  # worker 0 kept acting past its validity
    assert page.count('class="fault pause"') == 1  # on worker 0's row
    assert page.count('class="fault partition"') == 1  # on server 1's row only
    assert re.findall(r"<text[^>]*>(worker \d+)</text>", page) == ["worker 0", "worker 1"]


def test_the_chaos_page_escapes_what_it_shows() -> None:
    page = render(paused_history())
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<b>note</b>" not in page and "&lt;b&gt;note&lt;/b&gt;" in page


def test_a_stale_write_accepted_is_red_too() -> None:
    ops = paused_history()
    # the store accepted worker 0's late write although fence 2 had been acknowledged
    ops[12] = Op(0, 0, "write", "ok", 1501 * MS, 1502 * MS, 1, 2)
    assert len(stale_accepted_writes(ops)) == check_fenced_register(ops, 2).stale_accepted == 1
    assert unfenced_overlap_ops(ops) == [ops[11]]
    assert render(ops).count('class="violation"') == 2


def test_histogram_bins_hold_every_sample_once() -> None:
    values = [1e-4, 2e-4, 2e-4, 5e-3, 1.0]
    hist = _histogram({"a": values, "b": values[:2]})
    assert len(hist["edges_us"]) == 31
    assert sum(hist["counts"]["a"]) == 5 and sum(hist["counts"]["b"]) == 2
    assert hist["counts"]["a"][0] >= 1 and hist["counts"]["a"][-1] >= 1  # min and max inside
    assert bin_counts([], log_edges([])) == [0]

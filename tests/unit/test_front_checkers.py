"""The MultiLock's and the election's chaos checkers on known-good and known-BAD histories.

Each bad history is the violation its checker exists for (a MultiLock overlap, a key's fence
going back, two leaders in one term, a term out of grant order, two leaders at once), and the
test asserts it is caught. Pure logic: no servers, no clock.
"""

from __future__ import annotations

import pytest

from fencelock.cli.chaos.checkers import Op, check_election, check_key_fences
from fencelock.cli.chaos.cli import analyse

MS = 1_000_000  # ns
KEYS = ("chaos:a", "chaos:b")


def grant(worker: int, it: int, t0_ms: int, hold_ms: int, fence: int, mode: str = "") -> list[Op]:
    """A granted acquire at t0 (acknowledged 1 ms later, valid 1 s) released after ``hold_ms``."""
    t, done = t0_ms * MS, (t0_ms + 1) * MS
    release = (t0_ms + 1 + hold_ms) * MS
    return [
        Op(worker, it, "acquire", "ok", t, done, fence, None, done + 1000 * MS, mode),
        Op(worker, it, "release", "ok", release, release + MS, fence),
    ]


def multi(worker: int, it: int, t0_ms: int, hold_ms: int, fences: tuple[int, int]) -> list[Op]:
    """A MultiLock grant: the acquire carries the first key's fence, one key-fence per key."""
    ops = grant(worker, it, t0_ms, hold_ms, fences[0], "multi")
    t, done = t0_ms * MS, (t0_ms + 1) * MS
    keyed = [
        Op(worker, it, "key-fence", "ok", t, done, f, info=k)
        for k, f in zip(KEYS, fences, strict=True)
    ]
    return [ops[0], *keyed, ops[1]]


def run(ops: list[Op], primitive: str) -> dict[str, object]:
    result = analyse(ops, fenced_final=0, canary_final=0, records=[], start_ns=0,
                     end_ns=500 * MS, ttl=1.0, retry_cap=0.5, primitive=primitive,
                     front="asyncio")  # fmt: skip
    return result.as_dict()


# -- MultiLock: one holder at a time, each key's fences growing ------------------------------


def test_multilock_grants_in_turn_with_growing_fences_pass() -> None:
    ops = multi(0, 1, 0, 10, (10, 70)) + multi(1, 1, 20, 10, (11, 71))
    data = run(ops, "multi")
    assert data["double_grants"] == 0 and data["fence_violations"] == 0
    assert data["keys"] == 2 and data["primitive"] == "multi" and data["front"] == "asyncio"


def test_a_multilock_overlap_is_a_double_grant() -> None:
    ops = multi(0, 1, 0, 50, (10, 70)) + multi(1, 1, 20, 10, (11, 71))  # 1 starts while 0 holds
    data = run(ops, "multi")
    assert data["double_grants"] == 1


def test_a_second_keys_fence_going_back_is_caught_though_the_first_grows() -> None:
    ops = multi(0, 1, 0, 10, (10, 70)) + multi(1, 1, 20, 10, (11, 69))
    result = check_key_fences(ops)
    assert not result.ok and result.by_key == {"chaos:a": 0, "chaos:b": 1}
    data = run(ops, "multi")
    assert data["fence_violations"] == 1
    assert data["fence_violations_by_key"] == {"chaos:a": 0, "chaos:b": 1}


# -- election: one leader per term, terms growing, never two leaders at once ----------------


def test_leaders_in_turn_with_growing_terms_pass() -> None:
    ops = grant(0, 1, 0, 10, 5, "term") + grant(1, 1, 20, 10, 6, "term")
    ops += grant(2, 1, 40, 10, 9, "term")
    result = check_election(ops)
    assert result.ok and result.terms == 3
    data = run(ops, "election")
    assert data["two_leaders_in_a_term"] == 0 and data["terms_out_of_order"] == 0
    assert data["two_leaders_at_once"] == 0 and data["terms"] == 3


def test_two_leaders_in_one_term_are_caught() -> None:
    # one after the other (not at once), but both were given term 5
    ops = grant(0, 1, 0, 10, 5, "term") + grant(1, 1, 20, 10, 5, "term")
    result = check_election(ops)
    assert not result.ok and result.same_term == 1
    data = run(ops, "election")
    assert data["two_leaders_in_a_term"] == 1 and data["fence_violations"] >= 1


def test_a_term_smaller_than_an_earlier_leaders_is_caught() -> None:
    ops = grant(0, 1, 0, 10, 8, "term") + grant(1, 1, 20, 10, 7, "term")
    result = check_election(ops)
    assert not result.ok and result.out_of_order == 1 and result.same_term == 0


def test_two_leaders_valid_at_once_are_caught() -> None:
    ops = grant(0, 1, 0, 50, 5, "term") + grant(1, 1, 20, 10, 6, "term")
    result = check_election(ops)
    assert not result.ok and result.two_leaders == 1
    assert run(ops, "election")["two_leaders_at_once"] == 1


# -- the report labels the primitive and the front end; a missing form is refused -----------


def test_the_table_and_the_page_name_the_primitive_and_the_front_end() -> None:
    from fencelock.cli.chaos.report import History, html_report

    ops = grant(0, 1, 0, 10, 5, "term") + grant(1, 1, 20, 10, 6, "term")
    result = analyse(ops, fenced_final=0, canary_final=0, records=[], start_ns=0,
                     end_ns=500 * MS, ttl=1.0, retry_cap=0.5, primitive="election",
                     front="asyncio")  # fmt: skip
    table = result.table()
    assert "front asyncio" in table and "two leaders in a term" in table
    page = html_report(result, History(ops, [], 0, 500 * MS, servers=3, workers=2))
    assert "<title>fencelock chaos: election, asyncio</title>" in page
    assert "election (asyncio front end)" in page


def test_a_primitive_without_an_asyncio_form_is_refused_before_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import fencelock.asyncio
    from fencelock import ConfigError
    from fencelock.cli.chaos.cli import ChaosConfig

    monkeypatch.delattr(fencelock.asyncio, "MultiLock")
    with pytest.raises(ConfigError, match="no asyncio form"):
        ChaosConfig(primitive="multi", front="asyncio")
    assert ChaosConfig(primitive="multi").front == "sync"  # the blocking form is there

"""The semaphore's and read-write lock's chaos checkers on known-good and known-BAD histories.

Each bad history is the violation its checker exists for, and the test asserts it is caught.
Pure logic: no servers, no clock.
"""

from __future__ import annotations

from fencelock.cli.chaos.checkers import (
    LeaseWindow,
    Op,
    check_permit_overlap,
    check_rw_exclusion,
    check_writer_fences,
    lease_modes,
    lease_windows,
    reader_fence_duplicates,
)
from fencelock.cli.chaos.cli import analyse

MS = 1_000_000  # ns


def window(worker: int, start_ms: int, end_ms: int, fence: int = 0) -> LeaseWindow:
    return LeaseWindow(worker, 1, fence, start_ms * MS, end_ms * MS, end_ms * MS)


def grant(worker: int, it: int, t0_ms: int, hold_ms: int, fence: int, mode: str) -> list[Op]:
    """A granted acquire at t0 (acknowledged 1 ms later) released after ``hold_ms``."""
    t, done = t0_ms * MS, (t0_ms + 1) * MS
    release = (t0_ms + 1 + hold_ms) * MS
    return [
        Op(worker, it, "acquire", "ok", t, done, fence, None, done + 1000 * MS, mode),
        Op(worker, it, "release", "ok", release, release + MS, fence),
    ]


# -- semaphore: never more than `limit` valid permits ---------------------------------------


def test_permits_up_to_the_limit_pass() -> None:
    # two at a time, a third only after one ended (touching ends do not overlap)
    windows = [window(0, 0, 10), window(1, 5, 20), window(2, 10, 30), window(3, 20, 40)]
    result = check_permit_overlap(windows, limit=2)
    assert result.ok and result.max_concurrent == 2 and result.leases == 4


def test_a_third_valid_permit_of_a_limit_two_semaphore_is_caught() -> None:
    windows = [window(0, 0, 10), window(1, 2, 12), window(2, 5, 8), window(3, 11, 13)]
    result = check_permit_overlap(windows, limit=2)
    assert not result.ok
    assert result.over_limit == 1 and result.max_concurrent == 3
    assert {w.worker for w in result.examples[0]} == {0, 1, 2}


def test_a_limit_of_one_is_a_mutex() -> None:
    assert check_permit_overlap([window(0, 0, 10), window(1, 10, 20)], limit=1).ok
    assert check_permit_overlap([window(0, 0, 10), window(1, 9, 20)], limit=1).over_limit == 1


def test_analyse_reports_a_semaphore_over_its_limit_as_a_double_grant() -> None:
    ops = grant(0, 1, 0, 50, 10, "permit") + grant(1, 1, 5, 50, 11, "permit")
    ops += grant(2, 1, 10, 50, 12, "permit")  # three at once, limit 2
    result = analyse(ops, fenced_final=0, canary_final=0, records=[], start_ns=0,
                     end_ns=100 * MS, ttl=1.0, retry_cap=0.5, primitive="semaphore",
                     limit=2)  # fmt: skip
    data = result.as_dict()
    assert data["primitive"] == "semaphore" and data["limit"] == 2
    assert data["permit_overlaps"] == 1 and data["double_grants"] == 1
    assert data["max_concurrent_permits"] == 3
    fine = analyse(ops, fenced_final=0, canary_final=0, records=[], start_ns=0,
                   end_ns=100 * MS, ttl=1.0, retry_cap=0.5, primitive="semaphore",
                   limit=3)  # fmt: skip
    assert fine.as_dict()["permit_overlaps"] == 0 and fine.as_dict()["double_grants"] == 0


# -- read-write lock: never a writer with a reader or two writers ---------------------------


def test_readers_share_and_writers_alternate_with_them() -> None:
    ops = grant(0, 1, 0, 20, 1, "read") + grant(1, 1, 5, 20, 2, "read")
    ops += grant(2, 1, 30, 10, 3, "write") + grant(0, 2, 45, 10, 4, "read")
    result = check_rw_exclusion(lease_windows(ops), lease_modes(ops))
    assert result.ok
    assert (result.readers, result.writers, result.max_readers) == (3, 1, 2)


def test_a_writer_with_a_reader_is_caught() -> None:
    ops = grant(0, 1, 0, 20, 1, "read") + grant(1, 1, 10, 20, 2, "write")
    result = check_rw_exclusion(lease_windows(ops), lease_modes(ops))
    assert not result.ok and result.writer_with_reader == 1 and result.two_writers == 0
    # the other way round too: a reader entering while a writer holds it
    ops = grant(1, 1, 0, 20, 1, "write") + grant(0, 1, 10, 20, 2, "read")
    result = check_rw_exclusion(lease_windows(ops), lease_modes(ops))
    assert result.writer_with_reader == 1 and not result.ok


def test_two_writers_at_once_are_caught() -> None:
    ops = grant(0, 1, 0, 20, 1, "write") + grant(1, 1, 10, 20, 2, "write")
    result = check_rw_exclusion(lease_windows(ops), lease_modes(ops))
    assert not result.ok and result.two_writers == 1 and result.writer_with_reader == 0


def test_a_lease_of_unknown_mode_counts_as_a_writer() -> None:
    ops = grant(0, 1, 0, 20, 1, "read") + grant(1, 1, 10, 20, 2, "")
    assert check_rw_exclusion(lease_windows(ops), lease_modes(ops)).writer_with_reader == 1


# -- read-write lock: a writer's fence exceeds every earlier fence --------------------------


def test_writer_fences_above_every_earlier_grant_pass() -> None:
    ops = grant(0, 1, 0, 5, 10, "read") + grant(1, 1, 1, 5, 11, "read")
    ops += grant(2, 1, 10, 5, 12, "write") + grant(0, 2, 20, 5, 13, "read")
    result = check_writer_fences(ops)
    assert result.ok and result.writers == 1


def test_a_writer_fence_below_an_earlier_readers_is_caught() -> None:
    # the reader was acknowledged (fence 20) before the writer, which got fence 15
    ops = grant(0, 1, 0, 5, 20, "read") + grant(1, 1, 10, 5, 15, "write")
    result = check_writer_fences(ops)
    assert not result.ok and result.violations == 1 and result.examples == ((20, 15),)


def test_a_writer_fence_equal_to_an_earlier_writers_is_caught() -> None:
    ops = grant(0, 1, 0, 5, 20, "write") + grant(1, 1, 10, 5, 20, "write")
    assert check_writer_fences(ops).violations == 1


def test_analyse_reports_the_read_write_lock_checkers() -> None:
    bad = grant(0, 1, 0, 20, 30, "read") + grant(1, 1, 10, 20, 25, "write")
    data = analyse(bad, fenced_final=0, canary_final=0, records=[], start_ns=0,
                   end_ns=100 * MS, ttl=1.0, retry_cap=0.5,
                   primitive="rwlock").as_dict()  # fmt: skip
    assert data["primitive"] == "rwlock"
    assert data["writer_with_reader"] == 1 and data["double_grants"] == 1
    assert data["writer_fence_violations"] == 1 and data["two_writers"] == 0
    good = grant(0, 1, 0, 5, 1, "read") + grant(1, 1, 1, 5, 2, "read")
    good += grant(2, 1, 20, 5, 3, "write")
    data = analyse(good, fenced_final=0, canary_final=0, records=[], start_ns=0,
                   end_ns=100 * MS, ttl=1.0, retry_cap=0.5,
                   primitive="rwlock").as_dict()  # fmt: skip
    assert data["double_grants"] == 0 and data["writer_fence_violations"] == 0
    assert data["max_readers"] == 2 and (data["reads"], data["writes"]) == (2, 1)


def test_a_lock_run_reports_its_primitive_and_keeps_its_double_grants() -> None:
    ops = grant(0, 1, 0, 20, 1, "") + grant(1, 1, 10, 20, 2, "")
    data = analyse(ops, fenced_final=0, canary_final=0, records=[], start_ns=0,
                   end_ns=100 * MS, ttl=1.0, retry_cap=0.5).as_dict()  # fmt: skip
    assert data["primitive"] == "lock" and data["double_grants"] == 1
    assert "permit_overlaps" not in data and "writer_with_reader" not in data


def test_readers_sharing_a_fence_are_reported_apart_from_fence_violations() -> None:
    # two concurrent readers with one merged fence: allowed for readers, reported apart
    shared = grant(0, 1, 0, 20, 7, "read") + grant(1, 1, 1, 20, 7, "read")
    assert reader_fence_duplicates(shared) == 1
    data = analyse(shared, fenced_final=0, canary_final=0, records=[], start_ns=0,
                   end_ns=100 * MS, ttl=1.0, retry_cap=0.5,
                   primitive="rwlock").as_dict()  # fmt: skip
    assert data["reader_fence_duplicates"] == 1 and data["fence_violations"] == 0
    # a writer sharing a reader's fence is a violation, and so are two permits sharing one
    mixed = grant(0, 1, 0, 5, 7, "read") + grant(1, 1, 1, 5, 7, "write")
    assert reader_fence_duplicates(mixed) == 0
    data = analyse(mixed, fenced_final=0, canary_final=0, records=[], start_ns=0,
                   end_ns=100 * MS, ttl=1.0, retry_cap=0.5,
                   primitive="rwlock").as_dict()  # fmt: skip
    assert data["fence_violations"] == 1
    permits = grant(0, 1, 0, 20, 7, "permit") + grant(1, 1, 1, 20, 7, "permit")
    data = analyse(permits, fenced_final=0, canary_final=0, records=[], start_ns=0,
                   end_ns=100 * MS, ttl=1.0, retry_cap=0.5, primitive="semaphore",
                   limit=2).as_dict()  # fmt: skip
    assert data["fence_violations"] == 1 and "reader_fence_duplicates" not in data

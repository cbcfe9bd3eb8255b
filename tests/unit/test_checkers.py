"""Every chaos checker on a known-good and a known-BAD hand-built history.

A checker that never fires proves nothing: each bad history below is the violation the checker
exists for, and the test asserts that it is reported.
"""

from __future__ import annotations

from fencelock.cli.chaos.checkers import (
    LeaseWindow,
    Op,
    check_canary,
    check_fenced_register,
    check_fences,
    check_lease_overlap,
    check_liveness,
    lease_windows,
    unfenced_overlaps,
)
from fencelock.cli.chaos.report import JSON_FIELDS, ChaosResult, availability

MS = 1_000_000  # ns


def cycle(worker: int, it: int, t0: int, fence: int, read: int, *, ttl_ms: int = 1000,
          work_ms: int = 10, write_status: str = "ok", info: str = "",
          canary: bool = True) -> list[Op]:
    """One acquire -> advance -> read -> canary read -> work -> writes -> release cycle
    starting at t0 ms; the fenced and canary registers both read ``read``."""
    t = t0 * MS
    acq_done = t + 2 * MS
    ops = [
        Op(worker, it, "acquire", "ok", t, acq_done, fence, None, t + ttl_ms * MS),
        Op(worker, it, "advance", "ok", acq_done + MS, acq_done + 2 * MS, fence),
        Op(worker, it, "read", "ok", acq_done + 2 * MS, acq_done + 3 * MS, fence, read),
    ]
    if canary:
        ops.append(Op(worker, it, "canary-read", "ok", acq_done + 3 * MS, acq_done + 4 * MS,
                      fence, read))
    w = acq_done + (4 + work_ms) * MS
    if canary:
        ops.append(Op(worker, it, "canary-write", "ok", w, w + MS, fence, read + 1))
    ops.append(Op(worker, it, "write", write_status,  # type: ignore[arg-type]
                  w + MS, w + 2 * MS, fence, read + 1, None, info))
    ops.append(Op(worker, it, "release", "ok", w + 2 * MS, w + 3 * MS, fence))
    return ops


def sequential(n: int) -> list[Op]:
    ops: list[Op] = []
    for i in range(n):
        ops += cycle(i % 3, i, i * 100, fence=1000 + i, read=i)
    return ops


# -- fenced register ----------------------------------------------------------------------------


def test_fenced_register_good_history() -> None:
    result = check_fenced_register(sequential(5), final=5)
    assert result.ok
    assert (result.acknowledged, result.lost_updates, result.stale_accepted) == (5, 0, 0)


def test_fenced_register_detects_a_lost_update() -> None:
    # two holders both read 0 and both writes were acknowledged: one increment is lost
    ops = cycle(0, 1, 0, fence=10, read=0) + cycle(1, 1, 100, fence=11, read=0)
    result = check_fenced_register(ops, final=1)
    assert not result.ok
    assert result.lost_updates == 1
    assert result.duplicates == 1


def test_fenced_register_detects_a_final_value_below_the_acknowledged_count() -> None:
    result = check_fenced_register(sequential(4), final=2)
    assert not result.ok and result.lost_updates == 2


def test_fenced_register_detects_a_stale_write_accepted() -> None:
    # worker 1 (fence 20) wrote and was acknowledged at ~115 ms; worker 0 (fence 10) sends its
    # write at 300 ms, after that, and the store accepted it: the guard failed
    newer = cycle(1, 1, 100, fence=20, read=0)
    old = [Op(0, 1, "acquire", "ok", 0, 2 * MS, 10, None, 1000 * MS),
           Op(0, 1, "write", "ok", 300 * MS, 301 * MS, 10, 2)]
    result = check_fenced_register(newer + old, final=2)
    assert result.stale_accepted == 1
    assert not result.ok


def test_fenced_register_counts_refusals_and_allows_unknown_writes() -> None:
    refused = [Op(0, 9, "acquire", "ok", 0, MS, 5, None, 1000 * MS),
               Op(0, 9, "write", "fail", 500 * MS, 501 * MS, 5, 1, None, "stale")]
    unknown = cycle(2, 3, 600, fence=2000, read=5, write_status="unknown")
    ops = sequential(5) + refused + unknown
    assert check_fenced_register(ops, final=5).ok  # the unknown write did not land
    assert check_fenced_register(ops, final=6).ok  # ... or it did
    result = check_fenced_register(ops, final=7)  # 7 > 5 acknowledged + 1 unknown: phantom
    assert result.rejected == 1 and result.phantom == 1 and not result.ok


# -- canary -------------------------------------------------------------------------------------


def test_canary_good_and_bad() -> None:
    assert check_canary(sequential(3), final=3).ok
    paused = cycle(0, 1, 0, fence=10, read=0, work_ms=1500)  # wakes after its lease
    others = cycle(1, 1, 1100, fence=11, read=0) + cycle(2, 1, 1200, fence=12, read=1)
    bad = check_canary(paused + others, final=1)  # the paused holder overwrote 2 with 1
    assert bad.lost_updates == 2 and not bad.ok
    assert unfenced_overlaps(paused + others) == 1
    assert unfenced_overlaps(sequential(3)) == 0


# -- fences -------------------------------------------------------------------------------------


def test_fences_good_history() -> None:
    result = check_fences(sequential(6))
    assert result.ok and result.leases == 6


def test_fences_detect_a_duplicate() -> None:
    ops = cycle(0, 1, 0, fence=7, read=0) + cycle(1, 1, 100, fence=7, read=1)
    result = check_fences(ops)
    assert result.duplicates == 1 and not result.ok


def test_fences_detect_a_fence_going_backwards() -> None:
    # acknowledged at 2 ms with fence 50; a lease requested at 100 ms got 40
    ops = cycle(0, 1, 0, fence=50, read=0) + cycle(1, 1, 100, fence=40, read=1)
    result = check_fences(ops)
    assert result.out_of_order == 1 and not result.ok


def test_fences_allow_concurrent_requests_in_any_order() -> None:
    # both requested before either was acknowledged: no real-time order to respect
    a = Op(0, 1, "acquire", "ok", 0, 10 * MS, 9, None, 1000 * MS)
    b = Op(1, 1, "acquire", "ok", 1 * MS, 5 * MS, 8, None, 1000 * MS)
    assert check_fences([a, b]).ok


# -- lease overlap ------------------------------------------------------------------------------


def test_lease_overlap_good_history() -> None:
    result = check_lease_overlap(lease_windows(sequential(5)))
    assert result.ok and result.double_grants == 0 and result.outlived == 0


def test_lease_overlap_detects_a_double_grant() -> None:
    # A holds [0, 1000] ms and has not released; B is granted at 302 ms
    a = [Op(0, 1, "acquire", "ok", 0, 2 * MS, 10, None, 1000 * MS),
         Op(0, 1, "release", "ok", 800 * MS, 801 * MS, 10)]
    b = cycle(1, 1, 300, fence=11, read=0)
    result = check_lease_overlap(lease_windows(a + b))
    assert result.double_grants == 1 and not result.ok


def test_lease_overlap_counts_a_paused_holder_apart() -> None:
    # A's lease ends at 1000 ms but A (paused) acts until ~1516 ms; B was granted at 1102 ms:
    # not a double grant (A's validity had ended) but an outlived lease
    paused = cycle(0, 1, 0, fence=10, read=0, work_ms=1500)
    b = cycle(1, 1, 1100, fence=11, read=0)
    result = check_lease_overlap(lease_windows(paused + b))
    assert result.ok
    assert result.outlived == 1


def test_lease_windows_end_at_release() -> None:
    (w,) = lease_windows(cycle(0, 1, 0, fence=3, read=0))
    assert isinstance(w, LeaseWindow)
    assert w.end_ns < 1000 * MS  # released long before the validity ended


# -- liveness -----------------------------------------------------------------------------------


def test_liveness_good_and_bad() -> None:
    heals = [1_000 * MS, 5_000 * MS]
    good = check_liveness(heals, [1_300 * MS, 5_100 * MS], end_ns=9_000 * MS, bound_s=2.5)
    assert good.ok and good.max_delay_s is not None and abs(good.max_delay_s - 0.3) < 1e-9
    late = check_liveness(heals, [1_300 * MS, 8_000 * MS], end_ns=9_000 * MS, bound_s=2.5)
    assert late.late == 1 and not late.ok
    never = check_liveness(heals, [1_300 * MS], end_ns=9_000 * MS, bound_s=2.5)
    assert never.late == 1 and not never.ok
    too_early_to_tell = check_liveness([8_000 * MS], [], end_ns=9_000 * MS, bound_s=2.5)
    assert too_early_to_tell.ok


# -- report -------------------------------------------------------------------------------------


def test_report_fields_and_verdict() -> None:
    result = ChaosResult(10, 9, 1, 0, 0, 2, 0.9, {"pause-holder": 1}, 12.0,
                         {"canary_lost_updates": 2})
    data = result.as_dict()
    assert list(data)[: len(JSON_FIELDS)] == list(JSON_FIELDS)
    assert data["canary_lost_updates"] == 2
    assert result.safe and "SAFE" in result.table()
    bad = ChaosResult(10, 9, 1, 1, 0, 2, 0.9, {}, 12.0)
    assert not bad.safe and "VIOLATION" in bad.table()


def test_availability_buckets() -> None:
    start = 0
    acquired = [100 * MS, 1_500 * MS, 3_200 * MS]  # buckets 0, 1, 3 of 0..3
    assert availability(acquired, start, 4_000 * MS) == 0.75
    assert availability([], 0, 0) == 1.0

"""Fences as the scripts return them (decimal strings) are read exactly, within 1..2^63 - 1."""

from __future__ import annotations

import pytest

from fencelock._core import fencing
from fencelock._core.handover import parse_handed
from fencelock._core.replies import ProtocolError, decode_acquire, decode_slot_acquire

FENCE_MAX = 2**63 - 1


@pytest.mark.parametrize("fence", [2**53 + 1, 2**53 + 3, FENCE_MAX])
def test_a_fence_string_past_2_53_is_read_exactly(fence: int) -> None:
    assert decode_acquire([1, str(fence).encode()]).fence == fence
    assert decode_slot_acquire([1, str(fence).encode(), 2]).fence == fence
    handed = parse_handed(f"hnext {fence} 1000 50".encode())
    assert handed is not None and handed.fence == fence


@pytest.mark.parametrize("fence", [0, -1, FENCE_MAX + 1])
def test_a_fence_out_of_range_is_a_protocol_error(fence: int) -> None:
    with pytest.raises(ProtocolError, match="out of range"):
        decode_acquire([1, str(fence).encode()])
    with pytest.raises(ProtocolError, match="out of range"):
        decode_slot_acquire([1, str(fence).encode(), 0])
    assert parse_handed(f"hnext {fence} 1000 50".encode()) is None


def test_bump_mirrors_the_scripts_up_to_the_cap() -> None:
    assert fencing.FENCE_MAX == FENCE_MAX
    assert fencing.bump(2**53 + 1, 10) == 2**53 + 2
    assert fencing.bump(5, 2**53 + 7) == 2**53 + 7
    assert fencing.bump(FENCE_MAX - 1, 0) == FENCE_MAX
    with pytest.raises(ValueError, match="2\\^63 - 1"):
        fencing.bump(FENCE_MAX, 0)


def test_bump_with_a_floor_step_rounds_the_clock_up_not_the_register() -> None:
    assert fencing.bump(0, 1_000_001, 10_000) == 1_010_000
    assert fencing.bump(1_010_000, 1_000_001, 10_000) == 1_010_001  # F + 1 wins
    assert fencing.bump(0, 1_000_001, 3) == 1_000_001  # not a divisor of 10^6: TIME itself
    assert fencing.floor_step_us(3, True) == fencing.FLOOR_STEP_US
    assert fencing.floor_step_us(3, False) == fencing.floor_step_us(1, True) == 0


def test_a_grant_commits_itself_only_when_a_majority_returned_the_merged_fence() -> None:
    assert fencing.committed_by_grant([7, 7, 7], 7, 2)
    assert fencing.committed_by_grant([7, 7, 5], 7, 2)
    assert not fencing.committed_by_grant([7, 5, 5], 7, 2)  # two agree, on a smaller value
    assert not fencing.committed_by_grant([7], 7, 2)

"""Property tests of the pure core (``fencelock._core``): no sockets, no sleeps, no clocks.

The fence property is checked on a simulation that drives ``fencing.bump`` / ``merge`` /
``commit`` exactly as the lock does, over 1, 3, 5 and 7 servers with crashes that wipe the
fence register; a canary shows the naive schemes this design replaces really do go backwards.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import cast

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from fencelock._core import fencing
from fencelock._core.backoff import retry_delay_s
from fencelock._core.keys import lock_keys
from fencelock._core.quorum import Outcome, Tally, contention_or_unavailable, majority, summary
from fencelock._core.replies import AcquireReply, ProtocolError, decode_acquire, decode_flag
from fencelock._core.rounds import Status, decide_acquire, decide_confirm, lost_for_sure
from fencelock._core.timing import drift_ms, seconds_to_ms, validity_ms

finite = st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False)
outcomes = st.sampled_from(list(Outcome))


# -- timing --------------------------------------------------------------------------------------


@given(
    ttl=st.floats(min_value=10.0, max_value=1e7),
    factor=st.floats(min_value=0.0, max_value=0.49),
    dmin=st.floats(min_value=0.0, max_value=1e4),
    e1=finite,
    e2=finite,
)
def test_validity_decreases_with_elapsed_and_stays_below_ttl_minus_drift(
    ttl: float, factor: float, dmin: float, e1: float, e2: float
) -> None:
    drift = drift_ms(ttl, factor, dmin)
    assert drift >= dmin and drift == pytest.approx(ttl * factor + dmin)
    lo, hi = sorted((e1, e2))
    assert validity_ms(ttl, hi, drift) <= validity_ms(ttl, lo, drift)
    assert validity_ms(ttl, lo, drift) <= ttl - drift
    assert validity_ms(ttl, 0.0, drift) == pytest.approx(ttl - drift)
    # a round that took the whole lease never yields a usable lease
    assert validity_ms(ttl, ttl, drift) <= 0.0 or drift == 0.0


@given(st.floats(min_value=1e-6, max_value=1e6))
def test_seconds_to_ms_is_positive_and_close(value: float) -> None:
    ms = seconds_to_ms(value)
    assert isinstance(ms, int) and ms >= 1
    assert abs(ms - value * 1000) <= 0.5 + 1.0 * (value < 0.001)


# -- quorum tally --------------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(1, 8))
def test_tally_exhaustive(n: int) -> None:
    """Every combination of outcomes, votes recorded in order: won iff granted >= n//2+1, and
    ``lost`` is never true while the remaining servers could still make a majority."""
    need = n // 2 + 1
    assert majority(n) == need
    for combo in itertools.product(list(Outcome), repeat=n):
        tally = Tally(n)
        for index, outcome in enumerate(combo):
            before_granted = tally.granted
            tally.record(index, outcome)
            granted = before_granted + (outcome is Outcome.GRANTED)
            pending = n - index - 1
            assert tally.granted == granted and tally.pending == pending
            assert tally.won == (granted >= need)
            still_possible = granted + pending >= need
            assert tally.lost == (not still_possible)
            assert not (tally.won and tally.lost)
            assert tally.decided == (tally.won or tally.lost)
        granted = combo.count(Outcome.GRANTED)
        answered = granted + combo.count(Outcome.HELD)
        assert tally.won == (granted >= need)
        assert tally.decided
        assert tally.answered == answered
        assert tally.granted_indexes() == [i for i, o in enumerate(combo) if o is Outcome.GRANTED]
        if not tally.won:
            assert contention_or_unavailable(tally) == (
                "contention" if answered >= need else "unavailable"
            )
        # "not ours" on more than n - need servers means no majority can ever be ours
        assert lost_for_sure(tally) == (combo.count(Outcome.HELD) > n - need)


@given(
    n=st.integers(1, 9),
    data=st.data(),
)
def test_tally_any_order(n: int, data: st.DataObject) -> None:
    order = data.draw(st.permutations(range(n)))
    votes = data.draw(st.lists(outcomes, min_size=n, max_size=n))
    tally = Tally(n)
    need = n // 2 + 1
    for step, index in enumerate(order):
        tally.record(index, votes[index], f"detail{index}")
        seen = [votes[i] for i in order[: step + 1]]
        granted = seen.count(Outcome.GRANTED)
        assert tally.won == (granted >= need)
        assert tally.lost == (granted + (n - step - 1) < need)
        if tally.lost:  # a decided loss stays lost; a win stays won
            assert not tally.won
    assert set(tally.details(Outcome.GRANTED)) == {
        f"detail{i}" for i in range(n) if votes[i] is Outcome.GRANTED
    }


def test_tally_rejects_double_votes_and_bad_indexes() -> None:
    tally = Tally(3)
    tally.record(0, Outcome.GRANTED)
    with pytest.raises(ValueError):
        tally.record(0, Outcome.HELD)
    with pytest.raises(IndexError):
        tally.record(3, Outcome.GRANTED)
    with pytest.raises(IndexError):
        tally.record(-1, Outcome.GRANTED)
    with pytest.raises(ValueError):
        majority(0)


def test_summary_wording() -> None:
    tally = Tally(5)
    tally.record(0, Outcome.GRANTED)
    tally.record(1, Outcome.GRANTED)
    assert summary("invoices:42", tally) == "'invoices:42': 2/5 servers agreed, majority is 3"


# -- backoff -------------------------------------------------------------------------------------


@given(
    attempt=st.integers(0, 10_000),
    remaining=st.floats(min_value=-10.0, max_value=1e4, allow_nan=False),
    pttl=st.one_of(st.none(), st.integers(-2, 10**7)),
    base=st.floats(min_value=1e-4, max_value=1.0),
    cap_extra=st.floats(min_value=0.0, max_value=10.0),
    rand=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_retry_delay_bounds(
    attempt: int,
    remaining: float,
    pttl: int | None,
    base: float,
    cap_extra: float,
    rand: float,
) -> None:
    cap = base + cap_extra
    delay = retry_delay_s(
        attempt=attempt,
        remaining_s=remaining,
        holder_pttl_ms=pttl,
        base_s=base,
        cap_s=cap,
        rand=rand,
    )
    assert math.isfinite(delay)
    assert delay >= 0.0
    assert delay <= max(0.0, remaining)
    if pttl is None or pttl <= 0:
        assert delay <= cap
        if remaining > cap:  # equal jitter: at least half of the current ceiling
            assert delay >= 0.5 * min(cap, base * 2.0 ** min(attempt, 30)) - 1e-12
    elif remaining > 0:
        # follows the holder: sleep until its lease can end (a release wakes us earlier),
        # plus at most one base of jitter, never past our own deadline
        expected = min(remaining, pttl / 1000.0)
        assert delay >= expected - 1e-9
        assert delay <= min(remaining, pttl / 1000.0 + base) + 1e-9


@given(base=st.floats(1e-3, 0.1), cap=st.floats(0.1, 1.0), rand=st.floats(0.0, 0.999))
def test_backoff_grows_with_attempts_until_the_cap(base: float, cap: float, rand: float) -> None:
    delays = [
        retry_delay_s(
            attempt=a, remaining_s=1e6, holder_pttl_ms=None, base_s=base, cap_s=cap, rand=rand
        )
        for a in range(40)
    ]
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(delays))
    assert delays[-1] == pytest.approx(cap * (0.5 + 0.5 * rand))


# -- reply decoding ------------------------------------------------------------------------------


@given(fence=st.integers(1, 2**62), pttl=st.integers(-2, 2**40))
def test_decode_acquire_known_shapes(fence: int, pttl: int) -> None:
    for shape in ([1, fence], (1, fence), [b"1", str(fence).encode()], ["1", str(fence)]):
        assert decode_acquire(shape) == AcquireReply(True, fence, 0)
    assert decode_acquire([0, pttl]) == AcquireReply(False, 0, pttl)


garbage = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(max_size=5),
        st.binary(max_size=5),
    ),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=2), inner),
    max_leaves=8,
)


@given(garbage)
def test_decode_acquire_never_succeeds_on_garbage(reply: object) -> None:
    """Anything but ``{1, fence>0}`` / ``{0, pttl}`` is a ProtocolError, never a grant."""
    ok_shape = (
        isinstance(reply, list | tuple)
        and len(reply) == 2
        and all(not isinstance(v, bool) for v in reply)
    )
    try:
        decoded = decode_acquire(reply)
    except ProtocolError:
        return
    assert ok_shape, f"{reply!r} decoded as {decoded}"
    flag = int(reply[0])  # type: ignore[index]
    assert flag in (0, 1)
    if decoded.granted:
        assert flag == 1 and decoded.fence == int(reply[1]) > 0  # type: ignore[index]


@pytest.mark.parametrize(
    "reply",
    [None, 1, b"OK", [], [1], [1, 2, 3], [2, 5], [-1, 5], [1, 0], [1, -3], [True, 5],
     [1, b"x"], [1, 1.5], {"a": 1}, "1", [1, None]],
)  # fmt: skip
def test_decode_acquire_rejects(reply: object) -> None:
    with pytest.raises(ProtocolError):
        decode_acquire(reply)


@given(garbage)
def test_decode_flag_only_accepts_0_and_1(reply: object) -> None:
    try:
        value = decode_flag(reply, "release")
    except ProtocolError:
        return
    assert not isinstance(reply, bool)
    assert int(reply) in (0, 1)  # type: ignore[call-overload]
    assert value is (int(reply) == 1)  # type: ignore[call-overload]


@pytest.mark.parametrize("reply", [None, True, False, 2, -1, b"OK", [1], "yes", 1.0])
def test_decode_flag_rejects(reply: object) -> None:
    with pytest.raises(ProtocolError):
        decode_flag(reply, "extend")


def test_decode_flag_accepts() -> None:
    assert decode_flag(1, "x") is True and decode_flag(b"0", "x") is False


# -- deciding an acquire round -------------------------------------------------------------------


@given(
    n=st.integers(1, 7),
    data=st.data(),
    ttl=st.floats(100.0, 60_000.0),
    elapsed=st.floats(0.0, 70_000.0),
    drift=st.floats(0.0, 1000.0),
)
def test_decide_acquire(
    n: int, data: st.DataObject, ttl: float, elapsed: float, drift: float
) -> None:
    votes = data.draw(st.lists(outcomes, min_size=n, max_size=n))
    fences = data.draw(st.lists(st.integers(1, 2**60), min_size=n, max_size=n))
    pttls = data.draw(st.lists(st.integers(-1, 10**6), min_size=n, max_size=n))
    tally = Tally(n)
    replies: dict[int, AcquireReply] = {}
    for i, outcome in enumerate(votes):
        tally.record(i, outcome)
        if outcome is Outcome.GRANTED:
            replies[i] = AcquireReply(True, fences[i], 0)
        elif outcome is Outcome.HELD:
            replies[i] = AcquireReply(False, 0, pttls[i])
    decision = decide_acquire(tally, replies, ttl_ms=ttl, elapsed_ms=elapsed, drift=drift)
    need = n // 2 + 1
    granted = votes.count(Outcome.GRANTED)
    answered = granted + votes.count(Outcome.HELD)
    validity = ttl - elapsed - drift
    if granted >= need and validity > 0:
        assert decision.status is Status.GRANTED
        assert decision.fence == max(fences[i] for i in range(n) if votes[i] is Outcome.GRANTED)
        assert decision.validity_ms == pytest.approx(validity)
        assert 0 < decision.validity_ms <= ttl - drift
    else:
        assert decision.status is not Status.GRANTED
        assert decision.fence == 0
        if granted >= need:
            assert decision.status is Status.TOO_SLOW
        elif answered >= need:
            assert decision.status is Status.CONTENTION
        else:
            assert decision.status is Status.UNAVAILABLE
        held = [pttls[i] for i in range(n) if votes[i] is Outcome.HELD and pttls[i] >= 0]
        assert decision.holder_pttl_ms == (max(held) if held else None)


@given(n=st.integers(1, 7), data=st.data(), elapsed=st.floats(0.0, 2000.0))
def test_decide_confirm(n: int, data: st.DataObject, elapsed: float) -> None:
    votes = data.draw(st.lists(outcomes, min_size=n, max_size=n))
    tally = Tally(n)
    for i, outcome in enumerate(votes):
        tally.record(i, outcome)
    validity = decide_confirm(tally, ttl_ms=1000.0, elapsed_ms=elapsed, drift=12.0)
    if votes.count(Outcome.GRANTED) >= n // 2 + 1:
        assert validity == pytest.approx(1000.0 - elapsed - 12.0)
    else:
        assert validity <= 0.0


def test_keys_share_one_hash_tag() -> None:
    keys = lock_keys("orders:42")
    assert keys.lock == "fencelock:{orders:42}"
    for key in keys.script_keys:
        assert key.startswith("fencelock:{orders:42}")
        tag = key[key.index("{") + 1 : key.index("}")]
        assert tag == "orders:42"
    assert len(set(keys.script_keys)) == 7


# -- the fence property --------------------------------------------------------------------------
#
# Model. N servers; server i has a register F_i and a clock clock_i = global_time + offset_i with
# a fixed offset in [0, SKEW] (clocks only move forward, and agree within SKEW microseconds).
# Steps, in order: the global time advances by some microseconds (possibly 0: several
# acquisitions in one microsecond); a server crashes and restarts without persistence (F_i := 0,
# and the restart itself takes RESTART_US of time); or an acquisition: round 1 on a granting set
# (a majority, or fewer: a failed round whose bumps stay behind), each granting server stores and
# returns bump(F_i, clock_i); a crash may hit between the rounds; round 2 commits the merged fence
# on the granting servers still up; the lease (and its fence) is handed out only when a majority
# acknowledged round 2. Successive acquisitions are sequential (each lease ends before the next
# one starts), which is what the lock keys guarantee.
#
# Assumptions, the ones DESIGN.md states: clocks agree within SKEW, and a restart takes longer
# than SKEW plus the number of fences that can be issued in one microsecond (here < 100).

SKEW = 50
RESTART_US = 1_000


Acquire = tuple[list[int], "int | None", list[int]]


@dataclass
class Case:
    n: int
    offsets: list[int]
    steps: list[tuple[str, object]] = field(default_factory=list)


@st.composite
def fence_cases(draw: st.DrawFn, ns: tuple[int, ...] = (1, 3, 5, 7)) -> Case:
    n = draw(st.sampled_from(ns))
    offsets = draw(st.lists(st.integers(0, SKEW), min_size=n, max_size=n))
    need = n // 2 + 1
    steps: list[tuple[str, object]] = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["tick", "crash", "acquire", "acquire", "acquire"]))
        if kind == "tick":
            steps.append(("tick", draw(st.integers(0, 3))))
        elif kind == "crash":
            steps.append(("crash", draw(st.integers(0, n - 1))))
        else:
            size = draw(st.integers(1, n))
            granting = sorted(draw(st.permutations(range(n)))[:size])
            crash_between = draw(st.one_of(st.none(), st.sampled_from(granting)))
            committed = draw(st.permutations(granting))
            commit_size = draw(st.integers(min(need, len(granting)), len(granting)))
            steps.append(("acquire", (granting, crash_between, committed[:commit_size])))
    return Case(n, offsets, steps)


def simulate(case: Case, *, with_commit: bool = True, with_floor: bool = True) -> list[int]:
    """The fences handed out, in order, for ``case`` under the lock's scheme (or a naive one)."""
    n, need = case.n, case.n // 2 + 1
    registers = [0] * n
    now = 1_700_000_000_000_000  # microseconds, like a server's TIME
    issued: list[int] = []

    def clock(i: int) -> int:
        return now + case.offsets[i]

    def bump(i: int) -> int:
        if with_floor:
            return fencing.bump(registers[i], clock(i))
        return registers[i] + 1

    for kind, arg in case.steps:
        if kind == "tick":
            assert isinstance(arg, int)
            now += arg
        elif kind == "crash":
            assert isinstance(arg, int)
            registers[arg] = 0
            now += RESTART_US
        else:
            granting, crash_between, committing = cast(Acquire, arg)
            bumped = []
            for i in granting:
                registers[i] = bump(i)
                bumped.append(registers[i])
            up = set(granting)
            if crash_between is not None:
                registers[crash_between] = 0
                up.discard(crash_between)
                now += RESTART_US
            if len(granting) < need:
                continue  # no majority: no lease, but the minority's bumps stay
            fence = fencing.merge(bumped)
            if not with_commit:
                if len(up) >= need:
                    issued.append(fence)
                continue
            acks = [i for i in committing if i in up]
            for i in acks:
                registers[i] = fencing.commit(registers[i], fence)
            if len(acks) >= need:
                issued.append(fence)
    return issued


def strictly_increasing(values: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(fence_cases())
def test_fences_strictly_increase(case: Case) -> None:
    fences = simulate(case)
    assert strictly_increasing(fences), fences


@settings(max_examples=200)
@given(fence_cases(ns=(1,)))
def test_one_server_fences_strictly_increase(case: Case) -> None:
    # N = 1: the bump is the commit (needs_commit is False), so round 2 changes nothing
    assert not fencing.needs_commit(1)
    assert fencing.needs_commit(3)
    fences = simulate(case)
    assert strictly_increasing(fences)
    assert fences == simulate(case, with_commit=False)


@given(st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**62))
def test_fence_functions(register: int, now_us: int, fence: int) -> None:
    bumped = fencing.bump(register, now_us)
    assert bumped > register and bumped >= now_us
    assert fencing.commit(register, fence) >= register
    assert fencing.commit(register, fence) >= fence
    assert fencing.merge([register, now_us, fence]) == max(register, now_us, fence)
    with pytest.raises(ValueError):
        fencing.merge([])


_CANARY = settings(max_examples=5_000, database=None, derandomize=True, phases=[Phase.generate])


def test_canary_majority_max_without_commit_goes_backwards() -> None:
    """Without round 2, two majorities can see different maxima: hypothesis finds a case."""
    case = find(
        fence_cases(ns=(3, 5)),
        lambda c: not strictly_increasing(simulate(c, with_commit=False)),
        settings=_CANARY,
    )
    assert not strictly_increasing(simulate(case, with_commit=False))
    assert strictly_increasing(simulate(case))  # the real scheme survives the same case


def test_canary_without_time_floor_goes_backwards_after_a_wipe() -> None:
    case = find(
        fence_cases(),
        lambda c: not strictly_increasing(simulate(c, with_floor=False)),
        settings=_CANARY,
    )
    assert not strictly_increasing(simulate(case, with_floor=False))
    assert strictly_increasing(simulate(case))


def test_canary_hand_built() -> None:
    # three servers, A's clock 10 us ahead. {A,B} then {B,C}: B's register is the intersection.
    case = Case(3, [10, 0, 0])
    case.steps = [
        ("acquire", ([0, 1], None, [0, 1])),
        ("tick", 1),
        ("acquire", ([1, 2], None, [1, 2])),
    ]
    naive = simulate(case, with_commit=False)
    assert len(naive) == 2 and naive[1] < naive[0]
    fences = simulate(case)
    assert len(fences) == 2 and fences[0] < fences[1]
    # one server, crash without persistence: F + 1 alone restarts from 1
    single = Case(1, [0])
    single.steps = [("acquire", ([0], None, [0])), ("crash", 0), ("acquire", ([0], None, [0]))]
    assert simulate(single, with_floor=False) == [1, 1]
    assert strictly_increasing(simulate(single))


def test_model_assumption_is_needed() -> None:
    """The property needs restarts slower than clock skew (documented): with a server clock far
    ahead and a wipe of the intersection, even the real scheme goes backwards. This pins the
    model's honesty: the simulation is not trivially monotonic."""
    case = Case(3, [10 * RESTART_US, 0, 0])
    case.steps = [
        ("acquire", ([0, 1], None, [0, 1])),
        ("crash", 1),
        ("acquire", ([1, 2], None, [1, 2])),
    ]
    fences = simulate(case)
    assert len(fences) == 2 and fences[1] < fences[0]

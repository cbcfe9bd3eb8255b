"""Shrinking a failing schedule: the smallest schedule found that still fails the same way.

A schedule is a seed plus a :class:`Plan`: which of the seed's planned faults are injected
(by their index in the plan the seed draws) and which parts of its configuration are made
smaller (fewer client processes, jobs, tasks, keys or servers; no renewals, extends,
overruns or idle gaps; one primitive of the mix; a lower semaphore limit). Everything else
still follows from the seed, so a plan replays exactly: ``python tools/simulate.py --replay
SEED --plan TEXT``.

:func:`shrink` is delta debugging over that plan: it first tries the schedule with no fault
at all, then leaves out halves, quarters ... single faults (ddmin), then tries each smaller
configuration value one at a time, and repeats both until nothing more can go. A reduction is
kept only if the reduced schedule still fails the **same property** with no more planned
faults than the current one and no more steps than the original (and fewer of one of them).
Leaving a fault out keeps the draws the seed made to plan it, so the schedule is the same
until the moment the fault would have come; from there on the world may go another way (the
network's delays and the scheduler's ties share the seed's stream): the shrunk schedule is a
schedule of its own, replayed exactly from its plan, not an edit of the original's trace.

Each run is deterministic, so shrinking is too when its run bound (not its time bound) is
what stops it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .world import Config, World

__all__ = ["Outcome", "Plan", "ShrinkResult", "apply_plan", "shrink"]

#: Config fields a plan may make smaller, in the order the shrinker tries them.
SHRINKABLE = (
    "clients",
    "jobs",
    "tasks",
    "keys",
    "servers",
    "renew",
    "extends",
    "extend_while_renewing",
    "overrun",
    "job_gap",
    "primitives",
    "limit",
)


@dataclass(frozen=True)
class Plan:
    """What a schedule changes from its seed's: config values, and the planned faults kept
    (``None``: all of them)."""

    overrides: tuple[tuple[str, Any], ...] = ()
    keep: tuple[int, ...] | None = None

    def with_value(self, name: str, value: Any) -> Plan:
        rest = tuple((k, v) for k, v in self.overrides if k != name)
        return replace(self, overrides=(*rest, (name, value)))

    def text(self) -> str:
        """The plan as ``--plan`` takes it: ``clients=2,renew=0,primitives=lock,faults=0+3``
        (``faults=-``: none kept; empty: the seed's own schedule)."""
        parts = []
        for name, value in sorted(self.overrides):
            if isinstance(value, bool):
                shown = "1" if value else "0"
            elif isinstance(value, tuple):
                shown = "+".join(str(v) for v in value)
            else:
                shown = f"{value:g}" if isinstance(value, float) else str(value)
            parts.append(f"{name}={shown}")
        if self.keep is not None:
            parts.append("faults=" + ("+".join(str(i) for i in self.keep) or "-"))
        return ",".join(parts)

    @classmethod
    def parse(cls, text: str) -> Plan:
        """The inverse of :meth:`text`.

        Raises:
            ValueError: an unknown field or a malformed value.
        """
        types = {f.name: f.type for f in fields(Config)}
        overrides: list[tuple[str, Any]] = []
        keep: tuple[int, ...] | None = None
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, raw = part.partition("=")
            if not sep:
                raise ValueError(f"plan item {part!r} is not NAME=VALUE")
            if name == "faults":
                keep = () if raw == "-" else tuple(sorted({int(i) for i in raw.split("+")}))
                continue
            if name not in SHRINKABLE:
                raise ValueError(f"plan field {name!r} is not one of {', '.join(SHRINKABLE)}")
            kind = str(types[name])
            value: Any
            if kind == "bool":
                if raw not in ("0", "1"):
                    raise ValueError(f"plan field {name} takes 0 or 1, not {raw!r}")
                value = raw == "1"
            elif kind == "int":
                value = int(raw)
            elif kind == "float":
                value = float(raw)
            else:
                value = tuple(raw.split("+"))
            overrides.append((name, value))
        return cls(tuple(overrides), keep)


def apply_plan(config: Config, plan: Plan) -> Config:
    """``config`` with ``plan``'s values and kept faults (in place; returned)."""
    for name, value in plan.overrides:
        setattr(config, name, value)
    config.keep_faults = plan.keep
    return config


@dataclass
class Outcome:
    """One run of a plan: whether the property failed, its detail, and its size."""

    plan: Plan
    failed: bool
    detail: str
    faults: int  # planned faults injected
    steps: int
    world: World | None = field(default=None, repr=False)
    fault_kinds: dict[str, int] = field(default_factory=dict)

    @property
    def trace(self) -> list[str]:
        return self.world.history.trace if self.world is not None else []


@dataclass
class ShrinkResult:
    prop: str
    original: Outcome
    shrunk: Outcome
    runs: int  # schedules run while shrinking (the original's not counted)
    seconds: float
    complete: bool  # nothing more could go (False: a bound stopped it)


Runner = Callable[[Plan], tuple[World, list[tuple[str, str]]]]


def outcome(run: Runner, plan: Plan, prop: str) -> Outcome:
    """Run ``plan`` and measure it against property ``prop``."""
    world, bad = run(plan)
    return measure(world, bad, plan, prop)


def measure(world: World, bad: list[tuple[str, str]], plan: Plan, prop: str) -> Outcome:
    details = [detail for name, detail in bad if name == prop]
    kept = sum(1 for _, _, k in world.history.plan if k)
    return Outcome(
        plan=plan,
        failed=bool(details),
        detail=details[0] if details else "",
        faults=kept,
        steps=world.steps,
        world=world,
        fault_kinds=dict(world.history.faults),
    )


def _config_candidates(config: Config) -> Iterator[tuple[str, Any]]:
    """Smaller values for each shrinkable field, smallest first."""
    for name in SHRINKABLE:
        value = getattr(config, name)
        if name == "servers":
            yield from ((name, n) for n in (1, 3) if n < value)
        elif name == "limit":
            yield from ((name, n) for n in range(1, value))
        elif isinstance(value, bool):
            if value:
                yield name, False
        elif isinstance(value, int):
            yield from ((name, n) for n in range(1, value))
        elif isinstance(value, float):
            if value > 0.0:
                yield name, 0.0
        elif isinstance(value, tuple) and len(value) > 1:
            yield from ((name, (p,)) for p in value)


def shrink(
    run: Runner,
    base_config: Callable[[], Config],
    prop: str,
    original: Outcome,
    *,
    max_runs: int = 200,
    max_seconds: float = 120.0,
) -> ShrinkResult:
    """Shrink ``original`` (a failing run of property ``prop``) within ``max_runs`` schedules
    and ``max_seconds``. ``base_config()`` is the seed's own configuration (the plan's values
    are what changes it); ``run(plan)`` runs a plan of the same seed."""
    started = time.perf_counter()
    best = original
    runs = 0
    stopped = False
    tried: set[Plan] = {original.plan}  # (a plan that did not shrink once will not again)

    def budget_left() -> bool:
        nonlocal stopped
        if runs >= max_runs or time.perf_counter() - started >= max_seconds:
            stopped = True
        return not stopped

    def attempt(plan: Plan) -> bool:
        """Run ``plan``; keep it if it still fails the same way and is smaller."""
        nonlocal best, runs
        plan = Plan(tuple(sorted(plan.overrides)), plan.keep)
        if plan in tried:
            return False
        tried.add(plan)
        runs += 1
        got = outcome(run, plan, prop)
        smaller = got.faults < best.faults or got.steps < best.steps
        if got.failed and got.faults <= best.faults and got.steps <= original.steps and smaller:
            best = got
            return True
        got.world = None  # (its history is garbage now)
        return False

    def kept() -> list[int]:
        if best.plan.keep is not None:
            return list(best.plan.keep)
        assert best.world is not None
        return [i for i, (_, _, k) in enumerate(best.world.history.plan) if k]

    def shrink_faults() -> bool:
        """ddmin over the kept faults: none; then each of n chunks left out, n = 2, 4, ..."""
        progress = False
        faults = kept()
        if faults and budget_left() and attempt(replace(best.plan, keep=())):
            return True
        n = 2
        while len(faults) >= 2 and budget_left():
            size = -(-len(faults) // n)
            chunks = [faults[i : i + size] for i in range(0, len(faults), size)]
            for chunk in chunks:
                if not budget_left():
                    break
                rest = tuple(i for i in faults if i not in chunk)
                if attempt(replace(best.plan, keep=rest)):
                    faults = list(rest)
                    n = max(n - 1, 2)
                    progress = True
                    break
            else:
                if n >= len(faults):
                    break
                n = min(n * 2, len(faults))
        if len(faults) == 1 and budget_left() and attempt(replace(best.plan, keep=())):
            progress = True
        return progress

    def shrink_config() -> bool:
        progress = False
        config = apply_plan(base_config(), best.plan)
        for name, value in list(_config_candidates(config)):
            if not budget_left():
                break
            current = apply_plan(base_config(), best.plan)
            if _not_smaller(getattr(current, name), value):
                continue  # an earlier candidate of this field went further
            if attempt(best.plan.with_value(name, value)):
                progress = True
        return progress

    while original.failed and budget_left():
        moved = shrink_faults()
        moved = shrink_config() or moved
        if not moved:
            break
    return ShrinkResult(
        prop=prop,
        original=original,
        shrunk=best,
        runs=runs,
        seconds=time.perf_counter() - started,
        complete=not stopped,
    )


def _not_smaller(current: Any, candidate: Any) -> bool:
    if isinstance(current, tuple):
        return len(candidate) >= len(current)
    if isinstance(current, bool):
        return not current
    return bool(candidate >= current)

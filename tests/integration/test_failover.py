"""The famous failover double grant, measured on real processes (a few trials of
``benchmarks/failover.py``): the primary is killed right after a grant that never reached
its replicas. Without ``replicas``, the promoted replica grants the lock again and the fence
refuses the stale holder's write; with ``replicas=1`` the unreplicated grant is never handed
out, so there is no double grant."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

TRIALS = 1


def _benchmark() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "failover.py"
    spec = importlib.util.spec_from_file_location("fencelock_failover_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rig(fencelock_server_binary: str) -> Iterator[Any]:
    made = _benchmark().Rig(fencelock_server_binary)
    try:
        yield made
    finally:
        made.close()


def test_without_replicas_a_lost_grant_is_granted_again_and_the_fence_refuses_the_stale_holder(
    rig: Any,
) -> None:
    results = _benchmark().run(TRIALS, 0, True, rig)
    assert all(r.a_granted for r in results)
    doubles = [r for r in results if r.double_grant]
    assert doubles, results  # the promoted replica never saw A's grant: B gets it too
    assert all(r.stale_refused for r in doubles), results


def test_with_replicas_1_an_unreplicated_grant_is_not_handed_out_so_no_double_grant(
    rig: Any,
) -> None:
    bench = _benchmark()
    stalled = bench.run(TRIALS, 1, True, rig)
    assert not any(r.a_granted for r in stalled), stalled  # WAIT saw no replica
    assert all(r.b_granted for r in stalled), stalled  # the lock was free after the failover
    natural = bench.run(1, 1, False, rig)
    assert all(r.a_granted and not r.b_granted for r in natural), natural  # the hold survived
    assert not any(r.double_grant for r in stalled + natural)

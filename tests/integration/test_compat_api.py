"""Issue 26 §6, the API bits beside the compat shapes: ``fencelock.Election`` (and
``fencelock.asyncio.Election``) at the top, ``Semaphore.hold()`` typed as giving a ``Permit``,
and ``with lock:`` documented as the un-renewed form."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import fencelock
import fencelock.asyncio
from fencelock.election import AsyncElection, Election

ROOT = Path(__file__).resolve().parents[2]


def test_election_is_a_top_level_name_of_both_front_ends() -> None:
    assert fencelock.Election is Election
    assert fencelock.asyncio.Election is AsyncElection
    assert "Election" in fencelock.__all__
    assert "Election" in fencelock.asyncio.__all__


def test_a_top_level_election_campaigns(topologies: Any, key: str) -> None:
    url = topologies.urls(1)[0]
    election = fencelock.Election(fencelock.Lock(url, key, ttl=5), "host-1")
    with election.campaign(wait=10) as term:
        leader = election.leader()
        assert leader is not None and leader.name == "host-1" and leader.fence == term.fence

    async def main() -> None:
        lock = fencelock.asyncio.Lock(url, key, ttl=5)
        running = fencelock.asyncio.Election(lock, "host-2")
        async with running.campaign(wait=10) as term:
            leader = await running.leader()
            assert leader is not None and leader.name == "host-2"
            assert leader.fence == term.fence

    asyncio.run(main())


def test_semaphore_hold_gives_a_permit_on_both_front_ends(topologies: Any, key: str) -> None:
    url = topologies.urls(1)[0]
    with fencelock.Semaphore(url, key, 2, ttl=5).hold(wait=5) as permit:
        assert isinstance(permit, fencelock.Permit) and permit.slot in (0, 1)

    async def main() -> None:
        async with fencelock.asyncio.Semaphore(url, key, 2, ttl=5).hold(wait=5) as permit:
            assert isinstance(permit, fencelock.asyncio.Permit) and permit.slot in (0, 1)

    asyncio.run(main())


def test_semaphore_hold_is_typed_as_giving_a_permit(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    snippet = tmp_path / "uses_hold.py"
    snippet.write_text(
        textwrap.dedent(
            """
            from typing_extensions import assert_type

            import fencelock
            import fencelock.asyncio


            def blocking(sem: fencelock.Semaphore) -> None:
                with sem.hold(wait=5) as permit:
                    assert_type(permit, fencelock.Permit)


            async def awaiting(sem: fencelock.asyncio.Semaphore) -> None:
                async with sem.hold(wait=5) as permit:
                    assert_type(permit, fencelock.asyncio.Permit)
            """
        )
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(snippet),
        ],
        cwd=ROOT,
        env={"MYPYPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_with_lock_is_documented_as_the_un_renewed_form() -> None:
    for method in (fencelock.Lock.__enter__, fencelock.asyncio.Lock.__aenter__):
        doc = method.__doc__ or ""
        assert "un-renewed" in doc and ":meth:`hold`" in doc, method

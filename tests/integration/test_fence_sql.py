"""The SQL fencing guard on SQLite and on a real PostgreSQL server.

PostgreSQL is expected at 127.0.0.1:5432, database ``test`` (trust auth, user ``postgres`` or
``root``; ``$FENCELOCK_POSTGRES_URL`` overrides). If it cannot be reached the PostgreSQL cases
fail with a clear message, unless ``FENCELOCK_SKIP_POSTGRES=1`` says to skip them.
"""

from __future__ import annotations

import os
import random
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sa = pytest.importorskip("sqlalchemy")

from fencelock import ConfigError, StaleFence  # noqa: E402
from fencelock.fence import (  # noqa: E402
    MissingRow,
    execute_fenced,
    fence_column,
    fenced_update,
)

BASE = 1_800_000_000_000_000  # fences look like server TIME in microseconds: > 2^31
PG_URLS = [
    "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "postgresql+psycopg://root@127.0.0.1:5432/test",
]


def _postgres_engine() -> Any:
    urls = (
        [os.environ["FENCELOCK_POSTGRES_URL"]]
        if os.environ.get("FENCELOCK_POSTGRES_URL")
        else PG_URLS
    )
    errors = []
    for url in urls:
        engine = sa.create_engine(url, connect_args={"connect_timeout": 5}, pool_size=10)
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("select 1"))
        except Exception as exc:
            errors.append(f"{url}: {type(exc).__name__}: {exc}".strip())
            engine.dispose()
            continue
        return engine
    message = "PostgreSQL is unreachable (" + "; ".join(errors) + ")"
    if os.environ.get("FENCELOCK_SKIP_POSTGRES") == "1":
        pytest.skip(message + "; skipped because FENCELOCK_SKIP_POSTGRES=1")
    pytest.fail(
        message + ". Start it (database 'test' on 127.0.0.1:5432) or set "
        "FENCELOCK_SKIP_POSTGRES=1 to skip these tests on purpose.",
        pytrace=False,
    )


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    if request.param == "sqlite":
        path: Path = tmp_path_factory.mktemp("fence_sql") / "fence.db"
        # a file, so each thread has its own connection; wait up to 30 s for the write lock
        eng = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 30})
    else:
        eng = _postgres_engine()
    yield eng
    eng.dispose()


@pytest.fixture
def table(engine: Any) -> Iterator[Any]:
    """A fresh table per test (unique name), dropped afterwards."""
    metadata = sa.MetaData()
    t = sa.Table(
        f"fence_test_{uuid.uuid4().hex[:12]}",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("value", sa.String(200), nullable=False),
        fence_column(),
    )
    metadata.create_all(engine)
    try:
        yield t
    finally:
        metadata.drop_all(engine)


def insert(engine: Any, table: Any, row_id: int, value: str, fence: int | None = None) -> None:
    row: dict[str, Any] = {"id": row_id, "value": value}
    if fence is not None:
        row["fence"] = fence
    with engine.begin() as conn:
        conn.execute(table.insert().values(**row))


def row(engine: Any, table: Any, row_id: int) -> tuple[str, int | None] | None:
    with engine.connect() as conn:
        found = conn.execute(
            sa.select(table.c.value, table.c.fence).where(table.c.id == row_id)
        ).one_or_none()
    return None if found is None else (found[0], found[1])


def write(engine: Any, table: Any, row_id: int, fence: int, value: str) -> int:
    with engine.begin() as conn:
        return execute_fenced(conn, table, fence, table.c.id == row_id, values={"value": value})


def test_fence_column_is_a_bigint_defaulting_to_zero(engine: Any, table: Any) -> None:
    assert isinstance(table.c.fence.type, sa.BigInteger)
    assert table.c.fence.nullable is False
    insert(engine, table, 1, "new")
    assert row(engine, table, 1) == ("new", 0)
    with engine.connect() as conn:  # the server-side default too (a row inserted by plain SQL)
        conn.execute(sa.text(f"INSERT INTO {table.name} (id, value) VALUES (2, 'raw')"))
        conn.commit()
    assert row(engine, table, 2) == ("raw", 0)


def test_equal_and_greater_fences_are_accepted(engine: Any, table: Any) -> None:
    insert(engine, table, 1, "initial")
    assert write(engine, table, 1, BASE, "a") == 1
    assert row(engine, table, 1) == ("a", BASE)
    assert write(engine, table, 1, BASE, "b") == 1  # same lease, second write
    assert row(engine, table, 1) == ("b", BASE)
    assert write(engine, table, 1, BASE + 1, "c") == 1
    assert row(engine, table, 1) == ("c", BASE + 1)


def test_older_fence_is_refused_and_the_row_unchanged(engine: Any, table: Any) -> None:
    insert(engine, table, 1, "new holder", fence=BASE + 34)
    insert(engine, table, 2, "other row", fence=BASE)
    with pytest.raises(StaleFence) as info:
        write(engine, table, 1, BASE + 33, "paused holder")
    exc = info.value
    assert (exc.offered, exc.current) == (BASE + 33, BASE + 34)
    assert table.name in exc.resource and "id = 1" in exc.resource
    assert row(engine, table, 1) == ("new holder", BASE + 34)
    assert row(engine, table, 2) == ("other row", BASE)


def test_missing_row_is_told_apart_from_a_stale_fence(engine: Any, table: Any) -> None:
    insert(engine, table, 1, "present", fence=BASE)
    with pytest.raises(MissingRow) as info:
        write(engine, table, 99, BASE + 1, "nobody")
    assert isinstance(info.value, LookupError)
    assert not isinstance(info.value, StaleFence)
    assert "id = 99" in info.value.resource
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 1
    assert row(engine, table, 1) == ("present", BASE)


def test_fences_above_32_bits_are_exact(engine: Any, table: Any) -> None:
    insert(engine, table, 1, "x")
    top = 2**63 - 1
    assert write(engine, table, 1, top - 1, "near the top") == 1
    assert row(engine, table, 1) == ("near the top", top - 1)
    assert write(engine, table, 1, top, "top") == 1
    with pytest.raises(StaleFence):
        write(engine, table, 1, top - 1, "one below")
    assert row(engine, table, 1) == ("top", top)


def test_fenced_update_statement_can_be_run_by_hand(engine: Any, table: Any) -> None:
    insert(engine, table, 1, "old", fence=BASE + 5)
    stale = fenced_update(table, BASE + 4, table.c.id == 1, values={"value": "stale"})
    sql = str(stale.compile())
    assert "fence <=" in sql and "SET" in sql
    with engine.begin() as conn:
        assert conn.execute(stale).rowcount == 0
    fresh = fenced_update(table, BASE + 6, table.c.id == 1, values={table.c.value: "fresh"})
    with engine.begin() as conn:
        assert conn.execute(fresh).rowcount == 1
    assert row(engine, table, 1) == ("fresh", BASE + 6)


def test_rows_with_a_newer_fence_are_left_alone(engine: Any, table: Any) -> None:
    insert(engine, table, 1, "a", fence=BASE)
    insert(engine, table, 2, "b", fence=BASE + 10)
    with engine.begin() as conn:
        assert (
            execute_fenced(conn, table, BASE + 5, table.c.id.in_([1, 2]), values={"value": "z"})
            == 1
        )
    assert row(engine, table, 1) == ("z", BASE + 5)
    assert row(engine, table, 2) == ("b", BASE + 10)


@pytest.fixture
def nullable_table(engine: Any) -> Iterator[Any]:
    """A table whose fence column allows NULL, as ``ALTER TABLE t ADD COLUMN fence BIGINT``
    leaves the rows that existed before (a fresh table per test, dropped afterwards)."""
    metadata = sa.MetaData()
    t = sa.Table(
        f"fence_null_{uuid.uuid4().hex[:12]}",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("value", sa.String(200), nullable=False),
        sa.Column("fence", sa.BigInteger(), nullable=True),
    )
    metadata.create_all(engine)
    try:
        yield t
    finally:
        metadata.drop_all(engine)


def test_a_null_fence_counts_as_no_fence_yet_and_the_first_write_sets_it(
    engine: Any, nullable_table: Any
) -> None:
    t = nullable_table
    insert(engine, t, 1, "before fencing")  # fence NULL
    assert row(engine, t, 1) == ("before fencing", None)
    assert write(engine, t, 1, BASE, "first fenced") == 1
    assert row(engine, t, 1) == ("first fenced", BASE)
    with pytest.raises(StaleFence) as info:  # from now on the row is fenced as usual
        write(engine, t, 1, BASE - 1, "older")
    assert (info.value.offered, info.value.current) == (BASE - 1, BASE)
    assert write(engine, t, 1, BASE, "same lease") == 1
    assert row(engine, t, 1) == ("same lease", BASE)


def test_a_null_fence_accepts_even_fence_zero(engine: Any, nullable_table: Any) -> None:
    t = nullable_table
    insert(engine, t, 1, "unfenced")
    assert write(engine, t, 1, 0, "zero") == 1
    assert row(engine, t, 1) == ("zero", 0)


def test_null_rows_are_written_and_newer_rows_left_alone(engine: Any, nullable_table: Any) -> None:
    t = nullable_table
    insert(engine, t, 1, "null")
    insert(engine, t, 2, "newer", fence=BASE + 10)
    insert(engine, t, 3, "older", fence=BASE)
    with engine.begin() as conn:
        updated = execute_fenced(conn, t, BASE + 5, t.c.id.in_([1, 2, 3]), values={"value": "z"})
    assert updated == 2
    assert row(engine, t, 1) == ("z", BASE + 5)
    assert row(engine, t, 2) == ("newer", BASE + 10)
    assert row(engine, t, 3) == ("z", BASE + 5)


def test_fenced_update_run_by_hand_writes_a_null_fence_row(
    engine: Any, nullable_table: Any
) -> None:
    t = nullable_table
    insert(engine, t, 1, "null")
    with engine.begin() as conn:
        statement = fenced_update(t, BASE, t.c.id == 1, values={"value": "set"})
        assert conn.execute(statement).rowcount == 1
    assert row(engine, t, 1) == ("set", BASE)


def test_a_missing_row_is_still_missing_next_to_null_rows(engine: Any, nullable_table: Any) -> None:
    t = nullable_table
    insert(engine, t, 1, "null")
    with pytest.raises(MissingRow):
        write(engine, t, 2, BASE, "nobody")
    assert row(engine, t, 1) == ("null", None)


BAD: list[tuple[str, Any]] = [
    ("negative fence", lambda t: fenced_update(t, -1, t.c.id == 1, values={"value": "v"})),
    ("bool fence", lambda t: fenced_update(t, True, t.c.id == 1, values={"value": "v"})),
    ("float fence", lambda t: fenced_update(t, 1.5, t.c.id == 1, values={"value": "v"})),  # type: ignore[arg-type]
    ("no where", lambda t: fenced_update(t, 1, values={"value": "v"})),
    ("empty values", lambda t: fenced_update(t, 1, t.c.id == 1, values={})),
    ("sets the fence", lambda t: fenced_update(t, 1, t.c.id == 1, values={"fence": 9})),
    ("unknown column", lambda t: fenced_update(t, 1, t.c.id == 1, values={"nope": 1})),
    (
        "no fence column",
        lambda t: fenced_update(t, 1, t.c.id == 1, values={"value": "v"}, fence_column="f"),
    ),
    ("not a table", lambda t: fenced_update("t", 1, t.c.id == 1, values={"value": "v"})),  # type: ignore[arg-type]
    ("empty column name", lambda t: fence_column("")),
]


@pytest.mark.parametrize("make", [b[1] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_raises_config_error_and_changes_nothing(
    engine: Any, table: Any, make: Any
) -> None:
    insert(engine, table, 1, "kept", fence=BASE)
    with pytest.raises(ConfigError):
        make(table)
    with engine.begin() as conn, pytest.raises(ConfigError):
        execute_fenced(conn, table, -1, table.c.id == 1, values={"value": "v"})
    assert row(engine, table, 1) == ("kept", BASE)


@dataclass(frozen=True)
class Attempt:
    offered: int
    value: str
    accepted: bool
    current: int


def test_concurrent_writers_threads_random_fences(engine: Any, table: Any) -> None:
    insert(engine, table, 1, "initial")
    writers, per_writer = 8, 40
    results: list[list[Attempt]] = [[] for _ in range(writers)]
    start = threading.Barrier(writers, timeout=30)
    errors: list[BaseException] = []

    def run(w: int) -> None:
        rng = random.Random(w)
        try:
            start.wait()
            for i in range(per_writer):
                offered = BASE + rng.randrange(150)
                value = f"{w}:{i}:{offered}"
                with engine.begin() as conn:  # each write: its own connection and transaction
                    try:
                        execute_fenced(
                            conn, table, offered, table.c.id == 1, values={"value": value}
                        )
                    except StaleFence as exc:
                        results[w].append(Attempt(offered, value, False, exc.current))
                    else:
                        results[w].append(Attempt(offered, value, True, offered))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive()
    assert not errors, errors
    attempts = [a for chunk in results for a in chunk]
    assert len(attempts) == writers * per_writer
    offered = {a.offered for a in attempts}
    top = max(offered)
    final = row(engine, table, 1)
    assert final is not None
    assert final[1] == top
    assert final[0] in {a.value for a in attempts if a.accepted and a.offered == top}
    assert all(a.accepted for a in attempts if a.offered == top)
    refusals = [a for a in attempts if not a.accepted]
    assert refusals
    for a in refusals:
        assert a.offered < a.current and a.current in offered

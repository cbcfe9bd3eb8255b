"""The SQL fencing guard on SQLite and on a real PostgreSQL server.

PostgreSQL is expected at 127.0.0.1:5432, database ``test`` (trust auth, user ``postgres`` or
``root``; ``$FENCELOCK_POSTGRES_URL`` overrides). If it cannot be reached the PostgreSQL cases
fail with a clear message, unless ``FENCELOCK_SKIP_POSTGRES=1`` says to skip them.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sa = pytest.importorskip("sqlalchemy")
sa_orm = pytest.importorskip("sqlalchemy.orm")

from fencelock import ConfigError, StaleFence  # noqa: E402
from fencelock.fence import (  # noqa: E402
    EqualFence,
    MissingRow,
    execute_fenced,
    execute_fenced_delete,
    fence_column,
    fence_token_column,
    fenced_update,
    tombstone_column,
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


def test_a_multi_row_write_is_refused_whole_when_one_row_is_newer(engine: Any, table: Any) -> None:
    """The newer holder wrote row 2 only; the stale holder's write of rows 1 and 2 is refused
    as a whole (StaleFence, not success for row 1), so nothing after it in its transaction
    runs as if it held the fence (issue 21, item 22)."""
    insert(engine, table, 1, "a", fence=BASE)
    insert(engine, table, 2, "b", fence=BASE + 10)
    with engine.begin() as conn, pytest.raises(StaleFence) as info:
        execute_fenced(conn, table, BASE + 5, table.c.id.in_([1, 2]), values={"value": "z"})
    assert (info.value.offered, info.value.current) == (BASE + 5, BASE + 10)
    assert row(engine, table, 1) == ("a", BASE)
    assert row(engine, table, 2) == ("b", BASE + 10)
    # the statement alone is all-or-none too (for callers who run it by hand)
    with engine.begin() as conn:
        stale = fenced_update(table, BASE + 5, table.c.id.in_([1, 2]), values={"value": "z"})
        assert conn.execute(stale).rowcount == 0
    assert row(engine, table, 1) == ("a", BASE)
    # every row accepting: all written
    with engine.begin() as conn:
        assert (
            execute_fenced(conn, table, BASE + 10, table.c.id.in_([1, 2]), values={"value": "y"})
            == 2
        )
    assert row(engine, table, 1) == ("y", BASE + 10)
    assert row(engine, table, 2) == ("y", BASE + 10)


def test_a_text_condition_naming_the_table_is_guarded_the_same(engine: Any, table: Any) -> None:
    """``where`` as SQL text that names the table: the all-or-none check reads the same rows
    (not every row of the table)."""
    insert(engine, table, 1, "a", fence=BASE)
    insert(engine, table, 2, "b", fence=BASE + 10)
    insert(engine, table, 3, "c", fence=BASE + 99)  # newer, but not named by the condition
    both = sa.text(f"{table.name}.id IN (1, 2)")
    with engine.begin() as conn, pytest.raises(StaleFence) as info:
        execute_fenced(conn, table, BASE + 5, both, values={"value": "z"})
    assert info.value.current == BASE + 10
    assert row(engine, table, 1) == ("a", BASE)
    with engine.begin() as conn:
        assert execute_fenced(conn, table, BASE + 10, both, values={"value": "y"}) == 2
    assert row(engine, table, 1) == ("y", BASE + 10)
    assert row(engine, table, 3) == ("c", BASE + 99)


@pytest.mark.parametrize("via", ["connection", "session"])
def test_a_refused_multi_row_write_leaves_no_row_written_when_the_caller_commits(
    engine: Any, table: Any, via: str
) -> None:
    """Racing writers: the newer holder B updates row 2 and keeps its transaction open; the
    stale holder A writes rows 1 and 2 (it waits for B's row lock, or SQLite's write lock),
    then B commits. A gets StaleFence, catches it and commits its transaction: row 1 must not
    carry A's write (on PostgreSQL the savepoint around the UPDATE is rolled back)."""
    insert(engine, table, 1, "a", fence=BASE)
    insert(engine, table, 2, "b", fence=BASE)
    b_wrote, outcome = threading.Event(), {}

    def newer_holder() -> None:
        with engine.begin() as conn:
            execute_fenced(conn, table, BASE + 20, table.c.id == 2, values={"value": "B"})
            b_wrote.set()
            outcome["a_waited"] = _wait_until_blocked(engine, table)

    def stale_holder() -> None:
        assert b_wrote.wait(30)
        with contextlib.ExitStack() as stack:
            if via == "connection":
                conn: Any = stack.enter_context(engine.begin())
            else:
                conn = stack.enter_context(sa_orm.Session(engine))
                stack.enter_context(conn.begin())
            try:
                execute_fenced(
                    conn, table, BASE + 10, table.c.id.in_([1, 2]), values={"value": "A"}
                )
                outcome["a"] = "accepted"
            except StaleFence as exc:
                outcome["a"] = (exc.offered, exc.current)
            conn.execute(table.update().where(table.c.id == 99).values(value="later"))

    threads = [threading.Thread(target=newer_holder), threading.Thread(target=stale_holder)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert outcome["a"] == (BASE + 10, BASE + 20)
    assert row(engine, table, 1) == ("a", BASE)
    assert row(engine, table, 2) == ("B", BASE + 20)
    if engine.dialect.name == "postgresql":
        assert outcome["a_waited"], "A's UPDATE never waited for B's row lock"


def _wait_until_blocked(engine: Any, table: Any) -> bool:
    """PostgreSQL: until a statement on ``table`` waits for a lock (bounded: 10 s). SQLite:
    half a second (its waiting writer is not visible from outside)."""
    if engine.dialect.name != "postgresql":
        time.sleep(0.5)
        return False
    deadline = time.monotonic() + 10
    with engine.connect() as probe:
        while time.monotonic() < deadline:
            waiting = probe.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE :name"
                ),
                {"name": f"%{table.name}%"},
            ).scalar()
            probe.rollback()
            if waiting:
                return True
            time.sleep(0.02)
    return False


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


def test_null_rows_do_not_save_a_write_refused_by_a_newer_row(
    engine: Any, nullable_table: Any
) -> None:
    t = nullable_table
    insert(engine, t, 1, "null")
    insert(engine, t, 2, "newer", fence=BASE + 10)
    insert(engine, t, 3, "older", fence=BASE)
    with engine.begin() as conn, pytest.raises(StaleFence):
        execute_fenced(conn, t, BASE + 5, t.c.id.in_([1, 2, 3]), values={"value": "z"})
    assert row(engine, t, 1) == ("null", None)
    assert row(engine, t, 2) == ("newer", BASE + 10)
    assert row(engine, t, 3) == ("older", BASE)
    with engine.begin() as conn:
        updated = execute_fenced(conn, t, BASE + 5, t.c.id.in_([1, 3]), values={"value": "z"})
    assert updated == 2
    assert row(engine, t, 1) == ("z", BASE + 5)
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


# --- the lease's token beside the fence (issue 23, finding 1) -----------------------------------


@pytest.fixture
def token_table(engine: Any) -> Iterator[Any]:
    """A table with a fence, a token and a tombstone column (fresh per test, dropped after)."""
    metadata = sa.MetaData()
    t = sa.Table(
        f"fence_tok_{uuid.uuid4().hex[:12]}",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("value", sa.String(200), nullable=False),
        fence_column(),
        fence_token_column(),
        tombstone_column(),
    )
    metadata.create_all(engine)
    try:
        yield t
    finally:
        metadata.drop_all(engine)


def token_write(engine: Any, t: Any, row_id: int, fence: int, value: str, token: str | None) -> int:
    with engine.begin() as conn:
        return execute_fenced(
            conn, t, fence, t.c.id == row_id, values={"value": value}, token=token
        )


def token_row(engine: Any, t: Any, row_id: int) -> tuple[Any, ...] | None:
    with engine.connect() as conn:
        found = conn.execute(
            sa.select(t.c.value, t.c.fence, t.c.fence_token, t.c.deleted).where(t.c.id == row_id)
        ).one_or_none()
    return None if found is None else tuple(found)


def test_an_equal_fence_from_another_lease_is_refused(engine: Any, token_table: Any) -> None:
    t = token_table
    insert(engine, t, 1, "initial")
    assert token_write(engine, t, 1, BASE, "new holder", "lease-b") == 1
    assert token_row(engine, t, 1) == ("new holder", BASE, "lease-b", False)
    for token in ("lease-a", None):  # another lease, or a write without a token
        with pytest.raises(EqualFence) as info:
            token_write(engine, t, 1, BASE, "stale holder", token)
        assert isinstance(info.value, StaleFence)
        assert (info.value.offered, info.value.current) == (BASE, BASE)
        assert token_row(engine, t, 1) == ("new holder", BASE, "lease-b", False)
    with engine.begin() as conn:  # the statement alone refuses it too
        stale = fenced_update(t, BASE, t.c.id == 1, values={"value": "x"}, token="lease-a")
        assert conn.execute(stale).rowcount == 0
    assert token_write(engine, t, 1, BASE, "new holder again", "lease-b") == 1  # same lease
    assert token_write(engine, t, 1, BASE + 1, "newer, no token", None) == 1
    assert token_row(engine, t, 1) == ("newer, no token", BASE + 1, None, False)
    assert token_write(engine, t, 1, BASE + 1, "no token again", None) == 1  # old rule
    with pytest.raises(EqualFence):
        token_write(engine, t, 1, BASE + 1, "a token now", "lease-c")


def test_a_table_without_a_token_column_keeps_the_old_rule(engine: Any, table: Any) -> None:
    insert(engine, table, 1, "initial")
    assert write(engine, table, 1, BASE, "a") == 1
    assert write(engine, table, 1, BASE, "b") == 1  # equal: accepted, nothing to tell apart
    with engine.begin() as conn, pytest.raises(ConfigError):
        execute_fenced(conn, table, BASE, table.c.id == 1, values={"value": "c"}, token="t")
    assert row(engine, table, 1) == ("b", BASE)


def test_fences_near_2_pow_53_and_2_pow_63_are_exact(engine: Any, token_table: Any) -> None:
    t = token_table
    pairs = ((2**53, 2**53 + 1), (2**53 - 1, 2**53), (2**63 - 2, 2**63 - 1))
    for n, (low, high) in enumerate(pairs):
        insert(engine, t, n, "x")
        assert token_write(engine, t, n, high, "high", "lease") == 1
        with pytest.raises(StaleFence) as info:
            token_write(engine, t, n, low, "low", "lease")
        assert not isinstance(info.value, EqualFence)
        assert (info.value.offered, info.value.current) == (low, high)
        assert type(info.value.current) is int
        found = token_row(engine, t, n)
        assert found is not None and found[1] == high and type(found[1]) is int
        with pytest.raises(EqualFence):
            token_write(engine, t, n, high, "same fence, other lease", "other")


def test_racing_leases_with_shared_fences_one_lease_per_fence(
    engine: Any, token_table: Any
) -> None:
    """6 writers, each a lease of its own, offering fences from a small range: for every fence
    the table accepted one lease only."""
    t = token_table
    insert(engine, t, 1, "initial")
    writers, per_writer = 6, 30
    accepted: list[list[tuple[int, str]]] = [[] for _ in range(writers)]
    equal_refusals: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(writers, timeout=30)

    def run(w: int) -> None:
        rng, token = random.Random(500 + w), f"lease-{w}"
        try:
            start.wait()
            for i in range(per_writer):
                offered = BASE + rng.randrange(12)
                try:
                    token_write(engine, t, 1, offered, f"{token}:{i}", token)
                except EqualFence:
                    equal_refusals.append(offered)
                except StaleFence:
                    pass
                else:
                    accepted[w].append((offered, token))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
        assert not th.is_alive()
    assert not errors, errors
    leases: dict[int, set[str]] = {}
    for chunk in accepted:
        for offered, token in chunk:
            leases.setdefault(offered, set()).add(token)
    assert leases and all(len(tokens) == 1 for tokens in leases.values())
    assert equal_refusals, "the small fence range should have made leases share fences"
    final = token_row(engine, t, 1)
    assert final is not None and final[1] == max(leases)
    assert {final[2]} == leases[final[1]]


# --- deleting: a tombstone keeps the fence (issue 21, item 24) ----------------------------------


def test_a_fenced_delete_leaves_a_tombstone_a_stale_holder_cannot_revive(
    engine: Any, token_table: Any
) -> None:
    t = token_table
    insert(engine, t, 1, "order")
    assert token_write(engine, t, 1, BASE + 1, "stale holder's write", "a") == 1
    with engine.begin() as conn:  # the newer holder deletes the row
        assert execute_fenced_delete(conn, t, BASE + 2, t.c.id == 1, token="b") == 1
    assert token_row(engine, t, 1) == ("stale holder's write", BASE + 2, "b", True)
    # the stale holder cannot update it back ...
    with pytest.raises(StaleFence) as info:
        token_write(engine, t, 1, BASE + 1, "revived", "a")
    assert (info.value.offered, info.value.current) == (BASE + 1, BASE + 2)
    # ... nor re-create it: the tombstone still holds the primary key
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(t.insert().values(id=1, value="re-created", fence=BASE + 1))
    with engine.begin() as conn, pytest.raises(StaleFence):
        execute_fenced_delete(conn, t, BASE + 1, t.c.id == 1, token="a")
    assert token_row(engine, t, 1) == ("stale holder's write", BASE + 2, "b", True)
    # a newer holder brings it back
    with engine.begin() as conn:
        execute_fenced(
            conn, t, BASE + 3, t.c.id == 1, values={"value": "back", "deleted": False}, token="c"
        )
    assert token_row(engine, t, 1) == ("back", BASE + 3, "c", False)


def test_a_fenced_delete_needs_a_tombstone_column(engine: Any, table: Any) -> None:
    insert(engine, table, 1, "kept", fence=BASE)
    with engine.begin() as conn, pytest.raises(ConfigError):
        execute_fenced_delete(conn, table, BASE + 1, table.c.id == 1)
    with engine.begin() as conn, pytest.raises(ConfigError):
        execute_fenced_delete(conn, "t", BASE + 1, table.c.id == 1)  # type: ignore[arg-type]
    assert row(engine, table, 1) == ("kept", BASE)


def test_token_arguments_are_checked_before_anything_is_sent(
    engine: Any, token_table: Any
) -> None:
    t = token_table
    insert(engine, t, 1, "kept", fence=BASE)
    bad: list[Any] = [
        lambda: fenced_update(t, BASE + 1, t.c.id == 1, values={"value": "v"}, token=""),
        lambda: fenced_update(t, BASE + 1, t.c.id == 1, values={"value": "v"}, token=b"t"),
        lambda: fenced_update(t, BASE + 1, t.c.id == 1, values={"value": "v"}, token="t" * 256),
        lambda: fenced_update(t, BASE + 1, t.c.id == 1, values={"fence_token": "t"}),
        lambda: fenced_update(
            t, BASE + 1, t.c.id == 1, values={"value": "v"}, token="t", token_column="nope"
        ),
        lambda: fenced_update(t, BASE + 1, t.c.id == 1, values={"value": "v"}, token_column=""),
        lambda: fence_token_column(""),
        lambda: tombstone_column(""),
    ]
    for make in bad:
        with pytest.raises(ConfigError):
            make()
    assert token_row(engine, t, 1) == ("kept", BASE, None, False)


# --- isolation levels (issue 21, item 23) --------------------------------------------------------


def _serialization_failure(exc: BaseException) -> bool:
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == "40001"


def _run_retrying(engine: Any, attempt: Any, tries: int = 3) -> tuple[list[str], Any]:
    """The documented recipe: run the transaction again after a serialization failure.
    Returns what each try raised (by kind) and the last try's result or exception."""
    seen: list[str] = []
    for _ in range(tries):
        try:
            with engine.begin() as conn:
                result = attempt(conn)
        except sa.exc.OperationalError as exc:
            if not _serialization_failure(exc):
                raise
            seen.append("serialization failure")
            continue
        except StaleFence as exc:
            seen.append("StaleFence")
            return seen, exc
        seen.append("ok")
        return seen, result
    return seen, None


@pytest.fixture(scope="module")
def pg_engine() -> Iterator[Any]:
    eng = _postgres_engine()
    yield eng
    eng.dispose()


@pytest.fixture
def pg_table(pg_engine: Any) -> Iterator[Any]:
    metadata = sa.MetaData()
    t = sa.Table(
        f"fence_iso_{uuid.uuid4().hex[:12]}",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("value", sa.String(200), nullable=False),
        fence_column(),
    )
    metadata.create_all(pg_engine)
    try:
        yield t
    finally:
        metadata.drop_all(pg_engine)


def _race_pg(
    engine: Any, leveled: Any, table: Any, first: int, second: int
) -> tuple[bool, tuple[list[str], Any]]:
    """Writer 1 (fence ``first``) updates row 1 and commits once writer 2 (fence ``second``,
    retrying after serialization failures) waits for its row lock. Returns whether writer 2
    was seen waiting, and what it saw."""
    first_wrote, result = threading.Event(), {}

    def writer_first() -> None:
        with leveled.begin() as conn:
            execute_fenced(conn, table, first, table.c.id == 1, values={"value": "first"})
            first_wrote.set()
            result["waited"] = _wait_until_blocked(engine, table)

    def writer_second() -> None:
        assert first_wrote.wait(30)
        result["second"] = _run_retrying(
            leveled,
            lambda conn: execute_fenced(
                conn, table, second, table.c.id == 1, values={"value": "second"}
            ),
        )

    threads = [threading.Thread(target=writer_first), threading.Thread(target=writer_second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    return result["waited"], result["second"]


@pytest.mark.parametrize("level", ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"])
def test_two_racing_writers_under_each_isolation_level(
    pg_engine: Any, pg_table: Any, level: str
) -> None:
    """PostgreSQL: writer 1 updates the row and holds its transaction open until writer 2's
    UPDATE waits for the row lock, then commits. Under READ COMMITTED writer 2 gets its answer
    at once (StaleFence, or success for a newer fence); under REPEATABLE READ and SERIALIZABLE
    the database refuses it with a serialization failure (SQLSTATE 40001), and the retry the
    docs prescribe gets the same answer. The older fence never lands after the newer one."""
    engine, table = pg_engine, pg_table  # SQLite has one writer at a time: nothing to race
    leveled = engine.execution_options(isolation_level=level)
    for first, second in ((BASE + 20, BASE + 10), (BASE + 10, BASE + 20)):
        with engine.begin() as conn:
            conn.execute(table.delete())
        insert(engine, table, 1, "initial", fence=BASE)
        waited, (seen, last) = _race_pg(engine, leveled, table, first, second)
        assert waited, "writer 2 never waited for writer 1's row lock"
        before = [] if level == "READ COMMITTED" else ["serialization failure"]
        if first > second:  # the older fence comes second: refused
            assert seen == [*before, "StaleFence"]
            assert (last.offered, last.current) == (second, first)
            assert row(engine, table, 1) == ("first", first)
        else:  # the newer fence comes second: accepted (after one retry under RR/SER)
            assert seen == [*before, "ok"]
            assert last == 1
            assert row(engine, table, 1) == ("second", second)

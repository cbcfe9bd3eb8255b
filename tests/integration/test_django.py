"""The Django integration: a client from settings, ``locked``, and the ORM storage guard, on
SQLite and on the PostgreSQL of these machines (127.0.0.1:5432, database ``test``, trust auth;
``FENCELOCK_SKIP_POSTGRES=1`` skips the PostgreSQL cases on purpose, as in test_fence_sql)."""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

django = pytest.importorskip("django")

from django.conf import settings  # noqa: E402

_SQLITE = os.path.join(tempfile.mkdtemp(prefix="fencelock-django-"), "db.sqlite3")
if not settings.configured:
    settings.configure(
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": _SQLITE},
            "pg": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": "test",
                "USER": "postgres",
                "HOST": "127.0.0.1",
                "PORT": "5432",
                "OPTIONS": {"connect_timeout": 5},
            },
            **{
                f"pg_{name}": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": "test",
                    "USER": "postgres",
                    "HOST": "127.0.0.1",
                    "PORT": "5432",
                    "OPTIONS": {"connect_timeout": 5, "isolation_level": level},
                }
                for name, level in (("rr", 3), ("ser", 4))  # psycopg.IsolationLevel values
            },
        },
        INSTALLED_APPS=["django_fence_app"],
        USE_TZ=True,
    )
    django.setup()

from django.db import IntegrityError, OperationalError, connections, transaction  # noqa: E402
from django.db.models import F  # noqa: E402
from django_fence_app.models import Account, TokenAccount  # noqa: E402

import fencelock  # noqa: E402
from fencelock import ConfigError, StaleFence  # noqa: E402
from fencelock.fence import EqualFence, MissingRow  # noqa: E402
from fencelock.integrations import django as fl_django  # noqa: E402
from fencelock.testing import Server  # noqa: E402

BASE = 1_800_000_000_000_000


def _ready(alias: str) -> None:
    for model in (Account, TokenAccount):
        try:
            with connections[alias].schema_editor() as editor:
                editor.create_model(model)
        except Exception as exc:
            if alias.startswith("pg") and isinstance(exc, OperationalError):
                message = f"PostgreSQL is unreachable: {exc}"
                if os.environ.get("FENCELOCK_SKIP_POSTGRES") == "1":
                    pytest.skip(message + "; skipped because FENCELOCK_SKIP_POSTGRES=1")
                pytest.fail(message)
            if "already exists" not in str(exc):
                raise
            connections[alias].close()  # PostgreSQL: the failed DDL's transaction is aborted


def _database(alias: str) -> Iterator[str]:
    _ready(alias)
    Account.objects.using(alias).all().delete()
    TokenAccount.objects.using(alias).all().delete()
    yield alias
    Account.objects.using(alias).all().delete()
    TokenAccount.objects.using(alias).all().delete()
    connections[alias].close()


@pytest.fixture(params=["default", "pg"], ids=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from _database(request.param)


@pytest.fixture
def pg() -> Iterator[str]:
    yield from _database("pg")


def _account(db: str, name: str = "a", balance: int = 100, fence: int = 0) -> Account:
    return Account.objects.using(db).create(name=name, balance=balance, fence=fence)


def test_a_newer_fence_writes_and_an_older_one_is_refused(db: str) -> None:
    acc = _account(db)
    rows = Account.objects.using(db).filter(pk=acc.pk)
    assert fl_django.fenced_update(rows, BASE + 2, balance=F("balance") - 10) == 1
    assert fl_django.fenced_update(rows, BASE + 2, balance=F("balance") - 10) == 1  # same lease
    with pytest.raises(StaleFence) as info:
        fl_django.fenced_update(rows, BASE + 1, balance=0)
    assert info.value.offered == BASE + 1 and info.value.current == BASE + 2
    acc.refresh_from_db(using=db)
    assert (acc.balance, acc.fence) == (80, BASE + 2)


def test_a_multi_row_write_is_all_or_none(db: str) -> None:
    a, b = _account(db, "a"), _account(db, "b")
    both = Account.objects.using(db).filter(pk__in=[a.pk, b.pk])
    # the newer holder wrote only row b
    fl_django.fenced_update(Account.objects.using(db).filter(pk=b.pk), BASE + 5, balance=1)
    with pytest.raises(StaleFence) as info:
        fl_django.fenced_update(both, BASE + 4, balance=F("balance") + 1000)
    assert info.value.current == BASE + 5
    a.refresh_from_db(using=db)
    b.refresh_from_db(using=db)
    assert (a.balance, a.fence) == (100, 0)  # nothing of the stale write landed on row a
    assert (b.balance, b.fence) == (1, BASE + 5)


def test_a_refusal_rolls_back_only_the_guarded_write(db: str) -> None:
    a, b = _account(db, "a"), _account(db, "b", fence=BASE + 9)
    with transaction.atomic(using=db):
        Account.objects.using(db).filter(pk=a.pk).update(name="renamed")
        with pytest.raises(StaleFence):
            fl_django.fenced_update(Account.objects.using(db).filter(pk=b.pk), BASE, balance=0)
    a.refresh_from_db(using=db)
    assert a.name == "renamed"  # the caller decides about its own transaction


def test_no_row_is_missing_row(db: str) -> None:
    with pytest.raises(MissingRow):
        fl_django.fenced_update(Account.objects.using(db).filter(pk=-1), BASE, balance=1)


def test_bad_input_is_refused_before_anything_is_sent(db: str) -> None:
    rows = Account.objects.using(db).all()
    with pytest.raises(ConfigError):
        fl_django.fenced_update(rows, -1, balance=1)
    with pytest.raises(ConfigError):
        fl_django.fenced_update(rows, BASE)
    with pytest.raises(ConfigError):
        fl_django.fenced_update(rows, BASE, fence=3)
    with pytest.raises(ConfigError):
        fl_django.fenced_update(rows, BASE, fence_field="nope", balance=1)


def _race(db: str, first: int, second: int) -> tuple[BaseException | None, Account]:
    """Writer ``first`` updates the row and keeps its transaction open while writer ``second``
    tries the same row (it blocks on the row lock); then ``first`` commits. Returns what the
    second writer raised and the row at the end."""
    acc = _account(db)
    rows = Account.objects.using(db).filter(pk=acc.pk)
    first_wrote = threading.Event()
    outcome: dict[str, BaseException | None] = {}

    def writer_first() -> None:
        try:
            with transaction.atomic(using=db):
                fl_django.fenced_update(rows, first, balance=F("balance") + 1)
                first_wrote.set()
                time.sleep(0.5)  # the second writer is blocked on our row lock meanwhile
        finally:
            connections[db].close()

    def writer_second() -> None:
        try:
            assert first_wrote.wait(10)
            with transaction.atomic(using=db):
                fl_django.fenced_update(rows, second, balance=F("balance") + 100)
            outcome["error"] = None
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            connections[db].close()

    threads = [threading.Thread(target=writer_first), threading.Thread(target=writer_second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    acc.refresh_from_db(using=db)
    return outcome["error"], acc


def test_read_committed_the_older_fence_never_lands_after_the_newer(pg: str) -> None:
    db = pg
    error, acc = _race(db, BASE + 20, BASE + 10)
    assert isinstance(error, StaleFence), error
    assert (acc.balance, acc.fence) == (101, BASE + 20)
    # and the other order: the newer fence lands after the older, both accepted
    Account.objects.using(db).all().delete()
    error, acc = _race(db, BASE + 10, BASE + 20)
    assert error is None
    assert (acc.balance, acc.fence) == (201, BASE + 20)


@pytest.fixture
def fencelock_settings() -> Iterator[Server]:
    with Server() as server:
        settings.FENCELOCK = {"servers": server.url, "ttl": 5.0, "wait": 0.0}
        fl_django.reset_client()
        try:
            yield server
        finally:
            fl_django.reset_client()
            del settings.FENCELOCK


def test_locked_uses_the_client_from_settings(fencelock_settings: Server) -> None:
    key = f"django:{uuid.uuid4().hex}"
    seen: list[int] = []

    @fl_django.locked(key + ":{n}", skip=True)
    def job(n: int) -> int:
        lease = fencelock.current_lease()
        assert lease is not None
        seen.append(lease.fence)
        inner = fl_django.client().lock(f"{key}:{n}").try_acquire()
        assert inner is None  # held by the decorated call
        return n

    assert job(1) == 1
    assert len(seen) == 1

    @fl_django.locked(key + ":async")
    async def ajob() -> bool:
        return fencelock.current_lease() is not None

    assert asyncio.run(ajob()) is True


def test_settings_without_servers_is_a_config_error() -> None:
    settings.FENCELOCK = {"ttl": 5}
    fl_django.reset_client()
    try:
        with pytest.raises(ConfigError):
            fl_django.client()
    finally:
        del settings.FENCELOCK
        fl_django.reset_client()


def test_the_fence_field_is_a_64_bit_column_defaulting_to_0(db: str) -> None:
    acc = Account.objects.using(db).create(name="x")
    assert acc.fence == 0
    fl_django.fenced_update(Account.objects.using(db).filter(pk=acc.pk), 2**62, balance=1)
    acc.refresh_from_db(using=db)
    assert acc.fence == 2**62
    field: Any = Account._meta.get_field("fence")
    assert field.get_internal_type() == "BigIntegerField"


# --- the lease's token beside the fence (issue 23, finding 1) -------------------------------------


def _token_account(db: str, name: str = "a", fence: int = 0) -> TokenAccount:
    return TokenAccount.objects.using(db).create(name=name, balance=100, fence=fence)


def test_an_equal_fence_from_another_lease_is_refused(db: str) -> None:
    acc = _token_account(db)
    rows = TokenAccount.objects.using(db).filter(pk=acc.pk)
    assert fl_django.fenced_update(rows, BASE, token="lease-b", balance=F("balance") - 1) == 1
    for token in ("lease-a", None):
        with pytest.raises(EqualFence) as info:
            fl_django.fenced_update(rows, BASE, token=token, balance=0)
        assert isinstance(info.value, StaleFence)
        assert (info.value.offered, info.value.current) == (BASE, BASE)
    acc.refresh_from_db(using=db)
    assert (acc.balance, acc.fence, acc.fence_token) == (99, BASE, "lease-b")
    assert fl_django.fenced_update(rows, BASE, token="lease-b", balance=F("balance") - 1) == 1
    assert fl_django.fenced_update(rows, BASE + 1, balance=5) == 1  # newer, no token
    acc.refresh_from_db(using=db)
    assert (acc.balance, acc.fence, acc.fence_token) == (5, BASE + 1, None)
    assert fl_django.fenced_update(rows, BASE + 1, balance=6) == 1  # no token on both sides
    with pytest.raises(EqualFence):
        fl_django.fenced_update(rows, BASE + 1, token="lease-c", balance=7)


def test_a_multi_row_write_with_one_equal_fence_of_another_lease_is_refused(db: str) -> None:
    a, b = _token_account(db, "a"), _token_account(db, "b")
    both = TokenAccount.objects.using(db).filter(pk__in=[a.pk, b.pk])
    fl_django.fenced_update(
        TokenAccount.objects.using(db).filter(pk=b.pk), BASE, token="new", balance=1
    )
    with pytest.raises(EqualFence):
        fl_django.fenced_update(both, BASE, token="stale", balance=1000)
    a.refresh_from_db(using=db)
    assert (a.balance, a.fence, a.fence_token) == (100, 0, None)


def test_fences_near_2_pow_53_and_2_pow_63_are_exact(db: str) -> None:
    for low, high in ((2**53, 2**53 + 1), (2**53 - 1, 2**53), (2**63 - 2, 2**63 - 1)):
        acc = _token_account(db)
        rows = TokenAccount.objects.using(db).filter(pk=acc.pk)
        fl_django.fenced_update(rows, high, token="t", balance=1)
        with pytest.raises(StaleFence) as info:
            fl_django.fenced_update(rows, low, token="t", balance=2)
        assert not isinstance(info.value, EqualFence)
        assert (info.value.offered, info.value.current) == (low, high)
        acc.refresh_from_db(using=db)
        assert (acc.balance, acc.fence) == (1, high) and type(acc.fence) is int


def test_token_arguments_are_checked_before_anything_is_sent(db: str) -> None:
    acc = _token_account(db)
    rows = TokenAccount.objects.using(db).filter(pk=acc.pk)
    for kwargs in (
        {"token": "", "balance": 1},
        {"token": b"t", "balance": 1},
        {"token": "t" * 256, "balance": 1},
        {"fence_token": "t", "balance": 1},
        {"token": "t", "token_field": "nope", "balance": 1},
    ):
        with pytest.raises(ConfigError):
            fl_django.fenced_update(rows, BASE, **kwargs)
    with pytest.raises(ConfigError):  # Account has no token field
        fl_django.fenced_update(Account.objects.using(db).all(), BASE, token="t", balance=1)
    with pytest.raises(ConfigError):  # nor a tombstone field
        fl_django.fenced_delete(Account.objects.using(db).all(), BASE)
    acc.refresh_from_db(using=db)
    assert (acc.balance, acc.fence) == (100, 0)


# --- deleting: a tombstone keeps the fence (issue 21, item 24) ----------------------------------


def test_a_fenced_delete_leaves_a_tombstone_a_stale_holder_cannot_revive(db: str) -> None:
    acc = _token_account(db)
    rows = TokenAccount.objects.using(db).filter(pk=acc.pk)
    fl_django.fenced_update(rows, BASE + 1, token="a", balance=50)
    assert fl_django.fenced_delete(rows, BASE + 2, token="b") == 1  # the newer holder deletes
    acc.refresh_from_db(using=db)
    assert (acc.deleted, acc.fence, acc.fence_token) == (True, BASE + 2, "b")
    with pytest.raises(StaleFence):
        fl_django.fenced_update(rows, BASE + 1, token="a", deleted=False, balance=0)
    with pytest.raises(StaleFence):
        fl_django.fenced_delete(rows, BASE + 1, token="a")
    with pytest.raises(IntegrityError), transaction.atomic(using=db):  # re-creating it
        TokenAccount.objects.using(db).create(pk=acc.pk, name="again", fence=BASE + 1)
    acc.refresh_from_db(using=db)
    assert (acc.deleted, acc.balance, acc.fence) == (True, 50, BASE + 2)
    fl_django.fenced_update(rows, BASE + 3, token="c", deleted=False, balance=7)
    acc.refresh_from_db(using=db)
    assert (acc.deleted, acc.balance, acc.fence) == (False, 7, BASE + 3)


# --- isolation levels (issue 21, item 23) --------------------------------------------------------


def _retrying(db: str, fence: int, pk: int) -> tuple[list[str], BaseException | None]:
    """The documented recipe: roll back and run again after a serialization failure."""
    seen: list[str] = []
    for _ in range(3):
        try:
            with transaction.atomic(using=db):
                rows = Account.objects.using(db).filter(pk=pk)
                fl_django.fenced_update(rows, fence, balance=F("balance") + 100)
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != "40001":
                raise
            seen.append("serialization failure")
            continue
        except StaleFence as exc:
            seen.append("StaleFence")
            return seen, exc
        seen.append("ok")
        return seen, None
    return seen, None


def _blocked(db: str) -> bool:
    """Until a statement on the account table waits for a lock (bounded: 10 s)."""
    deadline = time.monotonic() + 10
    with connections["pg"].cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE %s",
                ["%django_fence_app_account%"],
            )
            if cursor.fetchone()[0]:
                return True
            time.sleep(0.02)
    return False


def _race_isolated(
    pg: str, alias: str, pk: int, first: int, second: int
) -> tuple[bool, tuple[list[str], BaseException | None]]:
    first_wrote, out = threading.Event(), {}

    def writer_first() -> None:
        try:
            with transaction.atomic(using=alias):
                rows = Account.objects.using(alias).filter(pk=pk)
                fl_django.fenced_update(rows, first, balance=F("balance") + 1)
                first_wrote.set()
                out["waited"] = _blocked(pg)
        finally:
            connections[alias].close()
            connections[pg].close()

    def writer_second() -> None:
        try:
            assert first_wrote.wait(30)
            out["second"] = _retrying(alias, second, pk)
        finally:
            connections[alias].close()

    threads = [threading.Thread(target=writer_first), threading.Thread(target=writer_second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return out["waited"], out["second"]


@pytest.mark.parametrize("alias", ["pg_rr", "pg_ser"], ids=["repeatable-read", "serializable"])
def test_under_repeatable_read_and_serializable_a_retry_gets_the_answer(
    pg: str, alias: str
) -> None:
    """Writer 1 updates and holds its transaction until writer 2's UPDATE waits for the row
    lock, then commits: writer 2 gets a serialization failure (not StaleFence), and its retry
    gets StaleFence when its fence is older, success when newer."""
    for first, second in ((BASE + 20, BASE + 10), (BASE + 10, BASE + 20)):
        Account.objects.using(pg).all().delete()
        acc = _account(pg)
        waited, (seen, error) = _race_isolated(pg, alias, acc.pk, first, second)
        assert waited, "writer 2 never waited for writer 1's row lock"
        acc.refresh_from_db(using=pg)
        if first > second:
            assert seen == ["serialization failure", "StaleFence"]
            assert isinstance(error, StaleFence) and error.current == first
            assert (acc.balance, acc.fence) == (101, first)
        else:
            assert seen == ["serialization failure", "ok"]
            assert (acc.balance, acc.fence) == (201, second)

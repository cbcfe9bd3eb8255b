"""Django: a client from settings, ``locked`` for views and management commands, and the
storage guard for the ORM (extra ``django``).

::

    # settings.py
    FENCELOCK = {"servers": ["redis://127.0.0.1:6379/0"], "ttl": 30, "wait": 10}

    # models.py
    from fencelock.integrations.django import FenceField

    class Account(models.Model):
        balance = models.IntegerField()
        fence = FenceField()              # the newest fence accepted for this row
        fence_token = FenceTokenField()   # the token of the lease that set it
        deleted = models.BooleanField(default=False)   # for fenced_delete's tombstones

    # a view, a task, a management command
    from fencelock.integrations.django import fenced_update, locked

    @locked("account:{account_id}")
    def charge(account_id, amount):
        lease = fencelock.current_lease()
        fenced_update(
            Account.objects.filter(pk=account_id),
            lease.fence,
            token=lease.token,
            balance=F("balance") - amount,
        )

- :func:`client` builds one :class:`fencelock.Client` per process from ``settings.FENCELOCK``
  (``servers`` is required; every other key is a keyword option of ``Client``), on first use.
- :func:`locked` is :func:`fencelock.locked` with that client (sync and ``async def`` alike).
- :func:`fenced_update` runs ``UPDATE ... SET <values>, fence = :f WHERE <queryset> AND
  <the fence accepts :f>`` and refuses the whole write with :class:`~fencelock.StaleFence`
  when any row the queryset names carries a newer fence: a stale holder's write never lands
  after a newer holder's, on any row, under READ COMMITTED (PostgreSQL re-checks the
  condition on a row a concurrent writer changed before it updates it). Under REPEATABLE
  READ or SERIALIZABLE the database itself refuses the second of two concurrent writers with
  a serialization error (Django's ``OperationalError``, SQLSTATE 40001): roll back and retry
  the transaction; the retry reads the newer fence and raises
  :class:`~fencelock.StaleFence` (or succeeds, if the other writer's fence was older).
- :func:`fenced_delete` deletes by leaving a tombstone: the rows stay, marked deleted, with
  the fence, so a stale holder can neither update them nor insert them again.

An equal fence is accepted only from the lease that set it: give the model a
:class:`FenceTokenField` and pass ``token=lease.token``; an equal fence offered with another
token, or without one, is refused with :class:`~fencelock.fence.EqualFence` (a
``StaleFence``). Without a token field an equal fence is accepted (the guard then relies on
fences being unique per grant, as fencelock's are).
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.db.models import Max, Q

from ..client import Client
from ..decorator import locked as _locked
from ..errors import ConfigError, StaleFence
from ..fence import MAX_TOKEN, EqualFence, MissingRow, _check_fence, _check_token

__all__ = [
    "EqualFence",
    "FenceField",
    "FenceTokenField",
    "MissingRow",
    "client",
    "fenced_delete",
    "fenced_update",
    "locked",
    "reset_client",
]

_client: Client | None = None
_client_lock = threading.Lock()


class FenceField(models.BigIntegerField):  # type: ignore[misc]  # django has no types
    """A ``BIGINT NOT NULL DEFAULT 0`` column for the newest fence accepted for a row
    (fences are about 1.8e15, server microseconds: they do not fit a 32-bit integer)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", 0)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        if kwargs.get("default") == 0:
            del kwargs["default"]
        return name, path, args, kwargs


class FenceTokenField(models.CharField):  # type: ignore[misc]  # django has no types
    """A ``VARCHAR(255) NULL`` column for the token of the lease that set the row's fence
    (NULL: set without a token). With it, :func:`fenced_update` accepts an equal fence only
    from that lease."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", MAX_TOKEN)
        kwargs.setdefault("null", True)
        kwargs.setdefault("blank", True)
        kwargs.setdefault("default", None)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        for key, value in (("max_length", MAX_TOKEN), ("null", True), ("blank", True)):
            if kwargs.get(key) == value:
                del kwargs[key]
        if "default" in kwargs and kwargs["default"] is None:
            del kwargs["default"]
        return name, path, args, kwargs


def client() -> Client:
    """The process's :class:`fencelock.Client`, built from ``settings.FENCELOCK`` on first use.

    Raises :class:`~fencelock.ConfigError` when the setting is missing, not a dict, or has no
    ``servers``; the options themselves are checked as ``Client`` checks them.
    """
    global _client
    if _client is None:
        with _client_lock:
            if _client is None:
                config = getattr(settings, "FENCELOCK", None)
                if not isinstance(config, dict) or "servers" not in config:
                    raise ConfigError(
                        "settings.FENCELOCK must be a dict with 'servers' (a URL or a list)"
                    )
                options = dict(config)
                servers = options.pop("servers")
                _client = Client(servers, **options)
    return _client


def reset_client() -> None:
    """Close the settings' client, so that the next :func:`client` reads the settings again
    (for tests that change ``settings.FENCELOCK``)."""
    global _client
    with _client_lock:
        if _client is not None:
            _client.close()
        _client = None


def locked(key: str, **options: Any) -> Any:
    """:func:`fencelock.locked` with the settings' client: ``@locked("report:{day}", ttl=60)``.
    The client is built when the decorated function is first called, not at import."""

    def decorate(func: Any) -> Any:
        state: dict[str, Any] = {}
        lock_guard = threading.Lock()

        def decorated() -> Any:
            with lock_guard:
                if "wrapped" not in state:
                    state["wrapped"] = _locked(client(), key, **options)(func)
            return state["wrapped"]

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                return await decorated()(*args, **kwargs)

            return run_async

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            return decorated()(*args, **kwargs)

        return run

    return decorate


def fenced_update(
    queryset: models.QuerySet[Any],
    fence: int,
    /,
    *,
    token: str | None = None,
    fence_field: str = "fence",
    token_field: str = "fence_token",
    **values: Any,
) -> int:
    """Update every row of ``queryset`` with ``values`` and ``fence``, all or none; return how
    many rows were updated (>= 1).

    A row accepts ``fence`` when its fence is NULL, older, or equal and set by the same lease:
    with a ``token_field`` (:class:`FenceTokenField`) on the model, an equal fence is accepted
    only with the token stored there (pass ``token=lease.token``; no token matches only a row
    set without one), and the token is stored with the fence; without that field an equal
    fence is accepted. ``token``, ``fence_field`` and ``token_field`` are this function's
    keywords, so a model field of one of those names cannot be set through ``values``.

    Runs in ``transaction.atomic()`` on the queryset's database (a savepoint inside the
    caller's transaction). Raises, and nothing of the write stays:

    - :class:`~fencelock.StaleFence` when a row of ``queryset`` carries a newer fence
      (``current`` is the highest), :class:`~fencelock.fence.EqualFence` when the refusing
      rows carry ``fence`` itself, set by another lease;
    - :class:`~fencelock.fence.MissingRow` (a ``LookupError``) when ``queryset`` names no row.
      Do not ``.delete()`` guarded rows (the fence goes with them): use :func:`fenced_delete`;
      create rows with fence 0 (the default), never with your own fence;
    - :class:`~fencelock.ConfigError` before anything is sent for a bad fence or token, no
      ``values``, ``values`` setting the fence or token field, a model without
      ``fence_field``, or a token without ``token_field``.
    """
    fence, token = _check_fence(fence), _check_token(token)
    if not values:
        raise ConfigError("fenced_update needs the values to write, e.g. balance=F('balance') - 1")
    model = queryset.model
    if not _has_field(model, fence_field):
        raise ConfigError(f"{model.__name__} has no fence field {fence_field!r}")
    has_token = isinstance(token_field, str) and _has_field(model, token_field)
    if token is not None and not has_token:
        raise ConfigError(
            f"{model.__name__} has no token field {token_field!r} to keep the token in "
            "(add a FenceTokenField)"
        )
    for field in (fence_field, token_field):
        if field in values:
            raise ConfigError(f"values must not set the field {field!r}: the guard sets it")
    if has_token:
        same_lease = Q(
            **{f"{token_field}__isnull": True} if token is None else {token_field: token}
        )
        refused = Q(**{f"{fence_field}__gt": fence}) | (Q(**{fence_field: fence}) & ~same_lease)
        values = {**values, token_field: token}
    else:
        refused = Q(**{f"{fence_field}__gt": fence})
    accepted = Q(**{f"{fence_field}__isnull": True}) | ~refused
    with transaction.atomic(using=queryset.db):
        updated = queryset.filter(accepted).update(**{fence_field: fence}, **values)
        # rows named but not updated: a newer fence or another lease's (refuse all), or none
        top = queryset.filter(refused).aggregate(top=Max(fence_field))["top"]
        if top is not None:
            refusal = EqualFence if int(top) == fence else StaleFence
            raise refusal(_describe(queryset), fence, int(top))
        if not updated:
            raise MissingRow(_describe(queryset))
    return int(updated)


def fenced_delete(
    queryset: models.QuerySet[Any],
    fence: int,
    /,
    *,
    token: str | None = None,
    deleted_field: str = "deleted",
    fence_field: str = "fence",
    token_field: str = "fence_token",
) -> int:
    """Delete the rows of ``queryset`` under ``fence`` by leaving tombstones: each row stays,
    with ``deleted_field`` (a ``BooleanField(default=False)``) set true and the fence (and
    token) set, so an older holder can neither update it nor create it again (the row still
    holds its primary key). All or none, with :func:`fenced_update`'s rules and errors;
    returns how many rows were marked. Filter ``deleted=False`` where you read; a newer holder
    brings a row back with ``fenced_update(..., deleted=False)``. Raises
    :class:`~fencelock.ConfigError` when the model has no ``deleted_field``.
    """
    if not isinstance(deleted_field, str) or not _has_field(queryset.model, deleted_field):
        raise ConfigError(
            f"{queryset.model.__name__} has no tombstone field {deleted_field!r} "
            "(add a BooleanField(default=False))"
        )
    return fenced_update(
        queryset,
        fence,
        token=token,
        fence_field=fence_field,
        token_field=token_field,
        **{deleted_field: True},
    )


def _has_field(model: Any, name: str) -> bool:
    try:
        model._meta.get_field(name)
    except Exception:
        return False
    return True


def _describe(queryset: models.QuerySet[Any]) -> str:
    where = str(queryset.query.where) or "all rows"
    return f"{queryset.model._meta.db_table} WHERE {where}"

"""What a new connection says first, and what the answers tell about the server (pure).

A new connection sends :func:`prelude` in the same write as its first request, so connecting
costs no extra round trip: ``AUTH`` (when there is a password), ``SELECT`` (db != 0), then
``INFO server`` and ``ROLE``, whose answers give the server's :class:`Identity` (and, on a
Cluster's node, ``CLUSTER NODES``, which gives the cluster's id). RESP2 only:
no ``HELLO`` and no ``CLIENT SETINFO``, so nothing here depends on the server's version.

Failing ``AUTH`` or ``SELECT`` makes the connection useless: :class:`HandshakeError`. A user
without the right to run ``INFO`` or ``ROLE`` (least-privilege ACLs) is fine: no identity.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .address import Address
from .resp import ReplyError, command

__all__ = ["HandshakeError", "Identity", "identity_from", "prelude"]

_INFO = command("INFO", "server")
_ROLE = command("ROLE")
_NODES = command("CLUSTER", "NODES")
_AUTH_KINDS = frozenset({"NOAUTH", "WRONGPASS"})  # on INFO/ROLE: the AUTH did not happen


class HandshakeError(ConnectionError):
    """The server refused the connection's ``AUTH`` or ``SELECT``.

    ``server`` is the password-free name, ``reply`` the server's error. The message names both
    and never contains the password.
    """

    def __init__(self, server: str, command_name: str, reply: ReplyError) -> None:
        super().__init__(f"{server}: {command_name} refused: {reply.message}")
        self.server = server
        self.command = command_name
        self.reply = reply

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.server, self.command, self.reply))


@dataclass(frozen=True)
class Identity:
    """Who answered: ``run_id`` (new on every restart), ``role`` (``"master"``, ``"slave"``...),
    ``engine`` (``"valkey"`` or ``"redis"``), ``version`` and ``uptime_s``.

    ``restarted_at``: when this process saw the ``run_id`` change, the monotonic time (s) the
    server restarted (the sighting minus its uptime); None when no restart was seen.
    """

    run_id: str
    role: str
    engine: str
    version: tuple[int, int, int]
    uptime_s: int
    restarted_at: float | None = None
    #: On a Cluster's node: the cluster's id, the smallest node id of ``CLUSTER NODES`` (the
    #: same through any node, and across failovers: node ids stay); None elsewhere, or when
    #: the node could not say (an ACL, say).
    cluster_id: str | None = None


def _setup_commands(address: Address) -> list[tuple[str, bytes]]:
    steps: list[tuple[str, bytes]] = []
    if address.password is not None:
        if address.username:
            steps.append(("AUTH", command("AUTH", address.username, address.password)))
        else:
            steps.append(("AUTH", command("AUTH", address.password)))
    if address.db:
        steps.append(("SELECT", command("SELECT", address.db)))
    return steps


def prelude(address: Address, *, identify: bool = True) -> tuple[bytes, int]:
    """The commands a new connection sends before its first request, and how many replies
    they produce (``AUTH``? ``SELECT``? then, with ``identify``, ``INFO server`` and ``ROLE``).
    Without ``identify`` (the server's identity is known and nothing failed since) a new
    connection costs the server no INFO."""
    steps = _setup_commands(address)
    payload = b"".join(encoded for _, encoded in steps)
    if not identify:
        return payload, len(steps)
    if address.cluster:
        return payload + _INFO + _ROLE + _NODES, len(steps) + 3
    return payload + _INFO + _ROLE, len(steps) + 2


def cluster_id_from(reply: object) -> str | None:
    """The smallest node id of a ``CLUSTER NODES`` reply (None: an error, or none found)."""
    if not isinstance(reply, bytes):
        return None
    ids = [
        line.split(maxsplit=1)[0]
        for line in reply.decode("utf-8", "replace").splitlines()
        if line.strip()
    ]
    ids = [node_id for node_id in ids if re.fullmatch(r"[0-9a-f]{40}", node_id)]
    return min(ids) if ids else None


def _version(text: str) -> tuple[int, int, int]:
    numbers = [int(n) for n in re.findall(r"\d+", text)[:3]]
    numbers += [0] * (3 - len(numbers))
    return numbers[0], numbers[1], numbers[2]


def _info_fields(reply: object) -> dict[str, str]:
    if not isinstance(reply, bytes):
        return {}
    fields: dict[str, str] = {}
    for line in reply.decode("utf-8", "replace").splitlines():
        name, sep, value = line.partition(":")
        if sep and not line.startswith("#"):
            fields[name.strip()] = value.strip()
    return fields


def identity_from(
    replies: list[object], *, address: Address | None = None, identify: bool = True
) -> Identity | None:
    """The server's identity from the :func:`prelude` replies (in order).

    ``address`` names the server in errors and says which setup commands were sent; without it,
    every reply before the last two is taken as a setup reply.

    Returns ``None`` when ``INFO`` or ``ROLE`` was not allowed (``NOPERM``) or not understood.

    Raises:
        HandshakeError: ``AUTH`` or ``SELECT`` failed, or the server wants a password that
            was not given (``NOAUTH``).
    """
    if not identify:  # a prelude without INFO/ROLE: only the setup replies to check
        replies = [*replies, b"", [b"master"]]
    cluster_id = None
    if identify and address is not None and address.cluster:
        if len(replies) < 3:
            raise ValueError(f"a cluster node's prelude has 3 replies, got {len(replies)}")
        cluster_id = cluster_id_from(replies[-1])
        replies = replies[:-1]
    if len(replies) < 2:
        raise ValueError(f"the prelude has at least 2 replies, got {len(replies)}")
    server = address.name if address is not None else "server"
    setup = replies[:-2]
    names = (
        [name for name, _ in _setup_commands(address)]
        if address is not None
        else ["AUTH/SELECT"] * len(setup)
    )
    if len(names) != len(setup):
        raise ValueError(f"expected {len(names) + 2} prelude replies, got {len(replies)}")
    for name, reply in zip(names, setup, strict=True):
        if isinstance(reply, ReplyError):
            raise HandshakeError(server, name, reply)
    info, role = replies[-2], replies[-1]
    for name, reply in (("INFO", info), ("ROLE", role)):
        if isinstance(reply, ReplyError) and reply.kind in _AUTH_KINDS:
            raise HandshakeError(server, name, reply)
    if isinstance(info, ReplyError) or isinstance(role, ReplyError):
        return None
    fields = _info_fields(info)
    run_id = fields.get("run_id")
    if not run_id or not isinstance(role, list) or not role or not isinstance(role[0], bytes):
        return None
    if "valkey_version" in fields or fields.get("server_name") == "valkey":
        engine = "valkey"
        version = fields.get("valkey_version") or fields.get("redis_version", "")
    else:
        engine = "redis"
        version = fields.get("redis_version", "")
    uptime = fields.get("uptime_in_seconds", "0")
    return Identity(
        run_id=run_id,
        role=role[0].decode("utf-8", "replace"),
        engine=engine,
        version=_version(version),
        uptime_s=int(uptime) if uptime.isdigit() else 0,
        cluster_id=cluster_id,
    )


def split_prelude(
    replies: list[object],
    n: int,
    *,
    address: Address | None,
    identify: bool,
    on_error: Callable[[], object],
) -> tuple[Identity | None, list[object]]:
    """The identity told by the first ``n`` of ``replies`` (the :func:`prelude`'s), and the
    replies after them. When they say the handshake failed, ``on_error`` runs (the connection
    closes) before the error is raised on."""
    try:
        identity = identity_from(replies[:n], address=address, identify=identify)
    except BaseException:
        on_error()
        raise
    return identity, replies[n:]

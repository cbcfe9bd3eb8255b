"""``fencelock top``: every lock under a prefix, who holds it, right now.

One snapshot is: a ``SCAN`` (never ``KEYS``) of each server for fencelock's keys under the
prefix, bounded per server (:data:`SCAN_MAX_KEYS` keys; the row says when it stopped short),
the lock names those keys belong to, and then :func:`fencelock.admin.status` of each name (at
most ``max_items`` of them, in name order), read as one item per name:

``{"kind", "key", "holder", "token_prefix", "ttl_ms", "fence", "waiters", "servers_held",
"agree", ...}``

- ``kind``: ``lock``, ``fair`` (a fair lock: it has a queue), ``semaphore``, ``rwlock`` or
  ``election`` (a leader is named beside the lock, or observers are registered);
- ``holder``: the holder info of the lease held on a majority (host, pid, since...), None when
  nobody holds it on a majority; ``token_prefix`` its token's first characters;
- ``ttl_ms``: the validity left on a majority, in ms (None: not held on a majority);
- ``fence``: the highest fence register (a term, for an election);
- ``waiters``: a fair lock's queue length (the longest any server has); for other kinds None,
  with ``waiting`` true when a refused caller marked the lock as waited for;
- ``servers_held``: on how many servers the holder's token is there; ``agree``: every server
  that answered has the same view (the same token, or all free);
- semaphores add ``permits`` (valid on a majority) and ``limit`` (None: servers do not store
  it); read-write locks ``readers`` and ``writer``; elections ``leader``.

Reads only; nothing changes. A server that fails is reported in its row, never raised.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypedDict

from .. import admin
from .._core.keys import PREFIX, keys_glob
from .._engine.address import check_any_url, url_name
from .._engine.plain_clients import client_name, describe, plain_client
from ..errors import ConfigError
from ..options import check_url
from .common import shown

__all__ = [
    "SCAN_MAX_KEYS",
    "Item",
    "ServerScan",
    "Snapshot",
    "render_html",
    "render_text",
    "snapshot",
]

#: Keys one refresh reads of one server at the most (SCAN pages of :data:`SCAN_COUNT`).
SCAN_MAX_KEYS = 20_000
SCAN_COUNT = 1_000
#: Lock names one snapshot reports at the most (each costs a status read of every server).
MAX_ITEMS = 200


class ServerScan(TypedDict):
    server: str  # password-free name
    keys_scanned: int
    complete: bool  # the SCAN reached its end (False: stopped at SCAN_MAX_KEYS, or an error)
    error: str | None


class Item(TypedDict, total=False):
    kind: str
    key: str
    holder: dict[str, Any] | None
    token_prefix: str | None
    ttl_ms: int | None
    fence: int | None
    waiters: int | None
    waiting: bool
    servers_held: int
    agree: bool
    permits: list[admin.Lessee]
    limit: int | None
    readers: list[admin.Lessee]
    writer: admin.Lessee | None
    leader: str | None


class Snapshot(TypedDict):
    servers: list[ServerScan]
    items: list[Item]
    truncated: bool  # more names were found than max_items
    taken_at: float  # wall-clock seconds since the epoch


def _name_of(key: str) -> tuple[str, str] | None:
    """(lock name, what follows its tag) of one of fencelock's keys, or None."""
    if not key.startswith(PREFIX + "{"):
        return None
    rest = key[len(PREFIX) + 1 :]
    end = rest.find("}")
    if end <= 0:
        return None
    tag, suffix = rest[:end], rest[end + 1 :]
    if tag.startswith("{"):  # an escaped name (keys.hash_tag): percent-decode it
        name = tag[1:].replace("%7D", "}").replace("%7B", "{").replace("%25", "%")
    else:
        name = tag
    return name, suffix


def _scan(url: str, pattern: str, timeout: float) -> tuple[ServerScan, dict[str, set[str]]]:
    found: dict[str, set[str]] = {}
    try:
        client = plain_client(url, timeout)
    except Exception as exc:
        return {"server": url, "keys_scanned": 0, "complete": False, "error": str(exc)}, found
    name = client_name(client, url)
    scanned = 0
    cursor = 0
    try:
        while True:
            cursor, keys = client.scan(cursor=cursor, match=pattern, count=SCAN_COUNT)
            for raw in keys:
                scanned += 1
                text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
                parsed = _name_of(text)
                if parsed is not None:
                    found.setdefault(parsed[0], set()).add(parsed[1])
            if cursor == 0 or scanned >= SCAN_MAX_KEYS:
                break
        row: ServerScan = {
            "server": name,
            "keys_scanned": scanned,
            "complete": cursor == 0,
            "error": None,
        }
    except Exception as exc:
        row = {"server": name, "keys_scanned": scanned, "complete": False, "error": str(exc)}
    finally:
        client.close()
    return row, found


def _fair_waiters(urls: Sequence[str], name: str, timeout: float) -> int:
    queue = f"{PREFIX}{{{name}}}:fair"
    longest = 0
    for url in urls:
        client = plain_client(url, timeout)
        try:
            longest = max(longest, int(client.zcard(queue)))
        except Exception:
            continue
        finally:
            client.close()
    return longest


def _kind(suffixes: set[str], report: admin.Status) -> str:
    if report.get("kind") in ("semaphore", "rwlock"):
        return str(report["kind"])
    if any(s.startswith(":slot:") for s in suffixes):
        return "semaphore"
    if ":readers" in suffixes or ":intent" in suffixes:
        return "rwlock"
    if report["leader"] is not None or ":observers" in suffixes:
        return "election"
    if any(s.startswith(":fair") for s in suffixes):
        return "fair"
    return "lock"


def _item(name: str, suffixes: set[str], report: admin.Status, waiters: int | None) -> Item:
    rows = report["servers"]
    majority = len(rows) // 2 + 1
    tokens = [row["token_prefix"] for row in rows if row["error"] is None or row["held"]]
    held = [row for row in rows if row["held"] and row["token_prefix"] is not None]
    counts: dict[str, int] = {}
    for row in held:
        prefix = row["token_prefix"]
        assert prefix is not None
        counts[prefix] = counts.get(prefix, 0) + 1
    token, servers_held = max(counts.items(), key=lambda kv: kv[1], default=(None, 0))
    on_majority = token is not None and servers_held >= majority
    ttls = sorted(
        (row["ttl_s"] for row in held if row["token_prefix"] == token and row["ttl_s"] is not None),
        reverse=True,
    )
    ttl_ms = round(ttls[majority - 1] * 1000) if on_majority and len(ttls) >= majority else None
    holder = None
    if on_majority:
        holder = next((row["holder"] for row in held if row["token_prefix"] == token), None)
    item: Item = {
        "kind": _kind(suffixes, report),
        "key": name,
        "holder": holder,
        "token_prefix": token if on_majority else None,
        "ttl_ms": ttl_ms,
        "fence": report["fence"],
        "waiters": waiters,
        "waiting": ":waiters" in suffixes,
        "servers_held": servers_held,
        "agree": len(set(tokens)) <= 1,
    }
    if item["kind"] == "semaphore":
        item["permits"] = [p for p in report.get("permits", []) if p.get("majority")]
        item["limit"] = report.get("limit")
    elif item["kind"] == "rwlock":
        item["readers"] = [r for r in report.get("readers", []) if r.get("majority")]
        item["writer"] = report.get("writer")
    elif item["kind"] == "election":
        item["leader"] = report["leader"]
    return item


def snapshot(
    servers: str | Sequence[str],
    *,
    prefix: str = "",
    timeout: float = admin.DEFAULT_TIMEOUT,
    max_items: int = MAX_ITEMS,
) -> Snapshot:
    """One look at every lock whose name starts with ``prefix`` (see the module docstring).

    Raises :class:`~fencelock.ConfigError` before any I/O for no servers, a malformed URL, a
    prefix with braces or glob characters, or ``max_items`` below 1.
    """
    urls = [servers] if isinstance(servers, str) else list(servers)
    if not urls:
        raise ConfigError("top needs at least one server URL")
    clusters = [url for url in urls if _is_cluster(url)]
    if clusters and len(urls) > 1:
        raise ConfigError("top takes one redis+cluster:// URL, or standalone servers, not both")
    # a Sentinel URL is read on the primary its sentinels name now (as the Lock would)
    urls = [_cluster_seed(url) if _is_cluster(url) else check_any_url(url) for url in urls]
    if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
        raise ConfigError(f"max_items must be an int >= 1, got {max_items!r}")
    try:
        pattern = keys_glob(prefix)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    # a Cluster is one vote over many primaries: each primary is scanned, and each lock is
    # read on the primary that owns its slot (its keys share one hash tag)
    targets = _primaries(urls[0], timeout) if clusters else urls
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        scans = list(pool.map(lambda url: _scan(url, pattern, timeout), targets))
    names: dict[str, set[str]] = {}
    owner: dict[str, str] = {}
    for target, (_, found) in zip(targets, scans, strict=True):
        for name, suffixes in found.items():
            names.setdefault(name, set()).update(suffixes)
            owner.setdefault(name, target)
    chosen = sorted(names)[:max_items]
    items: list[Item] = []
    for name in chosen:
        suffixes = names[name]
        where = [owner[name]] if clusters else urls
        report = admin.status(where, name, timeout=timeout)
        waiters = None
        if any(s.startswith(":fair") for s in suffixes):
            waiters = _fair_waiters(where, name, timeout)
        items.append(_item(name, suffixes, report, waiters))
    urls = targets
    # a scan's row names the server as the client saw it; a failed connect keeps the URL,
    # which may carry a password: show the password-free form then
    server_rows = [row for row, _ in scans]
    for row, url in zip(server_rows, urls, strict=True):
        if row["server"] == url:
            row["server"] = _safe_name(url)
    return {
        "servers": server_rows,
        "items": items,
        "truncated": len(names) > max_items,
        "taken_at": time.time(),
    }


def _is_cluster(url: str) -> bool:
    scheme, sep, _ = url.partition("://")
    return bool(sep) and scheme.lower().endswith("+cluster")


def _cluster_seed(url: str) -> str:
    """``redis+cluster://host:port`` -> the seed node's plain URL (checked)."""
    scheme, _, rest = url.partition("://")
    return check_url(f"{scheme[: -len('+cluster')]}://{rest}")


def _primaries(seed: str, timeout: float) -> list[str]:
    """Plain URLs of the cluster's primaries, from ``CLUSTER SLOTS`` on the seed node (the
    seed itself when it cannot say: its row then shows the error)."""
    scheme = seed.partition("://")[0]
    client = plain_client(seed, timeout)
    try:
        slots: Any = client.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
    except Exception:
        return [seed]
    finally:
        client.close()
    base = client.connection_pool.connection_kwargs
    auth = ""
    if base.get("password"):
        user = base.get("username") or ""
        auth = f"{user}:{base['password']}@" if user else f":{base['password']}@"
    found: list[str] = []
    for entry in slots:
        host, port = entry[2][0], entry[2][1]
        host = host.decode() if isinstance(host, bytes) else str(host)
        url = f"{scheme}://{auth}{host or base.get('host', '127.0.0.1')}:{int(port)}"
        if url not in found:
            found.append(url)
    return found or [seed]


def _safe_name(url: str) -> str:
    named = url_name(url)  # a Sentinel URL: its sentinels and service
    if named is not None:
        return named
    try:
        client = plain_client(url, 0.1)
    except Exception:
        return "<unparsable URL>"
    try:
        return describe(client.connection_pool.connection_kwargs)
    finally:
        client.close()


def _holder_text(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "-"
    parts = [f"{k}={holder[k]}" for k in ("leader", "host", "pid", "purpose") if k in holder]
    if not parts:
        parts = [json.dumps(holder, sort_keys=True)[:40]]
    return shown(" ".join(parts))


def _detail(item: Item) -> str:
    kind = item["kind"]
    if kind == "semaphore":
        limit = item.get("limit")
        return f"permits {len(item.get('permits', []))}/{'?' if limit is None else limit}"
    if kind == "rwlock":
        writer = "writer" if item.get("writer") else "no writer"
        return f"readers {len(item.get('readers', []))}, {writer}"
    if kind == "election":
        leader = item.get("leader")
        return f"leader {shown(leader) if leader is not None else '-'}"
    if kind == "fair":
        return f"queue {item.get('waiters') or 0}"
    return "waiting" if item.get("waiting") else ""


def render_text(snap: Snapshot) -> str:
    """The snapshot as the terminal table ``fencelock top`` refreshes."""
    lines = []
    for row in snap["servers"]:
        state = (
            "error: " + shown(row["error"])
            if row["error"]
            else ("complete" if row["complete"] else f"stopped at {row['keys_scanned']} keys")
        )
        lines.append(f"server {row['server']}: {row['keys_scanned']} keys, {state}")
    header = (
        f"{'KIND':<9} {'KEY':<32} {'HOLDER':<28} {'TTL ms':>8} {'FENCE':>17} {'HELD':>4}  DETAIL"
    )
    lines.append(header)
    for item in snap["items"]:
        ttl = "-" if item["ttl_ms"] is None else str(item["ttl_ms"])
        fence = "-" if item["fence"] is None else str(item["fence"])
        held = f"{item['servers_held']}{'' if item['agree'] else '!'}"
        lines.append(
            f"{item['kind']:<9} {shown(item['key'])[:32]:<32} "
            f"{_holder_text(item['holder'])[:28]:<28} {ttl:>8} {fence:>17} {held:>4}  "
            f"{_detail(item)}"
        )
    if not snap["items"]:
        lines.append("(no locks under this prefix)")
    if snap["truncated"]:
        lines.append(f"(more locks than the {len(snap['items'])} shown: narrow the prefix)")
    return "\n".join(lines)


def render_html(snap: Snapshot) -> str:
    """The snapshot as a self-contained HTML page (escaped; no scripts, no external assets)."""
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(cell))}</td>"
            for cell in (
                item["kind"],
                item["key"],
                _holder_text(item["holder"]),
                "-" if item["ttl_ms"] is None else item["ttl_ms"],
                "-" if item["fence"] is None else item["fence"],
                f"{item['servers_held']}{'' if item['agree'] else ' (servers disagree)'}",
                _detail(item),
            )
        )
        + "</tr>"
        for item in snap["items"]
    )
    servers = "".join(
        f"<li>{html.escape(row['server'])}: {row['keys_scanned']} keys"
        f"{', error: ' + html.escape(str(row['error'])) if row['error'] else ''}</li>"
        for row in snap["servers"]
    )
    taken = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snap["taken_at"]))
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>fencelock top</title>"
        "<style>body{font:14px system-ui,sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}th{background:#f4f4f4}"
        "</style></head><body>"
        f"<h1>fencelock top</h1><p>taken {taken}</p><ul>{servers}</ul>"
        "<table><tr><th>kind</th><th>key</th><th>holder</th><th>TTL ms</th><th>fence</th>"
        f"<th>servers held</th><th>detail</th></tr>{rows}</table></body></html>"
    )

"""``fencelock status`` and ``fencelock release``: who holds a key, for how long, with which
fence; give a lock back by token, or force it free."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

from .. import (
    ConfigError,
    admin,
)
from ..options import check_key
from .common import (
    ADMIN_TIMEOUT,
    DEFAULT_SERVER,
    EX_LOST,
    EX_OK,
    EX_UNAVAILABLE,
    PROG,
    resolve_servers,
    say,
    shown,
)

# -- status ---------------------------------------------------------------------------------------


def status_report(
    key: str, servers: Sequence[str], *, kind: str = "auto", limit: int | None = None
) -> admin.Status:
    """The ``status --json`` object for ``key`` on ``servers`` (:func:`fencelock.admin.status`)."""
    return admin.status(servers, key, timeout=ADMIN_TIMEOUT, kind=kind, limit=limit)


def _describe_holder(holder: dict[str, Any]) -> str:
    parts = []
    for field_name in ("leader", "term", "host", "pid", "purpose"):
        if field_name in holder:
            parts.append(f"{field_name}={shown(holder[field_name])}")
    acquired = holder.get("acquired_at")
    if isinstance(acquired, int | float):
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(acquired))
        parts.append(f"acquired_at={stamp} ({max(0.0, time.time() - acquired):.1f} s ago)")
    if "raw" in holder:
        parts.append(f"raw={holder['raw']!r}")
    if holder.get("handed_over"):
        parts.append("handed over by a release to the first waiter in line (no holder info)")
    return " ".join(parts)


def _describe_lessee(one: admin.Lessee, n: int) -> str:
    ttl = "unknown" if one["ttl_s"] is None else f"{one['ttl_s']:.3f} s"
    line = f"{shown(one['token_prefix'])}…, validity left {ttl}"
    if "servers_held" in one:
        line += f", on {one['servers_held']}/{n} servers"
        if not one.get("majority"):
            line += " (not a majority: not valid)"
    if one["holder"]:
        line += f"; holder {_describe_holder(one['holder'])}"
    return line


def _print_family_status(report: admin.Status) -> None:
    """The text form of a semaphore's or read-write lock's status (stdout)."""
    rows, key, kind = report["servers"], report["key"], report.get("kind")
    n = len(rows)
    for row in rows:
        if row["error"] is not None:
            print(f"  {row['server']}: error: {shown(row['error'])}")
    if kind == "semaphore":
        permits = report.get("permits", [])
        valid = sum(1 for one in permits if one.get("majority"))
        limit = report.get("limit")
        of = f"limit {limit}" if limit is not None else "limit unknown (not kept on a majority)"
        print(f"semaphore {key!r}: {valid} permit(s) held on a majority of {n} ({of})")
        for one in permits:
            print(f"  slot {one.get('slot')}: {_describe_lessee(one, n)}")
    else:
        readers = report.get("readers", [])
        writer = report.get("writer")
        valid = sum(1 for one in readers if one.get("majority"))
        print(f"read-write lock {key!r}: {valid} reader(s) on a majority of {n} servers")
        for one in readers:
            print(f"  reader {_describe_lessee(one, n)}")
        print(f"  writer: {'none' if writer is None else _describe_lessee(writer, n)}")
        if report.get("writer_waiting"):
            print("  a writer is waiting: new readers are refused")
    print(f"current fence: {report['fence'] if report['fence'] is not None else 'none'}")


def cmd_status(args: argparse.Namespace) -> int:
    key = check_key(args.key)
    servers = resolve_servers(args.servers, [DEFAULT_SERVER])
    report = status_report(key, servers, kind=args.kind, limit=args.limit)
    rows = report["servers"]
    answered = [row for row in rows if row["error"] is None or row["held"]]
    if args.json:
        print(json.dumps(report, sort_keys=False))
    elif "kind" in report:
        _print_family_status(report)
    else:
        majority = len(rows) // 2 + 1
        held = sum(1 for row in rows if row["held"])
        print(f"lock {key!r}: held on {held}/{len(rows)} servers (majority {majority})")
        for row in rows:
            if row["error"] is not None and not row["held"]:
                print(f"  {row['server']}: error: {shown(row['error'])}")
                continue
            if row["held"]:
                ttl = "unknown" if row["ttl_s"] is None else f"{row['ttl_s']:.3f} s"
                holder = shown(row["token_prefix"])
                line = f"  {row['server']}: held by {holder}…, validity left {ttl}"
            else:
                line = f"  {row['server']}: free"
            line += f", fence {row['fence'] if row['fence'] is not None else 'none'}"
            if row["holder"]:
                line += f"; holder {_describe_holder(row['holder'])}"
            print(line)
        print(f"current fence: {report['fence'] if report['fence'] is not None else 'none'}")
        if report["leader"] is not None:
            print(f"leader: {shown(report['leader'])}")
        queue = report.get("queue", [])
        if queue:
            print(f"fair queue: {len(queue)} waiter(s) in line")
            for place, waiter in enumerate(queue, 1):
                on = f"{waiter['servers']}/{len(rows)}"
                print(f"  {place}. {shown(waiter['waiter_prefix'])}… (in line on {on} servers)")
    if not answered:
        if not args.json:
            say(f"{PROG} status", "no server answered")
        return EX_UNAVAILABLE
    return EX_OK


# -- release --------------------------------------------------------------------------------------


def cmd_release(args: argparse.Namespace) -> int:
    prog = f"{PROG} release"
    key = check_key(args.key)
    if args.token is not None and not args.token.strip():
        raise ConfigError("--token must not be empty")
    servers = resolve_servers(args.servers, [DEFAULT_SERVER])
    if args.force:
        return _force(prog, key, admin.force_release(servers, key, timeout=ADMIN_TIMEOUT))
    result = admin.release(servers, key, args.token, timeout=ADMIN_TIMEOUT)
    for one in result.servers:
        say(prog, f"{one.server}: {one.outcome}")
    n, majority = len(result.servers), result.majority
    summary = f"{key!r}: released on {result.freed}/{n} servers, majority is {majority}"
    if result.ok:
        say(prog, summary)
        return EX_OK
    if result.freed + result.failed >= majority:
        say(prog, f"{summary}; too few servers answered to be sure")
        return EX_UNAVAILABLE
    say(prog, f"{summary}: not held by token {args.token[:8]}…")
    return EX_LOST


def _force(prog: str, key: str, result: admin.ReleaseResult) -> int:
    for one in result.servers:
        if one.outcome == "deleted":
            who = f" (holder {shown(one.holder)})" if one.holder else ""
            say(
                prog,
                f"WARNING: FORCED: deleted lock {key!r} held by token {shown(one.token_prefix)}… "
                f"on {one.server}{who}",
            )
        elif one.outcome == "free":
            say(prog, f"{one.server}: lock {key!r} was not held; nothing deleted")
        elif one.outcome == "busy":
            say(prog, f"{one.server}: lock {key!r} kept changing hands; NOT deleted")
        else:
            say(prog, f"{one.server}: {one.outcome}; NOT deleted")
    n = len(result.servers)
    if result.ok:
        say(
            prog,
            f"WARNING: lock {key!r} is free on {result.freed}/{n} servers. A holder that is still "
            "running does not know yet: only fencing protects the resource from its writes.",
        )
        return EX_OK
    say(prog, f"lock {key!r} freed on only {result.freed}/{n} servers (majority {result.majority})")
    return EX_UNAVAILABLE

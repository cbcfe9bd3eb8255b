"""The result of a chaos run: the JSON object of ``fencelock chaos --json`` and the final table.

:class:`ChaosResult` holds exactly the fields DESIGN.md names (``acquisitions``,
``fenced_writes_accepted``, ``stale_writes_rejected``, ``stale_writes_accepted``,
``lost_updates``, ``unfenced_overlaps``, ``availability``, ``faults``, ``duration_s``) and, in
``details``, extra figures (the canary's lost updates, double grants, fence order, recovery
times, the fault log) that :meth:`ChaosResult.to_json` adds after them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._html import Svg, esc, page, table
from .checkers import Op, lease_windows, stale_accepted_writes, unfenced_overlap_ops

if TYPE_CHECKING:
    from .nemesis import FaultRecord

__all__ = ["JSON_FIELDS", "ChaosResult", "History", "availability", "html_report"]

JSON_FIELDS = (
    "acquisitions",
    "fenced_writes_accepted",
    "stale_writes_rejected",
    "stale_writes_accepted",
    "lost_updates",
    "unfenced_overlaps",
    "availability",
    "faults",
    "duration_s",
)


@dataclass
class ChaosResult:
    """One run's figures.

    - ``acquisitions``: leases granted;
    - ``fenced_writes_accepted`` / ``stale_writes_rejected``: fenced register writes the store
      accepted / refused for an older fence (advance or write);
    - ``stale_writes_accepted``: fenced writes accepted although the store had acknowledged a
      newer fence before they were sent (must be 0);
    - ``lost_updates``: acknowledged increments of the *fenced* register missing from its final
      value (must be 0);
    - ``unfenced_overlaps``: canary writes acknowledged after a newer holder had acquired (what
      fencing refuses; expected > 0 under pauses);
    - ``availability``: fraction of 1-second buckets of the run with at least one acquisition;
    - ``faults``: faults injected, by name; ``duration_s``: wall time of the workload, seconds.
    """

    acquisitions: int
    fenced_writes_accepted: int
    stale_writes_rejected: int
    stale_writes_accepted: int
    lost_updates: int
    unfenced_overlaps: int
    availability: float
    faults: dict[str, int]
    duration_s: float
    details: dict[str, Any] = field(default_factory=dict)
    history: History | None = field(default=None, repr=False, compare=False)

    @property
    def safe(self) -> bool:
        """No safety violation on the fenced register (the exit-code rule)."""
        return (
            self.stale_writes_accepted == 0
            and self.lost_updates == 0
            and not self.details.get("phantom_writes", 0)
        )

    def as_dict(self) -> dict[str, Any]:
        """The JSON object: DESIGN.md's fields first, then the details."""
        data: dict[str, Any] = {name: getattr(self, name) for name in JSON_FIELDS}
        for key, value in self.details.items():
            data.setdefault(key, value)
        return data

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=False)

    def table(self) -> str:
        """The human summary (several lines, no trailing newline)."""
        d = self.details
        rows: list[tuple[str, str, str]] = [
            ("acquisitions", str(self.acquisitions), ""),
            ("fenced writes accepted", str(self.fenced_writes_accepted), ""),
            ("stale writes rejected", str(self.stale_writes_rejected), "fencing at work"),
            (
                "stale writes accepted",
                str(self.stale_writes_accepted),
                _verdict(self.stale_writes_accepted == 0),
            ),
            ("lost updates (fenced)", str(self.lost_updates), _verdict(self.lost_updates == 0)),
            ("unfenced overlaps (canary)", str(self.unfenced_overlaps), "what fencing prevents"),
            (
                "lost updates (canary)",
                str(d.get("canary_lost_updates", "-")),
                _rate(d.get("canary_lost_updates"), d.get("canary_writes_acknowledged")),
            ),
            (
                "double grants",
                str(d.get("double_grants", "-")),
                "two valid leases at once (fault-induced)",
            ),
            *_family_rows(d),
            ("holders outliving their lease", str(d.get("outlived_leases", "-")), ""),
            ("fence order violations", str(d.get("fence_violations", "-")), ""),
            ("availability", f"{self.availability:.1%}", "1-s buckets with an acquisition"),
            (
                "recovery after heal (max)",
                _seconds(d.get("recovery_max_s")),
                f"bound {_seconds(d.get('recovery_bound_s'))}, late: {d.get('liveness_late', '-')}",
            ),
            ("duration", f"{self.duration_s:.1f} s", ""),
        ]
        width = max(len(r[0]) for r in rows)
        lines = [f"{name:<{width}}  {value:>10}  {note}".rstrip() for name, value, note in rows]
        faults = ", ".join(f"{k}={v}" for k, v in sorted(self.faults.items())) or "none"
        lines.append(f"{'faults':<{width}}  {faults}")
        lines.append(
            "result: "
            + (
                "SAFE (no violation on the fenced register)"
                if self.safe
                else "VIOLATION on the fenced register"
            )
        )
        return "\n".join(lines)


def _family_rows(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The primitive and front end, and the rows of the primitive's own checkers."""
    primitive = str(d.get("primitive", "lock"))
    front = f"front {d.get('front', 'sync')}"
    if primitive == "semaphore":
        return [
            ("primitive", "semaphore", f"limit {d.get('limit')}, {front}"),
            (
                "permits over the limit",
                str(d.get("permit_overlaps", "-")),
                f"most valid at once: {d.get('max_concurrent_permits', '-')}",
            ),
        ]
    if primitive == "rwlock":
        return [
            (
                "primitive",
                "rwlock",
                f"{d.get('reads', '-')} reads, {d.get('writes', '-')} writes, {front}",
            ),
            ("writer with a reader", str(d.get("writer_with_reader", "-")), ""),
            ("two writers", str(d.get("two_writers", "-")), ""),
            ("most readers at once", str(d.get("max_readers", "-")), "readers share"),
            (
                "readers sharing a fence",
                str(d.get("reader_fence_duplicates", "-")),
                "allowed (not a fence violation)",
            ),
            (
                "writer fence not above earlier",
                str(d.get("writer_fence_violations", "-")),
                "",
            ),
        ]
    if primitive == "multi":
        by_key = d.get("fence_violations_by_key") or {}
        return [
            ("primitive", "multi", f"{d.get('keys', '-')} keys, {front}"),
            (
                "key fence violations",
                str(sum(by_key.values())) if by_key else "-",
                ", ".join(f"{k}: {v}" for k, v in by_key.items()),
            ),
        ]
    if primitive == "election":
        return [
            ("primitive", "election", f"{d.get('terms', '-')} terms, {front}"),
            ("two leaders in a term", str(d.get("two_leaders_in_a_term", "-")), ""),
            ("terms out of grant order", str(d.get("terms_out_of_order", "-")), ""),
            ("two leaders at once", str(d.get("two_leaders_at_once", "-")), ""),
            (
                "terms lost",
                str(d.get("terms_lost", "-")),
                f"bodies cancelled: {d.get('bodies_cancelled', '-')}",
            ),
        ]
    return [("primitive", primitive, front)]


@dataclass(frozen=True)
class History:
    """What a run recorded, for the picture: every worker's operations, the fault log, the
    workload's monotonic start and end (ns), and the number of lock servers and workers."""

    ops: Sequence[Op]
    records: Sequence[FaultRecord]
    start_ns: int
    end_ns: int
    servers: int
    workers: int


def _verdict(ok: bool) -> str:
    return "ok" if ok else "VIOLATION"


def _rate(part: object, whole: object) -> str:
    if isinstance(part, int) and isinstance(whole, int) and whole > 0:
        return f"{part / whole:.1%} of acknowledged canary writes"
    return ""


def _seconds(value: object) -> str:
    return f"{value:.2f} s" if isinstance(value, int | float) else "-"


def availability(
    acquired_ns: list[int], start_ns: int, end_ns: int, bucket_s: float = 1.0
) -> float:
    """Fraction of ``bucket_s``-second buckets in ``[start_ns, end_ns)`` with at least one
    acquisition (1.0 for an empty interval)."""
    width = int(bucket_s * 1e9)
    buckets = max((end_ns - start_ns) // width, 0)
    if buckets == 0:
        return 1.0
    hit = {
        (t - start_ns) // width for t in acquired_ns if start_ns <= t < start_ns + buckets * width
    }
    return round(len(hit) / buckets, 4)


# --------------------------------------------------------------------------------------------
# the HTML page of ``fencelock chaos --html``

FAULT_COLOURS = {
    "pause": "#ffcc80",
    "kill": "#ef9a9a",
    "partition": "#b39ddb",
    "network": "#90caf9",
    "clock": "#a5d6a7",
}
_WORKER_NOTE = re.compile(r"worker=(\d+)")
_WIDTH = 1320
_LEFT = 110
_RIGHT = 20
_ROW = 26
_MAX_LATENCY_POINTS = 6000


def html_report(result: ChaosResult, history: History) -> str:
    """The self-contained page: summary table, timeline (per lock server: the faults; per
    worker: leases, validity, pauses, every write, violations in red) and latency over time."""
    from .nemesis import CATEGORY

    span_ns = max(history.end_ns - history.start_ns, 1)
    plot_w = _WIDTH - _LEFT - _RIGHT

    def x_of(t_ns: int) -> float:
        clipped = min(max(t_ns, history.start_ns), history.end_ns)
        return _LEFT + plot_w * (clipped - history.start_ns) / span_ns

    def secs(t_ns: int) -> str:
        return f"{(t_ns - history.start_ns) / 1e9:.3f} s"

    d = result.details
    body: list[str] = []
    verdict = (
        '<p class="verdict-safe">SAFE: no violation on the fenced register</p>'
        if result.safe
        else '<p class="verdict-bad">VIOLATION on the fenced register</p>'
    )
    body.append(verdict)
    body.append("<h2>Summary</h2>")
    body.append(_summary_table(result))

    # ---- timeline --------------------------------------------------------------------------
    violations = {id(op) for op in unfenced_overlap_ops(history.ops)}
    stale_ok = {id(op) for op in stale_accepted_writes(history.ops)}
    rows = history.servers + history.workers
    top = 30.0
    height = top + rows * _ROW + 40
    svg = Svg(_WIDTH, height, cls="timeline")
    _axis(svg, x_of, history, top, top + rows * _ROW)
    for i in range(history.servers):
        y = top + i * _ROW
        svg.rect(_LEFT, y + 2, plot_w, _ROW - 4, "#f5f5f5")
        svg.text(_LEFT - 8, y + _ROW / 2 + 4, f"server {i}", anchor="end")
    for w in range(history.workers):
        y = top + (history.servers + w) * _ROW
        svg.rect(_LEFT, y + 2, plot_w, _ROW - 4, "#fafafa", cls="worker-row")
        svg.text(_LEFT - 8, y + _ROW / 2 + 4, f"worker {w}", anchor="end")

    def worker_y(worker: int) -> float:
        return top + (history.servers + worker) * _ROW

    for rec in history.records:
        category = CATEGORY.get(rec.fault.name, "network")
        colour = FAULT_COLOURS.get(category, "#e0e0e0")
        end = rec.heal_ns if rec.heal_ns is not None else history.end_ns
        x0, x1 = x_of(rec.start_ns), x_of(end)
        label = f"{rec.fault.name} {secs(rec.start_ns)} .. {secs(end)} {rec.note} {rec.error}"
        match = _WORKER_NOTE.search(rec.note)
        if rec.fault.name == "pause-holder" and match and int(match.group(1)) < history.workers:
            y = worker_y(int(match.group(1)))
            svg.rect(
                x0,
                y + 1,
                x1 - x0,
                _ROW - 2,
                colour,
                cls="fault pause",
                title=label,
                extra='opacity="0.8"',
            )
            continue
        if rec.fault.name == "pause-holder":
            continue  # no worker was paused (the fault log says why)
        targets = rec.fault.targets or tuple(range(history.servers))
        for t in targets:
            if 0 <= t < history.servers:
                y = top + t * _ROW
                svg.rect(
                    x0,
                    y + 2,
                    x1 - x0,
                    _ROW - 4,
                    colour,
                    cls=f"fault {category}",
                    title=label.strip(),
                )

    for lw in lease_windows(history.ops):
        if lw.worker >= history.workers:
            continue
        y = worker_y(lw.worker)
        x0, x1 = x_of(lw.start_ns), x_of(lw.end_ns)
        svg.rect(
            x0,
            y + 6,
            x1 - x0,
            _ROW - 12,
            "#42a5f5",
            cls="lease",
            title=f"worker {lw.worker} fence {lw.fence}: {secs(lw.start_ns)} .. {secs(lw.end_ns)}",
        )
        if lw.used_until_ns > lw.end_ns:
            svg.line(
                x1,
                y + _ROW / 2,
                x_of(lw.used_until_ns),
                y + _ROW / 2,
                "#c62828",
                width=2,
                cls="outlived",
                extra='stroke-dasharray="3,2"',
                title=f"fence {lw.fence} kept acting until {secs(lw.used_until_ns)}",
            )
    for op in history.ops:
        if (
            op.kind == "acquire"
            and op.status == "ok"
            and op.until_ns is not None
            and op.worker < history.workers
            and op.done_ns is not None
        ):
            y = worker_y(op.worker)
            svg.rect(
                x_of(op.done_ns),
                y + 4,
                x_of(op.until_ns) - x_of(op.done_ns),
                2,
                "#0d47a1",
                cls="validity",
                title=f"validity of fence {op.fence} until {secs(op.until_ns)}",
            )
    marks = {"accepted": 0, "refused": 0, "unknown": 0, "violation": 0}
    for op in history.ops:
        if op.kind not in ("write", "advance", "canary-write") or op.worker >= history.workers:
            continue
        t = op.done_ns if op.done_ns is not None else op.invoke_ns
        x, y = x_of(t), worker_y(op.worker)
        what = f"{op.kind} fence {op.fence} value {op.value} at {secs(t)}"
        if id(op) in violations or id(op) in stale_ok:
            reason = (
                "canary write after a newer holder acquired"
                if id(op) in violations
                else ("STALE fenced write accepted")
            )
            svg.rect(
                x - 4, y + 2, 8, _ROW - 4, "#d50000", cls="violation", title=f"{reason}: {what}"
            )
            marks["violation"] += 1
        elif op.kind == "canary-write":
            continue  # an ordinary canary write: nothing to show
        elif op.status == "ok":
            if op.kind == "write":
                svg.circle(
                    x, y + _ROW - 7, 3, "#2e7d32", cls="write accepted", title=f"accepted {what}"
                )
                marks["accepted"] += 1
        elif op.status == "fail" and op.info == "stale":
            svg.line(
                x - 4,
                y + 3,
                x + 4,
                y + _ROW - 3,
                "#e65100",
                width=2,
                cls="write refused",
                title=f"refused as stale: {what}",
            )
            svg.line(x - 4, y + _ROW - 3, x + 4, y + 3, "#e65100", width=2)
            marks["refused"] += 1
        elif op.status == "unknown":
            svg.circle(
                x,
                y + _ROW - 7,
                3,
                "#9e9e9e",
                cls="write unknown",
                title=f"outcome unknown ({op.info}): {what}",
            )
            marks["unknown"] += 1
    body.append("<h2>Timeline</h2>")
    body.append(_legend())
    body.append(svg.render())
    body.append(
        f"<p>{marks['accepted']} fenced writes accepted, {marks['refused']} refused as stale, "
        f"{marks['unknown']} of unknown outcome, {marks['violation']} violation(s) marked in red "
        f"(canary writes that fencing would have refused, and stale fenced writes accepted).</p>"
    )

    # ---- latency over time -----------------------------------------------------------------
    body.append("<h2>Acquire latency over time</h2>")
    body.append(_latency_plot(history, x_of))

    if d.get("fault_log"):
        body.append("<h2>Fault log</h2><pre>")
        body.append(esc("\n".join(str(line) for line in d["fault_log"])))
        body.append("</pre>")
    subtitle = (
        f"{d.get('primitive', 'lock')} ({d.get('front', 'sync')} front end), "
        f"{history.servers} servers, {history.workers} workers, {result.duration_s:.1f} s, "
        f"seed {d.get('seed', '-')}, engine {d.get('engine', '-')}"
    )
    title = f"fencelock chaos: {d.get('primitive', 'lock')}, {d.get('front', 'sync')}"
    return page(title, subtitle, body)


def _summary_table(result: ChaosResult) -> str:
    rows = []
    for line in result.table().splitlines():
        if line.startswith("result:"):
            continue
        parts = re.split(r"\s{2,}", line.strip(), maxsplit=2)
        parts += [""] * (3 - len(parts))
        name, value, note = parts[0], parts[1], parts[2]
        cls = "bad" if "VIOLATION" in note else ("good" if note == "ok" else "")
        rows.append(((name, ""), (value, cls), (note, "")))
    return table(("figure", "value", "note"), rows, cls="summary")


def _legend() -> str:
    items = [
        ("#42a5f5", "lease held (acquire .. validity end or release)"),
        ("#0d47a1", "validity window"),
        ("#c62828", "holder acting past its validity (dashed)"),
        ("#2e7d32", "fenced write accepted"),
        ("#e65100", "write refused as stale (x)"),
        ("#d50000", "violation"),
    ] + [(colour, f"fault: {name}") for name, colour in FAULT_COLOURS.items()]
    spans = "".join(
        f'<span><i style="background:{esc(c)}"></i>{esc(label)}</span>' for c, label in items
    )
    return f'<p class="legend">{spans}</p>'


def _axis(svg: Svg, x_of: Any, history: History, y0: float, y1: float) -> None:
    span_s = (history.end_ns - history.start_ns) / 1e9
    step = _nice_step(span_s)
    t = 0.0
    for _ in range(1000):
        if t > span_s + 1e-9:
            break
        x = x_of(history.start_ns + int(t * 1e9))
        svg.line(x, y0 - 4, x, y1, "#e0e0e0")
        svg.text(x, y0 - 8, f"{t:g} s", anchor="middle")
        t += step


def _nice_step(span_s: float) -> float:
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600, 7200):
        if span_s / step <= 16:
            return float(step)
    return 3600.0 * 6


def _latency_plot(history: History, x_of: Any) -> str:
    points = [
        op
        for op in history.ops
        if op.kind == "acquire" and op.done_ns is not None and op.status != "unknown"
    ]
    if len(points) > _MAX_LATENCY_POINTS:
        every = len(points) // _MAX_LATENCY_POINTS + 1
        points = points[::every]
    height, top, bottom = 240, 20, 30
    plot_h = height - top - bottom
    svg = Svg(_WIDTH, height, cls="latency")
    plot_w = _WIDTH - _LEFT - _RIGHT
    svg.rect(_LEFT, top, plot_w, plot_h, "#ffffff", extra='stroke="#bbb"')
    for rec in history.records:
        end = rec.heal_ns if rec.heal_ns is not None else history.end_ns
        svg.rect(
            x_of(rec.start_ns),
            top,
            x_of(end) - x_of(rec.start_ns),
            plot_h,
            "#fff3e0",
            title=rec.fault.name,
        )
    lat_ms = [((op.done_ns or 0) - op.invoke_ns) / 1e6 for op in points]
    peak = max(lat_ms, default=0.0) or 1.0
    for op, ms in zip(points, lat_ms, strict=True):
        y = top + plot_h - plot_h * ms / peak
        ok = op.status == "ok"
        svg.circle(
            x_of(op.done_ns or op.invoke_ns),
            y,
            2,
            "#1565c0" if ok else "#9e9e9e",
            cls="latency-point",
            title=f"worker {op.worker} acquire {'ok' if ok else op.info}: {ms:.1f} ms",
        )
    svg.text(_LEFT - 6, top + 10, f"{peak:.0f} ms", anchor="end")
    svg.text(_LEFT - 6, top + plot_h, "0", anchor="end")
    svg.text(
        _LEFT + plot_w / 2,
        height - 8,
        f"acquire() latency per attempt (blue: granted, grey: refused), {len(points)} "
        f"attempts; fault windows shaded",
        anchor="middle",
    )
    svg.line(_LEFT, top + plot_h, _LEFT + plot_w, top + plot_h, "#777")
    return svg.render()

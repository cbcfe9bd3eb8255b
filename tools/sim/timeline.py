"""The HTML timeline of a simulated schedule (``simulate.py --replay SEED --html FILE``).

One self-contained page (inline CSS and SVG, as ``fencelock chaos --html`` draws, with its
helpers from :mod:`fencelock.cli._html`): per schedule shown (the replayed one and, with
``--shrink``, its shrunk form), a lane per server and per client process on the simulation's
true time axis. Servers' lanes carry their faults (a crash or a pause as a bar, with the
restart; a reset, a dropped reply, a lost request, a script flush, a clock jump as a mark);
the network lane the delay spikes; each client process's lane its leases (from the grant's
round to the earlier of its local deadline and its release, one bar per lease, stacked when
they overlap; a lease the violation names outlined in red), its pauses and its death.
Every shape has a title (hover) with what happened. Below it, the trace.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from fencelock.cli._html import Svg, esc, page

from .world import World

__all__ = ["html_timeline", "marks_of"]

T0 = 1000.0  # the world's clock starts here (the trace prints time - T0)
_WIDTH = 1320
_LEFT = 120
_RIGHT = 20
_ROW = 22

COLOURS = {
    "crash": "#ef9a9a",  # data kept
    "wiped": "#c62828",  # data lost
    "pause": "#ffcc80",
    "network": "#90caf9",
    "clock": "#a5d6a7",
    "script": "#ce93d8",
    "restart": "#2e7d32",
    "kill": "#b71c1c",
    "repeat": "#9e9e9e",
    "fork": "#6a1b9a",
}
LABELS = {
    "crash": "crash (data kept)",
    "wiped": "crash (data wiped)",
    "pause": "pause (server or client)",
    "network": "reset, reply dropped, request lost, delay spike",
    "clock": "clock jump",
    "script": "SCRIPT FLUSH",
    "kill": "client process killed",
    "repeat": "background repeat of a release",
    "fork": "client process forked (on the parent's and the child's lanes)",
}
KEY_COLOURS = ("#42a5f5", "#26a69a", "#7e57c2", "#8d6e63", "#5c6bc0", "#66bb6a")

_LINE = re.compile(r"^\s*(-?\d+\.\d+) (.*)$")
_CLIENT = r"([A-Za-z0-9_]+)(?:/[^\s']*)?"


@dataclass(frozen=True)
class Mark:
    """One thing the trace shows: a bar (``end`` set) or a mark, on a lane."""

    lane: str  # "sim0", "network", or a client process ("c1", "sy", "probe")
    kind: str  # a key of COLOURS
    start: float  # true time, trace scale (seconds from the world's start)
    end: float | None
    text: str


_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^crash sim(\d+) \(kept\), back in (\d+\.\d+) s"), "crash"),
    (re.compile(r"^crash sim(\d+) \(wiped\), back in (\d+\.\d+) s"), "wiped"),
    (re.compile(r"^pause sim(\d+) for (\d+\.\d+) s"), "pause"),
    (re.compile(r"^restart sim(\d+)"), "restart"),
    (re.compile(r"^SCRIPT FLUSH on sim(\d+)"), "script"),
    (re.compile(r"^clock of sim(\d+) jumps"), "clock"),
    (re.compile(r"^reset conn \d+ \(sim(\d+)\)"), "network"),
    (re.compile(r"^drop reply on conn \d+ \(sim(\d+)\)"), "network"),
    (re.compile(r"^lose request on conn \d+ \(sim(\d+)"), "network"),
    (re.compile(r"^background repeat of \S+ on sim(\d+)"), "repeat"),
)


def marks_of(trace: Sequence[str]) -> list[Mark]:
    """The faults and events of a trace, as lanes' bars and marks."""
    marks: list[Mark] = []
    for line in trace:
        found = _LINE.match(line)
        if found is None:
            continue
        t, text = float(found.group(1)), found.group(2)
        for pattern, kind in _PATTERNS:
            hit = pattern.match(text)
            if hit is None:
                continue
            end = t + float(hit.group(2)) if kind in ("crash", "wiped", "pause") else None
            marks.append(Mark(f"sim{hit.group(1)}", kind, t, end, text))
            break
        else:
            if hit := re.match(r"^delay spike to \S+ s until (-?\d+\.\d+)", text):
                marks.append(Mark("network", "network", t, float(hit.group(1)), text))
            elif hit := re.match(rf"^pause client {_CLIENT} until (-?\d+\.\d+)", text):
                marks.append(Mark(hit.group(1), "pause", t, float(hit.group(2)), text))
            elif hit := re.match(rf"^slow round: {_CLIENT} stops for (\d+\.\d+) s", text):
                marks.append(Mark(hit.group(1), "pause", t, t + float(hit.group(2)), text))
            elif hit := re.match(r"^kill client process (\S+)", text):
                marks.append(Mark(hit.group(1), "kill", t, None, text))
            elif hit := re.match(r"^fork client process (\S+) -> (\S+)", text):
                marks.append(Mark(hit.group(1), "fork", t, None, text))
                marks.append(Mark(hit.group(2), "fork", t, None, text))
    return marks


def _process(client: str) -> str:
    return client.split("/", 1)[0]


def _nice_step(span: float) -> float:
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60):
        if span / step <= 16:
            return float(step)
    return 120.0


def _timeline(world: World, bad: Sequence[tuple[str, str]]) -> str:
    history = world.history
    marks = marks_of(history.trace)
    grants = history.grants
    # the involved leases: fences the violations name
    named = {int(f) for _, detail in bad for f in re.findall(r"fence (\d+)", detail)}
    ends = [g.deadline - T0 for g in grants] + [m.end or m.start for m in marks]
    ends += [m.start for m in marks]
    span = max([world.clock.now - T0, *ends, 0.1])
    servers = [f"sim{i}" for i in range(len(world.servers))]
    processes: list[str] = []
    for name in [_process(g.client) for g in grants] + [m.lane for m in marks]:
        if name not in processes and name not in servers and name != "network":
            processes.append(name)
    processes.sort(key=lambda p: (not re.fullmatch(r"c\d+", p), len(p), p))
    # stack overlapping leases of one process in rows of its lane
    rows_of: dict[str, list[float]] = {p: [] for p in processes}
    placed: list[tuple[int, str, int]] = []  # (grant index, process, row)
    for i, g in sorted(enumerate(grants), key=lambda ig: ig[1].start or ig[1].at):
        rows = rows_of[_process(g.client)]
        start = (g.start or g.at) - T0
        end = min(g.deadline, g.ended if g.ended is not None else g.deadline) - T0
        for r, free_at in enumerate(rows):
            if free_at <= start:
                rows[r] = end
                break
        else:
            rows.append(end)
            r = len(rows) - 1
        placed.append((i, _process(g.client), r))
    lanes = [*servers, "network", *processes]
    height_of = {lane: _ROW * max(1, len(rows_of.get(lane, []))) for lane in lanes}
    top = 30.0
    y_of: dict[str, float] = {}
    y = top
    for lane in lanes:
        y_of[lane] = y
        y += height_of[lane]
    plot_w = _WIDTH - _LEFT - _RIGHT
    svg = Svg(_WIDTH, y + 20, cls="timeline")

    def x_of(t: float) -> float:
        return _LEFT + plot_w * min(max(t, 0.0), span) / span

    step = _nice_step(span)
    tick = 0.0
    while tick <= span + 1e-9:
        svg.line(x_of(tick), top - 4, x_of(tick), y, "#e0e0e0")
        svg.text(x_of(tick), top - 8, f"{tick:g} s", anchor="middle")
        tick += step
    for lane in lanes:
        kind = "server" if lane in servers else ("network" if lane == "network" else "client")
        svg.rect(
            _LEFT,
            y_of[lane] + 1,
            plot_w,
            height_of[lane] - 2,
            "#f5f5f5" if kind != "client" else "#fafafa",
            cls=f"lane {kind}",
            title=lane,
        )
        svg.text(_LEFT - 8, y_of[lane] + _ROW / 2 + 4, lane, anchor="end")
    keys = sorted({g.key for g in grants})
    for i, process, row in placed:
        g = grants[i]
        start = (g.start or g.at) - T0
        valid = g.deadline - T0
        end = min(valid, (g.ended if g.ended is not None else g.deadline) - T0)
        colour = KEY_COLOURS[keys.index(g.key) % len(KEY_COLOURS)]
        top_y = y_of[process] + row * _ROW
        bad_lease = g.fence in named
        svg.rect(
            x_of(start),
            top_y + 5,
            x_of(end) - x_of(start),
            _ROW - 10,
            colour,
            cls="grant violation" if bad_lease else "grant",
            title=(
                f"{g.client} {g.key} fence {g.fence}: round from {start:.4f}, returned "
                f"{g.at - T0:.4f}, valid until {valid:.4f}"
                + (f", release from {g.ended - T0:.4f}: {g.release}" if g.ended else "")
                + (f", lost: {g.lost_reason}" if g.lost_reason else "")
            ),
            extra='stroke="#d50000" stroke-width="2"' if bad_lease else "",
        )
        svg.line(x_of(g.at - T0), top_y + 3, x_of(g.at - T0), top_y + _ROW - 3, "#0d47a1")
        if g.ended is not None:
            svg.circle(
                x_of(g.ended - T0),
                top_y + _ROW / 2,
                3,
                "#2e7d32" if g.release == "ok" else "#e65100",
                cls="release",
                title=f"{g.client} release of {g.key} at {g.ended - T0:.4f}: {g.release}",
            )
    for m in marks:
        lane_y = y_of.get(m.lane)
        if lane_y is None:
            continue
        colour = COLOURS[m.kind]
        h = height_of[m.lane]
        if m.end is not None:
            svg.rect(
                x_of(m.start),
                lane_y + 2,
                x_of(m.end) - x_of(m.start),
                h - 4,
                colour,
                cls=f"fault {m.kind}",
                title=f"{m.start:.4f} .. {m.end:.4f} {m.text}",
                extra='opacity="0.75"',
            )
        else:
            x = x_of(m.start)
            svg.line(
                x,
                lane_y + 1,
                x,
                lane_y + h - 1,
                colour,
                width=1 if m.kind == "repeat" else 3,
                cls=f"mark {m.kind}",
                title=f"{m.start:.4f} {m.text}",
            )
    for _, detail in bad:
        for at in re.findall(r"at (\d+\.\d+)", detail):
            x = x_of(float(at))
            svg.line(
                x, top, x, y, "#d50000", cls="violation-at", title=detail,
                extra='stroke-dasharray="4,3"',
            )  # fmt: skip
    return svg.render()


def _legend() -> str:
    items = [
        (KEY_COLOURS[0], "lease (one colour per key): its round to its deadline or release"),
        ("#0d47a1", "acquire() returned (tick)"),
        ("#d50000", "a lease the violation names (outline), the violation's time (dashed)"),
        ("#2e7d32", "release ok / restart"),
        ("#e65100", "release not confirmed"),
    ] + [(c, LABELS[k]) for k, c in COLOURS.items() if k in LABELS]
    spans = "".join(f'<span><i style="background:{esc(c)}"></i>{esc(t)}</span>' for c, t in items)
    return f'<p class="legend">{spans}</p>'


def html_timeline(seed: int, shown: Sequence[tuple[str, World, Sequence[tuple[str, str]]]]) -> str:
    """The page: for each ``(replay command, world, violations)``, its timeline and trace."""
    body: list[str] = []
    for command, world, bad in shown:
        history = world.history
        kept = sum(1 for _, _, k in history.plan if k)
        body.append(f"<h2>{esc(command)}</h2>")
        if bad:
            body.append("".join(f'<p class="verdict-bad">{esc(p)}: {esc(d)}</p>' for p, d in bad))
        else:
            body.append('<p class="verdict-safe">no violation</p>')
        body.append(
            f"<p>{len(world.servers)} servers, {world.steps} steps, {len(history.grants)} "
            f"grants, {kept} planned faults ({esc(history.faults)})</p>"
        )
        body.append(_legend())
        body.append(_timeline(world, bad))
        plan = [
            f"#{i} {kind} at {when - T0:.4f}" + ("" if k else " (left out)")
            for i, (when, kind, k) in enumerate(history.plan)
        ]
        body.append("<details><summary>trace</summary><pre>")
        body.append(esc("\n".join(["planned faults: " + ", ".join(plan), *history.trace])))
        body.append("</pre></details>")
    title = f"fencelock simulation: seed {seed}"
    subtitle = "true time axis; servers, the network and client processes as lanes"
    return page(title, subtitle, body)

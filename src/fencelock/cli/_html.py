"""Self-contained HTML pages (inline CSS and SVG, no network, no JS) for ``--html`` outputs.

Plain string building with :func:`html.escape`; used by ``fencelock chaos --html`` and
``fencelock bench --html``. Nothing here does I/O.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence

__all__ = ["Svg", "bin_counts", "esc", "fmt", "histogram_svg", "log_edges", "page", "table"]

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}
p.sub{color:#555;margin:0 0 16px}
table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
td.bad{color:#fff;background:#c62828;font-weight:600}td.good{color:#1b5e20}
.legend span{display:inline-block;margin-right:14px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
svg{display:block;margin:6px 0;background:#fcfcfc;border:1px solid #ddd}
svg text{font:11px system-ui,sans-serif;fill:#333}
pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}
.verdict-safe{color:#1b5e20;font-weight:600}.verdict-bad{color:#c62828;font-weight:600}
"""


def esc(value: object) -> str:
    """``value`` as HTML-escaped text (attributes included)."""
    return html.escape(str(value), quote=True)


def fmt(value: float, digits: int = 3) -> str:
    """A compact SVG coordinate/number."""
    text = f"{value:.{digits}f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def page(title: str, subtitle: str, body: Iterable[str]) -> str:
    """A whole HTML document."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f'<h1>{esc(title)}</h1><p class="sub">{esc(subtitle)}</p>'
        + "".join(body)
        + "</body></html>\n"
    )


def table(header: Sequence[str], rows: Iterable[Sequence[tuple[str, str]]], cls: str = "") -> str:
    """A table; each row is a sequence of ``(text, css_class)`` cells (text is escaped)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="{esc(c)}">{esc(t)}</td>' if c else f"<td>{esc(t)}</td>" for t, c in row
        )
        body.append(f"<tr>{cells}</tr>")
    attr = f' class="{esc(cls)}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


class Svg:
    """An SVG drawing built element by element."""

    def __init__(self, width: float, height: float, cls: str = "") -> None:
        self.width = width
        self.height = height
        self.cls = cls
        self.parts: list[str] = []

    # each element takes the keywords of :meth:`_shape` (``cls``, ``title``, ``extra``) as
    # ``**style``

    def rect(self, x: float, y: float, w: float, h: float, fill: str, **style: str) -> None:
        attrs = (
            f'x="{fmt(x)}" y="{fmt(y)}" width="{fmt(max(w, 0.5))}" height="{fmt(h)}" '
            f'fill="{esc(fill)}"'
        )
        self._shape("rect", attrs, **style)

    def line(
        self,
        x1: float,
        y1: float,
        x2: float,
        y2: float,
        stroke: str,
        *,
        width: float = 1,
        **style: str,
    ) -> None:
        attrs = (
            f'x1="{fmt(x1)}" y1="{fmt(y1)}" x2="{fmt(x2)}" y2="{fmt(y2)}" '
            f'stroke="{esc(stroke)}" stroke-width="{fmt(width)}"'
        )
        self._shape("line", attrs, **style)

    def circle(self, x: float, y: float, r: float, fill: str, **style: str) -> None:
        attrs = f'cx="{fmt(x)}" cy="{fmt(y)}" r="{fmt(r)}" fill="{esc(fill)}"'
        self._shape("circle", attrs, **style)

    def path(self, d: str, stroke: str, **style: str) -> None:
        attrs = f'd="{esc(d)}" stroke="{esc(stroke)}" fill="none" stroke-width="2"'
        self._shape("path", attrs, **style)

    def text(
        self, x: float, y: float, value: str, *, anchor: str = "start", extra: str = ""
    ) -> None:
        self.parts.append(
            f'<text x="{fmt(x)}" y="{fmt(y)}" text-anchor="{anchor}"{extra}>{esc(value)}</text>'
        )

    def _shape(
        self, tag: str, attrs: str, *, cls: str = "", title: str = "", extra: str = ""
    ) -> None:
        """The element ``tag``: ``cls`` its CSS class, ``title`` its tooltip, ``extra`` more
        attributes as written."""
        if cls:
            attrs += f' class="{esc(cls)}"'
        if extra:
            attrs += " " + extra
        if title:
            self.parts.append(f"<{tag} {attrs}><title>{esc(title)}</title></{tag}>")
        else:
            self.parts.append(f"<{tag} {attrs}/>")

    def render(self) -> str:
        cls = f' class="{esc(self.cls)}"' if self.cls else ""
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg"{cls} width="{fmt(self.width)}" '
            f'height="{fmt(self.height)}" viewBox="0 0 {fmt(self.width)} {fmt(self.height)}">'
            + "".join(self.parts)
            + "</svg>"
        )


PALETTE = ("#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#00838f", "#ad1457")


def histogram_svg(
    title: str, edges_us: Sequence[float], counts: dict[str, Sequence[int]], *, width: int = 640
) -> str:
    """Overlaid latency histograms (a step line per series) over log-spaced ``edges_us``."""
    height, left, right, top, bottom = 230, 56, 40, 24, 40
    svg = Svg(width, height, cls="histogram")
    svg.text(left, 15, title)
    bins = len(edges_us) - 1
    peak = max((max(c, default=0) for c in counts.values()), default=0)
    plot_w, plot_h = width - left - right, height - top - bottom
    svg.rect(left, top, plot_w, plot_h, "#ffffff", extra='stroke="#bbb"')
    if bins < 1 or peak == 0:
        svg.text(left + plot_w / 2, top + plot_h / 2, "no samples", anchor="middle")
        return svg.render()
    step = plot_w / bins

    def y_of(count: int) -> float:
        return top + plot_h - plot_h * count / peak

    for index, (name, series) in enumerate(counts.items()):
        colour = PALETTE[index % len(PALETTE)]
        d = [f"M{fmt(left)},{fmt(top + plot_h)}"]
        for i, count in enumerate(series):
            x0, x1 = left + i * step, left + (i + 1) * step
            d.append(f"L{fmt(x0)},{fmt(y_of(count))}L{fmt(x1)},{fmt(y_of(count))}")
        d.append(f"L{fmt(left + plot_w)},{fmt(top + plot_h)}")
        total = sum(series)
        svg.path("".join(d), colour, cls="series", title=f"{name}: {total} samples")
        svg.rect(left + plot_w - 150, top + 6 + 16 * index, 10, 10, colour)
        svg.text(left + plot_w - 136, top + 15 + 16 * index, f"{name} ({total})")
    # x labels: every few edges
    every = max(1, bins // 6)
    for i in range(0, bins + 1, every):
        x = left + i * step
        svg.line(x, top + plot_h, x, top + plot_h + 4, "#777")
        svg.text(x, top + plot_h + 16, _us_label(edges_us[i]), anchor="middle")
    svg.text(left + plot_w / 2, height - 6, "latency (log scale)", anchor="middle")
    svg.text(left - 6, top + 10, str(peak), anchor="end")
    svg.text(left - 6, top + plot_h, "0", anchor="end")
    return svg.render()


def _us_label(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    if us >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} µs"


def log_edges(values: Iterable[float], bins: int = 30) -> list[float]:
    """``bins + 1`` log-spaced edges covering every positive value (a single bin for none)."""
    positive = [v for v in values if v > 0]
    if not positive:
        return [0.0, 1.0]
    lo, hi = min(positive), max(positive)
    if hi <= lo:
        hi = lo * 1.5
    a, b = math.log10(lo), math.log10(hi)
    return [10 ** (a + (b - a) * i / bins) for i in range(bins + 1)]


def bin_counts(values: Iterable[float], edges: Sequence[float]) -> list[int]:
    """How many ``values`` fall in each ``[edges[i], edges[i+1])`` (the last bin closed)."""
    import bisect

    counts = [0] * (len(edges) - 1)
    if not counts:
        return counts
    for v in values:
        if v <= 0:
            continue
        i = bisect.bisect_right(edges, v) - 1
        counts[min(max(i, 0), len(counts) - 1)] += 1
    return counts

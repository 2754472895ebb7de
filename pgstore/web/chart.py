"""The overview's chart, drawn on the server as inline SVG: no JavaScript, no library.

Two panels over the last hour, one column per minute: the jobs marked dispatched in
that minute, and how late they were (from ``dispatch_at`` to the mark: the median as a
line, the worst as dots). Every label is escaped; the numbers are formatted here.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from pgstore.web.views import Minute, format_instant, format_span

__all__ = ["chart_svg"]

WIDTH = 760
PANEL = 150
LEFT = 70
RIGHT = 10
TOP = 24
BOTTOM = 26


def _nice_ceiling(value: float) -> float:
    """The least of 1, 2 or 5 times a power of ten at or above ``value`` (at least 1)."""
    if value <= 1:
        return 1
    scale = 1.0
    while True:
        for step in (1, 2, 5):
            if step * scale >= value:
                return step * scale
        scale *= 10


#: The tops the lateness axis may take: round lengths of time, in ms.
_TIME_TOPS = [
    s * 1000 for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14_400,
                       28_800, 86_400)
]


def _time_ceiling(ms: float) -> float:
    """The least round length of time (``_TIME_TOPS``) at or above ``ms``; past a day,
    whole days."""
    for top in _TIME_TOPS:
        if top >= ms:
            return top
    return float(-(-ms // 86_400_000) * 86_400_000)


def _panel(
    y0: int, title: str, values: Sequence[float | None], top: float, label: str,
    bars: bool, extra: Sequence[float | None] = (),
) -> list[str]:
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = PANEL - TOP - BOTTOM
    step = plot_w / max(1, len(values))
    base = y0 + TOP + plot_h
    parts = [
        f'<text class="chart-title" x="{LEFT}" y="{y0 + 16}">{escape(title)}</text>',
        f'<line class="axis" x1="{LEFT}" y1="{base}" x2="{WIDTH - RIGHT}" y2="{base}"/>',
        f'<line class="grid" x1="{LEFT}" y1="{y0 + TOP}" x2="{WIDTH - RIGHT}" y2="{y0 + TOP}"/>',
        f'<text class="tick" x="{LEFT - 6}" y="{y0 + TOP + 4}" text-anchor="end">'
        f"{escape(label)}</text>",
        f'<text class="tick" x="{LEFT - 6}" y="{base + 4}" text-anchor="end">0</text>',
    ]
    if bars:
        for i, value in enumerate(values):
            if not value:
                continue
            h = max(1.0, plot_h * value / top)
            parts.append(
                f'<rect class="bar" x="{LEFT + i * step + 1:.1f}" y="{base - h:.1f}" '
                f'width="{max(1.0, step - 2):.1f}" height="{h:.1f}"><title>{int(value)}'
                "</title></rect>"
            )
    else:
        points = [
            f"{LEFT + (i + 0.5) * step:.1f},{base - plot_h * v / top:.1f}"
            for i, v in enumerate(values) if v is not None
        ]
        if len(points) > 1:
            parts.append(f'<polyline class="line" points="{" ".join(points)}"/>')
        for i, v in enumerate(values):
            if v is not None:
                parts.append(
                    f'<circle class="median" cx="{LEFT + (i + 0.5) * step:.1f}" '
                    f'cy="{base - plot_h * v / top:.1f}" r="2.5"/>'
                )
        for i, v in enumerate(extra):
            if v is not None:
                parts.append(
                    f'<circle class="worst" cx="{LEFT + (i + 0.5) * step:.1f}" '
                    f'cy="{base - plot_h * v / top:.1f}" r="2.5"/>'
                )
    return parts


def chart_svg(minutes: Sequence[Minute]) -> str:
    """The two panels as one ``<svg>`` element (empty minutes draw nothing)."""
    height = 2 * PANEL + 10
    counts = [float(m.dispatched) for m in minutes]
    medians = [None if m.late_median is None else float(m.late_median) for m in minutes]
    worst = [None if m.late_max is None else float(m.late_max) for m in minutes]
    top_count = _nice_ceiling(max(counts, default=0))
    top_late = _time_ceiling(max((w for w in worst if w is not None), default=0))
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}"'
        f' width="{WIDTH}" height="{height}" role="img" '
        'aria-label="dispatched jobs per minute and their lateness, over the last hour">',
    ]
    parts += _panel(0, "dispatched per minute", counts, top_count, f"{int(top_count)}", True)
    parts += _panel(
        PANEL, "lateness: due to marked dispatched (line: median, red: worst)",
        medians, top_late, format_span(int(top_late)), False, worst,
    )
    if minutes:
        y = 2 * PANEL + 4
        parts.append(
            f'<text class="tick" x="{LEFT}" y="{y}">{escape(format_instant(minutes[0].start))}'
            "</text>"
        )
        parts.append(
            f'<text class="tick" x="{WIDTH - RIGHT}" y="{y}" text-anchor="end">'
            f"{escape(format_instant(minutes[-1].start))}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)

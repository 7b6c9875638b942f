"""Inline SVG drawn on the server: graph rows, metric curves, heat strips.

Colours and shapes are SVG attributes, not style, so the page's
Content-Security-Policy can forbid inline style; every text is escaped.
"""

import math
import sys

from .html import esc, number

PALETTE = ("#1f77b4", "#e4572e", "#2ca02c", "#9467bd", "#d4a017", "#17becf", "#e377c2", "#7f7f7f")
LANE_W, ROW_H, NODE_R = 14, 26, 4.5
LOG10_MAX = math.log10(sys.float_info.max)  # the largest t for which 10 ** t is a float


def lane_x(lane: int) -> float:
    return LANE_W / 2 + lane * LANE_W


def graph_row(row, width: int, pruned: bool = False) -> str:
    """One commit's band of the graph: its lanes' segments and its node."""
    ys = {"top": 0, "mid": ROW_H / 2, "bottom": ROW_H}
    parts = []
    for a, end_a, b, end_b in row.segments:
        colour = PALETTE[(b if end_b == "bottom" else a) % len(PALETTE)]
        x1, y1, x2, y2 = lane_x(a), ys[end_a], lane_x(b), ys[end_b]
        if x1 == x2:
            parts.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{colour}" stroke-width="2"/>')
        else:  # a bend: vertical at both ends, as a smooth curve
            ym = (y1 + y2) / 2
            parts.append(f'<path d="M{x1} {y1} C{x1} {ym} {x2} {ym} {x2} {y2}" fill="none" '
                         f'stroke="{colour}" stroke-width="2"/>')
    x = lane_x(row.lane)
    colour = PALETTE[row.lane % len(PALETTE)]
    fill = "#fff" if pruned else colour
    parts.append(f'<circle class="node" cx="{x}" cy="{ROW_H / 2}" r="{NODE_R}" fill="{fill}" stroke="{colour}" '
                 'stroke-width="2"/>')
    w = max(width, 1) * LANE_W
    return f'<svg width="{w}" height="{ROW_H}" viewBox="0 0 {w} {ROW_H}">{"".join(parts)}</svg>'


# -- curves ------------------------------------------------------------------

def _ticks(lo: float, hi: float, n: int = 5) -> list:
    """About ``n`` round values from ``lo`` to ``hi``; only the ends where the span is too
    small (subnormal) or the values too large for a round step in a float."""
    raw = hi / n - lo / n  # divided first: hi - lo overflows at the ends of float64's range
    if hi <= lo:
        return [lo]
    if not 0 < raw < math.inf or (mag := 10.0 ** math.floor(math.log10(raw))) == 0:
        return [lo, hi]
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first, last = math.ceil(lo / step), math.floor(hi / step)
    return [k * step for k in range(first, last + 1)] if 0 <= last - first <= 4 * n else [lo, hi]


def _span(lo: float, hi: float, pad: float) -> tuple:
    """(lo, hi) widened by ``pad`` of the span on each side (and around a single value),
    kept within float64's range."""
    top = sys.float_info.max
    if hi == lo:
        lo, hi = max(-top, lo - abs(lo) * 0.1 - 1e-9), min(top, hi + abs(hi) * 0.1 + 1e-9)
    margin = hi * pad - lo * pad
    return max(-top, lo - margin), min(top, hi + margin)


def _scale(v: float, lo: float, hi: float) -> float:
    """Where ``v`` lies from ``lo`` (0) to ``hi`` (1); halves first, as hi - lo may overflow."""
    return (v / 2 - lo / 2) / (hi / 2 - lo / 2)


def _log_ticks(lo: float, hi: float, n: int = 8) -> list:
    """Whole powers of ten from ``lo`` to ``hi`` (log10 values), at most about ``n`` of
    them, and none that 10 ** t cannot hold in a float."""
    first, last = max(math.ceil(lo), -323), min(math.floor(hi), math.floor(LOG10_MAX))
    every = max(1, math.ceil((last - first + 1) / n))
    return [float(t) for t in range(first, last + 1, every)]


def curves(series: list, x_label: str, y_label: str, width: int = 1040, height: int = 380,
           max_points: int = 400, x_format=None, log_y: bool = False, lanes: list = None) -> str:
    """A line chart of ``series``: [(name, [(x, y, commit id, tooltip)])]; each
    point a link to its commit. Long series draw every point in the line but
    at most ``max_points`` clickable points each (evenly spread). ``log_y``:
    a logarithmic y axis (points at or below zero are left out). ``lanes``:
    each series' lane in the history graph, so a branch has its lane's colour."""
    lanes = list(range(len(series))) if lanes is None else lanes
    if log_y:
        series = [(name, [(x, math.log10(y), cid, tip) for x, y, cid, tip in pts if y > 0]) for name, pts in series]
    points = [p for _, pts in series for p in pts]
    if not points:
        return '<p class=muted>No commit on these branches records this number.</p>'
    legend = 170  # the series' names, right of the plot
    left, right, top, bottom = 64, 16 + legend, 12, 40
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    y0, y1 = _span(min(ys), max(ys), 0.05)

    def sx(x):
        return left + _scale(x, x0, x1) * (width - left - right)

    def sy(y):
        return top + (1 - _scale(y, y0, y1)) * (height - top - bottom)

    out = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="{esc(y_label)} against {esc(x_label)}">',
           f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" '
           'fill="#fbfcfe" stroke="#d5dae3"/>']
    y_ticks = _log_ticks(y0, y1) if log_y else _ticks(y0, y1)
    if log_y and len(y_ticks) < 2:
        y_ticks = [t for t in _ticks(y0, y1) if t <= LOG10_MAX]
    for t in y_ticks:
        label = number(_round(10 ** t if log_y else t))
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eceff4"/>'
                   f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{esc(label)}</text>')
    for t in _ticks(x0, x1):
        out.append(f'<text x="{sx(t):.1f}" y="{height - bottom + 16}" text-anchor="middle">'
                   f'{esc(x_format(t) if x_format else number(_round(t)))}</text>')
    out.append(f'<text x="{(left + width) / 2}" y="{height - 6}" text-anchor="middle">{esc(x_label)}</text>')
    out.append(f'<text x="12" y="{top + (height - bottom) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 12 {top + (height - bottom) / 2})">{esc(y_label)}</text>')
    for i, (name, pts) in enumerate(series):
        colour = PALETTE[lanes[i] % len(PALETTE)]
        pts = sorted(pts, key=lambda p: p[0])
        line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y, _, _ in pts)
        out.append(f'<g class="series" data-series="{esc(name)}"><polyline points="{line}" fill="none" '
                   f'stroke="{colour}" stroke-width="1.5"/>')
        every = max(1, math.ceil(len(pts) / max_points))
        for x, y, cid, tip in pts[::every]:
            out.append(f'<a href="/commit?rev={esc(cid)}"><circle class="pt" cx="{sx(x):.1f}" cy="{sy(y):.1f}" '
                       f'r="3.5" fill="{colour}" data-commit="{esc(cid)}"><title>{esc(tip)}</title></circle></a>')
        out.append("</g>")
    for i, (name, _) in enumerate(series):
        y = top + 14 + 16 * i
        shown = name if len(name) <= 24 else name[:23] + "…"
        out.append(f'<rect x="{width - legend}" y="{y - 9}" width="10" height="10" '
                   f'fill="{PALETTE[lanes[i] % len(PALETTE)]}"/><text x="{width - legend + 14}" y="{y}">{esc(shown)}</text>')
    out.append("</svg>")
    return "".join(out)


def _round(t: float):
    return float(f"{t:.6g}")


# -- heat strip -----------------------------------------------------------------

def _common_prefix(names: list) -> str:
    """The dotted prefix every name shares (``model.``), to label cells by what differs."""
    if len(names) < 2:
        return ""
    first, last = min(names), max(names)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:first.rfind(".", 0, n) + 1] if n else ""


def heat(value: float) -> str:
    """White (0) to deep orange-red (1)."""
    v = min(1.0, max(0.0, value))
    r, g, b = 255 - int(v * 31), 255 - int(v * 170), 255 - int(v * 215)
    return f"#{r:02x}{g:02x}{b:02x}"


def heat_strip(cells: list, width: int = 880, height: int = 28) -> str:
    """One rectangle per layer: [(layer name, share in 0..1, tooltip, link)], in model order."""
    if not cells:
        return ""
    w = width / len(cells)
    common = _common_prefix([name for name, _, _, _ in cells])
    out = [f'<svg class="heat" width="{width}" height="{height + 14}" viewBox="0 0 {width} {height + 14}">']
    for i, (name, share, tip, href) in enumerate(cells):
        label = name[len(common):] or name
        text = (f'<text x="{i * w + w / 2:.2f}" y="{height / 2 + 4}" text-anchor="middle" '
                f'fill="{"#fff" if share > 0.6 else "#1d2330"}">{esc(label)}</text>') if w >= 7 * len(label) + 8 else ""
        out.append(f'<a href="{esc(href)}"><rect x="{i * w:.2f}" y="0" width="{max(w - 1, 0.5):.2f}" '
                   f'height="{height}" fill="{heat(share)}" stroke="#d5dae3" stroke-width="0.5" '
                   f'data-layer="{esc(name)}"><title>{esc(tip)}</title></rect>{text}</a>')
    out.append(f'<text x="0" y="{height + 12}">{esc(cells[0][0])}</text>'
               f'<text x="{width}" y="{height + 12}" text-anchor="end">{esc(cells[-1][0])}</text></svg>')
    return "".join(out)

"""Pictures of diffs and metrics, drawn with matplotlib (the optional ``plot`` extra).

matplotlib is imported only when a picture is drawn, and only its
object-oriented API with the Agg renderer is used (no pyplot, no display),
so plotting works on headless machines and in threads. Functions return
the path they wrote; they never print.

Rows follow the diff's model order (``mvc.diff.natural_key``): digit runs
compare as numbers, so ``layers.2`` comes before ``layers.10``.

**Layer**: when a diff has more tensors than fit (``max_rows``), tensors
are grouped into layers: a key up to its last all-digit component
(``model.layers.12.attn.q.weight`` -> ``model.layers.12``), or without its
last component when it has none (``model.embed.weight`` -> ``model.embed``).
"""

import math
from pathlib import Path

from .errors import BadInput, MetricNotRecorded, MissingExtra
from .files import check_not_in_repository

INSTALL_HINT = "pip install 'mvc-checkpoints[plot]'"
MAX_ROWS = 80
STATUS_COLOURS = {"changed": "#3b6fb6", "added": "#2e9d5b", "removed": "#c8453c",
                  "reshaped": "#e08a1e", "unchanged": "#b0b0b0"}


def require_matplotlib():
    """The matplotlib module; MissingExtra (an MvcError) saying how to install it if it is missing."""
    try:
        import matplotlib
    except ImportError:
        raise MissingExtra(f"plotting needs matplotlib, which is not installed; install it with: {INSTALL_HINT}",
                           package="matplotlib", extra="plot") from None
    return matplotlib


def _figure(width: float, height: float):
    require_matplotlib()
    from matplotlib.figure import Figure  # a Figure without pyplot renders with Agg
    return Figure(figsize=(width, height), layout="constrained")


def layer_of(key: str) -> str:
    parts = key.split(".")
    digits = [i for i, p in enumerate(parts) if p.isdigit()]
    if digits:
        return ".".join(parts[:digits[-1] + 1])
    return ".".join(parts[:-1]) if len(parts) > 1 else key


def _rows(diff, max_rows: int) -> list:
    """(label, relative change or None, status) per tensor, or per layer when too many."""
    tensors = diff.tensors
    if len(tensors) <= max_rows:
        return [(t.key, t.relative_change, t.status) for t in tensors]
    layers: dict = {}
    for t in tensors:
        layers.setdefault(layer_of(t.key), []).append(t)
    return [(name, layer_change(group), _layer_status(group)) for name, group in layers.items()]


def layer_change(group: list):
    """A layer's relative change: its tensors' ‖B−A‖/‖A‖, weighted by their bytes.

    Weighted, so a small bias that moved a lot does not stand for a layer
    whose weights barely moved; unchanged tensors count as 0 (known from
    their ids, without reading data). None when no tensor has a number.
    """
    numbered = [t for t in group if t.relative_change is not None]
    finite = [t for t in numbered if math.isfinite(t.relative_change)]
    if not numbered:
        return None
    if len(finite) < len(numbered):  # A was all zeros (inf) or NaN: no weighted mean is honest
        return max((t.relative_change for t in numbered), key=lambda v: (v == v, v))
    weight = sum(t.nbytes for t in finite)
    if not weight:
        return max(t.relative_change for t in finite)
    return sum(t.relative_change * t.nbytes for t in finite) / weight


def _layer_status(group: list) -> str:
    for status in ("reshaped", "added", "removed", "changed"):
        if any(t.status == status for t in group):
            return status
    return "unchanged"


def plot_diff(diff, path, max_rows: int = MAX_ROWS) -> Path:
    """Horizontal bars of ‖B−A‖/‖A‖ per tensor (per layer: see ``layer_change``)
    in model order, coloured by status, written as an image to ``path``.

    MvcError if matplotlib is missing; OSError if ``path`` cannot be written.
    """
    rows = _rows(diff, max_rows)
    fig = _figure(9, 1.8 + 0.24 * max(1, len(rows)))
    ax = fig.add_subplot()
    values = [v for _, v, _ in rows if v is not None and 0 < v < math.inf]
    top = max(values) if values else 1.0
    low = min(values) if values else 1.0
    log = bool(values) and top / low > 100
    floor = low / 10 if log else 0.0
    for y, (label, value, status) in enumerate(rows):
        _draw_row(ax, y, value, status, floor, top, log)
    ax.set_yticks(range(len(rows)), [label for label, _, _ in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first key at the top
    if log:
        ax.set_xscale("log")
        ax.set_xlim(floor, top * 3)
    else:
        ax.set_xlim(0, top * 1.15)
    per = ("tensor" if len(rows) == len(diff.tensors)
           else "layer: mean over its tensors weighted by bytes, unchanged ones as 0")
    ax.set_xlabel(f"relative change ‖B−A‖ / ‖A‖ per {per}")
    ax.set_title(_title(diff), fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    _legend(ax, {status for _, _, status in rows})
    _save(fig, path)
    return Path(path)


def _title(diff) -> str:
    """"A → B: 20 of 20 tensors differ (4 changed, 16 removed), 12% of parameters": what happened,
    not "changed" for tensors that were removed or added."""
    s = diff.summary
    kinds = [(n, status) for status in ("changed", "reshaped", "added", "removed")
             if (n := sum(t.status == status for t in diff.tensors))]
    what = (f"differ ({', '.join(f'{n} {status}' for n, status in kinds)})"
            if [status for _, status in kinds] not in ([], ["changed"]) else "changed")
    return (f"{diff.a.short_id} → {diff.b.short_id}: {s.tensors_changed} of {s.tensors} tensors {what}, "
            f"{100 * s.parameters_changed:.3g}% of parameters")  # .2g wrote 100% as 1e+02%


IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp")


def check_image_path(path) -> None:
    """BadInput unless ``path`` names an image format the plots can be written in."""
    suffix = Path(path).suffix.lower()
    if suffix not in IMAGE_SUFFIXES:
        raise BadInput(f"cannot draw into {path}: {suffix or 'no suffix'} is not an image format; "
                       "name it .png, .svg or .pdf")


def _save(fig, path) -> None:
    check_image_path(path)
    check_not_in_repository(path)  # as checkout -o: mvc never writes into a .mvc
    fig.savefig(path, dpi=110)


def _draw_row(ax, y: int, value, status: str, floor: float, top: float, log: bool) -> None:
    colour = STATUS_COLOURS[status]
    if value is not None and 0 < value < math.inf:
        ax.barh(y, value - floor, left=floor, color=colour, height=0.7)
    elif value == math.inf:  # A was all zeros: no finite ratio, show a full bar marked inf
        ax.barh(y, top - floor, left=floor, color=colour, height=0.7, hatch="//")
        ax.text(top, y, " inf", va="center", fontsize=7)
    else:  # no ratio to draw: unchanged, added, removed, reshaped, non-numeric dtype
        ax.text(floor if log else 0, y, f" {status}", va="center", fontsize=7, color=colour)


def _legend(ax, statuses: set) -> None:
    from matplotlib.patches import Patch
    handles = [Patch(color=STATUS_COLOURS[s], label=s) for s in STATUS_COLOURS if s in statuses]
    if handles:
        ax.legend(handles=handles, loc="best", fontsize=8)


def plot_metric(commits, metric: str, path, title: str = "") -> Path:
    """A line of ``metric`` over ``commits`` (newest first, as ``repo.log``
    gives them; drawn oldest first), against step when every commit that
    records the metric has one, else against the commit's number.

    BadInput if no commit records the metric; MvcError if matplotlib is
    missing; OSError if ``path`` cannot be written.
    """
    commits = list(commits)[::-1]
    points = [c for c in commits if metric in c.metrics]
    if not points:
        known = sorted({name for c in commits for name in c.metrics})
        raise MetricNotRecorded(f"no commit records metric {metric!r}; recorded metrics: "
                                f"{', '.join(known) if known else 'none'}", metric=metric, recorded=known)
    by_step = all(c.step is not None for c in points)
    xs = [c.step if by_step else commits.index(c) for c in points]
    fig = _figure(8, 4.5)
    ax = fig.add_subplot()
    ax.plot(xs, [c.metrics[metric] for c in points], marker="o" if len(points) <= 60 else None,
            color=STATUS_COLOURS["changed"])
    ax.set_xlabel("step" if by_step else "commit (oldest first)")
    ax.set_ylabel(metric)
    ax.set_title(title or f"{metric} over {len(points)} commits", fontsize=10)
    ax.grid(alpha=0.3)
    _save(fig, path)
    return Path(path)

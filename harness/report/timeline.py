"""The timeline picture (PNG, matplotlib Agg): one lane per stream plus the host.

Ops are bars (stall ops hatched), host syncs / pinned-memory accesses are ticks on the
host lane, event record -> wait edges are thin grey arrows, and both accesses of every
race are red with a red arrow from the first access to the second. A long trace is cut
to a window of ``MARGIN`` ops either side of the racing accesses (execution order).
"""
from __future__ import annotations

import bisect
import textwrap
from collections import namedtuple
from typing import Any, BinaryIO, Dict, List, Optional, Tuple

from harness.runtime.trace import WAIT_EVENT, OpKind, OpRecord, QueryRecord, SyncRecord, Trace

from harness.report.common import host_records, layout, op_at, race_marks, stream_ids, where
from seams.text import printable

MAX_FULL = 200  # ops shown without a window when there is no race to centre on
MARGIN = 60  # ops either side of the racing accesses in the overview
ZOOM = 6  # ops either side of the racing accesses in the zoomed panel
ZOOM_MAX_SPREAD = 40  # racing accesses further apart (in ops) than this: no zoom panel

KIND_STYLE = {
    OpKind.KERNEL: dict(facecolor="#4C72B0", edgecolor="#2B4468"),
    OpKind.COPY: dict(facecolor="#55A868", edgecolor="#2F6B3D"),
    OpKind.WAIT: dict(facecolor="#9A9A9A", edgecolor="#5A5A5A"),
    OpKind.STALL: dict(facecolor="#F6E3B4", edgecolor="#B8860B", hatch="////"),
}
RACE_COLOR = "#D62728"
HOST_COLORS = {"sync": "#333333", "access": "#8E44AD", "query": "#17A2B8"}
BAR_H = 0.56
PLOT_PT = 16 * 0.9 * 72  # width of a panel's plot area in points


def _race_positions(lay, trace, marks) -> List[int]:
    """Positions (in ``lay.ops``) of the racing accesses; a host access maps to the op
    running at its time."""
    ops = lay.ops
    pos = {o.index: i for i, o in enumerate(ops)}
    starts = [lay.span[o.index][0] for o in ops]
    hits: List[int] = []
    for idx in marks:
        if idx in pos:
            hits.append(pos[idx])
        elif ops:
            rec = trace.log[idx]
            hits.append(min(len(ops) - 1, bisect.bisect_left(starts, lay.host_time(rec))))
    return hits


def _span(lay, lo: int, hi: int) -> Tuple[float, float]:
    times = [lay.span[o.index] for o in lay.ops[lo:hi + 1]]
    return min(t[0] for t in times), max(t[1] for t in times)


def _windows(lay, trace, marks):
    """(overview t0, t1, note), and the zoom window (t0, t1, note) or None."""
    ops = lay.ops
    host = [lay.host_time(r) for r in host_records(trace)]
    if not ops:
        lo_t = min(host, default=0.0)
        return (lo_t, max(host, default=lo_t + 1.0), None), None
    hits = _race_positions(lay, trace, marks)
    order = "execution order" if lay.mode == "virtual" else "host order"
    n = len(ops)
    if hits:
        lo, hi = max(0, min(hits) - MARGIN), min(n - 1, max(hits) + MARGIN)
        what = f"{MARGIN} either side of the racing accesses"
    elif n <= MAX_FULL:
        lo, hi, what = 0, n - 1, ""
    else:
        lo, hi = 0, min(n - 1, 2 * MARGIN)
        what = "from the start (no race to centre on)"
    if lo == 0 and hi == n - 1:
        t0, t1 = _span(lay, lo, hi)
        t0, t1 = min([t0] + host), max([t1] + host)
        overview = (t0, t1, None)
    else:
        t0, t1 = _span(lay, lo, hi)
        overview = (t0, t1, f"window: ops {lo + 1}-{hi + 1} of {n} ({order}), {what}")
    zoom = None
    if hits and max(hits) - min(hits) <= ZOOM_MAX_SPREAD:
        zlo, zhi = max(0, min(hits) - ZOOM), min(n - 1, max(hits) + ZOOM)
        z0, z1 = _span(lay, zlo, zhi)
        if (z1 - z0) < 0.35 * (overview[1] - overview[0]):
            zoom = (z0, z1, f"zoom: ops {zlo + 1}-{zhi + 1}, {ZOOM} either side of the "
                            f"racing accesses")
    return overview, zoom


# what every panel draws from: the trace, its layout and races, stream id -> lane, lane names
_Scene = namedtuple("_Scene", "lay trace races marks lanes lane_names")
# heights in inches: title, a panel's axes, its x label, legend, race list; the whole figure
_Geometry = namedtuple("_Geometry", "title_in axes_in xlabel_in legend_in text_in fig_h")
# a panel's time range [t0, t1] and the sizes drawn relative to its width
_XRange = namedtuple("_XRange", "t0 t1 width pad min_w")
_Shown = Dict[int, Tuple[float, float, int]]  # log index -> (x0, x1, lane) drawn


def render_timeline(trace: Trace, races: List[Any], report: Any, out: BinaryIO) -> str:
    """Draw the timeline of ``report`` (a ``document.Report``) into ``out`` (PNG); returns
    what the picture shows (one line)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    lay = layout(trace)
    marks = race_marks(trace, races)
    overview, zoom = _windows(lay, trace, marks)
    panels = [overview] + ([zoom] if zoom else [])
    sids = stream_ids(trace)
    lanes = {sid: i for i, sid in enumerate(sids, 1)}
    lane_names = ["host"] + [printable(f"{trace.stream_name(s)}\n(stream {s})", keep_newlines=True)
                             for s in sids]  # tick labels are drawn later, unseen below
    scene = _Scene(lay, trace, races, marks, lanes, lane_names)
    geo = _geometry(len(scene.lane_names), len(races), len(panels))
    fig = Figure(figsize=(16, geo.fig_h), dpi=110)
    FigureCanvasAgg(fig)

    race_text = [_race_line(n, race, lay, trace) for n, race in enumerate(races, 1)]
    axes = _draw_panels(fig, geo, panels, scene, race_text)
    if zoom:
        axes[0].axvspan(zoom[0], zoom[1], color="#FFD7D7", alpha=0.55, zorder=0)
        axes[0].text(zoom[0], -0.88, " zoomed below", fontsize=8, color=RACE_COLOR,
                     va="top", ha="left", clip_on=True)

    fig.suptitle(_title(report.result, races, overview[2]), fontsize=10.5, x=0.085, ha="left",
                 y=1.0 - 0.12 / geo.fig_h, va="top", linespacing=1.45)
    _draw_key(fig, geo, race_text)
    # Report text is not trusted: no mathtext parsing ("$" in a path), nothing unprintable
    # (a lone surrogate cannot be drawn at all).
    for text in fig.findobj(Text):
        text.set_parse_math(False)
        text.set_text(printable(text.get_text(), keep_newlines=True))
    run_id = report.run_id
    fig.savefig(out, format="png",
                metadata={"Description": f"specrace run {run_id}"} if run_id else None)
    notes = [p[2] for p in panels if p[2]]
    return "; ".join(notes) if notes else "full trace"


def _geometry(n_lanes: int, n_races: int, n_panels: int) -> _Geometry:
    """The figure's height: a share for each lane of each panel and each race listed."""
    n_text = min(n_races, 6) + (1 if n_races > 6 else 0)
    title_in, lane_in, xlabel_in, legend_in = 0.95, 0.62, 0.55, 0.3
    text_in = 0.19 * n_text + (0.12 if n_text else 0.0)
    axes_in = lane_in * n_lanes + 0.35
    fig_h = title_in + n_panels * (axes_in + xlabel_in) + legend_in + text_in + 0.1
    return _Geometry(title_in, axes_in, xlabel_in, legend_in, text_in, fig_h)


def _draw_panels(fig, geo: _Geometry, panels, scene: _Scene, race_text: List[str]) -> List[Any]:
    """The panels stacked under the title, overview first; notes the races it misses."""
    top = geo.fig_h - geo.title_in
    axes = []
    for k, (t0, t1, note) in enumerate(panels):
        bottom = top - geo.axes_in
        ax = fig.add_axes([0.085, bottom / geo.fig_h, 0.9, geo.axes_in / geo.fig_h])
        shown = _panel(ax, scene, t0, t1, zoomed=k > 0)
        if k == 0:
            for n, race in enumerate(scene.races):
                if race.first.index not in shown or race.second.index not in shown:
                    race_text[n] += "  (outside the window)"
        label = ("simulator virtual time (µs) -- ops at their executed start/end"
                 if scene.lay.mode == "virtual" else
                 "no per-op timing on this backend: records laid out in host program order "
                 "(10 µs per trace-log record)")
        if k > 0:
            label = f"{note} -- {label}"
        ax.set_xlabel(label, fontsize=9)
        axes.append(ax)
        top = bottom - geo.xlabel_in
    return axes


def _draw_key(fig, geo: _Geometry, race_text: List[str]) -> None:
    """Under the panels: the legend, then the races one a line (the first six)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(label="kernel", **KIND_STYLE[OpKind.KERNEL]),
               Patch(label="copy", **KIND_STYLE[OpKind.COPY]),
               Patch(label=WAIT_EVENT, **KIND_STYLE[OpKind.WAIT]),
               Patch(label="stall (fault point)", **KIND_STYLE[OpKind.STALL]),
               Patch(facecolor=RACE_COLOR, edgecolor="black", label="racing access (#n)"),
               Line2D([], [], color=RACE_COLOR, lw=1.8, marker=">", label="race: first -> second"),
               Line2D([], [], color="#7F7F7F", lw=0.8, marker=">", markersize=4,
                      label="event record -> wait"),
               Line2D([], [], color=HOST_COLORS["sync"], lw=1.3, label="host sync"),
               Line2D([], [], color=HOST_COLORS["access"], lw=1.3, label="host pinned read/write")]
    fig.legend(handles=handles, loc="upper left",
               bbox_to_anchor=(0.08, (geo.legend_in + geo.text_in + 0.1) / geo.fig_h),
               ncol=9, fontsize=8, frameon=False, handlelength=1.6, columnspacing=1.2)
    if race_text:
        shown_lines = race_text[:6] + ([f"... and {len(race_text) - 6} more race site(s)"]
                                       if len(race_text) > 6 else [])
        fig.text(0.085, 0.1 / geo.fig_h, "\n".join(textwrap.shorten(t, 215, placeholder=" ...")
                                                   for t in shown_lines),
                 fontsize=8, family="monospace", color="#8B0000", va="bottom", ha="left",
                 linespacing=1.5)


def _race_line(n: int, race: Any, lay, trace) -> str:
    return (f"#{n} {race.kind} on {race.storage}: {race.first.actor} {race.first.op} "
            f"[{race.first.access_kind()}] {where(race.first.frame)} -> "
            f"{race.second.actor} {race.second.op} [{race.second.access_kind()}]"
            f" {where(race.second.frame)}" + _order_note(lay, trace, race))


def _panel(ax, scene: _Scene, t0: float, t1: float, zoomed: bool) -> _Shown:
    """One timeline panel over [t0, t1]; returns log index -> (x0, x1, lane) drawn."""
    width = max(t1 - t0, 1e-6)
    pad = width * 0.02
    min_w = width / 900.0  # zero-length ops (waits) stay visible
    xr = _XRange(t0, t1, width, pad, min_w)
    shown = _draw_ops(ax, scene, xr, zoomed)
    _draw_host(ax, scene, xr, zoomed, shown)

    by_pos = op_at(scene.trace)  # event record -> wait edges: thin grey arrows
    for op in scene.lay.ops:
        if op.kind != OpKind.WAIT or op.wait_for is None or op.index not in shown:
            continue
        src = by_pos.get(tuple(op.wait_for))
        if src is None or src.index not in shown:
            continue
        sx, sy = shown[src.index][1], shown[src.index][2]
        dx, dy = shown[op.index][0], shown[op.index][2]
        ax.annotate("", xy=(dx, dy), xytext=(sx, sy), zorder=2,
                    arrowprops=dict(arrowstyle="->", color="#7F7F7F", lw=0.8, alpha=0.8,
                                    shrinkA=0, shrinkB=2))
    _draw_races(ax, scene.races, shown, width)

    lane_names = scene.lane_names
    ax.set_ylim(len(lane_names) - 0.2, -0.9)
    ax.set_yticks(range(len(lane_names)))
    ax.set_yticklabels(lane_names, fontsize=9)
    ax.set_xlim(t0 - pad, t1 + pad)
    ax.grid(axis="x", color="#E5E5E5", linewidth=0.6)
    ax.set_axisbelow(True)
    for y in range(len(lane_names)):
        ax.axhline(y + 0.5, color="#DDDDDD", linewidth=0.6, zorder=0)
    return shown


def _draw_ops(ax, scene: _Scene, xr: _XRange, zoomed: bool) -> _Shown:
    """The ops in the panel's range as bars on their streams' lanes (racing ones red and
    taller), named where the name fits; returns log index -> (x0, x1, lane) drawn."""
    groups: Dict[Tuple[int, str], List[Tuple[float, float]]] = {}
    race_bars: List[Tuple[int, float, float]] = []
    shown: _Shown = {}
    for op in scene.lay.ops:
        ts, end = scene.lay.span[op.index]
        if not (end >= xr.t0 and ts <= xr.t1):
            continue
        y = scene.lanes[op.stream]
        w = max(end - ts, xr.min_w)
        shown[op.index] = (ts, ts + w, y)
        if op.index in scene.marks:
            race_bars.append((y, ts, w))
        else:
            groups.setdefault((y, op.kind), []).append((ts, w))
    for (y, kind), spans in groups.items():
        style = KIND_STYLE.get(kind, KIND_STYLE[OpKind.KERNEL])
        ax.broken_barh(spans, (y - BAR_H / 2, BAR_H), linewidth=0.4 if not zoomed else 0.8,
                       **style)
    for y, ts, w in race_bars:
        ax.broken_barh([(ts, max(w, xr.min_w * 3))], (y - BAR_H * 0.7, BAR_H * 1.4),
                       facecolor=RACE_COLOR, edgecolor="black", linewidth=1.0, zorder=5)

    # names on bars wide enough to hold them (stalls, mostly; every op when zoomed)
    for op in scene.lay.ops:
        if op.index not in shown:
            continue
        ts, end, y = shown[op.index]
        a, b = max(ts, xr.t0), min(end, xr.t1)
        text = "stall (held until forced)" if op.kind == OpKind.STALL else op.name
        if text.endswith(".default"):
            text = text[:-len(".default")]
        if op.kind == OpKind.WAIT:
            text = "wait"
        if (b - a) / xr.width * PLOT_PT > 4.7 * len(text) + 4:  # fits at 7.5 pt
            ax.text((a + b) / 2, y, text, ha="center", va="center", fontsize=7.5, clip_on=True,
                    color="#6B4E00" if op.kind == OpKind.STALL else "white", zorder=6)
    return shown


def _draw_host(ax, scene: _Scene, xr: _XRange, zoomed: bool, shown: _Shown) -> None:
    """Host syncs, queries and pinned accesses in range: ticks on the host lane (lane 0)."""
    host_rows: List[Tuple[int, float, float]] = []
    for rec in host_records(scene.trace):
        t = scene.lay.host_time(rec)
        if not xr.t0 <= t <= xr.t1:
            continue
        if isinstance(rec, SyncRecord):
            color, h = HOST_COLORS["sync"], 0.8
        elif isinstance(rec, QueryRecord):
            color, h = HOST_COLORS["query"], 0.6
        else:
            color, h = HOST_COLORS["access"], 0.6
        racing = rec.index in scene.marks
        ax.vlines(t, -h / 2 * (1.3 if racing else 1), h / 2 * (1.3 if racing else 1),
                  colors=RACE_COLOR if racing else color, linewidth=3.0 if racing else 1.3,
                  zorder=5 if racing else 3)
        if zoomed:  # labels, each on the first row where it does not touch another
            text = _short(rec.label if hasattr(rec, "label") else rec.name, 28)
            x_end = t + (4.3 * len(text) + 6) / PLOT_PT * xr.width
            row = 0
            while any(r == row and lx0 <= x_end and t <= lx1 for r, lx0, lx1 in host_rows):
                row += 1
            host_rows.append((row, t, x_end))
            right = x_end > xr.t1 + xr.pad  # near the right edge: label to the left of the tick
            ax.text(t, -0.47 + 0.2 * (row % 4), (text + " ") if right else (" " + text),
                    fontsize=7, va="center", ha="right" if right else "left", color=color,
                    clip_on=True, zorder=4)
        shown[rec.index] = (t, t, 0)


def _draw_races(ax, races: List[Any], shown: _Shown, width: float) -> None:
    """A red arrow from each race's first access to its second (both drawn), "#n" tags."""
    tags: List[Tuple[int, float, int]] = []  # (lane, x, race number)
    for n, race in enumerate(races, 1):
        a, b = shown.get(race.first.index), shown.get(race.second.index)
        if a is None or b is None:
            continue
        top = BAR_H * 0.7  # from/to the top edge of the (taller) racing bars
        ax.annotate("", xy=((b[0] + b[1]) / 2, b[2] - top), xytext=((a[0] + a[1]) / 2,
                                                                    a[2] - top),
                    zorder=6, arrowprops=dict(
                        arrowstyle="-|>", color=RACE_COLOR, lw=1.8, mutation_scale=16,
                        shrinkA=0, shrinkB=0,
                        connectionstyle=f"arc3,rad={0.18 + 0.12 * ((n - 1) % 4)}"))
        for x0, x1, y in (a, b):
            tags.append((y, (x0 + x1) / 2, n))
    # "#n" tags under the racing bars (the arrows use the top edge): one text per bar,
    # "#1 #2" when a bar is in several races; tags that would touch are stacked down
    per_bar: Dict[Tuple[int, float], List[int]] = {}
    for y, x, n in tags:
        per_bar.setdefault((y, x), [])
        if n not in per_bar[(y, x)]:
            per_bar[(y, x)].append(n)
    placed: List[Tuple[int, float, float, int]] = []  # (lane, x0, x1, level)
    for (y, x), ns in sorted(per_bar.items()):
        text = " ".join(f"#{n}" for n in sorted(ns))
        half = (5.6 * len(text) / 2 + 3) / PLOT_PT * width
        level = 0
        while any(py == y and pl == level and px0 < x + half and x - half < px1
                  for py, px0, px1, pl in placed):
            level += 1
        placed.append((y, x - half, x + half, level))
        ax.text(x, y + BAR_H * 0.72 + 0.19 * level, text, ha="center", va="top",
                fontsize=8.5, fontweight="bold", color=RACE_COLOR, zorder=7)


def _order_note(lay, trace, race) -> str:
    """In virtual time: which access actually ran first (the stale read, usually)."""
    if lay.mode != "virtual":
        return ""
    times = []
    for acc in (race.first, race.second):
        rec = trace.log[acc.index] if 0 <= acc.index < len(trace.log) else None
        if isinstance(rec, OpRecord):
            span = lay.span.get(rec.index)
            times.append(span[0] if span else None)
        elif rec is not None:
            times.append(lay.host_time(rec))
        else:
            times.append(None)
    ta, tb = times
    if ta is None or tb is None or tb >= ta:
        return ""
    what = race.second.access_kind()
    return f"; the {what} ran {ta - tb:g} µs BEFORE it"


def _title(result: Any, races: List[Any], note: Optional[str]) -> str:
    n, t = result.reproduced, result.trials
    head = f"{result.heading()} ({result.policy}), seed {result.seed}"
    verdict = f"RACE reproduced in {n}/{t} trials" if n else f"clean in {t}/{t} trials"
    lines = [f"{head} -- {verdict}",
             f"timeline of trial {(result.first_trial or 0) + 1}: {len(races)} race "
             f"site(s) in this trial"]
    div = result.first_divergence
    if div is not None:
        if div.stale:
            lines[-1] += (f"; first divergence: stale {div.kind} for request "
                          f"{div.rid} step {div.step} (expected "
                          f"{_short(div.expected)}, observed {_short(div.observed)})")
        else:
            lines[-1] += f"; first divergence: {_short(div.message, 110)}"
    if note:
        lines.append(note)
    return "\n".join(lines)


def _short(v: Any, limit: int = 40) -> str:
    s = " ".join(str(v).split())
    return s if len(s) <= limit else s[:limit - 3] + "..."

"""``sweep plot``: the figures of a design-space study, drawn from a reduced ``sweep.h5``.

Every kind returns the figure and the table of the numbers it drew (a DataFrame), so the
tests can check the plotted data against the HDF5 tables:

* ``scaling``    throughput (or time to train) vs GPU count per job, colour = base hardware,
                 line style = NVLink domain, lines labelled at their ends, one ideal line
                 from the best per-GPU point of the panel;
* ``breakdown``  stacked time per iteration of the best configuration vs GPU count, its
                 layout on each bar (shares of the step with ``fractions``);
* ``memory``     stacked memory per GPU of the best configuration vs GPU count, with capacity;
* ``heatmap``    speed-up of the best throughput over a marked baseline cell, across two
                 swept hardware axes at one GPU count;
* ``strategies`` each strategy's best over the best of all strategies vs GPU count, one y
                 range, infeasible strategies marked;
* ``layout``     the best configuration's TP / TP2 / CP / PP / DP / EP degrees vs GPU count;
* ``pareto``     the Pareto front of throughput against GPU count (or a swept resource)
                 across hardware variants.

Large sweeps are summarised, not strip-mined: panels and bars go to the fastest variants
(MAX_PANELS, MAX_BARS, MAX_LINES), the rest is counted in the title or drawn as a range.

"Best" is over strategies (``Results.best_per_system``) unless a strategy is chosen. Partial,
empty and single-point results never crash a kind: it draws what exists (panels without
data say so) or raises :class:`SweepError` saying why there is nothing to draw. Needs
matplotlib and pandas (``pip install -e '.[plot]'`` in the checkout); uses matplotlib's
object API only (no pyplot state), so it is safe in any process.
"""

from __future__ import annotations

import functools
import math
import os
import tempfile
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SweepError, install_hint
from ..model.hardware import quantity_dimension
from . import fmt
from .results import DEGREES, MEMORY_PARTS, TIME_PARTS, Results, _pandas

__all__ = ["KINDS", "FORMATS", "PlotOptions", "draw", "save", "kinds_that_fit", "why_not"]

KINDS = ("scaling", "breakdown", "memory", "heatmap", "strategies", "layout", "pareto")
FORMATS = (".png", ".svg", ".pdf")
#: panels drawn at most (a variant grid of hundreds gets its first panels and a note)
MAX_PANELS = 12
#: memory is read in decimal GB (1e9 bytes) everywhere: plots, report, `sweep show` and
#: `sweep predict` (sweep.analysis.fmt.gigabytes)
GB = 1e9


@dataclass
class PlotOptions:
    """Choices a user can make on the command line."""

    metric: str = "samples_per_s"  # scaling: samples_per_s | tokens_per_s | step_time_s | days
    tokens: float = 0.0  # scaling with metric "days": tokens to train on
    strategy: str | None = None  # only this strategy (default: best over strategies)
    jobs: Sequence[str] = ()  # only these jobs
    hardware: Sequence[str] = ()  # only these hardware variants (labels or bases)
    n_gpus: int | None = None  # heatmap: GPU count (default: the largest); breakdown,
    #                            memory: only this count, hardware variants along x
    x: str | None = None  # heatmap axes (default: the first two swept axes)
    y: str | None = None
    fractions: bool = False  # breakdown: shares of the step instead of seconds


#: the PlotOptions each kind reads (sweep plot refuses the others instead of ignoring them;
#: the selection of jobs, hardware and strategy is _best's, --gpus / --x / --y the panels')
OPTIONS_OF = {
    "scaling": ("metric", "tokens", "strategy", "jobs", "hardware"),
    "breakdown": ("strategy", "jobs", "hardware", "n_gpus", "x", "y", "fractions"),
    "memory": ("strategy", "jobs", "hardware", "n_gpus", "x", "y"),
    "heatmap": ("strategy", "jobs", "hardware", "n_gpus", "x", "y"),
    "strategies": ("jobs", "n_gpus", "x", "y"),  # (every strategy, on every variant)
    "layout": ("strategy", "jobs", "hardware"),
    "pareto": ("strategy", "jobs", "hardware"),
}


def _mpl():
    try:
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - matplotlib is in the plot / test extras
        raise SweepError(f"sweep plot needs matplotlib: {install_hint('plot')}") from None
    return Figure


def _unknown_selection(res: Results, opts: PlotOptions) -> None:
    """SweepError naming a --job, --hardware or --strategy the results do not hold (rather
    than 'nothing feasible matches')."""
    cases = res.cases
    for flag, wanted, held in (
            ("--job", list(opts.jobs or ()), set(cases["job"])),
            ("--hardware", list(opts.hardware or ()), set(cases["hardware"]) | set(cases["base"])),
            ("--strategy", [opts.strategy] if opts.strategy else [], set(cases["strategy"]))):
        missing = [w for w in wanted if w not in held]
        if missing:
            raise SweepError(f"{res.path}: {flag} {', '.join(map(repr, missing))}: not in the "
                             f"results (they hold {', '.join(sorted(map(str, held))[:10])}"
                             f"{', ...' if len(held) > 10 else ''})")
    counts = sorted(int(g) for g in set(cases["n_gpus"]))
    if opts.n_gpus is not None and int(opts.n_gpus) not in counts:
        raise SweepError(f"{res.path}: --gpus {opts.n_gpus}: not a GPU count of the results "
                         f"(they hold {', '.join(map(str, counts[:12]))}"
                         f"{', ...' if len(counts) > 12 else ''})")


def _best(res: Results, opts: PlotOptions):
    best = res.best() if opts.strategy else res.best_per_system()
    if opts.strategy:
        best = best[best["strategy"] == opts.strategy]
    if opts.jobs:
        best = best[best["job"].isin(list(opts.jobs))]
    if opts.hardware:
        keep = list(opts.hardware)
        best = best[best["hardware"].isin(keep) | best["base"].isin(keep)]
    if best.empty:
        raise SweepError(f"{res.path}: no feasible configuration matches the selection")
    return best.sort_values(["job", "variant_id", "n_gpus"], kind="mergesort")


def _grid(Figure, n: int, width: float = 4.6, height: float = 3.4):
    if n < 1:
        raise SweepError("nothing to draw: no panel has data")
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(width * cols, height * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


#: characters of a panel title per line at 8 pt on a 4.6-inch panel (_grid): longer ones
#: (a hardware variant's label) wrap instead of running into the next panel's
PANEL_TITLE_CHARS = 64


def _panel_title(ax, title: str) -> None:
    ax.set_title(textwrap.fill(title, PANEL_TITLE_CHARS), fontsize=8)


def _fit_labels(fig, labels: list) -> None:
    """Raise each panel's y range until the rotated labels above its bars end inside it, with
    the figure laid out as it will be saved (a label's height is fixed in points, so how
    much room it needs depends on how tall the panel ends up); panels without labels keep
    theirs."""
    if not labels:
        return
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    for _, text in labels:  # (the layout must not shrink a panel around a label that
        text.set_in_layout(False)  # overflows it: then its size would depend on the labels)
    canvas = FigureCanvasAgg(fig)
    # (a new y range relabels the y axis, and the layout may then give the panels a little
    # less height: measured again until every label fits, three times at most)
    for _ in range(3):
        canvas.draw()
        renderer = canvas.get_renderer()
        need: dict = {}
        for ax, text in labels:
            panel = ax.get_window_extent(renderer)
            if text.get_window_extent(renderer).y1 <= panel.y1 - 0.01 * panel.height:
                continue
            height = text.get_window_extent(renderer).height / panel.height
            start = text.get_position()[1]
            # start + height x top <= 0.97 x top: the label ends below the panel's top edge
            need[ax] = max(need.get(ax, ax.get_ylim()[1]), start / max(0.97 - height, 0.05))
        if not need:
            return
        for ax, top in need.items():
            ax.set_ylim(0, top)


def _label(best, job: str, variant: int) -> str:
    row = best[(best["job"] == job) & (best["variant_id"] == variant)].iloc[0]
    return f"{job} on {row['hardware']}"


def _short_labels(best, sub, res: Results | None = None) -> list[str]:
    """Variant labels with only what differs between variants (base, swept values); with
    ``res``, an interpolated axis at a catalog point reads as that system's name."""
    import json

    def value(k, v) -> str:
        names = interpolated[k]
        if names and float(v).is_integer() and 0 <= int(v) < len(names):
            return names[int(v)]
        dimension = quantity_dimension(k)  # (a quantity swept in SI: its unit, 4.8 TB/s)
        if dimension is not None and not names:
            return fmt.si(float(v), _SI_UNIT_TEXT[dimension])
        return f"{float(v):.3g}" if names else _tick_text([v])[0]

    swept = [json.loads(v) for v in sub["swept"]]
    all_swept = [json.loads(v) for v in best["swept"]]
    # (the keys any variant sweeps: groups of a spec's hardware list sweep their own axes,
    # a key another group does not sweep is absent there)
    keys = list(dict.fromkeys(k for d in all_swept for k in d))
    varying = [k for k in keys if len({None if d.get(k) is None else round(float(d[k]), 12)
                                       for d in all_swept}) > 1]
    bases_vary = best["base"].nunique() > 1
    interpolated = {k: _interpolated(res, k) if res is not None else None for k in varying}
    out = []
    for base, hw, d in zip(sub["base"], sub["hardware"], swept):
        parts = ([str(base)] if bases_vary else []) + [f"{k}={value(k, d[k])}"
                                                       for k in varying if k in d]
        out.append(" ".join(parts) if parts else str(hw))
    return out


def _suptitle(fig, res: Results, what: str, note: str = "") -> None:
    """The figure title, wrapped to the figure's width (about 12 characters an inch at
    10 points) so that a narrow figure - one panel - does not clip it."""
    partial = " [PARTIAL RUN]" if not res.complete else ""
    text = f"{res.name}: {what} ({res.cost_model}){note}{partial}"
    fig.suptitle("\n".join(textwrap.wrap(text, min(90, int(12 * fig.get_figwidth())))),
                 fontsize=10)


def _finish_panel(ax, gpus, ylabel: str, title: str) -> None:
    """GPU-count x axis, labels, grid and legend of a line panel."""
    _gpu_axis(ax, gpus)
    ax.set_ylabel(ylabel)
    _panel_title(ax, title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6)


def _gpu_axis(ax, gpus) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(int(g) for g in gpus)))
    ax.set_xticklabels([str(int(g)) for g in sorted(set(int(g) for g in gpus))],
                       rotation=45, fontsize=7)
    ax.set_xlabel("GPUs")


# ------------------------------------------------------------------------------ encodings

#: lines drawn per panel at most; the other variants are summarised as a grey range
MAX_LINES = 12
_STYLES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _ranked_variants(sub) -> list[int]:
    """Variant ids of ``sub`` (one job), best first: by the highest throughput a variant
    reaches, ties by variant id."""
    top = sub.groupby("variant_id")["samples_per_s"].max()
    return [int(v) for v in sorted(top.index, key=lambda v: (-float(top[v]), int(v)))]


def _encoding(best) -> dict[int, tuple[str, object, str]]:
    """variant id -> (colour, line style, marker): colour = base hardware (the GPU generation
    or system), line style = NVLink domain size, marker = the other swept values."""
    order = best.sort_values("variant_id", kind="mergesort").drop_duplicates("variant_id")
    bases = list(dict.fromkeys(order["base"]))
    domains = sorted({int(d) for d in order["nvlink_domain"]}) if "nvlink_domain" in order \
        else [0]
    seen: dict[tuple, int] = {}
    out = {}
    for v, base, dom in zip(order["variant_id"], order["base"],
                            order["nvlink_domain"] if "nvlink_domain" in order
                            else [0] * len(order)):
        key = (base, int(dom))
        k = seen[key] = seen.get(key, -1) + 1
        out[int(v)] = (f"C{bases.index(base) % 10}", _STYLES[domains.index(int(dom)) % 4],
                       _MARKERS[k % len(_MARKERS)])
    return out


def _encoding_legend(ax, best, extra=()) -> None:
    """A legend that explains the encoding (base colours, NVLink line styles) plus ``extra``
    (handle, label) pairs; lines are labelled directly."""
    from matplotlib.lines import Line2D

    order = best.sort_values("variant_id", kind="mergesort").drop_duplicates("variant_id")
    bases = list(dict.fromkeys(order["base"]))
    handles = list(extra)
    if len(bases) > 1:
        handles += [(Line2D([], [], color=f"C{i % 10}", lw=2), b) for i, b in enumerate(bases)]
    if "nvlink_domain" in order:
        domains = sorted({int(d) for d in order["nvlink_domain"]})
        if len(domains) > 1:
            handles += [(Line2D([], [], color="k", ls=_STYLES[i % 4], lw=1),
                         f"NVLink domain {d}") for i, d in enumerate(domains)]
    if handles:
        ax.legend([h for h, _ in handles], [lab for _, lab in handles], fontsize=6)


def _label_line_ends(ax, ends: list[tuple]) -> None:
    """Label each line at its end, (x, y, text, colour) on a log y axis, the labels pushed
    apart vertically so that they never overlap (at least 3.5 % of the axis apart)."""
    if not ends:
        return
    lo, hi = (math.log10(v) for v in ax.get_ylim())
    gap = 0.035 * (hi - lo)
    order = sorted(range(len(ends)), key=lambda i: math.log10(ends[i][1]))
    placed: list[float] = []
    for i in order:
        want = math.log10(ends[i][1])
        placed.append(max(want, placed[-1] + gap) if placed else want)
    for i, y in zip(order, placed):
        x, _, text, color = ends[i]
        ax.annotate(text, (x, ends[i][1]), xytext=(x * 1.08, 10 ** y), textcoords="data",
                    fontsize=6, color=color, va="center", ha="left", annotation_clip=False)


# ------------------------------------------------------------------------------ kinds

def _scaling(res: Results, opts: PlotOptions):
    """Throughput (or time) vs GPU count per job: colour = base hardware, line style =
    NVLink domain, lines labelled at their ends; the ideal is one line per panel, from the
    best per-GPU figure anywhere in it (so no start point can make a curve look
    super-linear); beyond MAX_LINES variants the rest is a grey range."""
    Figure = _mpl()
    best = _best(res, opts)
    metric = opts.metric
    labels = {"samples_per_s": "throughput [samples/s]", "tokens_per_s": "throughput [tokens/s]",
              "step_time_s": "time per iteration [s]", "days": "time to train [days]"}
    if metric not in labels:
        raise SweepError(f"--metric: {metric!r}; valid: {', '.join(labels)}")
    if metric == "days" and opts.tokens <= 0:
        raise SweepError("--metric days needs --tokens (tokens to train on, e.g. 1e12)")
    best = best.copy()
    if best["n_gpus"].nunique() < 2:
        raise SweepError(f"{res.path}: scaling needs results at several GPU counts; this "
                         f"selection has {int(best['n_gpus'].iloc[0])} only (--kind "
                         f"breakdown and memory take any results; heatmap needs two swept "
                         f"hardware axes)")
    best["value"] = (opts.tokens / best["tokens_per_s"] / 86400.0 if metric == "days"
                     else best[metric])
    faster_is_higher = metric in ("samples_per_s", "tokens_per_s")
    jobs = list(dict.fromkeys(best["job"]))
    fig, axes = _grid(Figure, len(jobs), 6.4, 4.4)
    enc = _encoding(best)
    short = dict(zip(best["variant_id"], _short_labels(best, best, res)))
    rows = []
    for ax, job in zip(axes, jobs):
        sub = best[best["job"] == job]
        n = sub["n_gpus"].to_numpy(float)
        v = sub["value"].to_numpy(float)
        per_gpu = v / n if faster_is_higher else v * n
        k = int(np.argmax(per_gpu) if faster_is_higher else np.argmin(per_gpu))
        scale = per_gpu[k]

        def ideal(g, scale=scale):
            return scale * g if faster_is_higher else scale / g

        gx = np.array(sorted(set(n)))
        ideal_handle, = ax.plot(gx, ideal(gx), color="0.55", ls="-", lw=4, alpha=0.35,
                                solid_capstyle="butt", zorder=0)
        ranked = _ranked_variants(sub)
        shown, rest = ranked[:MAX_LINES], ranked[MAX_LINES:]
        ends: list[tuple] = []
        for variant in shown:
            line = sub[sub["variant_id"] == variant].sort_values("n_gpus")
            x, y = line["n_gpus"].to_numpy(float), line["value"].to_numpy(float)
            color, style, marker = enc[variant]
            ax.plot(x, y, color=color, ls=style, marker=marker, ms=3, lw=1.2)
            ends.append((x[-1], y[-1], short[variant], color))
        extra = [(ideal_handle, f"ideal: the best per GPU ({sub['hardware'].iloc[k]}, "
                                f"{int(n[k])} GPUs), scaled perfectly")]
        if rest:
            others = sub[sub["variant_id"].isin(rest)].groupby("n_gpus")["value"]
            lo, hi = others.min(), others.max()
            band = ax.fill_between(lo.index.to_numpy(float), lo.to_numpy(float),
                                   hi.to_numpy(float), color="0.85", zorder=0)
            extra.append((band, f"range of the other {len(rest)} variants"))
        for r in sub.itertuples():
            rows.append({"job": job, "variant_id": int(r.variant_id), "hardware": r.hardware,
                         "n_gpus": int(r.n_gpus), "value": float(r.value),
                         "ideal": float(ideal(float(r.n_gpus))), "case_id": int(r.case_id),
                         "drawn": int(r.variant_id) in shown})
        _gpu_axis(ax, sub["n_gpus"])
        lo_x, hi_x = gx.min(), gx.max()
        ax.set_xlim(lo_x / 1.3, hi_x * (2.6 if len(shown) else 1.3))  # room for the labels
        ax.set_yscale("log")
        _label_line_ends(ax, ends)
        ax.set_ylabel(labels[metric])
        ax.set_title(job, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        _encoding_legend(ax, sub, extra)
    _suptitle(fig, res, f"{labels[metric]} vs GPU count")
    return fig, rows


#: bars drawn at most per panel when the x axis is the hardware variant
MAX_BARS = 40
#: a time part under this share of every bar of a panel joins "other"
SLIVER = 0.01


def _labels_fit_level(ax, labels, fontsize: float) -> bool:
    """Whether tick labels drawn level fit their slots along the axes' width: a character
    taken as 0.6 em wide (DejaVu Sans' mean advance is about 0.55 em), every slot the axes'
    width over the labels."""
    fig = ax.get_figure()
    width_pt = ax.get_position().width * fig.get_size_inches()[0] * 72.0
    widest = max((len(str(t)) for t in labels), default=0) * 0.6 * fontsize
    return widest <= 0.9 * width_pt / max(len(labels), 1)


def _layout_text(r) -> str:
    """The chosen strategy and layout of a best row, short: '2d tp8x4 pp4 dp16'."""
    tp = f"tp{int(r['tp'])}" + (f"x{int(r['tp2'])}" if int(r.get("tp2", 1)) > 1 else "")
    parts = [str(r["strategy"]), tp, f"pp{int(r['pp'])}", f"dp{int(r['dp'])}"]
    for key in ("cp", "ep"):
        if key in r and int(r[key]) > 1:
            parts.append(f"{key}{int(r[key])}")
    return " ".join(parts)


def _top_panels(best) -> tuple[list[tuple[str, int]], str]:
    """(job, variant) panels, at most MAX_PANELS: the variants with the highest throughput
    first, then in variant order; a note says how many were left out."""
    keys = []
    for job in dict.fromkeys(best["job"]):
        keys += [(job, v) for v in _ranked_variants(best[best["job"] == job])]
    note = ""
    if len(keys) > MAX_PANELS:
        note = (f" (the {MAX_PANELS} fastest of {len(keys)} job x hardware panels; "
                f"select with --hardware / --job)")
        keys = keys[:MAX_PANELS]
    return sorted(keys, key=lambda k: (list(dict.fromkeys(best["job"])).index(k[0]), k[1])), note


#: bars per panel along a swept axis, and panels across a second one, for large grids
AXIS_BARS = 16
AXIS_PANELS = 3


def _spread(values: Sequence, k: int) -> list:
    """At most ``k`` of the sorted ``values``, evenly spaced, both ends kept."""
    values = sorted(values)
    if len(values) <= k:
        return values
    return [values[round(i * (len(values) - 1) / (k - 1))] for i in range(k)]


def _slices(res: Results, mine, swept: list[str], opts: PlotOptions):
    """Small multiples of one job's rows at one GPU count: (x axis, y axis or None,
    [(y value, rows)], note). x = the first swept axis (or --x), AXIS_BARS of its values;
    one slice per AXIS_PANELS values of the second (or --y); the other swept axes at the
    values of the fastest variant."""
    xa = opts.x if opts.x in swept else swept[0]
    rest = [a for a in swept if a != xa]
    ya = opts.y if opts.y in rest else (rest[0] if rest else None)
    fastest = mine.loc[mine["samples_per_s"].fillna(-1.0).idxmax()]
    fixed = mine
    for a in rest:
        if a != ya:
            fixed = fixed[fixed[f"swept_{a}"] == fastest[f"swept_{a}"]]
    xs = _spread(fixed[f"swept_{xa}"].unique(), AXIS_BARS)
    ys = _spread(fixed[f"swept_{ya}"].unique(), AXIS_PANELS) if ya else [None]
    slices = []
    for yv in ys:
        sub = fixed[fixed[f"swept_{xa}"].isin(xs)]
        slices.append((yv, sub[sub[f"swept_{ya}"] == yv] if ya else sub))
    others = [a for a in rest if a != ya]
    note = (f" ({len(xs)} values of {xa}" + (f" x {len(ys)} of {ya}" if ya else "")
            + (f"; {', '.join(others)} as in the fastest variant" if others else "")
            + f", of {mine['variant_id'].nunique()} variants)")
    return xa, ya, slices, note


def _variant_panels(res: Results, best, opts: PlotOptions):
    """Panels for a sweep at one GPU count: (job, rows, tick labels, x label, title, x
    positions). Up to MAX_BARS variants: every one, in variant order. A larger grid becomes
    small multiples along its swept axes: x = the first swept axis (or --x), AXIS_BARS of
    its values; panels = AXIS_PANELS values of the second (or --y); the other axes at the
    values of the fastest variant."""
    panels, note = [], ""
    for job in dict.fromkeys(best["job"]):
        mine = best[best["job"] == job]
        n = int(mine["n_gpus"].iloc[0])
        swept = [a for a in res.swept_axes if f"swept_{a}" in mine
                 and mine[f"swept_{a}"].nunique() > 1]
        if mine["variant_id"].nunique() <= MAX_BARS or not swept:
            chosen = _ranked_variants(mine)[:MAX_BARS]
            sub = mine[mine["variant_id"].isin(chosen)].sort_values("variant_id")
            if mine["variant_id"].nunique() > MAX_BARS:
                note = f" (the {MAX_BARS} fastest variants; select with --hardware)"
            panels.append((job, sub, _short_labels(best, sub, res), f"hardware variant ({n} GPUs)",
                           job, np.arange(len(sub))))
            continue
        xa, ya, slices, note = _slices(res, mine, swept, opts)
        for yv, sub in slices:
            sub = sub.sort_values(f"swept_{xa}").drop_duplicates(f"swept_{xa}")
            title = job + (f", {axis_label(ya)} = {_value_text(res, ya, yv)}" if ya else "")
            panels.append((job, sub, [_value_text(res, xa, v) for v in sub[f"swept_{xa}"]],
                           f"{_axis_text(res, xa)} ({n} GPUs)", title, np.arange(len(sub))))
    return panels, note


def _stacked(res: Results, opts: PlotOptions, parts: dict[str, str], what: str):
    """Stacked bars per panel: x = GPU count (the same counts on every panel), one panel per
    (job, variant); or, when the sweep has one GPU count, x = hardware variant, one panel
    per job. Breakdown: absolute time per iteration (fractions with ``opts.fractions``),
    the total and the chosen layout on each bar; memory: GB against the capacity."""
    Figure = _mpl()
    best = _best(res, opts)
    parts = {c: label for c, label in parts.items() if c in best}  # (older files: no EP)
    recorded = list(parts)  # every part goes into the data, slivers too
    if opts.n_gpus:  # one GPU count: the hardware variants along x
        if opts.n_gpus not in set(res.cases["n_gpus"]):
            raise SweepError(f"--gpus: {opts.n_gpus} is not a GPU count of this sweep; it has "
                             f"{', '.join(str(g) for g in sorted(set(res.cases['n_gpus'])))}")
        best = best[best["n_gpus"] == opts.n_gpus]
        if best.empty:
            raise SweepError(f"--gpus: no feasible configuration at {opts.n_gpus} GPUs yet")
    fractions = what == "breakdown" and opts.fractions
    if what == "breakdown":  # slivers: parts under SLIVER of every bar join "other"
        total = best[list(parts)].sum(axis=1).to_numpy(float)
        share = {c: np.max(best[c].to_numpy(float) / np.maximum(total, 1e-300))
                 for c in parts}
        small = [c for c in parts if 0 < share[c] < SLIVER]
        if len(small) > 1:
            best = best.copy()
            best["_other"] = best[small].sum(axis=1)
            parts = {**{c: lab for c, lab in parts.items() if c not in small},
                     "_other": f"other (each < {SLIVER:.0%})"}
    colors = {c: f"C{k}" for k, c in enumerate(
        TIME_PARTS if what == "breakdown" else MEMORY_PARTS)}
    by_variant = best["n_gpus"].nunique() == 1
    all_gpus = sorted({int(g) for g in best["n_gpus"]})
    if by_variant:  # one GPU count: the hardware variants along x
        panels, note = _variant_panels(res, best, opts)
        widest = max(len(p[2]) for p in panels)
        width = max(4.6, 0.28 * widest + 2)
        # labels drawn at 80 degrees take their length in height: the panel keeps its own
        # (about 0.8 of the figure's width is the panel's)
        longest = max((len(t) for p in panels for t in p[2]), default=0) * 0.6 * 7 / 72.0
        tilted = widest > 6 or longest > 0.9 * 0.8 * width / widest
        fig, axes = _grid(Figure, len(panels), width, 4.6 + (longest if tilted else 0.0))
    else:
        keys, note = _top_panels(best)
        panels = []
        for job, variant in keys:
            sub = best[(best["job"] == job) & (best["variant_id"] == variant)] \
                .sort_values("n_gpus")
            panels.append((job, sub, [str(g) for g in all_gpus], "GPUs",
                           _label(best, job, variant),
                           np.array([all_gpus.index(int(g)) for g in sub["n_gpus"]])))
        fig, axes = _grid(Figure, len(panels), 4.6, 3.8)
    rows = []
    labels: list = []  # (axes, the layout label above a bar)
    for ax, (job, sub, ticks, xlabel, title, pos) in zip(axes, panels):
        bottom = np.zeros(len(sub))
        values = {}
        total = sum(sub[c].to_numpy(float) for c in parts)
        for c in parts:
            raw_value = sub[c].to_numpy(float)
            values[c] = (raw_value / total if fractions else raw_value) if what == "breakdown" \
                else raw_value / GB
        for c, label in parts.items():
            if not np.any(values[c]):
                continue
            style = ({"color": "white", "edgecolor": "0.5", "hatch": "////"} if c == "_other"
                     else {"color": colors[c]})  # one colour per part in every figure
            ax.bar(pos, values[c], bottom=bottom, label=label, width=0.8, **style)
            bottom = bottom + values[c]
        for p in sorted(set(range(len(ticks))) - set(int(q) for q in pos)):
            ax.text(p, 0, "no feasible\nconfiguration", rotation=90, fontsize=6,
                    ha="center", va="bottom", color="0.4")
        if what == "memory":
            cap = sub["hbm_capacity_bytes"].to_numpy(float) / GB
            ax.plot(pos, cap, "k_", ms=14, mew=1.5, ls="none", label="HBM capacity")
            ax.set_ylabel("memory per GPU [GB]")
        else:
            ax.set_ylabel("fraction of step time" if fractions else "time per iteration [s]")
            top = 1.0 if fractions else float(np.max(bottom)) if len(bottom) else 1.0
            for p, b, t, (_, r) in zip(pos, bottom, total, sub.iterrows()):
                text = _layout_text(r) if fractions else f"{fmt.seconds(t)}  {_layout_text(r)}"
                labels.append((ax, ax.text(p, b + 0.02 * top, text, rotation=90, fontsize=6.5,
                                           ha="center", va="bottom")))
            ax.set_ylim(0, top * (1.9 if not fractions else 1.75))  # room for the labels
            if fractions:
                ax.set_yticks(np.linspace(0, 1, 6))
        ax.set_xticks(np.arange(len(ticks)))
        tilt = by_variant and (len(ticks) > 6 or not _labels_fit_level(ax, ticks, 7))
        ax.set_xticklabels(ticks, rotation=80 if tilt else (0 if by_variant else 45),
                           fontsize=7, ha="right" if tilt else "center")
        ax.set_xlim(-0.6, len(ticks) - 0.4)
        ax.set_xlabel(xlabel)
        _panel_title(ax, title)
        scale = (1.0 / total if fractions else 1.0) if what == "breakdown" else 1.0 / GB
        # the --data columns are named for what they hold: GB (mem_*_GB), a share of the
        # step (t_*_share), or seconds (the /top names, t_*_s)
        names = {c: (c.removesuffix("_bytes") + "_GB" if what == "memory" else
                     c.removesuffix("_s") + "_share" if fractions else c) for c in recorded}
        for i, (cid, g, v) in enumerate(zip(sub["case_id"], sub["n_gpus"], sub["variant_id"])):
            rows.append({"job": job, "variant_id": int(v), "n_gpus": int(g),
                         "case_id": int(cid), "strategy": str(sub["strategy"].iloc[i]),
                         **{names[c]: float(sub[c].iloc[i]
                                            * (scale[i] if np.ndim(scale) else scale))
                            for c in recorded}})
    # one legend for all panels, below them
    handles = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    order = [lab for lab in list(parts.values()) + ["HBM capacity"] if lab in handles]
    per_row = max(1, min(len(order), int(fig.get_figwidth() / 1.7)))
    fig.legend([handles[lab] for lab in order], order, loc="outside lower center",
               ncols=per_row, fontsize=7)
    title = (("share of the step time" if fractions else "time per iteration")
             + " of the best configuration" if what == "breakdown"
             else "memory per GPU of the best configuration")
    _suptitle(fig, res, title, note)
    _fit_labels(fig, labels)  # once the legend and the title take their room
    if not fractions:  # panels of one job (on one base system) share their y range
        groups = [(p[0], None if by_variant or p[1].empty else p[1]["base"].iloc[0])
                  for p in panels]
        for group in dict.fromkeys(groups):
            mine = [ax for ax, g in zip(axes, groups) if g == group]
            top = max(ax.get_ylim()[1] for ax in mine)
            for ax in mine:
                ax.set_ylim(0, top)
    return fig, rows

def _breakdown(res: Results, opts: PlotOptions):
    return _stacked(res, opts, TIME_PARTS, "breakdown")


def _memory(res: Results, opts: PlotOptions):
    return _stacked(res, opts, MEMORY_PARTS, "memory")


#: units of unit-suffixed spec keys, as axis labels print them
_UNIT_TEXT = {"GBps": "GB/s", "TBps": "TB/s", "MBps": "MB/s", "Gbps": "Gb/s", "GiB": "GiB",
              "GB": "GB", "TB": "TB", "MiB": "MiB", "us": "µs", "ms": "ms", "tflops": "TFLOP/s",
              "pflops": "PFLOP/s"}
#: names of the quantities a heat-map axis may sweep
_QUANTITY_TEXT = {"hbm": "HBM", "nvlink": "NVLink bandwidth", "scaleout": "scale-out bandwidth",
                  "matrix": "16-bit tensor peak", "vector": "16-bit vector peak",
                  "host_memory": "host memory", "host_link": "host link bandwidth",
                  "nvlink_latency": "NVLink latency", "scaleout_latency": "scale-out latency"}
#: the SI unit of a canonical quantity's swept values
_SI_UNIT_TEXT = {"bytes_per_s": "B/s", "bytes": "B", "s": "s", "flops_per_s": "FLOP/s"}
_PLAIN_AXES = {"nvlink_domain": "GPUs per NVLink domain", "nics_per_gpu": "NICs per GPU",
               "nvlink_efficiency": "NVLink efficiency",
               "scaleout_efficiency": "scale-out efficiency"}


def axis_label(key: str) -> str:
    """A swept key as a physical axis label: hbm_GBps -> 'HBM bandwidth [GB/s]'."""
    if key in _PLAIN_AXES:
        return _PLAIN_AXES[key]
    dimension = quantity_dimension(key)  # (hbm_bandwidth: "3.35 TB/s" values, swept in SI)
    if dimension is not None:
        name = key.replace("_", " ").replace("hbm", "HBM").replace("nvlink", "NVLink")
        return f"{name} [{_SI_UNIT_TEXT[dimension]}]"
    base, _, unit = key.rpartition("_")
    if unit in _UNIT_TEXT and base:
        name = _QUANTITY_TEXT.get(base, base.replace("_", " "))
        if base == "hbm":
            name = "HBM bandwidth" if unit.endswith("ps") else "HBM capacity"
        return f"{name} [{_UNIT_TEXT[unit]}]"
    return key.replace("_", " ")


@functools.lru_cache(maxsize=8)
def _grids_of(spec_text: str) -> tuple[dict, ...]:
    """The hardware grids of a resolved spec (a results file's ``spec`` attribute), in the
    spec's order; none if the text is not a spec."""
    import yaml

    try:
        spec = yaml.safe_load(spec_text) or {}
    except yaml.YAMLError:
        return ()
    groups = spec.get("hardware", []) if isinstance(spec, dict) else []
    return tuple(g["grid"] for g in (groups if isinstance(groups, list) else [groups])
                 if isinstance(g, dict) and isinstance(g.get("grid"), dict))


def _interpolation(res: Results, axis: str) -> dict | None:
    """The spec's grid entry of an interpolated axis (``interpolate``: the catalog systems,
    ``keys``: what it interpolates), or None for an ordinary axis; read from the resolved
    spec in the file."""
    for grid in _grids_of(str(res.attrs.get("spec", ""))):
        entry = grid.get(axis)
        if isinstance(entry, dict) and isinstance(entry.get("interpolate"), list):
            return entry
    return None


def _spec_order(res: Results, axes: list[str]) -> list[str]:
    """``axes`` in the order the spec's grids list them (the results' columns are sorted);
    axes the spec does not name keep their order, after the others."""
    named = list(dict.fromkeys(k for grid in _grids_of(str(res.attrs.get("spec", "")))
                               for k in grid))
    return sorted(axes, key=lambda a: (named.index(a) if a in named else len(named),
                                       axes.index(a)))


def _interpolated(res: Results, axis: str) -> list[str] | None:
    """The catalog names an interpolated axis runs through (its integer positions)."""
    entry = _interpolation(res, axis)
    return [str(n).removeprefix("nersc-") for n in entry["interpolate"]] if entry else None


def _axis_text(res: Results, axis: str) -> str:
    """Axis label: physical for unit-suffixed keys; for an interpolated axis, what it
    interpolates between which systems."""
    names = _interpolated(res, axis)
    if not names:
        return axis_label(axis)
    keys = _interpolation(res, axis).get("keys") or []
    what = ", ".join(str(k).replace("_", " ") for k in keys) or axis
    return f"{axis} ({what}), {names[0]} to {names[-1]}"


def _value_text(res: Results, axis: str, value) -> str:
    """One grid value as read: a generation name at an interpolated axis' catalog point."""
    names = _interpolated(res, axis)
    if names and float(value).is_integer() and 0 <= int(value) < len(names):
        return names[int(value)]
    return _tick_text([value])[0] if not names else f"{float(value):.3g}"


def _tick_text(values) -> list[str]:
    """One format per axis: SI prefixes from a million up (values in SI units: 3.35e12 B/s
    reads 3.35 T), thousands separators from 10,000, else 4 significant digits."""
    top = max((abs(float(v)) for v in values), default=0.0)
    if top >= 1e6:
        return [fmt.si(float(v)) for v in values]
    return [f"{float(v):,.0f}" if top >= 1e4 else f"{float(v):.4g}" for v in values]


#: heat-map cells up to which each carries its number (above: contour lines instead)
MAX_LABELLED_CELLS = 64


def _heatmap(res: Results, opts: PlotOptions):
    """Speed-up of the best throughput over a baseline cell, across two swept hardware axes:
    the study's form (arXiv 2410.00273, heat maps over HBM bandwidth x capacity). The
    baseline is the lowest value of both axes with a feasible configuration, marked on the
    map; a small grid's cells carry their speed-up, a larger one's contour lines at round
    speed-ups (interpolated between cells, which two values of an axis cannot support)."""
    Figure = _mpl()
    chosen = res.cases
    if opts.hardware:  # variants by label or base name, as the other kinds select them
        keep = list(opts.hardware)
        chosen = chosen[chosen["hardware"].isin(keep) | chosen["base"].isin(keep)]
    variants = set(chosen["variant_id"]) if opts.hardware else None
    axes_swept = _spec_order(res, [a for a in res.swept_axes
                                   if chosen[f"swept_{a}"].nunique() > 1])
    if opts.x and opts.x == opts.y:
        raise SweepError(f"--x and --y both name {opts.x}: a heatmap needs two different "
                         f"swept axes")
    x = opts.x or next((a for a in axes_swept if a != opts.y), None)
    y = opts.y or next((a for a in axes_swept if a != x), None)
    if x is None or y is None:
        raise SweepError(f"{res.path}: a heatmap needs two swept hardware axes; this sweep "
                         f"{'selection ' if opts.hardware else ''}has "
                         f"{', '.join(axes_swept) or 'none'} varying")
    best = res.best()
    if variants is not None:
        best = best[best["variant_id"].isin(list(variants))]
    if best.empty:
        raise SweepError(f"{res.path}: no case has a feasible configuration yet")
    panels = []
    for job in list(opts.jobs) or sorted(best["job"].unique()):
        mine = best[best["job"] == job]
        if opts.strategy:
            mine = mine[mine["strategy"] == opts.strategy]
        if mine.empty:
            continue
        n = opts.n_gpus or int(mine["n_gpus"].max())
        table = res.grid("samples_per_s", x, y, n_gpus=n, job=job, strategy=opts.strategy,
                         variants=variants)
        if table.size and np.isfinite(table.to_numpy(float)).any():
            panels.append((job, n, table))
    if not panels:
        raise SweepError(f"{res.path}: no feasible configuration matches the selection "
                         f"(job, strategy, GPU count) yet")
    fig, axs = _grid(Figure, len(panels), 5.5, 4.4)
    rows = []
    for ax, (job, n, table) in zip(axs, panels):
        data = table.to_numpy(float)
        # the baseline: the first feasible cell from the lowest y, then the lowest x
        bi, bj = next((i, j) for i in range(data.shape[0]) for j in range(data.shape[1])
                      if np.isfinite(data[i, j]))
        base = data[bi, bj]
        speedup = data / base
        im = ax.imshow(speedup, origin="lower", aspect="auto", cmap="viridis")
        if speedup.size <= MAX_LABELLED_CELLS:  # each cell its number, legible on its colour
            middle = 0.5 * (np.nanmin(speedup) + np.nanmax(speedup))
            for (i, j), v in np.ndenumerate(speedup):
                if np.isfinite(v):
                    ax.text(j, i + 0.18, f"{v:.2f}x", ha="center", va="center", fontsize=7,
                            color="black" if v > middle else "white")
        elif min(speedup.shape) >= 3 and np.isfinite(speedup).sum() >= 4:
            levels = [v for v in (1.25, 1.5, 2, 3, 4, 6, 8, 12, 16)
                      if np.nanmin(speedup) < v < np.nanmax(speedup)]
            if levels:
                lines = ax.contour(np.ma.masked_invalid(speedup), levels=levels, colors="w",
                                   linewidths=0.8)
                ax.clabel(lines, fmt=lambda v: f"{v:g}x", fontsize=7)
        ax.plot([bj], [bi], marker="s", ms=9, mfc="none", mec="red", mew=1.5, ls="none")
        ax.annotate("baseline", (bj, bi), xytext=(6, 6), textcoords="offset points",
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                          "alpha": 0.85},
                    color="red", fontsize=7)
        # at most ~10 labelled ticks per axis, one number format per axis
        for axis, values, set_ticks, set_labels, rot in (
                (x, table.columns, ax.set_xticks, ax.set_xticklabels, 45),
                (y, table.index, ax.set_yticks, ax.set_yticklabels, 0)):
            names = _interpolated(res, axis)
            if names:  # generation names at the catalog points, the rest unlabelled
                ticks = [i for i, v in enumerate(values) if float(v).is_integer()
                         and 0 <= int(v) < len(names)]
                text = [names[int(values[i])] for i in ticks]
            else:  # at most ~10 labelled ticks, one number format per axis
                step = max(1, math.ceil(len(values) / 10))
                ticks = list(range(0, len(values), step))
                text = _tick_text([values[i] for i in ticks])
            set_ticks(ticks)
            set_labels(text, rotation=rot, fontsize=7)
        ax.set_xlabel(_axis_text(res, x), fontsize=8)
        ax.set_ylabel(_axis_text(res, y), fontsize=8)
        ax.set_title(f"{job}, {n} GPUs; baseline {_value_text(res, x, table.columns[bj])} x "
                     f"{_value_text(res, y, table.index[bi])}: {base:.4g} samples/s",
                     fontsize=8)
        fig.colorbar(im, ax=ax, label="speed-up over the baseline")
        blank = ~np.isfinite(speedup)
        mine = chosen[(chosen["job"] == job) & (chosen["n_gpus"] == n)]
        if opts.strategy:
            mine = mine[mine["strategy"] == opts.strategy]
        # cells whose cases are not all searched yet (a partial run): a value there is the
        # best so far, and may still rise
        done = mine.assign(done=mine["complete"].astype(bool)).pivot_table(
            index=f"swept_{y}", columns=f"swept_{x}", values="done", aggfunc="all")
        unsettled = ~done.reindex(index=table.index, columns=table.columns).fillna(
            True).to_numpy(bool) & ~blank
        notes = []
        if blank.any():  # say what a blank cell is: no feasible configuration, or pending
            pending = int((~mine["complete"].astype(bool)
                           & ~np.isfinite(mine["best_samples_per_s"].to_numpy(float))).sum())
            ii, jj = np.nonzero(blank)
            ax.scatter(jj, ii, marker="x", s=12, color="0.5", linewidths=0.8)
            notes.append(f"x: {int(blank.sum())} cells without a result, "
                         + (f"{pending} of their cases not searched yet" if pending
                            else "no feasible configuration"))
        if unsettled.any():
            ii, jj = np.nonzero(unsettled)
            ax.scatter(jj, ii, marker="*", s=14, color="w", linewidths=0)
            notes.append(f"*: {int(unsettled.sum())} cells the best so far, cases pending")
        if notes:
            ax.set_xlabel(ax.get_xlabel() + "\n(" + "; ".join(notes) + ")", fontsize=8)
        for (i, yv) in enumerate(table.index):
            for (j, xv) in enumerate(table.columns):
                rows.append({"job": job, "n_gpus": n, x: float(xv), y: float(yv),
                             "samples_per_s": float(data[i, j]),
                             "speedup": float(speedup[i, j]), "baseline": (i, j) == (bi, bj)})
    # the other swept axes are not held at one value: each cell is the best over them
    others = [a for a in axes_swept if a not in (x, y)]
    note = (f"; each cell the best over {', '.join(axis_label(a) for a in others)}"
            if others else "")
    _suptitle(fig, res, f"best throughput over {axis_label(x)} x {axis_label(y)}{note}")
    return fig, rows


def _speedups(res: Results, jobs: Sequence[str] = ()):
    """(strategies, DataFrame: job, variant_id, n_gpus, strategy, samples_per_s, speedup,
    feasible, best_strategy): each strategy's best throughput over the best of every
    strategy at that (job, variant, GPU count), 1 for the winner, 0 and feasible False for a
    strategy whose case finished without a feasible configuration; pending cases are left
    out, and so are cases without any candidate (the strategy cannot lay the job out: an
    MoE job under 2d), which are not infeasible."""
    cases = res.cases
    if jobs:
        cases = cases[cases["job"].isin(list(jobs))]
    if "candidates" in cases:
        cases = cases[cases["candidates"] > 0]
    strategies = list(dict.fromkeys(cases["strategy"]))
    key = ["job", "variant_id", "n_gpus"]
    done = cases[cases["complete"].astype(bool) | np.isfinite(
        cases["best_samples_per_s"].to_numpy(float))]
    swept = [c for c in done.columns if c.startswith("swept_")]
    table = done[[*key, "strategy", "best_samples_per_s", *swept]].rename(
        columns={"best_samples_per_s": "samples_per_s"})
    top = table.groupby(key)["samples_per_s"].transform("max")
    table = table.assign(speedup=table["samples_per_s"] / top,
                         feasible=np.isfinite(table["samples_per_s"].to_numpy(float)))
    table["speedup"] = table["speedup"].fillna(0.0)
    winners = table[table["speedup"] == 1.0].drop_duplicates(key)[[*key, "strategy"]]
    table = table.merge(winners.rename(columns={"strategy": "best_strategy"}), on=key,
                        how="left")
    # only points where at least two strategies are known and one is feasible
    counts = table.groupby(key)["strategy"].transform("count")
    table = table[(counts >= 2) & table["best_strategy"].notna()]
    return strategies, table.reset_index(drop=True)


def _strategies(res: Results, opts: PlotOptions):
    """Each strategy's best throughput as a fraction of the best over all strategies, vs GPU
    count; one y range for every panel; a strategy with no feasible configuration is drawn
    as such (a cross at 0), not left out."""
    Figure = _mpl()
    strategies, table = _speedups(res, opts.jobs)
    if opts.n_gpus:  # one GPU count: along the swept hardware axes
        table = table[table["n_gpus"] == opts.n_gpus]
    if len(strategies) < 2:
        raise SweepError(f"{res.path}: comparing strategies needs two; this sweep has "
                         f"{', '.join(strategies) or 'none'}")
    if table.empty:
        raise SweepError(f"{res.path}: no GPU count has results of two strategies with a "
                         f"feasible configuration yet; nothing to compare")
    swept = [a for a in res.swept_axes if f"swept_{a}" in table
             and table[f"swept_{a}"].nunique() > 1]
    panels = []  # (title, rows, x column, x label)
    if table["n_gpus"].nunique() == 1 and swept:  # along the swept axes, as small multiples
        note = ""
        for job in dict.fromkeys(table["job"]):
            mine = table[table["job"] == job]
            xa, ya, slices, note = _slices(res, mine, swept, opts)
            n = int(mine["n_gpus"].iloc[0])
            for yv, sub in slices:
                title = job + (f", {axis_label(ya)} = {_value_text(res, ya, yv)}" if ya
                               else "") + f", {n} GPUs"
                panels.append((title, sub, f"swept_{xa}", _axis_text(res, xa)))
    else:
        ranked = table.assign(samples_per_s=table["samples_per_s"].fillna(0.0))
        keys, note = _top_panels(ranked)
        best = res.best()
        for job, variant in keys:
            sub = table[(table["job"] == job) & (table["variant_id"] == variant)]
            panels.append((_label(best, job, variant), sub, "n_gpus", "GPUs"))
    fig, axes = _grid(Figure, len(panels))
    rows = []
    for ax, (title, sub, xcol, xlabel) in zip(axes, panels):
        for k, strat in enumerate(strategies):
            line = sub[sub["strategy"] == strat].sort_values(xcol)
            if line.empty:
                continue
            ok = line["feasible"].to_numpy(bool)
            x, y = line[xcol].to_numpy(float), line["speedup"].to_numpy(float)
            # the line breaks where a point of the panel is missing (pending) or infeasible
            every = np.array(sorted(set(sub[xcol].to_numpy(float))))
            drawn = np.full(len(every), np.nan)
            drawn[np.searchsorted(every, x[ok])] = y[ok]
            ax.plot(every, drawn, "o-", color=f"C{k}", label=strat, ms=3)
            if (~ok).any():
                ax.plot(x[~ok], np.full((~ok).sum(), -0.02 - 0.03 * k), "x", color=f"C{k}",
                        ms=6, mew=1.5, label=f"{strat}: no feasible configuration",
                        clip_on=False)
            rows += [{"job": j, "variant_id": int(v), "strategy": strat, "n_gpus": int(g),
                      "speedup": float(s), "feasible": bool(f), "best_strategy": b}
                     for j, v, g, s, f, b in zip(line["job"], line["variant_id"],
                                                 line["n_gpus"], y, ok, line["best_strategy"])]
        ax.set_ylim(-0.03 - 0.03 * len(strategies), 1.08)
        ax.axhline(1.0, color="0.7", lw=0.6, ls="--", zorder=0)
        if xcol == "n_gpus":
            _finish_panel(ax, sub["n_gpus"], "throughput / best of all strategies", title)
        else:
            ax.set_xlabel(xlabel)
            ax.set_ylabel("throughput / best of all strategies")
            _panel_title(ax, title)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=6)
    _suptitle(fig, res, "each strategy's best against the best strategy", note)
    return fig, rows


def _layout(res: Results, opts: PlotOptions):
    """Parallel degrees of the best configuration vs GPU count; lines that coincide are
    drawn side by side (a small vertical offset in log space, distinct markers), the data
    exact."""
    Figure = _mpl()
    best = _best(res, opts)
    if best["n_gpus"].nunique() < 2:
        raise SweepError(f"{res.path}: a layout against GPU count needs results at several "
                         f"GPU counts; this selection has {int(best['n_gpus'].iloc[0])} only")
    keys, note = _top_panels(best)
    fig, axes = _grid(Figure, len(keys))
    rows = []
    for ax, (job, variant) in zip(axes, keys):
        sub = best[(best["job"] == job) & (best["variant_id"] == variant)].sort_values("n_gpus")
        degrees = [d for d in DEGREES if d in sub]  # (files before EP have no ep / etp)
        drawn = [d for d in degrees if d == "dp" or not np.all(sub[d].to_numpy(float) == 1)]
        for k, d in enumerate(drawn):
            style = DEGREES.index(d)  # one colour and marker per degree in every panel
            vals = sub[d].to_numpy(float)
            offset = 2.0 ** (0.07 * (k - (len(drawn) - 1) / 2))
            ax.plot(sub["n_gpus"], vals * offset, ls="-",
                    marker=_MARKERS[style % len(_MARKERS)], color=f"C{style}",
                    label=d.upper(), ms=4, lw=1.1)
        for _, r in sub.iterrows():
            rows.append({"job": job, "variant_id": int(variant), "n_gpus": int(r["n_gpus"]),
                         "case_id": int(r["case_id"]), **{d: int(r[d]) for d in degrees}})
        ax.set_yscale("log", base=2)
        _finish_panel(ax, sub["n_gpus"], "parallel degree (lines offset to stay visible)",
                      _label(best, job, variant))
    _suptitle(fig, res, "layout of the best configuration", note)
    return fig, rows


def _pareto(res: Results, opts: PlotOptions):
    """The Pareto front across hardware variants: throughput against GPU count (or, with one
    GPU count, against the first swept hardware axis), every best point in grey, the points
    nothing beats with fewer GPUs (less of the resource) joined and labelled."""
    Figure = _mpl()
    best = _best(res, opts)
    if best["n_gpus"].nunique() > 1:
        xcol, xlabel, log = "n_gpus", "GPUs", True
    else:
        swept = [a for a in res.swept_axes if best[f"swept_{a}"].nunique() > 1] \
            if res.swept_axes else []
        if not swept:
            raise SweepError(f"{res.path}: a Pareto front needs several GPU counts or a swept "
                             f"hardware axis")
        xcol, xlabel, log = f"swept_{swept[0]}", _axis_text(res, swept[0]), False
    jobs = list(dict.fromkeys(best["job"]))
    fig, axes = _grid(Figure, len(jobs), 6.0, 4.4)
    short = dict(zip(best["variant_id"], _short_labels(best, best, res)))
    rows = []
    for ax, job in zip(axes, jobs):
        sub = best[best["job"] == job].sort_values([xcol, "samples_per_s"],
                                                   ascending=[True, False], kind="mergesort")
        x, y = sub[xcol].to_numpy(float), sub["samples_per_s"].to_numpy(float)
        front = np.zeros(len(sub), dtype=bool)
        top = -np.inf
        for i in range(len(sub)):  # sorted by x, best first within an x: one pass
            if y[i] > top:
                front[i], top = True, y[i]
        ax.scatter(x[~front], y[~front], s=6, color="0.7", label="other variants")
        ax.plot(x[front], y[front], "o-", color="C3", ms=4, label="Pareto front")
        # a partial run: a point of a case not fully searched is its best so far
        unsettled = ~sub["complete"].astype(bool).to_numpy()
        if unsettled.any():
            ax.scatter(x[unsettled], y[unsettled], s=36, facecolors="none", edgecolors="k",
                       linewidths=0.8, label="best so far (case not fully searched)")
        # labels: at most 8 front points, without the x axis' own value
        own = xcol.removeprefix("swept_") + "="
        points = list(zip(x[front], y[front], sub["variant_id"].to_numpy()[front]))
        for xi, yi, v in _spread(points, 8):
            text = " ".join(w for w in short[v].split() if not w.startswith(own))
            ax.annotate(text or short[v], (xi, yi), xytext=(3, -8),
                        textcoords="offset points", fontsize=6, color="C3")
        for r, f in zip(sub.itertuples(), front):
            rows.append({"job": job, "variant_id": int(r.variant_id), "hardware": r.hardware,
                         "n_gpus": int(r.n_gpus), "x": float(getattr(r, xcol)),
                         "samples_per_s": float(r.samples_per_s), "on_front": bool(f),
                         "case_id": int(r.case_id), "complete": bool(r.complete)})
        if log:
            _gpu_axis(ax, sub["n_gpus"])
            ax.set_yscale("log")
        elif names := _interpolated(res, xcol.removeprefix("swept_")):
            # an interpolated axis: its catalog systems at their integer positions
            at = [i for i in range(len(names)) if x.min() <= i <= x.max()]
            ax.set_xticks(at)
            ax.set_xticklabels([names[i] for i in at], fontsize=7)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("throughput [samples/s]")
        ax.set_title(job, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    _suptitle(fig, res, f"Pareto front: the most throughput for the {xlabel.split(' [')[0]}")
    return fig, rows


_KIND = {"scaling": _scaling, "breakdown": _breakdown, "memory": _memory,
         "heatmap": _heatmap, "strategies": _strategies, "layout": _layout, "pareto": _pareto}


def draw(res: Results, kind: str, opts: PlotOptions | None = None):
    """(matplotlib Figure, DataFrame of the plotted numbers) for one kind."""
    if kind not in _KIND:
        raise SweepError(f"--kind: unknown kind {kind!r}; valid: {', '.join(KINDS)}")
    opts = opts or PlotOptions()
    _unknown_selection(res, opts)
    fig, rows = _KIND[kind](res, opts)
    return fig, _pandas().DataFrame(rows)


def save(res: Results, kind: str, out: str | Path, opts: PlotOptions | None = None):
    """Draw ``kind`` and write it to ``out`` (.png, .svg or .pdf, atomically); returns the
    plotted numbers."""
    out = Path(out)
    if out.suffix.lower() not in FORMATS:
        raise SweepError(f"-o: {out.name}: the file name must end in {', '.join(FORMATS)}")
    if not out.parent.is_dir():
        raise SweepError(f"-o: {out.parent} " + ("is not a directory" if out.parent.exists()
                                                 else "does not exist"))
    fig, data = draw(res, kind, opts)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=out.suffix, dir=out.parent)
    except OSError as exc:
        raise SweepError(f"-o: {out}: cannot write: {exc.strerror}") from None
    done = False
    try:
        with os.fdopen(fd, "wb") as fh:  # a fresh file with a random name, never a link
            os.fchmod(fh.fileno(), 0o666 & ~_umask())
            fig.savefig(fh, dpi=130, format=out.suffix[1:].lower())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, out)
        done = True
    except OSError as exc:
        raise SweepError(f"-o: {out}: cannot write: {exc.strerror or exc}") from None
    finally:
        if not done:
            os.unlink(tmp)
    return data


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def why_not(res: Results) -> dict[str, str]:
    """Kinds that say nothing for this sweep (or for the part of it done so far), with the
    reason."""
    best = res.best()
    yet = "" if res.complete else " so far"
    if best.empty:
        return {k: f"no case has a feasible configuration{yet}" for k in KINDS}
    out = {}
    if best["n_gpus"].nunique() < 2:
        for k in ("scaling", "layout"):
            out[k] = f"the results have one GPU count{yet}"
    swept = [a for a in res.swept_axes if res.cases[f"swept_{a}"].nunique() > 1]
    if len(swept) < 2:
        out["heatmap"] = (f"needs two swept hardware axes; this sweep has "
                          f"{', '.join(swept) or 'none'}")
    strategies, table = _speedups(res)
    if len(strategies) < 2:
        out["strategies"] = (f"needs two strategies; this sweep has "
                             f"{', '.join(sorted(strategies))}")
    elif table.empty:
        out["strategies"] = f"no GPU count has results of two strategies{yet}"
    per_system = res.best_per_system()
    if per_system["n_gpus"].nunique() < 2 and not any(
            per_system[f"swept_{a}"].nunique() > 1 for a in res.swept_axes):
        out["pareto"] = (f"needs results at several GPU counts or along a swept hardware "
                         f"axis{yet}")
    return out


def kinds_that_fit(res: Results) -> list[str]:
    """The kinds that say something for this sweep."""
    skip = why_not(res)
    return [k for k in KINDS if k not in skip]

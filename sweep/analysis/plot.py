"""``sweep plot``: the figures of a design-space study, drawn from a reduced ``sweep.h5``.

Every kind returns the figure and the table of the numbers it drew (a DataFrame), so the
tests can check the plotted data against the HDF5 tables:

* ``scaling``    throughput (or time to train) vs GPU count, one line per hardware variant
                 and job, log axes, each line's ideal-scaling reference dashed;
* ``breakdown``  stacked fractions of the best configuration's step time vs GPU count;
* ``memory``     stacked memory per GPU of the best configuration vs GPU count, with capacity;
* ``heatmap``    speed-up of the best throughput over a marked baseline cell, across two
                 swept hardware axes at one GPU count;
* ``strategies`` speed-up of each strategy's best over the 1d best vs GPU count;
* ``layout``     the best configuration's TP / TP2 / CP / PP / DP degrees vs GPU count.

"Best" is over strategies (``Results.best_per_system``) unless a strategy is chosen. Partial,
empty and single-point results never crash a kind: it draws what exists (panels without
data say so) or raises :class:`SweepError` saying why there is nothing to draw. Needs
matplotlib and pandas (``pip install -e '.[plot]'`` in the checkout); uses matplotlib's
object API only (no pyplot state), so it is safe in any process.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SweepError, install_hint
from .results import DEGREES, MEMORY_PARTS, TIME_PARTS, Results, _pandas

__all__ = ["KINDS", "FORMATS", "PlotOptions", "draw", "save", "kinds_that_fit", "why_not"]

KINDS = ("scaling", "breakdown", "memory", "heatmap", "strategies", "layout")
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
    n_gpus: int | None = None  # heatmap: GPU count (default: the largest)
    x: str | None = None  # heatmap axes (default: the first two swept axes)
    y: str | None = None


def _mpl():
    try:
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - matplotlib is in the plot / test extras
        raise SweepError(f"sweep plot needs matplotlib: {install_hint('plot')}") from None
    return Figure


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


def _panels(best) -> tuple[list[tuple[str, int]], str]:
    keys = list(dict.fromkeys(zip(best["job"], best["variant_id"])))
    note = ""
    if len(keys) > MAX_PANELS:
        note = (f" (first {MAX_PANELS} of {len(keys)} job x hardware panels; "
                f"select with --hardware / --job)")
        keys = keys[:MAX_PANELS]
    return keys, note


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


def _label(best, job: str, variant: int) -> str:
    row = best[(best["job"] == job) & (best["variant_id"] == variant)].iloc[0]
    return f"{job} on {row['hardware']}"


def _short_labels(best, sub) -> list[str]:
    """Variant labels with only what differs between variants (base, swept values)."""
    import json

    swept = [json.loads(v) for v in sub["swept"]]
    all_swept = [json.loads(v) for v in best["swept"]]
    varying = [k for k in (all_swept[0] if all_swept else {})
               if len({round(float(d.get(k, 0.0)), 12) for d in all_swept}) > 1]
    bases_vary = best["base"].nunique() > 1
    out = []
    for base, hw, d in zip(sub["base"], sub["hardware"], swept):
        parts = ([str(base)] if bases_vary else []) + [f"{k}={float(d[k]):.3g}" for k in varying]
        out.append(" ".join(parts) if parts else str(hw))
    return out


def _title(res: Results, what: str, note: str = "") -> str:
    partial = " [PARTIAL RUN]" if not res.complete else ""
    return f"{res.name}: {what} ({res.cost_model}){note}{partial}"


def _finish_panel(ax, gpus, ylabel: str, title: str) -> None:
    """GPU-count x axis, labels, grid and legend of a line panel."""
    _gpu_axis(ax, gpus)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6)


def _gpu_axis(ax, gpus) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(int(g) for g in gpus)))
    ax.set_xticklabels([str(int(g)) for g in sorted(set(int(g) for g in gpus))],
                       rotation=45, fontsize=7)
    ax.set_xlabel("GPUs")


# ------------------------------------------------------------------------------ kinds

def _scaling(res: Results, opts: PlotOptions):
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
    best["value"] = (opts.tokens / best["tokens_per_s"] / 86400.0 if metric == "days"
                     else best[metric])
    jobs = list(dict.fromkeys(best["job"]))
    fig, axes = _grid(Figure, len(jobs), 6.0, 4.2)
    rows = []
    for ax, job in zip(axes, jobs):
        sub = best[best["job"] == job]
        variants = list(dict.fromkeys(sub["variant_id"]))
        for k, variant in enumerate(variants[:20]):
            line = sub[sub["variant_id"] == variant].sort_values("n_gpus")
            x, y = line["n_gpus"].to_numpy(float), line["value"].to_numpy(float)
            color = f"C{k % 10}"
            ax.plot(x, y, "o-", color=color, label=line["hardware"].iloc[0], ms=3)
            # ideal scaling from the line's smallest GPU count
            grow = x / x[0]
            ideal = y[0] / grow if metric in ("step_time_s", "days") else y[0] * grow
            ax.plot(x, ideal, ":", color=color, lw=0.8)
            rows += [{"job": job, "variant_id": variant, "hardware": line["hardware"].iloc[0],
                      "n_gpus": int(g), "value": float(v), "ideal": float(i),
                      "case_id": int(cid)}
                     for g, v, i, cid in zip(x, y, ideal, line["case_id"])]
        _gpu_axis(ax, sub["n_gpus"])
        ax.set_yscale("log")
        ax.set_ylabel(labels[metric])
        ax.set_title(job, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, title="dotted: ideal scaling", title_fontsize=6)
    fig.suptitle(_title(res, f"{labels[metric]} vs GPU count"), fontsize=10)
    return fig, rows


#: bars drawn at most per panel when the x axis is the hardware variant
MAX_BARS = 40


def _stacked(res: Results, opts: PlotOptions, parts: dict[str, str], what: str):
    """Stacked bars per panel: x = GPU count, one panel per (job, variant); or, when the
    sweep has one GPU count, x = hardware variant, one panel per job."""
    Figure = _mpl()
    best = _best(res, opts)
    parts = {c: label for c, label in parts.items() if c in best}  # (older files: no EP)
    by_variant = best["n_gpus"].nunique() == 1
    if by_variant:
        jobs = list(dict.fromkeys(best["job"]))
        keys = [(job, None) for job in jobs]
        n_var = best.groupby("job")["variant_id"].nunique().max()
        note = (f" (first {MAX_BARS} of {n_var} variants; select with --hardware)"
                if n_var > MAX_BARS else "")
        fig, axes = _grid(Figure, len(keys), max(4.6, 0.28 * min(n_var, MAX_BARS) + 2), 4.2)
    else:
        keys, note = _panels(best)
        fig, axes = _grid(Figure, len(keys))
    rows = []
    for ax, (job, variant) in zip(axes, keys):
        if by_variant:
            sub = best[best["job"] == job].sort_values("variant_id").head(MAX_BARS)
            ticks = _short_labels(best, sub)
            xlabel = f"hardware variant ({int(sub['n_gpus'].iloc[0])} GPUs)"
            title = job
        else:
            sub = best[(best["job"] == job) & (best["variant_id"] == variant)] \
                .sort_values("n_gpus")
            ticks = [str(int(g)) for g in sub["n_gpus"]]
            xlabel = "GPUs"
            title = _label(best, job, variant)
        pos = np.arange(len(sub))
        bottom = np.zeros(len(sub))
        values = {}
        if what == "breakdown":
            total = sum(sub[c].to_numpy(float) for c in parts)
            for c in parts:
                values[c] = sub[c].to_numpy(float) / total
        else:
            for c in parts:
                values[c] = sub[c].to_numpy(float) / GB
        for k, (c, label) in enumerate(parts.items()):
            if not np.any(values[c]):
                continue
            ax.bar(pos, values[c], bottom=bottom, color=f"C{k}", label=label, width=0.8)
            bottom = bottom + values[c]
        if what == "memory":
            cap = sub["hbm_capacity_bytes"].to_numpy(float) / GB
            ax.plot(pos, cap, "k_", ms=14, mew=1.5, ls="none", label="HBM capacity")
            ax.set_ylabel("memory per GPU [GB]")
        else:
            ax.set_ylabel("fraction of step time")
            ax.set_ylim(0, 1)
        ax.set_xticks(pos)
        tilt = by_variant and len(ticks) > 6
        ax.set_xticklabels(ticks, rotation=80 if tilt else (0 if by_variant else 45),
                           fontsize=7, ha="right" if tilt else "center")
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=8)
        for i, (cid, g, v) in enumerate(zip(sub["case_id"], sub["n_gpus"], sub["variant_id"])):
            rows.append({"job": job, "variant_id": int(v), "n_gpus": int(g),
                         "case_id": int(cid), **{c: float(values[c][i]) for c in parts}})
    # one legend for all panels, below them
    handles = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    order = [lab for lab in list(parts.values()) + ["HBM capacity"] if lab in handles]
    per_row = max(1, min(len(order), int(fig.get_figwidth() / 1.7)))
    fig.legend([handles[lab] for lab in order], order, loc="outside lower center",
               ncols=per_row, fontsize=7)
    title = ("time breakdown of the best configuration" if what == "breakdown"
             else "memory per GPU of the best configuration")
    fig.suptitle(_title(res, title, note), fontsize=10)
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
_PLAIN_AXES = {"nvlink_domain": "GPUs per NVLink domain", "nics_per_gpu": "NICs per GPU",
               "nvlink_efficiency": "NVLink efficiency",
               "scaleout_efficiency": "scale-out efficiency"}


def axis_label(key: str) -> str:
    """A swept key as a physical axis label: hbm_GBps -> 'HBM bandwidth [GB/s]'."""
    if key in _PLAIN_AXES:
        return _PLAIN_AXES[key]
    base, _, unit = key.rpartition("_")
    if unit in _UNIT_TEXT and base:
        name = _QUANTITY_TEXT.get(base, base.replace("_", " "))
        if base == "hbm":
            name = "HBM bandwidth" if unit.endswith("ps") else "HBM capacity"
        return f"{name} [{_UNIT_TEXT[unit]}]"
    return key.replace("_", " ")


def _tick_text(values) -> list[str]:
    """One format per axis: thousands separators from 10,000 up, else 4 significant digits."""
    big = max((abs(float(v)) for v in values), default=0.0) >= 1e4
    return [f"{float(v):,.0f}" if big else f"{float(v):.4g}" for v in values]


def _heatmap(res: Results, opts: PlotOptions):
    """Speed-up of the best throughput over a baseline cell, across two swept hardware axes:
    the study's form (arXiv 2410.00273, heat maps over HBM bandwidth x capacity). The
    baseline is the lowest value of both axes with a feasible configuration, marked on the
    map; contour lines at round speed-ups."""
    Figure = _mpl()
    axes_swept = [a for a in res.swept_axes if res.cases[f"swept_{a}"].nunique() > 1]
    x = opts.x or (axes_swept[0] if axes_swept else None)
    y = opts.y or (axes_swept[1] if len(axes_swept) > 1 else None)
    if x is None or y is None:
        raise SweepError(f"{res.path}: a heatmap needs two swept hardware axes; this sweep "
                         f"has {', '.join(axes_swept) or 'none'}")
    best = res.best()
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
        table = res.grid("samples_per_s", x, y, n_gpus=n, job=job, strategy=opts.strategy)
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
        if min(speedup.shape) >= 2 and np.isfinite(speedup).sum() >= 4:
            levels = [v for v in (1.25, 1.5, 2, 3, 4, 6, 8, 12, 16)
                      if np.nanmin(speedup) < v < np.nanmax(speedup)]
            if levels:
                lines = ax.contour(np.ma.masked_invalid(speedup), levels=levels, colors="w",
                                   linewidths=0.8)
                ax.clabel(lines, fmt=lambda v: f"{v:g}x", fontsize=7)
        ax.plot([bj], [bi], marker="s", ms=9, mfc="none", mec="red", mew=1.5, ls="none")
        ax.annotate("baseline", (bj, bi), xytext=(4, 4), textcoords="offset points",
                    color="red", fontsize=7)
        # at most ~10 labelled ticks per axis, one number format per axis
        for values, set_ticks, set_labels, rot in (
                (table.columns, ax.set_xticks, ax.set_xticklabels, 45),
                (table.index, ax.set_yticks, ax.set_yticklabels, 0)):
            step = max(1, math.ceil(len(values) / 10))
            ticks = list(range(0, len(values), step))
            set_ticks(ticks)
            set_labels(_tick_text([values[i] for i in ticks]), rotation=rot, fontsize=7)
        ax.set_xlabel(axis_label(x))
        ax.set_ylabel(axis_label(y))
        ax.set_title(f"{job}, {n} GPUs; baseline {_tick_text([table.columns[bj]])[0]} x "
                     f"{_tick_text([table.index[bi]])[0]}: {base:.4g} samples/s", fontsize=8)
        fig.colorbar(im, ax=ax, label="speed-up over the baseline")
        for (i, yv) in enumerate(table.index):
            for (j, xv) in enumerate(table.columns):
                rows.append({"job": job, "n_gpus": n, x: float(xv), y: float(yv),
                             "samples_per_s": float(data[i, j]),
                             "speedup": float(speedup[i, j]), "baseline": (i, j) == (bi, bj)})
    fig.suptitle(_title(res, f"best throughput over {axis_label(x)} x {axis_label(y)}"),
                 fontsize=10)
    return fig, rows


def _speedups(res: Results, jobs: Sequence[str] = ()):
    """(best rows, strategies, DataFrame of speed-ups over 1d: job, variant_id, strategy,
    n_gpus, speedup) for the GPU counts where both 1d and the strategy have a best."""
    best = res.best()
    if jobs:
        best = best[best["job"].isin(list(jobs))]
    strategies = list(dict.fromkeys(best["strategy"]))
    key = ["job", "variant_id", "n_gpus"]
    base = best[best["strategy"] == "1d"][[*key, "samples_per_s"]]
    other = best[best["strategy"] != "1d"][[*key, "strategy", "samples_per_s"]]
    pairs = other.merge(base, on=key, suffixes=("", "_1d"))
    pairs["speedup"] = pairs["samples_per_s"] / pairs["samples_per_s_1d"]
    pairs = pairs[np.isfinite(pairs["speedup"].to_numpy(float)) & (pairs["speedup"] > 0)]
    return best, strategies, pairs[[*key, "strategy", "speedup"]]


def _strategies(res: Results, opts: PlotOptions):
    Figure = _mpl()
    best, strategies, pairs = _speedups(res, opts.jobs)
    if "1d" not in strategies or len(strategies) < 2:
        raise SweepError(f"{res.path}: speed-ups over 1d need 1d and another strategy; this "
                         f"sweep has {', '.join(strategies) or 'none'}")
    if pairs.empty:
        raise SweepError(f"{res.path}: no GPU count has a best configuration of both 1d and "
                         f"another strategy yet; nothing to compare")
    keys, note = _panels(pairs)
    lacking = len(set(zip(best["job"], best["variant_id"]))) - len(set(zip(pairs["job"],
                                                                           pairs["variant_id"])))
    if lacking:
        note += f" ({lacking} job x hardware panel(s) without a comparison yet)"
    fig, axes = _grid(Figure, len(keys))
    rows = []
    for ax, (job, variant) in zip(axes, keys):
        sub = pairs[(pairs["job"] == job) & (pairs["variant_id"] == variant)]
        for k, strat in enumerate(s for s in strategies if s != "1d"):
            line = sub[sub["strategy"] == strat].sort_values("n_gpus")
            if line.empty:
                continue
            speedup = line["speedup"].to_numpy(float)
            ax.plot(line["n_gpus"], speedup, "o-", color=f"C{k + 1}", label=strat, ms=3)
            rows += [{"job": job, "variant_id": int(variant), "strategy": strat, "n_gpus": int(g),
                      "speedup": float(v)} for g, v in zip(line["n_gpus"], speedup)]
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        _finish_panel(ax, sub["n_gpus"], "speed-up over 1d (best vs best)",
                      _label(best, job, variant))
    fig.suptitle(_title(res, "strategy speed-up over 1D tensor parallelism", note), fontsize=10)
    return fig, rows


def _layout(res: Results, opts: PlotOptions):
    Figure = _mpl()
    best = _best(res, opts)
    keys, note = _panels(best)
    fig, axes = _grid(Figure, len(keys))
    rows = []
    for ax, (job, variant) in zip(axes, keys):
        sub = best[(best["job"] == job) & (best["variant_id"] == variant)].sort_values("n_gpus")
        degrees = [d for d in DEGREES if d in sub]  # (files before EP have no ep / etp)
        for k, d in enumerate(degrees):
            vals = sub[d].to_numpy(float)
            if d != "dp" and np.all(vals == 1):
                continue
            ax.plot(sub["n_gpus"], vals, "o-", color=f"C{k}", label=d.upper(), ms=3)
        for _, r in sub.iterrows():
            rows.append({"job": job, "variant_id": int(variant), "n_gpus": int(r["n_gpus"]),
                         "case_id": int(r["case_id"]), **{d: int(r[d]) for d in degrees}})
        ax.set_yscale("log", base=2)
        _finish_panel(ax, sub["n_gpus"], "parallel degree", _label(best, job, variant))
    fig.suptitle(_title(res, "layout of the best configuration", note), fontsize=10)
    return fig, rows


_KIND = {"scaling": _scaling, "breakdown": _breakdown, "memory": _memory,
         "heatmap": _heatmap, "strategies": _strategies, "layout": _layout}


def draw(res: Results, kind: str, opts: PlotOptions | None = None):
    """(matplotlib Figure, DataFrame of the plotted numbers) for one kind."""
    if kind not in _KIND:
        raise SweepError(f"--kind: unknown kind {kind!r}; valid: {', '.join(KINDS)}")
    fig, rows = _KIND[kind](res, opts or PlotOptions())
    return fig, _pandas().DataFrame(rows)


def save(res: Results, kind: str, out: str | Path, opts: PlotOptions | None = None):
    """Draw ``kind`` and write it to ``out`` (.png, .svg or .pdf, atomically); returns the
    plotted numbers."""
    out = Path(out)
    if out.suffix.lower() not in FORMATS:
        raise SweepError(f"-o: {out.name}: the file name must end in {', '.join(FORMATS)}")
    if not out.parent.is_dir():
        raise SweepError(f"-o: {out.parent} is not a directory")
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
    _, strategies, pairs = _speedups(res)
    if "1d" not in strategies or len(strategies) < 2:
        out["strategies"] = (f"needs 1d and another strategy; this sweep has "
                             f"{', '.join(sorted(strategies))}{yet}")
    elif pairs.empty:
        out["strategies"] = (f"no GPU count has a best configuration of both 1d and another "
                             f"strategy{yet}")
    return out


def kinds_that_fit(res: Results) -> list[str]:
    """The kinds that say something for this sweep."""
    skip = why_not(res)
    return [k for k in KINDS if k not in skip]

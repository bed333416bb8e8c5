"""``sweep validate``: the calibrated profile's accuracy on measured training runs.

Every row expressed as a case (sweep.analysis.express) is predicted in its own metric in one
vectorised call of the calibrated profile (the context arrays hold one job and hardware per
row), which is what makes calibration and leave-one-source-out fast
(sweep.analysis.calibration). The report: error per row, source and category (GPU
generation, precision, dense / MoE), memory and out-of-memory checks, replicates, rankings
within sweeps, and leave-one-source-out re-fits; ``render`` and ``markdown`` print it.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import SweepError
from ..model.cost.calibrated import MEMORY_PARAMETERS
from .calibration import Evaluator, fill_generations, fit, predictions
from .express import express_all
from .measured import (
    MODEL_FILE_NOTE,
    Case,
    metric_of,
    nearest,
    precision_of,
)

__all__ = ["report", "render", "markdown", "spearman", "replicates", "CATEGORIES",
           "available_cpus", "catalog_parameters", "explain"]


# ------------------------------------------------------------------------------ the report

def _stats(errors) -> dict:
    a = np.abs(np.asarray(errors, dtype=np.float64))
    if a.size == 0:
        return {"n": 0, "median_abs": float("nan"), "p90_abs": float("nan"), "bias": float("nan")}
    return {"n": int(a.size), "median_abs": float(np.median(a)),
            "p90_abs": float(np.percentile(a, 90)), "bias": float(np.median(errors))}


def _ranks(a) -> np.ndarray:
    """Ranks 0..n-1, ties sharing their average rank."""
    a = np.asarray(a, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(len(a), dtype=np.float64)
    _, inverse, counts = np.unique(a, return_inverse=True, return_counts=True)
    return (np.bincount(inverse, weights=ranks) / counts)[inverse]


def spearman(a, b) -> float:
    """Spearman rank correlation (Pearson correlation of the tie-averaged ranks)."""
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
    return float((ra * rb).sum() / denom) if denom > 0 else float("nan")


#: columns that are measurements or provenance, not the configuration of a run
NOT_CONFIG = frozenset({
    "id", "source_ref", "table", "date", "tflops_per_gpu", "mfu", "hfu",
    "tokens_per_s_per_gpu", "tokens_per_s_total", "samples_per_s", "iter_time_s",
    "mem_per_gpu_GB", "outcome", "inferred_fields", "notes", "data_file", "release",
    "step_time_s"})


def replicates(cases: Sequence[Case]) -> list[dict]:
    """Groups of runs of one configuration measured more than once, and how far apart their
    measurements are: the noise floor under any model's error.

    One configuration: the same source and the same text in every column but the
    measurements and provenance (NOT_CONFIG), and, since the free-text notes are among
    those but ``express`` reads settings from them, the same job, options and assumptions.
    """
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        if c.oom:
            continue
        described = tuple(sorted((k, v) for k, v in c.row.items() if k not in NOT_CONFIG))
        key = (c.source, c.metric, described, repr(dataclasses.replace(c.job, name="")),
               c.options.tobytes(), tuple(c.assumptions))
        groups.setdefault(key, []).append(c)
    out = []
    for members in groups.values():
        if len(members) < 2:
            continue
        entry = {"ids": [c.row["id"] for c in members], "source": members[0].source,
                 "metric": members[0].metric, "spread": None, "mem_spread": None}
        values = [c.measured for c in members if c.metric]
        if len(values) > 1:
            entry["spread"] = max(values) / min(values) - 1.0
        mems = [c.mem_measured_bytes for c in members if c.mem_measured_bytes]
        if len(mems) > 1:
            entry["mem_spread"] = max(mems) / min(mems) - 1.0
        out.append(entry)
    return out


def report(rows: Sequence[Mapping[str, str]], params: Mapping[str, Mapping[str, float]],
           loso: bool = True, workers: int = 1) -> dict:
    """Predict every row with ``params`` ({generation | memory: {name: value}}) and summarise.

    With ``loso``, also re-calibrate without each source and predict it, one source per
    process on up to ``workers`` processes (``sweep validate`` uses every available core;
    more than one worker needs the ``if __name__ == "__main__":`` guard in a calling script).
    """
    cases, unexpressed = express_all(rows)
    if not cases:
        why = "; ".join(f"{u['id'] or '(no id)'}: {u['reason']}" for u in unexpressed[:3])
        more = f" (and {len(unexpressed) - 3} more)" if len(unexpressed) > 3 else ""
        raise SweepError(f"no row of the data can be expressed: {why}{more}")
    ev = Evaluator(cases)
    ev.set_parameters(params)
    pred, out = predictions(ev)
    per_row, errors, by_source, by_kind, mem_err = [], [], {}, {}, []
    by_category: dict[str, dict[str, list[float]]] = {k: {} for k in CATEGORIES}
    oom_rows, false_oom = [], []
    for i, c in enumerate(cases):
        mem_pred = float(out["mem_bytes"][i])
        reported = float(out["mem_reported_bytes"][i])
        entry = {"id": c.row["id"], "source": c.source, "group": c.group,
                 "gpu": c.row["gpu"], "hardware": c.hw.name,
                 "precision": precision_of(c.row.get("precision") or ""),
                 "kind": CATEGORIES["model_kind"](c),
                 "metric": c.metric, "measured": c.measured,
                 "predicted": float(pred[i]) if c.metric else None,
                 "error": float(pred[i] / c.measured - 1.0) if c.metric else None,
                 "feasible": bool(out["feasible"][i]), "outcome": "OOM" if c.oom else "ok",
                 "mem_required_GiB": mem_pred / 2**30, "mem_reported_GiB": reported / 2**30,
                 "mem_measured_GiB": c.mem_measured_bytes / 2**30 if c.mem_measured_bytes
                 else None, "capacity_GiB": c.hw.hbm_capacity_bytes / 2**30,
                 "assumptions": c.assumptions}
        if c.mem_measured_bytes:
            entry["mem_error"] = reported / c.mem_measured_bytes - 1.0
            mem_err.append(entry["mem_error"])
        if c.metric:
            errors.append(entry["error"])
            by_source.setdefault(c.source, []).append(entry["error"])
            by_kind.setdefault(f"{c.hw.name} {entry['precision']}", []).append(entry["error"])
            for kind, of in CATEGORIES.items():
                by_category[kind].setdefault(of(c), []).append(entry["error"])
        if c.oom:
            oom_rows.append(entry)
        elif not out["feasible"][i]:
            false_oom.append(entry)
        per_row.append(entry)
    # ranking within each sweep (source / table): measured vs predicted throughput
    batch = {c.row["id"]: c.job.global_batch for c in cases}

    def throughput(entry, value):
        return batch[entry["id"]] / value if entry["metric"] == "iter_time_s" else value

    groups: dict[str, list[dict]] = {}
    for e in per_row:
        if e["metric"]:
            groups.setdefault(e["group"], []).append(e)
    ranking = {}
    for g, members in sorted(groups.items()):
        if len(members) < 3:
            continue
        meas = [throughput(m, m["measured"]) for m in members]
        predt = [throughput(m, m["predicted"]) for m in members]
        ranking[g] = {"n": len(members), "rho": spearman(meas, predt)}
    result = {
        "replicates": replicates(cases),
        "parameters": {k: dict(v) for k, v in params.items()},
        "rows": per_row, "unexpressed": unexpressed,
        "expressed_fraction": len(cases) / len(rows),
        "files": _files(rows, unexpressed),
        "refused": dict(Counter(u["kind"] for u in unexpressed).most_common()),
        "overall": _stats(errors),
        "per_source": {s: _stats(v) for s, v in sorted(by_source.items())},
        "per_hardware_precision": {k: _stats(v) for k, v in sorted(by_kind.items())},
        **{f"per_{kind}": {k: _stats(v) for k, v in sorted(groups_.items())}
           for kind, groups_ in by_category.items()},
        "memory": {**_stats(mem_err), "within_15pct": float(np.mean(np.abs(mem_err) < 0.15))
                   if mem_err else float("nan")},
        "oom": {"n": len(oom_rows), "predicted_infeasible": sum(not e["feasible"]
                                                               for e in oom_rows),
                "missed": [e["id"] for e in oom_rows if e["feasible"]]},
        "ran_but_predicted_over_capacity": [
            {"id": e["id"], "over_pct": 100 * (e["mem_required_GiB"] / e["capacity_GiB"] - 1)}
            for e in false_oom],
        "spearman": ranking,
    }
    if loso:
        sources = sorted({c.source for c in cases if c.metric})
        held_out = _held_out_all(sources, cases, workers)
        per = {s: _stats(errs) for s, errs in zip(sources, held_out)}
        loso_err = [e for errs in held_out for e in errs]
        result["loso"] = {"overall": _stats(loso_err), "per_source": per}
        # the held-out errors by category (each row predicted without its own source)
        for kind, of in CATEGORIES.items():
            grouped: dict[str, list[float]] = {}
            for source, errs in zip(sources, held_out):
                test = [c for c in cases if c.source == source and c.metric]
                for c, e in zip(test, errs):
                    grouped.setdefault(of(c), []).append(e)
            result["loso"][f"per_{kind}"] = {k: _stats(v) for k, v in sorted(grouped.items())}
    return result


#: the categories accuracy is stated in besides the source: GPU generation, GEMM precision,
#: dense or mixture-of-experts model
CATEGORIES = {
    "generation": lambda c: c.hw.generation + (" MoE" if c.job.is_moe else ""),
    "precision": lambda c: c.job.dtype + (" MoE" if c.job.is_moe else ""),
    "model_kind": lambda c: "MoE" if c.job.is_moe else "dense",
}


def _files(rows: Sequence[Mapping[str, str]], unexpressed: Sequence[dict]) -> dict:
    """{data file: {"rows": n, "expressed": n}} in the order the rows came."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        f = out.setdefault(r.get("data_file", ""), {"rows": 0, "expressed": 0})
        f["rows"] += 1
        f["expressed"] += 1
    for u in unexpressed:
        out[u.get("data_file", "")]["expressed"] -= 1
    return out


def _held_out_errors(source: str, cases: Sequence[Case]) -> list[float]:
    """Leave ``source`` out: calibrate on the other sources (from the prior centres), then
    predict that source's timed rows; their relative errors."""
    train = [c for c in cases if c.source != source]
    test = [c for c in cases if c.source == source and c.metric]
    fitted = fit(train, tol=1e-2).parameters
    # a generation with no other source borrows its neighbour's fit (never the parameters
    # fitted with this source)
    fitted, _ = fill_generations(fitted, sorted({c.hw.generation for c in test}))
    ev = Evaluator(test)
    ev.set_parameters(fitted)
    pred, _ = predictions(ev)
    return [float(pred[i] / c.measured - 1.0) for i, c in enumerate(test)]


def available_cpus() -> int:
    """Cores this process may run on (its affinity mask: what Slurm or taskset granted)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _held_out_all(sources: Sequence[str], cases: Sequence[Case], workers: int) -> list:
    """``_held_out_errors`` of every source, on up to ``workers`` processes. The re-fits are
    independent and deterministic, so the result does not depend on the number of workers."""
    workers = min(workers, len(sources))
    if workers <= 1:
        return [_held_out_errors(s, cases) for s in sources]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial

    # spawn: a fresh interpreter per worker, safe whatever threads this process holds
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(partial(_held_out_errors, cases=cases), sources))


# ------------------------------------------------------------------------------ text

def _pct(x) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{100 * x:+.1f}%"


def _apct(x) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{100 * x:.1f}%"


def render(rep: Mapping, rows: bool = True) -> str:
    """The report as text: per-row table, per-source table, summary, memory and OOM checks,
    replicates, rows not expressed, rankings within sweeps."""
    from . import fmt

    out = []
    if rows:
        table = []
        for e in rep["rows"]:
            mem = "-" if e["mem_measured_GiB"] is None else (
                f"{e['mem_measured_GiB']:.1f}/{e['mem_reported_GiB']:.1f}")
            measured = "OOM" if e["outcome"] == "OOM" else (
                f"{e['measured']:.4g}" if e["metric"] else "-")
            table.append([e["id"], e["source"], e["metric"] or "-", measured,
                          "-" if e["predicted"] is None else f"{e['predicted']:.4g}",
                          _pct(e["error"]), mem,
                          "fits" if e["feasible"] else "OOM",
                          f"{len(e['assumptions'])}" if e["assumptions"] else ""])
        out.append(fmt.table(["run", "source", "metric", "measured", "predicted", "error",
                              "mem GiB meas/pred", "model", "assumed"], table))
        out.append("")
    loso = rep.get("loso", {}).get("per_source", {})
    src_rows = [[s, v["n"], _apct(v["median_abs"]), _apct(v["p90_abs"]), _pct(v["bias"]),
                 _apct(loso[s]["median_abs"]) if s in loso else "-"]
                for s, v in rep["per_source"].items()]
    o = rep["overall"]
    src_rows.append(["all", o["n"], _apct(o["median_abs"]), _apct(o["p90_abs"]),
                     _pct(o["bias"]), _apct(rep["loso"]["overall"]["median_abs"])
                     if "loso" in rep else "-"])
    out.append(fmt.table(["source", "rows", "median |err|", "p90 |err|", "median err",
                          "LOSO median |err|"], src_rows))
    out.append("")
    m = rep["memory"]
    out.append(f"expressed: {rep['expressed_fraction'] * 100:.1f}% of rows "
               f"({len(rep['rows'])} of {len(rep['rows']) + len(rep['unexpressed'])})")
    files = rep.get("files", {})
    if len(files) > 1:
        for name, f in files.items():
            out.append(f"  {name}: {f['expressed']} of {f['rows']} rows expressed")
    out.append(f"time:      median |error| {_apct(o['median_abs'])}, 90th percentile "
               f"{_apct(o['p90_abs'])} over {o['n']} rows")
    if "loso" in rep:
        lo = rep["loso"]["overall"]
        out.append(f"leave-one-source-out: median |error| {_apct(lo['median_abs'])}, "
                   f"90th percentile {_apct(lo['p90_abs'])}")
    if m["n"]:
        out.append(f"memory:    median |error| {_apct(m['median_abs'])}, 90th percentile "
                   f"{_apct(m['p90_abs'])}, {m['within_15pct'] * 100:.0f}% of {m['n']} rows "
                   f"within 15% (measured vs predicted peak, reserved or allocated as "
                   f"each source reports it)")
    oom = rep["oom"]
    if oom["n"]:
        missed = f"; missed: {', '.join(oom['missed'])}" if oom["missed"] else ""
        out.append(f"OOM rows:  {oom['predicted_infeasible']} of {oom['n']} predicted "
                   f"infeasible{missed}")
    over = rep["ran_but_predicted_over_capacity"]
    if over:
        out.append("ran, but predicted over capacity: " + ", ".join(
            f"{e['id']} (+{e['over_pct']:.1f}%)" for e in over))
    reps = rep.get("replicates", [])
    if reps:
        spreads = [r["spread"] for r in reps if r["spread"] is not None]
        mems = [r["mem_spread"] for r in reps if r["mem_spread"] is not None]
        line = f"replicates: {len(reps)} configurations measured more than once"
        if spreads:
            line += f"; the metric differs by up to {_apct(max(spreads))}"
        if mems:
            line += f", memory by up to {_apct(max(mems))}"
        out.append(line)
        for r in reps:
            out.append(f"  {', '.join(r['ids'])}: "
                       + ", ".join(f"{what} {_apct(r[key])}" for what, key in
                                   (("metric", "spread"), ("memory", "mem_spread"))
                                   if r[key] is not None))
    if rep["unexpressed"]:
        out.append("")
        out.append(fmt.table(["row not expressed", "source", "reason"],
                             [[e["id"], e["source"], e["reason"]] for e in rep["unexpressed"]],
                             "lll"))
        out.append("")
        out.append(fmt.table(["rows not expressed, by reason", "rows"],
                             [[k, n] for k, n in rep["refused"].items()]))
    if rep["spearman"]:
        out.append("")
        out.append(fmt.table(["sweep (source / table)", "configs", "Spearman rho"],
                             [[g, v["n"], f"{v['rho']:.2f}"]
                              for g, v in rep["spearman"].items()]))
    return "\n".join(out)


def markdown(rep: Mapping, files: Sequence[str]) -> str:
    """docs/validation.md: the accuracy of the calibrated profile per source, GPU
    generation, precision and model kind, in sample and leave-one-source-out; memory; the
    parameters against their cited physical ranges. Generated: ``sweep validate
    --markdown``."""
    from .calibration import GENERATIONS, load_ranges, outside_ranges

    def pct(x) -> str:
        return "–" if x is None or not np.isfinite(x) else f"{100 * x:.1f} %"

    loso = rep.get("loso", {})
    out = ["# Accuracy of the calibrated profile", "",
           "<!-- generated by `sweep validate --markdown` (the data: "
           + " + ".join(files) + "); do not edit by hand -->", "",
           f"Every row of {' and '.join(f'`sweep/data/{f}`' for f in files)} that the model "
           "can express is predicted in its own metric convention (iteration time, tokens/s, "
           "samples/s, TFLOP/s or MFU by the source's formula). *In sample*: with the shipped "
           "parameters (`hardware/calibration.yaml`, fitted on these rows). *Leave one source "
           "out* (LOSO): each source predicted by parameters re-fitted without it, from the "
           "same prior centres; this is the figure to expect on runs from a new source.", ""]
    ov, lo = rep["overall"], loso.get("overall", {})
    out += [f"**All {ov['n']} timed rows:** median |error| {pct(ov['median_abs'])}, 90th "
            f"percentile {pct(ov['p90_abs'])} in sample; leave one source out "
            f"{pct(lo.get('median_abs'))}, 90th percentile {pct(lo.get('p90_abs'))}. "
            f"Expressed: {sum(f['expressed'] for f in rep['files'].values())} of "
            f"{sum(f['rows'] for f in rep['files'].values())} rows"
            + (" (" + "; ".join(f"{k}: {n}" for k, n in rep["refused"].items())
               + " refused)" if rep["refused"] else "") + ".", ""]
    titles = {"source": "source", "generation": "GPU generation", "precision": "precision",
              "model_kind": "model"}
    for kind, title in titles.items():
        stats = rep[f"per_{kind}"]
        held = loso.get(f"per_{kind}", {})
        out += [f"## By {title}", "",
                f"| {title} | rows | median \\|error\\| | 90th pct | median error | "
                "LOSO median \\|error\\| | LOSO 90th pct |", "|---|---|---|---|---|---|---|"]
        for name, st in stats.items():
            h = held.get(name, {})
            out.append(f"| {name} | {st['n']} | {pct(st['median_abs'])} | "
                       f"{pct(st['p90_abs'])} | {_pct(st['bias']).replace('%', ' %')} | "
                       f"{pct(h.get('median_abs'))} | {pct(h.get('p90_abs'))} |")
        out.append(f"| **all** | {ov['n']} | {pct(ov['median_abs'])} | {pct(ov['p90_abs'])} "
                   f"| {_pct(ov['bias']).replace('%', ' %')} | {pct(lo.get('median_abs'))} | "
                   f"{pct(lo.get('p90_abs'))} |")
        out.append("")
    mem, oom = rep["memory"], rep["oom"]
    out += ["## Memory", "",
            f"{mem['n']} rows publish a measured peak (reserved or allocated, as each source "
            f"counts it): median error {pct(mem['median_abs'])}, 90th percentile "
            f"{pct(mem['p90_abs'])}, {100 * mem['within_15pct']:.0f} % within 15 %. "
            f"Out-of-memory rows: {oom['predicted_infeasible']} of {oom['n']} predicted "
            "infeasible. Rows that ran but are predicted over capacity (the margin): "
            + (", ".join(f"`{e['id']}` (+{e['over_pct']:.1f} %)"
                         for e in rep["ran_but_predicted_over_capacity"]) or "none") + ".", ""]
    params = {k: v for k, v in rep["parameters"].items() if k != "memory"}
    ranges = load_ranges()
    outside = outside_ranges(params, ranges)
    gens = [g for g in GENERATIONS if g in ranges and g in params]
    names = list(dict.fromkeys(n for g in gens for n in params[g]))
    out += ["## Parameters and their physical ranges", "",
            "Each value with its cited range (`hardware/parameter_ranges.yaml`, sources "
            "below). **Bold**: outside its range: the fit absorbs a mechanism the model "
            "lacks (docs/model.md).", "",
            "| parameter | " + " | ".join(gens) + " |", "|---" * (len(gens) + 1) + "|"]
    for name in names:
        cells = []
        for g in gens:
            value = params[g].get(name)
            entry = ranges[g].get(name)
            if value is None:
                cells.append("–")
                continue
            text = f"{value:.3g}"
            if name in outside.get(g, ()):
                text = f"**{text}**"
            cells.append(text + (f" ({entry[0]:g} – {entry[1]:g})" if entry else ""))
        out.append(f"| `{name}` | " + " | ".join(cells) + " |")
    out += ["", "Sources of the ranges:", ""]
    for g in gens:
        for name, (_, _, source) in ranges[g].items():
            out.append(f"* {g} `{name}`: {source}")
    return "\n".join(out) + "\n"


def catalog_parameters(cases) -> dict:
    """The parameters the hardware catalog holds for the generations of ``cases``."""
    params: dict[str, dict[str, float]] = {}
    for c in cases:
        cal = dict(c.hw.calibration)
        params.setdefault(c.hw.generation, {k: v for k, v in cal.items()
                                            if k not in MEMORY_PARAMETERS})
        params.setdefault("memory", {k: v for k, v in cal.items() if k in MEMORY_PARAMETERS})
    return params


# ------------------------------------------------------------------------------ one row

#: hardware fields a measured row may set apart from its catalog file (express.py:
#: INTERCONNECT, MEASURED_MACHINE, an NVL72 rack's 64-GPU domains) -> the override key
#: ``sweep predict --hardware name[key=value]`` reads, and the factor to its unit
_HARDWARE_OVERRIDES = {"nvlink_domain": ("nvlink_domain", 1.0),
                       "nics_per_gpu": ("nics_per_gpu", 1.0),
                       "matrix_sustained_fraction": ("matrix_sustained_fraction", 1.0),
                       "scaleout_bytes_per_s": ("scaleout_Gbps", 8e-9)}
#: job fields that name or describe it rather than set how it trains
_JOB_LABELS = ("name", "source")
#: the catalog job a row that gives its own dimensions is written against
DIMENSIONS_BASE_JOB = "gpt3"


def _yaml_value(v) -> str:
    """A job field's value as ``name[key=value]`` parses it back (YAML scalars)."""
    from ..engine.catalog import label_value

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(int(v)) if v.is_integer() else repr(v)
    return label_value(v)


def predict_command(case, row: Mapping) -> str:
    """The ``sweep predict`` command that evaluates ``case`` (an expressed row) in the
    configuration ``row`` (a candidate row), as validation does: the catalog job with the
    fields the row and its stack set, the catalog hardware with the row's system, every
    configuration column. It prints the same step time and memory. A layout the search
    does not enumerate (a first-k layer count or a virtual-stage count it does not try)
    has none: "(none: the reason)"."""
    from ..engine.catalog import load_hardware, load_job
    from .predict import predict

    head, tail = MODEL_FILE_NOTE.split("{}")
    base_name = next((a[len(head):-len(tail)] for a in case.assumptions
                      if a.startswith(head) and a.endswith(tail)), None)
    # (a row that gives its dimensions: any catalog job, every field that differs set)
    base_name = base_name or DIMENSIONS_BASE_JOB
    base = load_job(base_name)
    changed = [(f.name, getattr(case.job, f.name)) for f in dataclasses.fields(case.job)
               if f.name not in _JOB_LABELS
               and getattr(case.job, f.name) != getattr(base, f.name)]
    job = base_name + (f"[{','.join(f'{k}={_yaml_value(v)}' for k, v in changed)}]"
                       if changed else "")
    hw_base = load_hardware(case.hw.name)
    hw_changes = []
    for field, (key, factor) in _HARDWARE_OVERRIDES.items():
        value = getattr(case.hw, field)
        if value != getattr(hw_base, field):
            hw_changes.append(f"{key}={_yaml_value(float(value) * factor)}")
    hw = case.hw.name + (f"[{','.join(hw_changes)}]" if hw_changes else "")
    config = _predict_config(row)
    try:  # (a layout the search does not enumerate: say so rather than print a failure)
        predict("calibrated", case.job, case.hw, "1d", case.n_gpus, config)
    except SweepError as exc:
        why = " ".join(str(exc).split()).rsplit(" GPUs: ", 1)[-1]
        return f"(none: sweep predict's search does not enumerate this layout: {why})"
    text = ",".join(f"{k}={v}" for k, v in config.items())
    return (f"sweep predict --job '{job}' --hardware '{hw}' --gpus {case.n_gpus} "
            f"--config {text}")


def _predict_config(row: Mapping) -> dict[str, int]:
    """Every configuration column of a candidate row as sweep predict's search enumerates
    the same configuration: a shard group of the whole data-parallel group is its 0, and
    ZeRO without data parallelism its stage 0 (the same costs)."""
    from .predict import CONFIG_KEYS

    config = {k: int(row[k]) for k in CONFIG_KEYS}
    if config["shard_group"] == config["dp"]:
        config["shard_group"] = 0
    if config["dp"] == 1 and config["cp"] == 1:
        config["zero"] = 0
    return config


def explain(rows: Sequence[Mapping[str, str]], ids: Sequence[str], data: str = "the data"
            ) -> list[dict]:
    """Why a measured row is predicted as it is: per id, the expressed case, the option
    validation chose for it (the fastest that fits among the choices the row leaves open:
    ``Evaluator.run``), that option as a ``sweep predict`` would show it (its per-op table),
    and the measured and predicted metric.

    Returns one dict per id (each id once, in order): ``case``, ``prediction``
    (sweep.analysis.predict.Prediction), ``measured``, ``predicted``, ``error`` (predicted /
    measured - 1; the three None for a row that only reports running out of memory),
    ``mem_compared_bytes`` (the memory validation compares with the measured peak),
    ``mem_measured_bytes``, ``feasible`` and ``predict_command`` (the sweep predict that
    prints the same, or why none does: predict_command).

    Raises:
        SweepError: an id that is not a row of ``rows`` (with the nearest ids), or a row
            that cannot be expressed (with the reason).
    """
    from ..model.cost import evaluate_columns, op_table, pack_results
    from ..model.schema import CANDIDATE_DTYPE
    from .predict import Prediction

    cases, unexpressed = express_all(rows)
    by_id = {c.row.get("id", "").strip(): c for c in cases}
    refused = {u["id"].strip(): u for u in unexpressed}
    out = []
    for rid in dict.fromkeys(i.strip() for i in ids):  # (each once, in order)
        if not rid:
            raise SweepError("--explain: an empty id; give the id column's value of a row")
        if rid in refused:
            raise SweepError(f"--explain {rid}: the row is not expressed "
                             f"({refused[rid]['reason']})")
        if rid not in by_id:
            close = nearest(rid, [*by_id, *refused])
            raise SweepError(f"--explain {rid}: no row with that id in {data}"
                             + (f" (nearest: {', '.join(close)})" if close else ""))
        case = by_id[rid]
        run = Evaluator([case]).run()
        chosen = int(run["option"][0])
        cols = {k: np.array([case.options[chosen][k]]) for k in CANDIDATE_DTYPE.names}
        metrics = evaluate_columns("calibrated", case.job, case.hw, "1d", case.n_gpus, cols)
        row = pack_results(cols, metrics, np.array([0]))[0]
        ops = [{k: (v if k == "name" else float(np.asarray(v).ravel()[0]))
                for k, v in r.items()}
               for r in op_table("calibrated", case.job, case.hw, "1d", cols)]
        # a memory-only row (an out-of-memory report) has no timed metric
        predicted = float(metric_of(case, np.array([float(row["step_time_s"])]))[0]) \
            if case.metric else None
        out.append({"case": case,
                    "prediction": Prediction("calibrated", case.job, case.hw, "1d",
                                             case.n_gpus, row, ops, len(case.options)),
                    "measured": case.measured if case.metric else None,
                    "predicted": predicted,
                    "error": predicted / case.measured - 1.0 if case.metric else None,
                    # memory as validation compares it (what the source counts: reserved or
                    # allocated, with the allocator's cache), and whether it fits
                    "mem_compared_bytes": float(run["mem_reported_bytes"][0]),
                    "mem_measured_bytes": case.mem_measured_bytes,
                    "feasible": bool(run["feasible"][0]),
                    "predict_command": predict_command(case, row)})
    return out

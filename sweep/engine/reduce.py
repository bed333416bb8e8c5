"""Merge a run folder's part files into one ``sweep.h5`` (output contract: DESIGN.md §7).

``reduce_run(dir)`` reads ``dir/spec.yaml`` (the resolved spec the run used) and every
``part-*.h5``, checks that they belong to that spec and to its plan, merges the top-N of
every case (any number of parts, duplicates dropped, deterministic order), sums the per-case
counts from the finished work units and writes ``dir/sweep.h5`` atomically. Reducing twice
gives the same file. An incomplete run is refused unless ``partial=True``, and a partial
file says so (root attribute ``complete = False``, per-case ``complete`` column).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from .. import __version__
from ..errors import SpecError, StoreError
from .lock import RunLock
from .partition import unit_progress
from .plan import Plan, make_plan
from .spec import parse_spec
from .store import DONE_DTYPE, TOP_DTYPE, Table, list_parts, read_part, write_results

__all__ = ["reduce_run", "ReduceSummary", "load_run_plan", "merge_tops", "check_segments",
           "RESULTS_NAME", "SPEC_NAME"]

RESULTS_NAME = "sweep.h5"
SPEC_NAME = "spec.yaml"


@dataclass
class ReduceSummary:
    path: Path
    complete: bool
    cases: int
    units: int
    units_done: int
    candidates: int
    evaluated: int
    parts: int


def load_run_plan(run_dir: Path) -> tuple[Plan, str, str]:
    """(plan, resolved spec text, its sha256) of a run folder.

    Raises:
        StoreError: the folder has no (valid) spec.yaml.
    """
    path = Path(run_dir) / SPEC_NAME
    if not path.is_file():
        raise StoreError(f"{run_dir}: no {SPEC_NAME} here; is this a folder written by sweep run?")
    text = path.read_text()
    try:
        # the stored spec passed the run's limits once (perhaps a raised --max-variants)
        spec = parse_spec(yaml.safe_load(text), str(path), max_variants=2**62)
    except (SpecError, yaml.YAMLError) as exc:
        raise StoreError(f"{path}: the stored spec is not valid ({exc})") from None
    return make_plan(spec), text, hashlib.sha256(text.encode()).hexdigest()


def check_segments(units: np.ndarray, done: np.ndarray, where: Path | str) -> None:
    """Every finished segment lies inside a unit of the plan, of the right case.

    Raises:
        StoreError: naming ``where`` (a part file or run folder) otherwise.
    """
    uid = done["unit_id"]
    ok = (uid >= 0) & (uid < len(units))
    if ok.all():
        u = units[uid]
        ok = ((u["case_id"] == done["case_id"]) & (done["start"] >= u["start"])
              & (done["stop"] <= u["stop"]) & (done["start"] < done["stop"]))
    if not ok.all():
        raise StoreError(f"{where}: records work units that are not in the plan of {SPEC_NAME}")


def merge_tops(rows: np.ndarray, top_n: int) -> np.ndarray:
    """Per case, the best ``top_n`` distinct candidates (samples_per_s desc, index asc),
    with ``place`` renumbered; rows sorted by (case_id, place).

    One sort of the key columns and one gather of the rows kept, so the peak memory is the
    input plus the output (a reduction of many cases holds little else)."""
    if len(rows) == 0:
        return rows.astype(TOP_DTYPE)
    case, index, speed = rows["case_id"], rows["index"], rows["samples_per_s"]
    order = np.lexsort((index, -speed, case))
    case, index = case[order], index[order]
    # copies of one (case, candidate) from two parts sort next to each other: same speed
    fresh = np.ones(len(order), dtype=bool)
    fresh[1:] = (case[1:] != case[:-1]) | (index[1:] != index[:-1])
    order, case = order[fresh], case[fresh]
    starts = np.flatnonzero(np.r_[True, case[1:] != case[:-1]])
    place = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    keep = place < top_n
    out = rows[order[keep]]
    out["place"] = place[keep]
    return out


def _strings(values: list[str]) -> np.ndarray:
    width = max([len(v.encode()) for v in values] + [1])
    return np.array([v.encode() for v in values], dtype=f"S{width}")


def _cases_table(plan: Plan, done: np.ndarray, finished: np.ndarray, top: np.ndarray) -> Table:
    cases = plan.cases
    n = len(cases)
    counts = {k: np.bincount(done["case_id"], weights=done[k], minlength=n).astype(np.int64)
              for k in ("evaluated", "feasible", "out_of_memory", "other_infeasible")}
    units_total = np.bincount(plan.units["case_id"], minlength=n)
    units_done = np.bincount(plan.units["case_id"][finished], minlength=n)
    best = np.full(n, np.nan)
    first = top[top["place"] == 0]
    best[first["case_id"]] = first["samples_per_s"]
    axes = sorted({a for v in plan.variants for a, _ in v.swept})
    # hardware columns per variant (cases share variants), then per case by variant id;
    # union over variants: generations may carry different calibration parameters (NaN = absent)
    hw_keys = sorted({k for v in plan.variants for k in v.hardware.record()} - {"hardware"})
    column_of = {k: j for j, k in enumerate(hw_keys)}
    per_variant = np.full((len(plan.variants), len(hw_keys)), np.nan)
    for v in plan.variants:
        for k, value in v.hardware.record().items():
            if k in column_of:
                per_variant[v.variant_id, column_of[k]] = value
    variant_of_case = np.array([c.variant.variant_id for c in cases], dtype=np.int64)
    job_keys = ["n_layers", "hidden", "ffn_hidden", "n_heads", "n_kv_heads", "head_dim", "vocab",
                "seq_len", "global_batch"]
    columns: dict[str, tuple[str, str]] = {
        "case_id": ("", "case number"), "job": ("", "job (with overrides)"),
        "strategy": ("", "parallelization strategy"), "n_gpus": ("", "GPU count"),
        "variant_id": ("", "hardware variant number"), "hardware": ("", "variant label"),
        "base": ("", "base hardware"), "swept": ("", "swept axes -> values (JSON)")}
    data: dict[str, np.ndarray] = {
        "case_id": np.arange(n, dtype=np.int32),
        "job": _strings([c.job.name for c in cases]),
        "strategy": _strings([c.strategy for c in cases]),
        "n_gpus": np.array([c.n_gpus for c in cases], dtype=np.int64),
        "variant_id": np.array([c.variant.variant_id for c in cases], dtype=np.int32),
        "hardware": _strings([c.variant.label for c in cases]),
        "base": _strings([c.variant.base for c in cases]),
        "swept": _strings([json.dumps(dict(c.variant.swept)) for c in cases])}
    for k in job_keys:
        data[k] = np.array([getattr(c.job, k) for c in cases], dtype=np.int64)
        columns[k] = ("", f"job {k}")
    for a in axes:
        data[f"swept_{a}"] = np.array([dict(c.variant.swept).get(a, np.nan) for c in cases])
        columns[f"swept_{a}"] = ("", f"value of grid axis {a} (spec units; NaN = not swept)")
    for k in hw_keys:
        data[k] = per_variant[variant_of_case, column_of[k]]
        unit = ("B/s" if k.endswith("bytes_per_s") else "B" if k.endswith("_bytes") else
                "FLOP/s" if k.endswith("flops_per_s") else "s" if k.endswith("_s") else "")
        columns[k] = (unit, f"hardware parameter {k}")
    data["candidates"] = np.array([c.candidates for c in cases], dtype=np.int64)
    columns["candidates"] = ("", "candidates in the case's space")
    for k, v in counts.items():
        data[k] = v
        columns[k] = ("", f"candidates {k.replace('_', ' ')} (over finished units)")
    data["complete"] = units_done >= units_total
    columns["complete"] = ("", "every work unit of the case is finished")
    data["best_samples_per_s"] = best
    columns["best_samples_per_s"] = ("1/s", "throughput of the best feasible config (NaN: none)")
    dtype = np.dtype([(k, v.dtype) for k, v in data.items()])
    table = np.zeros(n, dtype)
    for k, v in data.items():
        table[k] = v
    return Table(table, columns)


def reduce_run(run_dir: Path, partial: bool = False, lock: bool = True,
               plan: tuple[Plan, str, str] | None = None) -> ReduceSummary:
    """Merge ``run_dir/part-*.h5`` into ``run_dir/sweep.h5``; with ``lock``, holding the
    folder's run lock (refused while a run is writing there). ``plan``: (plan, resolved
    spec text, its sha256) when the caller has built it from the folder's spec already
    (the run that just finished), so that it is not built twice.

    Raises:
        StoreError: no parts, a corrupt part, parts of another spec or plan, an incomplete
            run (unless ``partial``), or a run holding the folder.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise StoreError(f"{run_dir}: no such run folder")
    if not lock:
        return _reduce(run_dir, partial, plan)
    with RunLock(run_dir):
        return _reduce(run_dir, partial, plan)


def _reduce(run_dir: Path, partial: bool, loaded: tuple[Plan, str, str] | None = None
            ) -> ReduceSummary:
    plan, text, sha = loaded or load_run_plan(run_dir)
    parts = list_parts(run_dir)
    if not parts:
        raise StoreError(f"{run_dir}: no part files (part-00000.h5, ...) to reduce")
    done_list, top_list, written, sizes = [], [], [], set()
    for p in parts:
        attrs, done, top = read_part(p)
        if attrs.get("spec_sha256") != sha:
            raise StoreError(f"{p}: written for another spec (sha256 "
                             f"{attrs.get('spec_sha256')!s:.12} vs {sha:.12} of {SPEC_NAME}); "
                             f"remove it or use another --out")
        done_list.append(done)
        top_list.append(top)
        written.append(str(attrs.get("written_utc", "")))
        sizes.add(int(attrs.get("size", 0)))
        check_segments(plan.units, done, p)
    done = np.concatenate(done_list) if done_list else np.zeros(0, DONE_DTYPE)
    units = plan.units
    # segments: whole units, or parts of one cut by a stop or a checkpoint; copies count once
    progress, keep = unit_progress(units, done)
    done = done[keep]
    done = done[np.lexsort((done["start"], done["unit_id"]))]
    finished = progress == units["stop"] - units["start"]
    missing = int(np.count_nonzero(~finished))
    if missing and not partial:
        raise StoreError(f"{run_dir}: run incomplete: {missing} of {len(units)} work units "
                         f"missing from {len(parts)} part file(s); continue it with "
                         f"'sweep run {run_dir / SPEC_NAME} --out {run_dir} --resume' or "
                         f"reduce with --partial")
    all_top = np.concatenate(top_list) if top_list else np.zeros(0, TOP_DTYPE)
    del top_list  # the parts' tables are in all_top now
    top = merge_tops(all_top, plan.spec.top_n)
    del all_top
    cases = _cases_table(plan, done, finished, top)
    attrs = {"name": plan.spec.name, "sweep_version": __version__,
             "cost_model": plan.spec.cost_model, "spec": text, "spec_sha256": sha,
             "created_utc": max(written) if written else "",
             "ranks": json.dumps(sorted(sizes)), "complete": missing == 0,
             "top_n": plan.spec.top_n, "n_cases": len(plan.cases), "n_units": len(units),
             "n_units_done": len(units) - missing, "candidates_total": plan.total_candidates,
             "candidates_evaluated": int(done["evaluated"].sum())}
    out = run_dir / RESULTS_NAME
    write_results(out, attrs, cases, top, done)
    return ReduceSummary(out, missing == 0, len(plan.cases), len(units), len(units) - missing,
                         plan.total_candidates, int(done["evaluated"].sum()), len(parts))

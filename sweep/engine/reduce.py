"""Merge a run folder's part files into one ``sweep.h5`` (output contract: docs/output.md).

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
from .store import (
    DONE_DTYPE,
    TOP_DTYPE,
    PartTops,
    ResultsWriter,
    list_parts,
    read_part_done,
    remove_temporaries,
)

__all__ = ["reduce_run", "ReduceSummary", "load_run_plan", "merge_tops", "check_segments",
           "RESULTS_NAME", "SPEC_NAME"]

RESULTS_NAME = "sweep.h5"
SPEC_NAME = "spec.yaml"


#: units of hardware columns by the end of their names (SI, but the calibration parameters
#: named in microseconds and GiB); the first that matches
_UNIT_SUFFIXES = (("bytes_per_s", "B/s"), ("flops_per_s", "FLOP/s"), ("_per_s", "1/s"),
                  ("_bytes", "B"), ("_flops_per_exp", "FLOP"), ("_us", "us"), ("_GiB", "GiB"),
                  ("_s", "s"))


def hardware_unit(key: str) -> str:
    """The unit of the /cases column of hardware parameter ``key`` ('' for a count or a
    fraction)."""
    return next((unit for end, unit in _UNIT_SUFFIXES if key.endswith(end)), "")


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


#: top-N rows (and so about as many cases) merged and written per slice of the reduction:
#: its memory is about this many rows of every table (281 B per /top row, ~740 B per
#: /cases row with a few hardware parameters), whatever the number of cases
ROWS_PER_SLICE = 65536

_JOB_KEYS = ("n_layers", "hidden", "ffn_hidden", "n_heads", "n_kv_heads", "head_dim", "vocab",
             "seq_len", "global_batch")


def _field_of(record_key: str) -> str:
    """The Hardware field a key of Hardware.record comes from."""
    for prefix in ("matrix_", "vector_"):
        if record_key.startswith(prefix) and record_key.endswith("_flops_per_s"):
            return prefix + "flops_per_s"
    if record_key in ("gemm_tile_m", "gemm_tile_n"):
        return "gemm_tile"
    if record_key.startswith("calibration_"):
        return "calibration"
    return record_key


class _CasesTable:
    """The ``/cases`` table of a plan, built a slice of cases at a time: its columns (and
    their widths) are fixed up front from the spec, the rows of ``[a, b)`` from those
    cases' variants only."""

    def __init__(self, plan: Plan, counts: dict[str, np.ndarray], complete: np.ndarray
                 ) -> None:
        self.plan, self.counts, self.complete = plan, counts, complete
        spec, variants = plan.spec, plan.variants
        self.axes = variants.axis_names()
        # union over variants: generations may carry different calibration parameters
        self.hw_keys = [k for k in variants.record_keys() if k != "hardware"]
        width = variants.widths()
        text = {"job": max(len(j.name.encode()) for j in spec.jobs),
                "strategy": max(len(s.encode()) for s in spec.strategies),
                "hardware": width["hardware"], "base": width["base"], "swept": width["swept"]}
        columns: dict[str, tuple[str, str]] = {
            "case_id": ("", "case number"), "job": ("", "job (with overrides)"),
            "strategy": ("", "parallelization strategy"), "n_gpus": ("", "GPU count"),
            "variant_id": ("", "hardware variant number"), "hardware": ("", "variant label"),
            "base": ("", "base hardware"), "swept": ("", "swept axes -> values (JSON)")}
        types: dict[str, str] = {"case_id": "i4", "n_gpus": "i8", "variant_id": "i4"}
        types |= {k: f"S{max(w, 1)}" for k, w in text.items()}
        for k in _JOB_KEYS:
            columns[k], types[k] = ("", f"job {k}"), "i8"
        for a in self.axes:
            columns[f"swept_{a}"] = ("", f"value of grid axis {a} (spec units; NaN = not "
                                         f"swept)")
            types[f"swept_{a}"] = "f8"
        for k in self.hw_keys:
            columns[k], types[k] = (hardware_unit(k), f"hardware parameter {k}"), "f8"
        columns["candidates"], types["candidates"] = ("", "candidates in the case's space"), "i8"
        for k in counts:
            columns[k] = ("", f"candidates {k.replace('_', ' ')} (over finished units)")
            types[k] = "i8"
        columns["complete"] = ("", "every work unit of the case is finished")
        columns["best_samples_per_s"] = ("1/s", "throughput of the best feasible config "
                                                "(NaN: none)")
        types |= {"complete": "?", "best_samples_per_s": "f8"}
        self.columns = columns
        self.dtype = np.dtype([(k, types[k]) for k in columns])
        # hardware columns by the axes that set the Hardware field they come from: looked
        # up once per combination of those axes (one record of each), not built per variant
        by_setters: dict[tuple, tuple[set[str], list[str]]] = {}
        for k in self.hw_keys:
            field = _field_of(k)
            fields, keys = by_setters.setdefault(variants.setters(frozenset({field})),
                                                 (set(), []))
            fields.add(field)
            keys.append(k)
        self.hw_tables = []
        for fields, keys in by_setters.values():
            found = variants.lookup(frozenset(fields), lambda hw, keys=keys: [
                hw.record().get(k, np.nan) for k in keys])
            self.hw_tables.append((keys, found, np.array(found.values, dtype=np.float64)))

    def rows(self, a: int, b: int, top: np.ndarray) -> np.ndarray:
        """Rows of cases ``[a, b)``; ``top`` holds (at least) their merged /top rows."""
        plan, cases = self.plan, self.plan.cases
        out = np.zeros(b - a, self.dtype)
        ids = np.arange(a, b, dtype=np.int64)
        j, v, s, g = np.unravel_index(ids, cases.shape)
        spec = plan.spec
        out["case_id"] = ids
        out["job"] = np.array([x.name.encode() for x in spec.jobs])[j]
        out["strategy"] = np.array([x.encode() for x in spec.strategies])[s]
        out["n_gpus"] = np.array(spec.gpus, dtype=np.int64)[g]
        out["variant_id"] = v
        for k in _JOB_KEYS:
            out[k] = np.array([getattr(x, k) for x in spec.jobs], dtype=np.int64)[j]
        # every variant of the slice once, without building its hardware
        vids, which = np.unique(v, return_inverse=True)
        text = plan.variants.labels(vids)
        for k in ("hardware", "base", "swept"):
            out[k] = np.array([x.encode() for x in text[k]])[which]
        for ax in self.axes:
            out[f"swept_{ax}"] = text[f"swept_{ax}"][which]
        for keys, found, table in self.hw_tables:
            rows = table[found.index(vids)][which]
            for i, k in enumerate(keys):
                out[k] = rows[:, i]
        out["candidates"] = cases.candidates[a:b]
        for k, counts in self.counts.items():
            out[k] = counts[a:b]
        out["complete"] = self.complete[a:b]
        best = np.full(b - a, np.nan)
        first = top[(top["place"] == 0) & (top["case_id"] >= a) & (top["case_id"] < b)]
        best[first["case_id"] - a] = first["samples_per_s"]
        out["best_samples_per_s"] = best
        return out


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
    if run_dir.is_file():  # (as sweep status says it)
        raise StoreError(f"{run_dir}: a file, not a run folder (sweep reduce takes the "
                         f"folder: {run_dir.parent})")
    if not run_dir.is_dir():
        raise StoreError(f"{run_dir}: no such run folder")
    if not lock:
        return _reduce(run_dir, partial, plan)
    with RunLock(run_dir):
        return _reduce(run_dir, partial, plan)


def _reduce(run_dir: Path, partial: bool, loaded: tuple[Plan, str, str] | None = None
            ) -> ReduceSummary:
    """Merge in slices of cases: every part's finished units are read whole (72 B a
    unit), its /top a slice of cases at a time (PartTops), and sweep.h5 is written as the
    slices are merged (ResultsWriter), so memory stays about ROWS_PER_SLICE rows of each
    table plus the per-unit and per-case counts, whatever the size of the run."""
    plan, text, sha = loaded or load_run_plan(run_dir)
    remove_temporaries(run_dir)  # of a reduction or run killed here (we hold the lock)
    parts = list_parts(run_dir)
    if not parts:
        raise StoreError(f"{run_dir}: no part files (part-00000.h5, ...) to reduce")
    done_list, written, sizes = [], [], set()
    for p in parts:
        attrs, done = read_part_done(p)
        if attrs.get("spec_sha256") != sha:
            raise StoreError(f"{p}: written for another spec (sha256 "
                             f"{attrs.get('spec_sha256')!s:.12} vs {sha:.12} of {SPEC_NAME}); "
                             f"remove it or use another --out")
        done_list.append(done)
        written.append(str(attrs.get("written_utc", "")))
        sizes.add(int(attrs.get("size", 0)))
        check_segments(plan.units, done, p)
    done = np.concatenate(done_list) if done_list else np.zeros(0, DONE_DTYPE)
    del done_list
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
    n = len(plan.cases)
    counts = {k: np.bincount(done["case_id"], weights=done[k], minlength=n).astype(np.int64)
              for k in ("evaluated", "feasible", "out_of_memory", "other_infeasible")}
    complete = (np.bincount(units["case_id"][finished], minlength=n)
                >= np.bincount(units["case_id"], minlength=n))
    table = _CasesTable(plan, counts, complete)
    evaluated = int(done["evaluated"].sum())
    attrs = {"name": plan.spec.name, "sweep_version": __version__,
             "cost_model": plan.spec.cost_model, "spec": text, "spec_sha256": sha,
             "created_utc": max(written) if written else "",
             "ranks": json.dumps(sorted(sizes)), "complete": missing == 0,
             "top_n": plan.spec.top_n, "n_cases": n, "n_units": len(units),
             "n_units_done": len(units) - missing, "candidates_total": plan.total_candidates,
             "candidates_evaluated": evaluated}
    tops = [PartTops(p) for p in parts]
    top_rows = sum(len(t.case_id) for t in tops)  # at most (copies are dropped)
    size = (n * table.dtype.itemsize + top_rows * TOP_DTYPE.itemsize
            + len(done) * DONE_DTYPE.itemsize + 2**20)
    step = max(1, ROWS_PER_SLICE // max(plan.spec.top_n, 1))
    out = run_dir / RESULTS_NAME
    with ResultsWriter(out, attrs, size) as w:
        w.create("cases", table.dtype, table.columns, rows=n)
        w.create("top", rows=top_rows)
        w.create("units", rows=len(done))
        for a in range(0, n, step):
            b = min(n, a + step)
            rows = [t.until(b) for t in tops]
            merged = merge_tops(np.concatenate(rows), plan.spec.top_n)
            del rows
            w.append("top", merged)
            w.append("cases", table.rows(a, b, merged))
        w.append("units", done)
        w.commit()
    return ReduceSummary(out, missing == 0, n, len(units), len(units) - missing,
                         plan.total_candidates, evaluated, len(parts))

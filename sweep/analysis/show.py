"""``sweep show``: the best configurations per case of a ``sweep.h5``, as a table, CSV or JSON.

Rows join ``/top`` with ``/cases``; numbers keep SI units in CSV/JSON (seconds, bytes) and
are rounded for the table. Every rendered row has a ``status``: ``ok`` (a configuration of a
complete case), ``partial`` (the best so far of a case not completely searched: it may still
change), ``infeasible`` (the case is complete and has no feasible configuration) or
``pending`` (the case is not complete and has none yet). The JSON is strict: NaN and
infinities are null.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import numpy as np

from ..engine.store import read_results, read_results_cases
from ..errors import StoreError
from . import fmt

__all__ = ["load_rows", "format_rows", "config_text", "row_status", "status_text", "FORMATS",
           "RECOMPUTE_NAMES"]

FORMATS = ("table", "csv", "json")
_CASE_COLS = ("case_id", "job", "hardware", "strategy", "n_gpus")
_DEGREES = ("dp", "tp", "tp2", "cp", "pp", "mbs", "nb", "vpp", "ep", "etp")
_PLACEMENT = ("nv_tp", "nv_tp2", "nv_cp", "nv_dp", "nv_pp", "nv_ep")


def _records(table: np.ndarray) -> list[dict]:
    """Rows of a structured array as dicts of Python values (bytes decoded), column-wise."""
    columns = []
    for name in table.dtype.names:
        values = table[name].tolist()
        columns.append([v.decode() for v in values] if table[name].dtype.kind == "S" else values)
    return [dict(zip(table.dtype.names, row)) for row in zip(*columns)]


def load_rows(path: Path, top: int = 1, case: int | None = None,
              limit: int | None = None) -> tuple[dict, list[dict]]:
    """(root attributes, rows) with the ``top`` best configs of each case (or of ``case``;
    of the first ``limit`` cases only, if given; these two read without the rest of the
    file).

    Cases without any feasible configuration appear once with ``place = None``.
    """
    if case is not None:  # that case's rows only, whatever the size of the file
        attrs, data = read_results_cases(Path(path), max(case, 0), max(case, 0) + 1)
        if case < 0 or not (data["cases"]["case_id"] == case).any():
            n = int(attrs.get("n_cases", 0))
            raise StoreError(f"{path}: no case {case} (case ids 0 to {n - 1})")
    elif limit is not None:  # the head only (sweep run's printout)
        attrs, data = read_results_cases(Path(path), 0, limit)
    else:
        attrs, data = read_results(Path(path))
    cases, rows = data["cases"], data["top"]
    if case is not None:
        cases = cases[cases["case_id"] == case]
    cases = cases[:limit]
    rows = rows[rows["place"] < top]
    rows = rows[np.lexsort((rows["place"], rows["case_id"]))]
    first = np.searchsorted(rows["case_id"], cases["case_id"], side="left")
    last = np.searchsorted(rows["case_id"], cases["case_id"], side="right")
    row_records = iter(_records(rows[np.isin(rows["case_id"], cases["case_id"])]))
    out = []
    for base, a, b in zip(_records(cases), first, last):
        if a == b:
            out.append({**base, "place": None})
        for _ in range(b - a):
            out.append({**base, **next(row_records)})
    return attrs, out


#: short names of the recompute policies (schema.Recompute)
_RECOMPUTE = {1: "sel", 2: "full", 3: "first", 4: "op"}
#: readable names of the recompute policies
RECOMPUTE_NAMES = {0: "none", 1: "selective", 2: "full", 3: "first-k", 4: "per-op"}


def config_text(r) -> str:
    """A configuration in one short line (a row of /top as a mapping)."""
    parts = [f"{k}={r[k]}" for k in _DEGREES if k in ("dp", "tp", "pp", "mbs")
             or r.get(k, 1) != 1]
    # knobs of the calibrated profile, shown when set
    if r.get("sp"):
        parts.append("sp" + ("+overlap" if r.get("tp_overlap") else ""))
    if r.get("recompute"):
        name = _RECOMPUTE.get(r["recompute"], str(r["recompute"]))
        parts.append(f"rc={name}" + (f":{r['recompute_layers']}" if r["recompute"] == 3 else ""))
    if r.get("zero"):
        parts.append(f"zero={r['zero']}" + (f"/{r['shard_group']}" if r.get("shard_group")
                                            else ""))
    if r.get("cp_comm"):
        parts.append("cp-allgather")
    if r.get("offload"):
        parts.append(f"offload={r['offload']}")
    if r.get("a2a_overlap"):
        parts.append("a2a-overlap")
    return " ".join(parts)


def row_status(r) -> str:
    """``ok`` (a configuration of a complete case), ``partial`` (one of a case not yet
    completely searched), ``infeasible`` (its case is complete without a feasible one) or
    ``pending`` (its case is not complete and has none yet)."""
    if r.get("place") is not None:
        return "ok" if r.get("complete", True) else "partial"
    return "infeasible" if r.get("complete") else "pending"


def status_text(r) -> str:
    """What to print for a case (or row) without a configuration."""
    if r.get("complete"):
        return "no feasible configuration"
    if not r.get("evaluated"):
        return "pending (not yet evaluated)"
    return "pending (no feasible configuration yet)"


def _strict(value):
    """A JSON value: NaN and infinities become None."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _placement(r: dict) -> str:
    return " ".join(f"{k[3:]}{r[k]}" for k in _PLACEMENT if r.get(k, 1) != 1) or "-"


def format_rows(attrs: dict, rows: list[dict], kind: str = "table") -> str:
    """Render rows as ``table``, ``csv`` or ``json``."""
    rows = [{**r, "status": row_status(r)} for r in rows]
    if kind == "json":
        return json.dumps({"name": attrs.get("name"), "cost_model": attrs.get("cost_model"),
                           "complete": bool(attrs.get("complete")),
                           "rows": [{k: _strict(v) for k, v in r.items()} for r in rows]},
                          indent=1, allow_nan=False)
    if kind == "csv":
        buf = io.StringIO()
        keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k != "status"]
        w = csv.DictWriter(buf, fieldnames=[*keys, "status"], extrasaction="ignore",
                           lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow(r)
        return buf.getvalue().rstrip("\n")
    table = []
    for r in rows:
        head = [r["case_id"], r["job"], r["hardware"], r["strategy"], r["n_gpus"]]
        if r.get("place") is None:
            table.append(head + ["-", status_text(r), "", "", "", "", ""])
            continue
        place = f"{r['place'] + 1}" + ("*" if r["status"] == "partial" else "")
        table.append(head + [place, config_text(r), _placement(r),
                             fmt.seconds(r["step_time_s"]), f"{r['samples_per_s']:.5g}",
                             fmt.percent(r["mfu"]), f"{r['mem_bytes'] / 1e9:.1f}"])
    pending = sum(1 for r in rows if r["status"] == "pending")
    partial = len({r["case_id"] for r in rows if r["status"] == "partial"})
    note = "" if attrs.get("complete") else (
        "\n(partial results: the run is not complete"
        + (f"; {pending} case(s) pending" if pending else "")
        + (f"; * = best so far of {partial} case(s) not completely searched" if partial
           else "") + ")")
    return fmt.table(["case", "job", "hardware", "strategy", "GPUs", "#", "config",
                      "NVLink per domain", "step", "samples/s", "MFU", "mem GB"], table,
                     align="rlllrrllrrrr") + note

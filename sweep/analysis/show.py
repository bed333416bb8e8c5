"""``sweep show``: the best configurations per case of a ``sweep.h5``, as a table, CSV or JSON.

Rows join ``/top`` with ``/cases``; numbers keep SI units in CSV/JSON (seconds, bytes) and
are rounded for the table. Every rendered row has a ``status``: ``ok`` (a configuration of a
complete case), ``partial`` (the best so far of a case not completely searched: it may still
change), ``infeasible`` (the case is complete and has no feasible configuration), ``empty``
(its case has no candidate configuration at all) or
``pending`` (the case is not complete and has none yet). The JSON is strict: NaN and
infinities are null.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

import numpy as np

from ..engine.store import iter_results_cases, read_results, read_results_cases
from ..errors import StoreError
from . import fmt

__all__ = ["load_rows", "iter_rows", "format_rows", "write_rows", "config_text", "row_status",
           "status_text", "FORMATS", "RECOMPUTE_NAMES"]

FORMATS = ("table", "csv", "json")
#: cases ``sweep show`` reads and prints at a time (their rows as dicts: ~80 MB; a
#: 200,000-case file prints in 160 MB, against 2.3 GB read at once)
SLICE_CASES = 5_000
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
    cases = data["cases"]
    if case is not None:
        cases = cases[cases["case_id"] == case]
    return attrs, _joined(cases[:limit], data["top"], top)


def iter_rows(path: Path, top: int = 1, slice_cases: int = SLICE_CASES
              ) -> Iterator[tuple[dict, list[dict]]]:
    """(root attributes, rows) of every case, ``slice_cases`` cases at a time: together the
    rows :func:`load_rows` gives, in the same order, in memory bounded by the slice."""
    for attrs, data in iter_results_cases(Path(path), slice_cases):
        yield attrs, _joined(data["cases"], data["top"], top)


def _joined(cases: np.ndarray, rows: np.ndarray, top: int) -> list[dict]:
    """Each case's ``top`` best rows of /top joined with its /cases row (or the case alone,
    ``place`` None, without any)."""
    rows = rows[rows["place"] < top]
    rows = rows[np.lexsort((rows["place"], rows["case_id"]))]
    first = np.searchsorted(rows["case_id"], cases["case_id"], side="left")
    last = np.searchsorted(rows["case_id"], cases["case_id"], side="right")
    row_records = iter(_records(rows[np.isin(rows["case_id"], cases["case_id"])]))
    # (every row has every column, a case without a configuration its /top columns empty,
    # so a CSV's header does not depend on what the run found; the case's count of
    # feasible candidates is feasible_case, as sweep.analysis.results names it, beside a
    # configuration's feasible)
    none = {k: None for k in rows.dtype.names if k != "case_id"}
    out = []
    for base, a, b in zip(_records(cases), first, last):
        if "feasible" in base:
            base = {"feasible_case" if k == "feasible" else k: v for k, v in base.items()}
        if a == b:
            out.append({**base, **none, "place": None})
        for _ in range(b - a):
            out.append({**base, **next(row_records)})
    return out


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
    completely searched), ``infeasible`` (its case is complete without a feasible one),
    ``empty`` (its case has no candidate at all: the strategy cannot lay the job out on its
    GPU count, e.g. an MoE job under 2d; ``sweep plan`` says why) or ``pending`` (its case
    is not complete and has none yet)."""
    if r.get("place") is not None:
        return "ok" if r.get("complete", True) else "partial"
    if _empty(r):
        return "empty"
    return "infeasible" if r.get("complete") else "pending"


def _empty(r) -> bool:
    """Whether the case of ``r`` is complete without any candidate in its space."""
    return bool(r.get("complete")) and r.get("candidates") == 0


def status_text(r) -> str:
    """What to print for a case (or row) without a configuration."""
    if _empty(r):
        return "no candidate configuration (sweep plan says why)"
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
    out = io.StringIO()
    write_rows(out, [(attrs, rows)], kind)
    return out.getvalue().rstrip("\n")


def write_rows(out: TextIO, slices: Iterable[tuple[dict, list[dict]]], kind: str = "table"
               ) -> None:
    """Write slices of rows (:func:`iter_rows`) to ``out`` as one ``table``, ``csv`` or
    ``json`` document, a slice at a time. One slice gives what format_rows gives; with more,
    the table keeps the first slice's column widths (a wider cell later shifts its line)."""
    attrs: dict = {}
    keys: list[str] | None = None
    widths: list[int] | None = None
    writer = None
    pending = 0
    partial: set = set()
    first = True
    for attrs, rows in slices:
        rows = [{**r, "status": row_status(r)} for r in rows]
        if kind == "json":
            if first:
                head = json.dumps({"name": attrs.get("name"),
                                   "cost_model": attrs.get("cost_model"),
                                   "complete": bool(attrs.get("complete")), "rows": []},
                                  indent=1)
                out.write(head[:head.rindex("[") + 1])
            for r in rows:
                out.write(("\n" if first else ",\n") + json.dumps(
                    {k: _strict(v) for k, v in r.items()}, allow_nan=False))
                first = False
            continue
        if kind == "csv":
            if writer is None:
                keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k != "status"]
                writer = csv.DictWriter(out, fieldnames=[*keys, "status"],
                                        extrasaction="ignore", lineterminator="\n")
                writer.writeheader()
            writer.writerows(rows)
            continue
        cells = [_table_cells(r) for r in rows]
        if widths is None:
            widths = [max(len(c[i]) for c in [_HEADER, *cells]) for i in range(len(_HEADER))]
            cells = [_HEADER, ["-" * w for w in widths], *cells]
        for c in cells:
            out.write("  ".join(x.ljust(w) if a == "l" else x.rjust(w)
                                for x, w, a in zip(c, widths, _ALIGN)).rstrip() + "\n")
        pending += sum(1 for r in rows if r["status"] == "pending")
        partial |= {r["case_id"] for r in rows if r["status"] == "partial"}
    if kind == "json":
        if first:  # no rows at all
            out.write(json.dumps({"name": attrs.get("name"),
                                  "cost_model": attrs.get("cost_model"),
                                  "complete": bool(attrs.get("complete")), "rows": []},
                                 indent=1) + "\n")
        else:
            out.write("\n ]\n}\n")
        return
    if kind == "table" and not attrs.get("complete"):
        out.write("(partial results: the run is not complete"
                  + (f"; {pending} case(s) pending" if pending else "")
                  + (f"; * = best so far of {len(partial)} case(s) not completely searched"
                     if partial else "") + ")\n")


_HEADER = ["case", "job", "hardware", "strategy", "GPUs", "#", "config", "NVLink per domain",
           "step", "samples/s", "MFU", "mem GB"]
_ALIGN = "rlllrrllrrrr"


def _table_cells(r: dict) -> list[str]:
    """A row of the text table (``r`` with its status)."""
    head = [r["case_id"], r["job"], r["hardware"], r["strategy"], r["n_gpus"]]
    if r.get("place") is None:
        cells = head + ["-", status_text(r), "", "", "", "", ""]
    else:
        place = f"{r['place'] + 1}" + ("*" if r["status"] == "partial" else "")
        cells = head + [place, config_text(r), _placement(r), fmt.seconds(r["step_time_s"]),
                        f"{r['samples_per_s']:.5g}", fmt.percent(r["mfu"]),
                        f"{r['mem_bytes'] / 1e9:.1f}"]
    return [str(c) for c in cells]

"""``sweep status``: how far a run folder has got, read from its part files.

For a run that stopped (a time limit, a failed array task) or is still going: which work
units and candidates are done, what each part file holds, which shards of a job array have
not finished, whether ``sweep.h5`` is there, and what to do next. Reads the units tables and
attributes only (with ``verify``, every table, its checksums checked as ``sweep reduce``
checks them), and changes nothing. A damaged part file is listed as such, its work not
counted: a resumed run sets it aside and does that work again.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import StoreError
from .lock import holders
from .partition import SHARD_STRIDE, shard_of_units, unit_progress
from .reduce import RESULTS_NAME, load_run_plan
from .store import (
    DONE_DTYPE,
    CorruptFileError,
    list_parts,
    read_part,
    read_part_done,
    read_results,
    read_results_attrs,
)

__all__ = ["run_status"]


def _array_shards(parts: list[dict]) -> int:
    """Shards K of the newest job-array layout among the parts; 0 if none was written by a
    shard."""
    sharded = [p for p in parts if p["shard"]]
    if not sharded:
        return 0
    newest = max(sharded, key=lambda p: p["written_utc"])
    return int(newest["shard"].split("/")[1])


def run_status(run_dir: Path, verify: bool = False) -> dict:
    """Progress of the run in ``run_dir`` (JSON-ready); ``verify``: read each part file's
    top-N table too, checking its checksums.

    Raises:
        StoreError: no run folder, no spec.yaml, or a part file that is not one of ours.
    """
    run_dir = Path(run_dir)
    if run_dir.is_file():
        raise StoreError(f"{run_dir}: a file, not a run folder (sweep status takes the "
                         f"folder: {run_dir.parent})")
    if not run_dir.is_dir():
        raise StoreError(f"{run_dir}: no such run folder")
    plan, _, sha = load_run_plan(run_dir)
    units = plan.units
    parts, done = [], []
    for path in list_parts(run_dir):
        try:
            attrs, table = read_part(path)[:2] if verify else read_part_done(path)
        except CorruptFileError as exc:  # its work is redone by a resumed run
            parts.append({"file": path.name, "worker": None, "workers": None, "rank": None,
                          "ranks": None, "shard": "", "complete": False, "sealed": False,
                          "units": 0, "written_utc": "", "this_spec": False,
                          "corrupt": str(exc)})
            continue
        ours = attrs.get("spec_sha256") == sha
        worker, workers = int(attrs.get("rank", -1)), int(attrs.get("size", 0))
        shard = str(attrs.get("shard", ""))
        # (a shard's workers are numbered shard x SHARD_STRIDE + rank over all its shards'
        # ranks: "rank" / "ranks" are the rank within its own shard, and how many it had)
        shards = int(shard.split("/")[1]) if shard else 1
        parts.append({"file": path.name, "worker": worker, "workers": workers,
                      "rank": worker % SHARD_STRIDE if shard else worker,
                      "ranks": max(workers // max(shards, 1), 1) if shard else workers,
                      "shard": shard,
                      "complete": bool(attrs.get("complete")),
                      "sealed": bool(attrs.get("sealed")), "units": len(table),
                      "written_utc": str(attrs.get("written_utc", "")), "this_spec": ours,
                      "corrupt": ""})
        if ours:
            done.append(table)
    sizes = units["stop"] - units["start"]
    segments = np.concatenate(done) if done else np.zeros(0, DONE_DTYPE)
    segments = segments[(segments["unit_id"] >= 0) & (segments["unit_id"] < len(units))]
    progress, _ = unit_progress(units, segments)
    finished = progress == sizes
    # shards of that layout that own a unit nobody has done (the partition is fixed)
    shards = _array_shards([p for p in parts if p.get("this_spec")])
    unfinished: list[int] = []
    if shards:
        missing = ~finished
        owner = shard_of_units(sizes, shards)
        unfinished = [int(i) for i in np.unique(owner[missing])]
    results = run_dir / RESULTS_NAME
    reduced = None
    if results.exists():
        try:
            attrs = read_results(results)[0] if verify else read_results_attrs(results)
            reduced = {"complete": bool(attrs.get("complete")),
                       "units_done": int(attrs.get("n_units_done", 0)),
                       "current": attrs.get("spec_sha256") == sha, "corrupt": ""}
        except CorruptFileError as exc:
            reduced = {"complete": False, "units_done": 0, "current": False,
                       "corrupt": str(exc)}
    units_done, candidates_done = int(np.count_nonzero(finished)), int(progress.sum())
    from_results = (not any(p.get("this_spec") for p in parts) and reduced is not None
                    and reduced["complete"] and reduced["current"])
    if from_results:  # the part files are gone (removed after the reduction): sweep.h5 says
        units_done, candidates_done = len(units), int(sizes.sum())
    return {"dir": str(run_dir), "name": plan.spec.name, "cost_model": plan.spec.cost_model,
            "cases": len(plan.cases), "units": len(units),
            "units_done": units_done, "candidates": int(sizes.sum()),
            "candidates_done": candidates_done, "done_from_results": from_results,
            "parts": parts, "shards": shards, "unfinished_shards": unfinished,
            "results": reduced, "verified": verify, "running": holders(run_dir),
            "corrupt_parts": [p["file"] for p in parts if p["corrupt"]]}

"""HDF5 storage (the only h5py user): per-rank part files and the reduced ``sweep.h5``.

Every file is written to a temporary name in the same folder, flushed to disk and renamed,
so a reader sees either the previous complete file or the new one, never half of one.
Tables are compound datasets (``pd.DataFrame(f["top"][:])`` works); each carries a
``columns`` attribute (JSON: column -> {unit, description}).

Part file ``part-<rank>.h5``: root attrs (schema_version, kind="part", spec_sha256, rank,
size, sweep_version, written_utc, complete), ``/units`` (the work units this rank finished,
with counts and seconds) and ``/top`` (its top-N rows per case, ``case_id`` + ``place`` +
RESULT columns).

Reduced file ``sweep.h5``: root attrs (see reduce.py), ``/cases``, ``/top``, ``/units``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .errors import StoreError
from .schema import CANDIDATE_FIELDS, METRIC_FIELDS, RESULT_DTYPE

__all__ = ["SCHEMA_VERSION", "DONE_DTYPE", "TOP_DTYPE", "write_part", "read_part",
           "read_part_done", "write_results", "read_results",
           "read_results_attrs", "Table", "part_path", "list_parts"]

SCHEMA_VERSION = 1

#: a finished work unit, as recorded in part files and in sweep.h5 /units
DONE_DTYPE = np.dtype([("unit_id", "i8"), ("case_id", "i4"), ("start", "i8"), ("stop", "i8"),
                       ("evaluated", "i8"), ("feasible", "i8"), ("out_of_memory", "i8"),
                       ("other_infeasible", "i8"), ("seconds", "f8"), ("rank", "i4")])
#: a top-N row: its case, its place (0 = best) and the RESULT columns
TOP_DTYPE = np.dtype([("case_id", "i4"), ("place", "i4")] + RESULT_DTYPE.descr)

_DONE_COLUMNS = {
    "unit_id": ("", "work unit number in the plan"), "case_id": ("", "case of the unit"),
    "start": ("", "first candidate index"), "stop": ("", "one past the last candidate index"),
    "evaluated": ("", "candidates evaluated"), "feasible": ("", "feasible candidates"),
    "out_of_memory": ("", "candidates over HBM capacity"),
    "other_infeasible": ("", "candidates infeasible for other reasons"),
    "seconds": ("s", "wall time spent on the unit"), "rank": ("", "rank that did the unit")}
_TOP_COLUMNS = ({"case_id": ("", "case (row of /cases)"), "place": ("", "0 = best")}
                | {n: ("", d) for n, _, d in CANDIDATE_FIELDS}
                | {n: (u, d) for n, _, u, d in METRIC_FIELDS})


@dataclass
class Table:
    """A compound dataset with its per-column units and descriptions."""

    data: np.ndarray
    columns: dict[str, tuple[str, str]]  # column -> (unit, description)


def part_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"part-{rank:05d}.h5"


def list_parts(run_dir: Path) -> list[Path]:
    return sorted(Path(run_dir).glob("part-[0-9][0-9][0-9][0-9][0-9].h5"))


def _attr(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return value


def _write_atomic(path: Path, attrs: dict[str, Any], tables: dict[str, Table]) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w", libver="latest") as f:
            for k, v in attrs.items():
                f.attrs[k] = _attr(v)
            for name, table in tables.items():
                kwargs = {"compression": "gzip", "shuffle": True} if len(table.data) > 256 else {}
                ds = f.create_dataset(name, data=table.data, **kwargs)
                ds.attrs["columns"] = json.dumps(
                    {c: {"unit": u, "description": d} for c, (u, d) in table.columns.items()})
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read(path: Path, kind: str, tables: tuple[str, ...] | None = None
          ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(attrs, tables) of a sweep file: every table, or only those named in ``tables``."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
            if attrs.get("kind") != kind:
                raise StoreError(f"{path}: not a sweep {kind} file (kind = {attrs.get('kind')!r})")
            if attrs.get("schema_version") != SCHEMA_VERSION:
                raise StoreError(f"{path}: schema version {attrs.get('schema_version')} is not "
                                 f"{SCHEMA_VERSION}; it was written by another sweep version")
            data = {name: f[name][()] for name in (f.keys() if tables is None else tables)}
    except StoreError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise StoreError(f"{path}: unreadable or corrupt HDF5 file ({exc})") from None
    return attrs, data


def write_part(path: Path, attrs: dict[str, Any], done: np.ndarray, top: np.ndarray) -> None:
    """Write one rank's part file atomically."""
    _write_atomic(path, {"schema_version": SCHEMA_VERSION, "kind": "part", **attrs},
                  {"units": Table(done.astype(DONE_DTYPE, copy=False), _DONE_COLUMNS),
                   "top": Table(top.astype(TOP_DTYPE, copy=False), _TOP_COLUMNS)})


def read_part(path: Path) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """(attrs, units done, top rows) of a part file.

    Raises:
        StoreError: missing, corrupt, or not a part file of this schema.
    """
    attrs, data = _read(Path(path), "part")
    try:
        return (attrs, data["units"].astype(DONE_DTYPE, copy=False),
                data["top"].astype(TOP_DTYPE, copy=False))
    except (KeyError, ValueError) as exc:
        raise StoreError(f"{path}: part file lacks its tables ({exc})") from None


def read_part_done(path: Path) -> tuple[dict[str, Any], np.ndarray]:
    """(attrs, the table of units done) of a part file, without its top-N table.

    Raises:
        StoreError: missing, corrupt, or not a part file of this schema.
    """
    attrs, data = _read(Path(path), "part", ("units",))
    return attrs, data["units"].astype(DONE_DTYPE, copy=False)


def read_results_attrs(path: Path) -> dict[str, Any]:
    """The root attributes of a results file (no tables read).

    Raises:
        StoreError: missing, corrupt, or not a results file of this schema.
    """
    return _read(Path(path), "results", ())[0]


def write_results(path: Path, attrs: dict[str, Any], cases: Table, top: np.ndarray,
                  done: np.ndarray) -> None:
    """Write the reduced results file atomically."""
    _write_atomic(path, {"schema_version": SCHEMA_VERSION, "kind": "results", **attrs},
                  {"cases": cases,
                   "top": Table(top.astype(TOP_DTYPE, copy=False), _TOP_COLUMNS),
                   "units": Table(done.astype(DONE_DTYPE, copy=False), _DONE_COLUMNS)})


def read_results(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(attrs, {"cases", "top", "units"}) of a reduced file.

    Raises:
        StoreError: missing, corrupt, or not a results file of this schema.
    """
    p = Path(path)
    if not p.is_file():
        raise StoreError(f"{p}: no such results file")
    return _read(p, "results")


def read_columns(path: Path) -> dict[str, dict[str, Any]]:
    """Units and meanings of every column of a results file's tables: {column: {...}}."""
    import json

    out: dict[str, dict[str, Any]] = {}
    try:
        with h5py.File(path, "r", locking=False) as f:
            for name in ("cases", "top"):
                raw = f[name].attrs.get("columns") if name in f else None
                if raw is not None:
                    out.update(json.loads(raw))
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path}: unreadable or corrupt HDF5 file ({exc})") from None
    return out

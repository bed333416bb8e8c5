"""HDF5 storage (the only h5py user): per-rank part files and the reduced ``sweep.h5``.

Every file is built in memory (HDF5 never touches the disk, so a full disk cannot leave the
library in a broken state), written to a fresh temporary file with a random name in the
same folder (``tempfile.mkstemp``: created exclusively, never through a planted link),
flushed to disk and renamed, so a reader sees either the previous complete file or the new
one, never half of one. A failed write (disk full, read-only folder) raises
:class:`StoreError` naming the file and leaves no temporary file. The one exception is a
results file too large to build in memory, which :class:`ResultsWriter` writes straight
to its temporary file after checking the folder has room.

Tables are compound datasets (``pd.DataFrame(f["top"][:])`` works); each carries a
``columns`` attribute (JSON: column -> {unit, description}).

Integrity: every table is chunked with HDF5's Fletcher32 filter (checked by HDF5 on every
read of a chunk) and carries a ``sha256`` attribute, the hex SHA-256 of its raw bytes as
read back (packed, file byte order); every ``read_*`` verifies both and raises
:class:`CorruptFileError` on a mismatch. The root attributes carry ``attrs_sha256`` (their
canonical JSON; long strings such as the spec live in HDF5's global heap, which has no
checksum of its own), verified too. Files written before checksums existed: part files are
refused (their work is redone by ``--resume``); results files are still read, unverified,
for backward compatibility.

Part file ``part-<rank>.h5`` (and the rank's sealed parts ``part-<rank>-<n>.h5``, root
attr ``sealed``): root attrs (schema_version, kind="part", spec_sha256, rank, size,
sweep_version, written_utc, complete), ``/units`` (the work units this rank finished, with
counts and seconds) and ``/top`` (its top-N rows per case, sorted by ``case_id``, with
``place`` and the RESULT columns).

Reduced file ``sweep.h5``: root attrs (see reduce.py), ``/cases``, ``/top``, ``/units``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..errors import StoreError
from ..model.schema import CANDIDATE_FIELDS, METRIC_FIELDS, RESULT_DTYPE

__all__ = ["SCHEMA_VERSION", "DONE_DTYPE", "TOP_DTYPE", "write_part", "read_part",
           "read_part_done", "write_results", "read_results",
           "read_results_attrs", "Table", "part_path", "list_parts", "write_bytes_atomic",
           "write_text_atomic", "CorruptFileError", "table_sha256", "ResultsWriter",
           "PartTops", "part_worker", "read_results_cases", "iter_results_cases",
           "remove_temporaries"]


class CorruptFileError(StoreError):
    """A sweep file is damaged (checksum mismatch, unreadable HDF5) or cannot be verified
    (a part file without checksums). The work a corrupt part file recorded can be redone."""


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


def part_path(run_dir: Path, rank: int, sealed: int | None = None) -> Path:
    """``part-<rank>.h5``, the part file a worker rewrites; with ``sealed``, the worker's
    sealed part ``part-<rank>-<sealed>.h5`` (written once, when its results grew past
    the runner's bound, and never changed again)."""
    tail = "" if sealed is None else f"-{sealed:04d}"
    return Path(run_dir) / f"part-{rank:05d}{tail}.h5"


_PART_NAME = re.compile(r"part-(\d{5,})(?:-(\d{4,}))?\.h5")


def _part_name(name: str) -> tuple[int, int | None] | None:
    m = _PART_NAME.fullmatch(name)
    return None if m is None else (int(m.group(1)), None if m.group(2) is None
                                   else int(m.group(2)))


def part_worker(path: Path) -> tuple[int, int | None]:
    """(worker, sealed number or None) of a part file's name."""
    parsed = _part_name(Path(path).name)
    if parsed is None:
        raise ValueError(f"{path}: not a part file name")
    return parsed


def list_parts(run_dir: Path, workers: set[int] | None = None) -> list[Path]:
    """Every part file of a run folder (of ``workers`` only, if given), sealed ones
    included, in (worker, sealed number) order."""
    found = []
    for p in Path(run_dir).glob("part-*.h5"):
        parsed = _part_name(p.name)
        if parsed and (workers is None or parsed[0] in workers):
            found.append((parsed[0], -1 if parsed[1] is None else parsed[1], p))
    return [p for _, _, p in sorted(found)]


def _attr(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return value


def _attrs_sha256(attrs: dict[str, Any]) -> str:
    """SHA-256 of root attributes (as written or as read back) in canonical JSON."""
    def plain(v: Any) -> Any:
        v = v.item() if isinstance(v, np.generic) else v
        return v.decode() if isinstance(v, bytes) else v

    text = json.dumps({k: plain(v) for k, v in attrs.items() if k != "attrs_sha256"},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


#: bytes per chunk of a table (HDF5 checks one Fletcher32 sum per chunk)
CHUNK_BYTES = 256 * 1024
#: results files up to this size are built in memory (ResultsWriter), the size estimated
#: as COMPRESSED_FRACTION of the tables' (gzip shrinks sweep.h5's tables 11 - 17 times:
#: scale-80k-variants 16 MB of 172 MB, scale-1m-variants 70 MB of 1.1 GB)
IMAGE_BYTES = 512 * 2**20
COMPRESSED_FRACTION = 0.25


def table_sha256(data: np.ndarray) -> str:
    """Hex SHA-256 of a table's raw bytes (the value of each dataset's ``sha256`` attribute)."""
    return hashlib.sha256(np.ascontiguousarray(data).view(np.uint8)).hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _cannot_write(path: Path, exc: OSError) -> StoreError:
    why = exc.strerror or str(exc)
    full = "; free some space and run again"
    hint = {errno.ENOSPC: full, errno.EDQUOT: full,
            errno.EACCES: "; is the folder writable?"}.get(exc.errno, "")
    return StoreError(f"{path}: cannot write: {why}{hint}")


def write_bytes_atomic(path: str | Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` atomically: a fresh temporary file with a random name
    (O_EXCL, never through a symlink) in the same folder, fsync, rename, fsync the folder.

    Raises:
        StoreError: the file cannot be written (disk full, read-only, no permission); no
            temporary file is left behind and ``path`` is unchanged.
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                                   dir=path.parent)
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    try:
        try:
            os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it private; a normal file
            view = memoryview(data).cast("B")
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise _cannot_write(path, exc) from None
        raise
    _fsync_folder(path.parent)


class ResultsWriter:
    """``sweep.h5`` written a slice at a time, for results too large to build at once.

    Tables are appended to in order; each one's ``sha256`` attribute is the hash of all its
    rows, computed as they go (the same as that of the whole table at once)::

        with ResultsWriter(path, attrs, size_bytes) as w:
            w.create("top", rows=n)
            w.append("top", rows)  # any number of times
            w.commit()

    Where the file goes while it is written depends on ``size_bytes``, the size of its
    tables uncompressed, of which the file is estimated at COMPRESSED_FRACTION (gzip): up
    to IMAGE_BYTES it is built in memory (compressed) and written atomically at
    :meth:`commit` like every other sweep file, so a full disk cannot leave HDF5 in a
    broken state; a larger file is written straight to a fresh temporary file next to
    ``path``, once the folder is seen to have room for the estimate (refused with a
    one-line error otherwise), then synced and renamed onto ``path``. Either way a reader
    sees the previous file or the new complete one, and leaving the ``with`` block on an
    error leaves no temporary file (one left by a killed process is removed by the next
    run or reduction in the folder: remove_temporaries).
    """

    def __init__(self, path: Path, attrs: dict[str, Any], size_bytes: float) -> None:
        self.path = Path(path)
        self.tmp: Path | None = None
        self.buf: io.BytesIO | None = None
        self._hash: dict[str, Any] = {}
        try:
            expected = COMPRESSED_FRACTION * size_bytes
            if expected <= IMAGE_BYTES:
                self.buf = io.BytesIO()
                target: Any = self.buf
            else:
                free = shutil.disk_usage(self.path.parent).free
                if free < expected + 2**20:
                    raise OSError(errno.ENOSPC, f"No space left on device (the results "
                                                f"need about {expected / 1e9:.3g} GB, "
                                                f"{free / 1e9:.3g} GB free)")
                fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp",
                                           dir=self.path.parent)
                os.fchmod(fd, 0o666 & ~_umask())
                os.close(fd)
                self.tmp = target = Path(tmp)
            self.f = h5py.File(target, "w", libver="latest")
            attrs = {"schema_version": SCHEMA_VERSION, "kind": "results", **attrs}
            for k, v in attrs.items():
                self.f.attrs[k] = _attr(v)
            self.f.attrs["attrs_sha256"] = _attrs_sha256(dict(self.f.attrs))
        except BaseException as exc:
            self.discard()
            if isinstance(exc, OSError):
                raise _cannot_write(self.path, exc) from None
            raise

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is not None:
            self.discard()

    def create(self, name: str, dtype: np.dtype | None = None,
               columns: dict[str, tuple[str, str]] | None = None, rows: int = 0) -> None:
        """An empty table to append rows to (chunked, Fletcher32; gzip beyond 256 rows, as
        in every sweep file), ``rows`` the most it will hold; ``top`` and ``units`` have
        their standard columns."""
        if dtype is None:
            dtype, columns = {"top": (TOP_DTYPE, _TOP_COLUMNS),
                              "units": (DONE_DTYPE, _DONE_COLUMNS)}[name]
        chunk = max(1, min(rows, CHUNK_BYTES // max(dtype.itemsize, 1)))
        packing = {"compression": "gzip", "shuffle": True} if rows > 256 else {}
        try:
            ds = self.f.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dtype,
                                       chunks=(chunk,), fletcher32=True, **packing)
            ds.attrs["columns"] = json.dumps(
                {c: {"unit": u, "description": d} for c, (u, d) in columns.items()})
        except OSError as exc:
            raise _cannot_write(self.path, exc) from None
        self._hash[name] = hashlib.sha256()

    def append(self, name: str, data: np.ndarray) -> None:
        """Rows at the end of table ``name``."""
        if not len(data):
            return
        ds = self.f[name]
        data = np.ascontiguousarray(data, dtype=ds.dtype)
        n = ds.shape[0]
        try:
            ds.resize((n + len(data),))
            ds[n:] = data
        except OSError as exc:
            raise _cannot_write(self.path, exc) from None
        self._hash[name].update(data.view(np.uint8))

    def commit(self) -> None:
        """Checksums in, file closed, synced and renamed onto ``path``."""
        try:
            for name, h in self._hash.items():
                self.f[name].attrs["sha256"] = h.hexdigest()
            self.f.close()
            if self.buf is not None:
                with self.buf.getbuffer() as view:
                    write_bytes_atomic(self.path, view)
                return
            fd = os.open(self.tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(self.tmp, self.path)
        except OSError as exc:
            self.discard()
            raise _cannot_write(self.path, exc) from None
        _fsync_folder(self.path.parent)

    def discard(self) -> None:
        """Close and remove the temporary file (``path`` is left as it was)."""
        try:
            self.f.close()
        except Exception:  # noqa: BLE001  (already closed, or never opened)
            pass
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)


def remove_temporaries(folder: Path, workers=None) -> list[Path]:
    """Remove the temporary files an atomic write left in a run folder when its process
    was killed (``.<name>.<random>.tmp``); call it holding the folder's lock, so that no
    write is under way. ``workers``: a predicate on worker ids, to remove only the
    temporaries of those workers' part files (a shard holds the lock shared with the other
    shards, which may be writing theirs). Returns what was removed."""
    gone = []
    for p in Path(folder).glob(".*.tmp"):
        if not p.is_file():
            continue
        if workers is None:
            ours = p.name.startswith(".part-") or p.name.startswith(".sweep.h5.")
        else:
            head, sep, _ = p.name[1:].partition(".h5.")
            parsed = _part_name(head + ".h5") if sep else None
            ours = parsed is not None and bool(workers(parsed[0]))
        if ours:
            p.unlink(missing_ok=True)
            gone.append(p)
    return gone


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (some file systems cannot fsync a folder)."""
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


class PartTops:
    """A part file's ``/top`` read in case order, a slice at a time (rows are stored sorted
    by case). HDF5 checks each chunk's Fletcher32 as it is read; the SHA-256 of all rows is
    checked once the last slice is read. Only the ``case_id`` column is held in between, and
    the file is open only while a slice is read (a reduction of thousands of parts does not
    hold thousands of files open)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        with _open_checked(self.path) as f:
            ds = f["top"]
            stored = ds.attrs.get("sha256")
            if stored is None:
                raise CorruptFileError(f"{path}: /top has no checksum (written by an older "
                                       f"sweep version); delete the file and its work units "
                                       f"are redone by --resume")
            self.stored = stored.decode() if isinstance(stored, bytes) else str(stored)
            self.case_id = self._checked(lambda: ds.fields("case_id")[()])
        if np.any(np.diff(self.case_id) < 0):
            raise CorruptFileError(f"{path}: corrupt: /top rows are not in case order")
        self.position = 0
        self._hash = hashlib.sha256()
        if len(self.case_id) == 0:
            self._verify()

    def _checked(self, read):
        try:
            return read()
        except OSError as exc:  # the chunk's Fletcher32 sum, checked by HDF5
            raise CorruptFileError(f"{self.path}: corrupt: checksum of /top does not match "
                                   f"(HDF5 Fletcher32 check failed: {exc})") from None
        except (KeyError, ValueError) as exc:
            raise CorruptFileError(f"{self.path}: corrupt: /top cannot be read ({exc})"
                                   ) from None

    def until(self, case_stop: int) -> np.ndarray:
        """The rows not read yet whose case is below ``case_stop``."""
        hi = int(np.searchsorted(self.case_id, case_stop, side="left"))
        if hi <= self.position:
            return np.zeros(0, TOP_DTYPE)
        with _open_checked(self.path) as f:
            rows = self._checked(lambda: f["top"][self.position:hi])
        self._hash.update(np.ascontiguousarray(rows).view(np.uint8))
        self.position = hi
        if hi == len(self.case_id):
            self._verify()
        return rows.astype(TOP_DTYPE, copy=False)

    def _verify(self) -> None:
        _check_sha256(self.path, "top", self._hash.hexdigest(), self.stored)


def _check_sha256(path, name: str, actual: str, stored) -> None:
    """CorruptFileError unless table ``name``'s SHA-256 ``actual`` is the ``stored`` one
    (bytes or str; None: nothing stored, nothing to check)."""
    stored = stored.decode() if isinstance(stored, bytes) else stored
    if stored is not None and actual != str(stored):
        raise CorruptFileError(f"{path}: corrupt: checksum of /{name} does not match its "
                               f"data (sha256 {actual[:12]}... vs {str(stored)[:12]}... "
                               f"stored)")


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically; see :func:`write_bytes_atomic`.

    Raises:
        StoreError: the file cannot be written.
    """
    write_bytes_atomic(path, text.encode())


def _image(attrs: dict[str, Any], tables: dict[str, Table]) -> io.BytesIO:
    """The HDF5 file, built in memory."""
    buf = io.BytesIO()
    with h5py.File(buf, "w", libver="latest") as f:
        for k, v in attrs.items():
            f.attrs[k] = _attr(v)
        f.attrs["attrs_sha256"] = _attrs_sha256(dict(f.attrs))
        for name, table in tables.items():
            data = np.ascontiguousarray(table.data)
            n = len(data)
            rows = max(1, min(n, CHUNK_BYTES // max(data.dtype.itemsize, 1)))
            kwargs: dict[str, Any] = {"chunks": (rows,), "fletcher32": True}
            if n == 0:
                kwargs["maxshape"] = (None,)  # a chunk of one row in an empty table
            if n > 256:
                kwargs |= {"compression": "gzip", "shuffle": True}
            ds = f.create_dataset(name, data=data, **kwargs)
            # hash what a reader gets back (it is the array unless HDF5 repacked the dtype)
            ds.attrs["sha256"] = table_sha256(data if ds.dtype == data.dtype else ds[()])
            ds.attrs["columns"] = json.dumps(
                {c: {"unit": u, "description": d} for c, (u, d) in table.columns.items()})
    return buf


def _write_atomic(path: Path, attrs: dict[str, Any], tables: dict[str, Table]) -> None:
    buf = _image(attrs, tables)
    with buf.getbuffer() as view:
        write_bytes_atomic(path, view)


def _read_table(path: Path, f: h5py.File, name: str, kind: str) -> np.ndarray:
    """One table, its checksums verified."""
    ds = f[name]
    stored = ds.attrs.get("sha256")
    if stored is None and kind == "part":
        raise CorruptFileError(f"{path}: /{name} has no checksum (written by an older sweep "
                               f"version), so it cannot be verified; delete the file and its "
                               f"work units are redone by --resume")
    try:
        data = ds[()]
    except OSError as exc:
        if ds.fletcher32:
            raise CorruptFileError(f"{path}: corrupt: checksum of /{name} does not match "
                                   f"(HDF5 Fletcher32 check failed: {exc})") from None
        raise
    if stored is not None:
        _check_sha256(path, name, table_sha256(data), stored)
    return data


def _read(path: Path, kind: str, tables: tuple[str, ...] | None = None
          ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(attrs, tables) of a sweep file: every table, or only those named in ``tables``;
    checksums verified."""
    with _open_checked(Path(path)) as f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        if attrs.get("kind") != kind:
            raise StoreError(f"{path}: not a sweep {kind} file (kind = {attrs.get('kind')!r})")
        if attrs.get("schema_version") != SCHEMA_VERSION:
            raise StoreError(f"{path}: schema version {attrs.get('schema_version')} is not "
                             f"{SCHEMA_VERSION}; it was written by another sweep version")
        stored = attrs.pop("attrs_sha256", None)
        if stored is not None and stored != _attrs_sha256(attrs):
            raise CorruptFileError(f"{path}: corrupt: checksum of the root attributes "
                                   f"does not match them")
        data = {name: _read_table(path, f, name, kind)
                for name in (f.keys() if tables is None else tables)}
    return attrs, data


def write_part(path: Path, attrs: dict[str, Any], done: np.ndarray, top: np.ndarray) -> None:
    """Write one rank's part file atomically.

    Raises:
        StoreError: the file cannot be written (disk full, read-only folder, ...).
    """
    _write_atomic(path, {"schema_version": SCHEMA_VERSION, "kind": "part", **attrs},
                  {"units": Table(done.astype(DONE_DTYPE, copy=False), _DONE_COLUMNS),
                   "top": Table(top.astype(TOP_DTYPE, copy=False), _TOP_COLUMNS)})


def read_part(path: Path) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """(attrs, units done, top rows) of a part file.

    Raises:
        CorruptFileError: damaged (a checksum does not match) or written without checksums.
        StoreError: missing, or not a part file of this schema.
    """
    attrs, data = _read(Path(path), "part")
    try:
        return (attrs, data["units"].astype(DONE_DTYPE, copy=False),
                data["top"].astype(TOP_DTYPE, copy=False))
    except (KeyError, ValueError) as exc:
        raise CorruptFileError(f"{path}: part file lacks its tables ({exc})") from None


def read_part_done(path: Path) -> tuple[dict[str, Any], np.ndarray]:
    """(attrs, the table of units done) of a part file, without its top-N table.

    Raises:
        CorruptFileError: damaged (a checksum does not match) or written without checksums.
        StoreError: missing, or not a part file of this schema.
    """
    attrs, data = _read(Path(path), "part", ("units",))
    return attrs, data["units"].astype(DONE_DTYPE, copy=False)


def read_results_attrs(path: Path) -> dict[str, Any]:
    """The root attributes of a results file (no tables read).

    Raises:
        CorruptFileError: damaged (a checksum does not match).
        StoreError: missing, or not a results file of this schema.
    """
    return _read(Path(path), "results", ())[0]


def write_results(path: Path, attrs: dict[str, Any], cases: Table, top: np.ndarray,
                  done: np.ndarray) -> None:
    """Write a whole results file at once (the reduction writes it a slice at a time with
    :class:`ResultsWriter`, which this uses).

    Raises:
        StoreError: the file cannot be written (disk full, read-only folder, ...).
    """
    size = cases.data.nbytes + top.nbytes + done.nbytes
    with ResultsWriter(path, attrs, size) as w:
        w.create("cases", cases.data.dtype, cases.columns, rows=len(cases.data))
        w.create("top", rows=len(top))
        w.create("units", rows=len(done))
        w.append("cases", cases.data)
        w.append("top", top.astype(TOP_DTYPE, copy=False))
        w.append("units", done.astype(DONE_DTYPE, copy=False))
        w.commit()


def read_results(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(attrs, {"cases", "top", "units"}) of a reduced file.

    Raises:
        CorruptFileError: damaged (a checksum does not match).
        StoreError: missing, or not a results file of this schema.
    """
    p = Path(path)
    if not p.is_file():
        raise StoreError(_no_results_file(p))
    return _read(p, "results")


def _no_results_file(p: Path) -> str:
    """Why ``p`` cannot be read as a results file: missing, or a folder (a run folder's
    results are its sweep.h5)."""
    if p.is_dir():
        hint = f"; its results: {p / 'sweep.h5'}" if (p / "sweep.h5").is_file() else ""
        return f"{p}: a folder, not a results file{hint}"
    return f"{p}: no such results file"


def _results_attrs(p: Path) -> dict[str, Any]:
    """The verified root attributes of the results file ``p`` (no table read)."""
    if not p.is_file():
        raise StoreError(_no_results_file(p))
    attrs, _ = _read(p, "results", ())
    return attrs


def read_results_cases(path: Path, start: int, stop: int
                       ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(attrs, {"cases", "top"}) of cases ``[start, stop)`` of a reduced file: their
    ``/cases`` rows and their ``/top`` rows, read without the rest of the tables (what
    ``sweep run`` prints of a million-case file). The root attributes' checksum is
    verified; the rows read are checked by HDF5's per-chunk Fletcher32 sums (the tables'
    SHA-256 covers whole tables only, see :func:`read_results`).

    Raises:
        CorruptFileError: damaged. StoreError: missing, or not a results file.
    """
    p = Path(path)
    attrs = _results_attrs(p)
    with _open_checked(p) as f:
        cases = f["cases"][start:stop]
        ids = f["top"].fields("case_id")[()]
        lo, hi = np.searchsorted(ids, [start, stop], side="left")
        top = f["top"][int(lo):int(hi)]
    return attrs, {"cases": cases, "top": top}


def iter_results_cases(path: Path, slice_cases: int
                       ) -> Iterator[tuple[dict[str, Any], dict[str, np.ndarray]]]:
    """(attrs, {"cases", "top"}) of every case of a reduced file, ``slice_cases`` cases at a
    time with their ``/top`` rows, memory bounded by the slice (what ``sweep show``
    streams). Checked as :func:`read_results` before anything is given: the root
    attributes, then both tables read through once, a slice at a time, against their
    SHA-256 and the case ids of /top (so a corrupt file prints nothing); then read again
    and given. A file of no cases gives one empty slice.

    Raises:
        CorruptFileError: damaged. StoreError: missing, or not a results file.
    """
    p = Path(path)
    attrs = _results_attrs(p)
    with _open_checked(p) as f:
        tables = {name: f[name] for name in ("cases", "top")}
        hashes = {name: hashlib.sha256() for name in tables}
        for data in _result_slices(p, attrs, tables, slice_cases):
            for name, part in data.items():
                hashes[name].update(np.ascontiguousarray(part).view(np.uint8))
        for name, ds in tables.items():
            _check_sha256(p, name, hashes[name].hexdigest(), ds.attrs.get("sha256"))
        for data in _result_slices(p, attrs, tables, slice_cases):
            yield attrs, data


def _result_slices(p: Path, attrs: Mapping, tables: Mapping, slice_cases: int
                   ) -> Iterator[dict[str, np.ndarray]]:
    """{"cases", "top"} of ``slice_cases`` cases at a time, each /top row read once
    (CorruptFileError where /top is not sorted by case id or holds rows of no case)."""
    per_case = int(attrs.get("top_n", 0))  # /top holds at most top_n rows of a case
    n, rows = len(tables["cases"]), len(tables["top"])
    cursor = 0  # /top is sorted by case id, and case ids are /cases row numbers
    for lo in range(0, max(n, 1), max(slice_cases, 1)):
        hi = min(lo + slice_cases, n)
        end = rows if per_case <= 0 else min(rows, cursor + (hi - lo) * per_case)
        ids = _read_slice(p, tables["top"], cursor, end, "case_id")
        a, b = np.searchsorted(ids, [lo, hi], side="left")
        if a:  # (rows of no case before this slice: the table is not as written)
            raise CorruptFileError(f"{p}: corrupt: /top is not sorted by case id")
        data = {"cases": _read_slice(p, tables["cases"], lo, hi),
                "top": _read_slice(p, tables["top"], cursor, cursor + int(b))}
        cursor += int(b)
        if hi == n and cursor != rows:
            raise CorruptFileError(f"{p}: corrupt: /top holds rows of no case")
        yield data


@contextlib.contextmanager
def _open_checked(p: Path):
    """A sweep file open for reading; anything HDF5 fails on while it is open (a damaged
    object header or B-tree: a KeyError, OSError, ValueError or RuntimeError from h5py) is
    a CorruptFileError naming the file, not a traceback."""
    try:
        f = h5py.File(p, "r", locking=False)
    except FileNotFoundError:
        raise StoreError(f"{p}: no such file") from None
    except PermissionError as exc:
        raise StoreError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except OSError as exc:
        if p.suffix.lower() in (".yaml", ".yml"):  # (a spec given where its results go)
            raise StoreError(f"{p}: a spec, not a results file: its results are in the "
                             f"run folder sweep run writes (results/<name>/sweep.h5, or "
                             f"--out)") from None
        raise CorruptFileError(f"{p}: unreadable or corrupt HDF5 file ({exc})") from None
    with f:
        try:
            yield f
        except StoreError:
            raise
        except (OSError, KeyError, ValueError, RuntimeError) as exc:
            raise CorruptFileError(f"{p}: unreadable or corrupt HDF5 file ({exc})") from None


def _read_slice(p: Path, ds, lo: int, hi: int, field: str | None = None) -> np.ndarray:
    """Rows [lo, hi) of a table (one field of them), HDF5's chunk checksums verified."""
    try:
        return (ds.fields(field) if field else ds)[lo:hi]
    except (OSError, KeyError, ValueError) as exc:
        raise CorruptFileError(f"{p}: corrupt: checksum of /{ds.name.lstrip('/')} does not "
                               f"match (HDF5 Fletcher32 check failed: {exc})") from None


def read_columns(path: Path) -> dict[str, dict[str, Any]]:
    """Units and meanings of every column of a results file's tables: {column: {...}}."""
    out: dict[str, dict[str, Any]] = {}
    with _open_checked(Path(path)) as f:
        for name in ("cases", "top"):
            raw = f[name].attrs.get("columns") if name in f else None
            if raw is not None:
                out.update(json.loads(raw))  # (a damaged one: ValueError, corrupt)
    return out

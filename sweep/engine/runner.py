"""``sweep run``: spec -> plan -> this rank's work units -> search -> part file -> reduce.

The same code runs serially (``SerialComm``) and on any number of MPI ranks:

1. rank 0 validates the spec, prepares the run folder (refusing to mix runs) and reads what
   earlier attempts finished; the outcome, or the error, is broadcast so all ranks agree;
2. every rank builds the same plan and takes its share of the pending work units
   (``partition.share_units``), continuing from its own earlier part file on ``--resume``;
3. each rank searches its units, keeps a top-N per case and rewrites ``part-<rank>.h5``
   atomically every ``checkpoint_s`` seconds and at the end; the plan's tail is not dealt
   in advance: rank 0 hands its pieces out to the ranks that finish their share first
   (``_Share``);
4. SIGTERM or SIGINT (Slurm's time limit, Ctrl-C) makes every rank finish its current block
   of candidates, write its part file (the searched part of a unit is a segment) and stop:
   the run can be resumed, with any number of ranks;
5. after a complete run, rank 0 merges the parts into ``sweep.h5``.

A run can also be cut into ``K`` shards that start independently, at any time, e.g. the tasks
of a Slurm job array (``RunOptions.shard = (i, K)``). Shard ``i`` owns a fixed share of *all*
work units (the same partition whichever shards have run, on however many ranks each); its
ranks share what is left of that share (units an earlier attempt of the shard finished, in
any of its part files, are skipped), and rank ``r`` writes ``part-<i * SHARD_STRIDE + r>.h5``,
so shards never write one another's files. Shards never reduce:
``sweep reduce`` merges them once all have finished. The result is the same as that of one
run on any number of ranks.
"""

from __future__ import annotations

import hashlib
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import yaml

from .. import __version__
from ..errors import StoreError, SweepError, WorldError
from ..model.cost import fuse
from ..model.schema import RESULT_DTYPE, Reason, concat_records
from ..model.search import DEFAULT_BLOCK, search_cases, search_range
from ..model.topn import merge_top_n
from .catalog import load_checked
from .lock import RunLock
from .parallel import STOP_GRACE_S
from .partition import (
    MAX_SHARDS,
    SHARD_STRIDE,
    imbalance,
    shard_of_units,
    shard_worker,
    share_units,
    unit_progress,
)
from .plan import (
    SEAL_ROWS,
    Plan,
    SpaceCache,
    batched_units,
    estimate_memory,
    make_plan,
    measure_working_set,
    refuse_over,
    rss_bytes,
    warm_up,
)
from .reduce import RESULTS_NAME, SPEC_NAME, ReduceSummary, check_segments, reduce_run
from .spec import DEFAULT_MAX_VARIANTS, load_spec, parse_spec, resolved_yaml
from .store import (
    DONE_DTYPE,
    TOP_DTYPE,
    CorruptFileError,
    list_parts,
    part_path,
    part_worker,
    read_part,
    read_part_done,
    read_results_attrs,
    remove_temporaries,
    write_part,
    write_text_atomic,
)

__all__ = ["RunOptions", "RunSummary", "run_sweep", "Interrupted"]


class Interrupted(SweepError):
    """The run stopped on a signal after saving its progress (exit code 143)."""

    collective = True  # every rank raises it (they agreed on the stop)


def _collective(exc: SweepError) -> SweepError:
    """Mark an error that every rank raises alike (no rank is left waiting)."""
    exc.collective = True  # type: ignore[attr-defined]
    return exc


@dataclass
class RunOptions:
    out_dir: Path | None = None  # default results/<spec name>
    resume: bool = False  # continue an earlier run in out_dir
    force: bool = False  # discard an earlier run in out_dir
    checkpoint_s: float = 60.0  # rewrite the part file at least this often
    reduce: bool = True  # rank 0 writes sweep.h5 when the run is complete
    block_size: int = DEFAULT_BLOCK
    progress: Callable[[dict], None] | None = None  # rank 0: called with progress records
    shard: tuple[int, int] | None = None  # (index, count): run only this shard; implies resume
    max_variants: int = DEFAULT_MAX_VARIANTS  # refuse specs with more hardware variants
    overrides: tuple[str, ...] = ()  # KEY=VALUE items applied to the spec (sweep run --set)
    warn: Callable[[str], None] | None = None  # rank 0: called with warnings (corrupt parts)
    notice: Callable[[str], None] | None = None  # rank 0: what the run is doing (compiling)
    max_memory: float | None = None  # bytes: refuse a run estimated to need more on a rank


#: seconds rank 0 waits for its first block (or the memory estimate's warm-up) before
#: saying why it has not got there: numba compiling the model's loops
STARTUP_NOTICE_S = 10.0


class _StartupNotice:
    """Rank 0's one notice that the search has not started yet because numba is compiling
    the model's loops (a minute or two, on a machine's first run of a kind of job and
    hardware): a timer thread that only prints, armed while such compiling can happen (the
    first block, the memory estimate's warm-up) and stopped once that is done."""

    def __init__(self, notice: Callable[[str], None] | None) -> None:
        self.notice = notice if self.compiles() else None
        self.timer: threading.Timer | None = None
        self.fired = False

    @staticmethod
    def compiles() -> bool:
        """Whether the model runs as compiled loops (else numpy: nothing compiles)."""
        return fuse.enabled()

    def arm(self) -> None:
        if self.notice is None or self.fired or self.timer is not None:
            return
        self.timer = threading.Timer(STARTUP_NOTICE_S, self._fire)
        self.timer.daemon = True
        self.timer.start()

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fire(self) -> None:
        self.fired = True
        self.notice(f"nothing searched yet after {STARTUP_NOTICE_S:.0f} s: numba is compiling "
                    f"the model's loops (once per machine for each kind of job and hardware, "
                    f"a minute or two; kept in {fuse.cache_dir() / 'fused'})")


@dataclass
class RunSummary:
    out_dir: Path
    plan: Plan
    ranks: int
    units_mine: int
    evaluated: int  # this run, all ranks (rank 0 only; others: their own)
    wall_s: float
    busy_s: list[float] = field(default_factory=list)  # per rank
    candidates_per_rank: list[int] = field(default_factory=list)
    reduced: ReduceSummary | None = None
    resumed_units: int = 0
    shard: tuple[int, int] | None = None

    @property
    def imbalance_time(self) -> float:
        return imbalance(np.array(self.busy_s))

    @property
    def imbalance_candidates(self) -> float:
        return imbalance(np.array(self.candidates_per_rank))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _prepare(spec_path: str, options: RunOptions, size: int
             ) -> tuple[RunLock | None, tuple[str, str, np.ndarray, list[str], bool, bool, bool]]:
    """Rank 0: validate, lock and set up the folder. Returns the lock (held; None when
    nothing is written) and (spec text, out dir, the finished segments of earlier attempts,
    warnings, whether this run continues an earlier one: --resume, a shard, or a complete
    earlier run of the same spec, whether that complete run's sweep.h5 stands alone, its
    part files gone, and whether it is only shown: a complete run of the same spec in a
    folder this process cannot write). A
    corrupt part file is moved aside (``<name>.corrupt-<time>``) and its work redone. A
    shard (of ``size`` ranks) reads only its own part files: no other worker can have done
    its units (but a run with another layout, whose units it then redoes; the reduction
    drops the duplicates), and a thousand-task array does not make every task open every
    part."""
    spec = load_spec(spec_path, max_variants=options.max_variants,
                     overrides=options.overrides)
    text = resolved_yaml(spec)
    base = rss_bytes()
    cache = SpaceCache(spec.cost_model, offload=spec.offload)
    plan = make_plan(spec, cache)  # SpecError for useless GPU counts before anything is written
    if options.max_memory is not None:  # refused before anything is written, too
        plan_bytes = max(0.0, rss_bytes() - base)
        # the compiled loops loaded first (the largest case's, and a small case's batched
        # with others of its space: per-row hardware), then the working set traced
        startup_bytes = 0.0
        if len(plan.units):
            largest = int(np.argmax(plan.cases.candidates))
            warm = [int(np.flatnonzero(plan.units["case_id"] == largest)[0])]
            warm += np.flatnonzero(batched_units(plan))[:1].tolist()
            notice = _StartupNotice(options.notice)
            notice.arm()
            try:
                startup_bytes = sum(warm_up(plan, cache, plan.units[i])[1] for i in set(warm))
            finally:
                notice.disarm()
        refuse_over(estimate_memory(plan, size, base, plan_bytes,
                                    measure_working_set(plan, cache), mpi_bytes=0.0,
                                    startup_bytes=startup_bytes), options.max_memory)
    out = Path(options.out_dir) if options.out_dir else Path("results") / spec.name
    out = out.resolve()
    if (options.shard is None and not options.force and out.is_dir()
            and not os.access(out, os.W_OK) and _complete_run_of(out, text)):
        # the same spec run to the end in a folder this process cannot write (a read-only
        # file system, another user's results): shown as they are, nothing written
        shown = (f"{out} already holds a complete run of this spec: showing its results "
                 f"(the folder is read-only here: nothing written)")
        return None, (text, str(out), np.zeros(0, DONE_DTYPE), [shown], True, True, True)
    resume = options.resume or options.shard is not None  # shards start in any order
    if options.force and options.shard is not None:
        raise StoreError("--force cannot be used with --shard: the other shards share the "
                         "folder; remove it first, or use another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"{out}: cannot create the run folder ({exc.strerror})") from None
    lock = RunLock(out, None if options.shard is None else options.shard[0]).acquire()
    try:
        return lock, _prepare_locked(options, size, text, plan, out, resume)
    except BaseException:
        lock.release()
        raise


def _complete_run_of(out: Path, text: str) -> bool:
    """Whether ``out`` holds a finished, reduced run of the resolved spec ``text``."""
    stored, results = out / SPEC_NAME, out / RESULTS_NAME
    if not (stored.is_file() and results.is_file()) or stored.read_text() != text:
        return False
    try:
        return bool(read_results_attrs(results).get("complete"))
    except SweepError:  # unreadable or foreign: not ours to reuse
        return False


def _stored_name(stored: Path) -> str | None:
    """The name of the spec a run folder's spec.yaml holds (None: unreadable)."""
    try:
        raw = load_checked(stored.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return raw.get("name") if isinstance(raw, dict) else None


def _parts_complete(parts: list[Path], plan: Plan, text: str) -> bool:
    """Whether ``parts``, every one written for the resolved spec ``text`` and readable,
    hold every unit of ``plan`` searched to its end (nothing is moved or changed)."""
    if not parts:  # (nothing written: nothing to reduce either)
        return False
    sha = hashlib.sha256(text.encode()).hexdigest()
    done = []
    for p in parts:
        try:
            attrs, units = read_part_done(p)  # (not the top-N tables: the reduction reads them)
            # (a rank that stopped on a signal left its part unfinished, not sealed: a run to
            # continue; its finished cases' sealed parts say complete=False too)
            if attrs.get("spec_sha256") != sha or not (attrs.get("complete")
                                                       or attrs.get("sealed")):
                return False
            check_segments(plan.units, units, p)
        except (SweepError, OSError):  # damaged or foreign: --resume deals with it, says so
            return False
        done.append(units)
    progress, _ = unit_progress(plan.units, np.concatenate(done) if done else
                                np.zeros(0, DONE_DTYPE))
    return bool(np.all(progress >= plan.units["stop"] - plan.units["start"]))


def _prepare_locked(options: RunOptions, size: int, text: str, plan: Plan, out: Path,
                    resume: bool) -> tuple[str, str, np.ndarray, list[str], bool, bool, bool]:
    """The part of :func:`_prepare` done holding the folder lock."""
    stored = out / SPEC_NAME
    # a shard's part files (workers index * SHARD_STRIDE + rank), None for a plain run
    index = None if options.shard is None else options.shard[0]
    ours = None if index is None else (lambda worker: worker // SHARD_STRIDE == index)
    # left by a process killed while writing: all of them when we hold the lock alone, a
    # shard's own when it holds it shared with the other shards
    remove_temporaries(out, ours)
    parts = list_parts(out)
    if options.force:
        for p in parts + [out / RESULTS_NAME, stored]:
            p.unlink(missing_ok=True)
        parts = []
    warnings: list[str] = []
    kept = False  # a complete sweep.h5 of this spec whose part files are gone: it stands
    if (out / RESULTS_NAME).exists() and not (stored.exists() or parts):
        # (a results file no run of sweep left here, nor any run folder of ours: not
        # overwritten unasked)
        raise StoreError(f"{out} holds a {RESULTS_NAME} that is not a sweep run's (no "
                         f"{SPEC_NAME}); use another --out, or --force to replace it")
    if stored.exists() or parts:
        if not resume and _complete_run_of(out, text):
            # the same spec run to the end before (say, the README's command again): the
            # results stand (a run is deterministic); show them instead of refusing
            resume = True
            kept = not parts  # (removed after the reduction): nothing to merge them from
            warnings.append(f"{out} already holds a complete run of this spec: showing its "
                            f"results (--force computes them again)")
        if stored.exists() and stored.read_text() != text:
            # (the folder's spec.yaml is the spec as the run resolved it: it continues it)
            other = _stored_name(stored)
            what = (f"holds a run of another spec ({other!r})" if other != plan.spec.name
                    else "the spec (or a job / hardware file it uses) changed since this run "
                         "started")
            raise StoreError(f"{out}: {what}; continue that run as it started with sweep run "
                             f"{stored} --out {out} --resume, use another --out, or --force "
                             f"to start over")
        if not resume and _parts_complete(parts, plan, text):
            # the same spec run to the end without its reduction (--no-reduce, or shards
            # reduced with --partial before the last one ended): nothing to search, so nothing
            # to continue by mistake; reduced (unless --no-reduce again)
            resume = True
            warnings.append(f"{out} already holds a complete run of this spec, not reduced: "
                            + ("reducing it" if options.reduce else "nothing to do")
                            + " (--force computes it again)")
        if not resume:
            raise StoreError(f"{out} holds an earlier run; continue it with --resume or "
                             f"start over with --force")
    if not stored.exists():
        write_text_atomic(stored, text)
    sha = hashlib.sha256(text.encode()).hexdigest()
    if ours is not None:
        parts = [p for p in list_parts(out) if ours(part_worker(p)[0])]
    done = []
    for p in parts:
        try:
            attrs, units, _ = read_part(p)  # every table, so every checksum is verified
            if attrs.get("spec_sha256") == sha:
                check_segments(plan.units, units, p)
        except CorruptFileError as exc:  # keep it for inspection, redo its work
            aside = p.with_name(f"{p.name}.corrupt-{datetime.now():%Y%m%dT%H%M%S}")
            os.replace(p, aside)
            warnings.append(f"{exc}; moved it to {aside.name}: its work units will be redone")
            continue
        if attrs.get("spec_sha256") != sha:
            raise StoreError(f"{p}: written for another spec; remove it or use another --out")
        done.append(units)
    segments = np.concatenate(done) if done else np.zeros(0, DONE_DTYPE)
    return text, str(out), segments, warnings, resume, kept, False


class _State:
    """One rank's finished units and per-case top-N since its last seal. ``units_left``
    counts, per case, this rank's units not yet finished: a case with none left is
    *final* here, and only final cases are sealed. A case that a piece of the shared tail
    not yet handed out still holds (``last_piece``: per case, the last piece with any of its
    units, -1 for none; pieces go out in order, and ``seen`` is the last this rank took) is
    held until no such piece is left: a piece could bring more of it to this rank, whose
    top-N would then be cut in two, up to top_n more rows in a later part each time. So a
    case's top-N is never cut in two on one rank."""

    def __init__(self, top_n: int, units_left: np.ndarray | None = None,
                 last_piece: np.ndarray | None = None) -> None:
        self.top_n = top_n
        self.done: list[tuple] = []
        self.tops: dict[int, np.ndarray] = {}
        self.rows = 0  # top rows held
        self.units_left = units_left
        self.final: dict[int, int] = {}  # cases final here since the last seal -> rows held
        self.final_held = 0  # their top rows and segments
        self.last_piece = last_piece
        self.seen = -1  # the last piece of the shared tail this rank took
        self.held: set[int] = set()  # finished here, but a piece to come still holds them

    def _finish(self, cid: int) -> None:
        """Case ``cid`` has no units left on this rank: final, or held while a piece of the
        shared tail still to be handed out has some of it."""
        if self.last_piece is not None and self.last_piece[cid] > self.seen:
            self.held.add(cid)
            return
        self.final[cid] = len(self.tops[cid]) + 1
        self.final_held += self.final[cid]

    def pop_final(self) -> _State:
        """The final cases' rows and segments, taken out of this state."""
        final = set(self.final)
        out = _State(self.top_n)
        out.done = [d for d in self.done if d[1] in final]
        self.done = [d for d in self.done if d[1] not in final]
        out.tops = {cid: self.tops.pop(cid) for cid in final if cid in self.tops}
        out.rows = sum(len(v) for v in out.tops.values())
        self.rows -= out.rows
        self.final, self.final_held = {}, 0
        return out

    def load(self, done: np.ndarray, top: np.ndarray) -> None:
        self.done = [tuple(r) for r in done]
        top = top[np.argsort(top["case_id"], kind="stable")]
        res = np.zeros(len(top), RESULT_DTYPE)
        for name in RESULT_DTYPE.names:
            res[name] = top[name]
        ids, first = np.unique(top["case_id"], return_index=True)
        for cid, rows in zip(ids, np.split(res, first[1:])):
            self.tops[int(cid)] = rows
        self.rows = len(res)

    def add(self, unit: np.void, start: int, result, seconds: float, rank: int) -> None:
        """Record the segment ``[start, result.stop)`` of ``unit`` as searched."""
        oom = result.reasons.get(int(Reason.OUT_OF_MEMORY), 0)
        other = sum(v for k, v in result.reasons.items() if k != Reason.OUT_OF_MEMORY)
        self.done.append((int(unit["unit_id"]), int(unit["case_id"]), start,
                          int(result.stop), result.evaluated, result.feasible, oom, other,
                          seconds, rank))
        cid = int(unit["case_id"])
        prev = self.tops.get(cid)
        # a search's top-N is already one (best first, at most top_n rows): kept as it is
        self.tops[cid] = (result.top if prev is None
                          else merge_top_n([prev, result.top], self.top_n))
        self.rows += len(self.tops[cid]) - (0 if prev is None else len(prev))
        if self.units_left is not None and int(result.stop) == int(unit["stop"]):
            self.units_left[cid] -= 1
            if self.units_left[cid] == 0:
                self._finish(cid)

    def take(self, units: np.ndarray, piece: int = -1) -> None:
        """More units for this rank (piece ``piece`` of the shared tail): their cases are
        open again (a final case not sealed yet stops being final), and the held cases no
        piece after this one holds become final."""
        cids, counts = np.unique(units["case_id"], return_counts=True)
        for cid, k in zip(cids.tolist(), counts.tolist()):
            self.final_held -= self.final.pop(cid, 0)
            self.held.discard(cid)
            self.units_left[cid] += k
        self.seen = max(self.seen, piece)
        for cid in sorted(self.held):
            if self.last_piece[cid] <= self.seen:
                self.held.discard(cid)
                self._finish(cid)

    def tables(self) -> tuple[np.ndarray, np.ndarray]:
        done = np.array(self.done, dtype=DONE_DTYPE) if self.done else np.zeros(0, DONE_DTYPE)
        ids = sorted(self.tops)
        if not ids:
            return done, np.zeros(0, TOP_DTYPE)
        rows = concat_records([self.tops[cid] for cid in ids], RESULT_DTYPE)
        counts = np.array([len(self.tops[cid]) for cid in ids])
        top = np.zeros(len(rows), TOP_DTYPE)
        for name in RESULT_DTYPE.names:
            top[name] = rows[name]
        top["case_id"] = np.repeat(ids, counts)
        top["place"] = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
        return done, top


class _Share:
    """The shared tail of a run's work (``partition.share_units``): rank 0 hands its pieces
    out in order, to itself and to whichever rank asks first. Another rank asks for its
    next piece as soon as it starts one, so that the answer (given by rank 0 between two
    blocks of its own search, or while it waits at the end) is there when it needs it."""

    def __init__(self, comm, units: np.ndarray, piece: np.ndarray) -> None:
        self.comm, self.units = comm, units
        # piece k is units[bounds[k]:bounds[k + 1]] (pieces are contiguous and in order)
        self.bounds = np.searchsorted(piece, np.arange(int(piece.max(initial=-1)) + 2))
        self.pieces = len(self.bounds) - 1
        self.dealt = 0  # rank 0: pieces handed out
        self.asked = False  # another rank: a request waits for its answer

    def _deal(self) -> int:
        if self.dealt >= self.pieces:
            return -1
        self.dealt += 1
        return self.dealt - 1

    def serve(self) -> None:
        """Rank 0: answer the requests that have arrived (a probe when none has)."""
        if self.pieces and self.comm.rank == 0:
            self.comm.serve_work(self._deal)

    def _answer(self, halted: Callable[[], int], timeout_s: float | None = None) -> int:
        """Wait (politely) for rank 0's answer: the piece, or -1 (none left, a stop came
        while waiting, or no answer within ``timeout_s``)."""
        start, delay = time.monotonic(), 1e-4
        while True:
            arrived, piece = self.comm.poll_work()
            if arrived:
                self.asked = False
                return piece
            if halted() or (timeout_s is not None and time.monotonic() - start > timeout_s):
                return -1
            time.sleep(delay)
            delay = min(2 * delay, 0.01)

    def last_piece(self, n_cases: int) -> np.ndarray:
        """(n_cases,) the last piece with any of each case's units (-1: none)."""
        last = np.full(n_cases, -1, np.int64)
        piece = np.repeat(np.arange(self.pieces), np.diff(self.bounds))
        np.maximum.at(last, self.units["case_id"], piece)
        return last

    def take(self, halted: Callable[[], int]) -> tuple[np.ndarray, int] | None:
        """The units of this rank's next piece and its number (None: no piece left, or a
        stop came)."""
        if not self.pieces:
            return None
        if self.comm.rank == 0:
            piece = self._deal()
        else:
            if not self.asked:
                self.comm.ask_work()
                self.asked = True
            piece = self._answer(halted)
            if piece >= 0 and not halted():  # the next one's answer comes while this is searched
                self.comm.ask_work()
                self.asked = True
        if piece < 0:
            return None
        return self.units[self.bounds[piece]:self.bounds[piece + 1]], piece

    def settle(self) -> None:
        """Before the run's end (the agreement every rank joins): take in the answer to a
        request still open (its piece is left to a resumed run), so that no request is in
        flight once all ranks have joined. Rank 0 answers while it waits there; if the
        answer has not come within STOP_GRACE_S, rank 0 is stuck and the job is aborted
        (every rank's progress is saved by then), as the agreement itself does."""
        if self.asked:
            self._answer(lambda: 0, timeout_s=STOP_GRACE_S)
            if self.asked:
                self.comm.abort_stuck(f"rank 0 did not answer a request for work within "
                                      f"{STOP_GRACE_S:.0f} s")

    def close(self) -> None:
        """After the agreement: every request and answer has been received (checked, so
        that none is pending when MPI ends)."""
        if self.pieces:
            self.comm.settle_work(STOP_GRACE_S)


class _StopFlag:
    """Set by SIGTERM / SIGINT; handlers restored on exit."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._old: dict[int, object] = {}

    def __enter__(self) -> _StopFlag:
        try:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: no signal handling
            pass
        return self

    def _handle(self, signum, frame) -> None:
        self.signal = signum

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class _SignalDuringMerge(Exception):
    """A SIGTERM / SIGINT while rank 0 merges the part files (see _merge)."""


def _merge(out: Path, plan: tuple) -> ReduceSummary:
    """Rank 0's reduction at the end of a run. A SIGTERM or SIGINT now (the other ranks have
    finished) stops the merge at once: its temporary file is removed, every part file is
    complete, and the message says how to merge them later (exit 143, as any stop)."""

    def handle(signum, frame):
        raise _SignalDuringMerge(signum)

    old = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            old[sig] = signal.signal(sig, handle)
    except ValueError:  # not the main thread: no signal handling
        pass
    try:
        return reduce_run(out, lock=False, plan=plan)
    except _SignalDuringMerge as exc:
        raise Interrupted(f"stopped by signal {exc.args[0]} while merging the part files "
                          f"into {out / RESULTS_NAME}: the run itself is complete; merge "
                          f"them with 'sweep reduce {out}'") from None
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


class _Tracker:
    """Progress of the whole run on rank 0: the other ranks post their evaluated counts
    (non-blocking, at most every ``every_s``, and once more when done); rank 0 adds them to
    its own and calls ``options.progress`` with the total. Rank 0 keeps reporting while it
    waits for the last rank, until every rank's final post has arrived. The interval grows
    with the rank count so that rank 0, which computes too, receives at most
    MAX_POSTS_PER_S posts a second (4,096 ranks: one post per rank every 4 s)."""

    POST_EVERY_S = 0.5
    MAX_POSTS_PER_S = 1000.0

    def __init__(self, comm, callback, total: int, start: float) -> None:
        self.comm, self.callback, self.total, self.start = comm, callback, total, start
        self.done = {r: 0 for r in range(comm.size)}
        self.finished: set[int] = set()
        self.stopped: set[int] = set()  # (finished on a stop signal, their work unfinished)
        self.last_post = -math.inf  # the first post is never held back
        self.every_s = max(self.POST_EVERY_S, comm.size / self.MAX_POSTS_PER_S)

    def _report(self) -> None:
        if self.callback is not None:
            self.callback({"candidates_done": sum(self.done.values()),
                           "candidates": self.total, "ranks": self.comm.size,
                           "ranks_done": len(self.finished),
                           "ranks_stopped": len(self.stopped),
                           "elapsed_s": time.monotonic() - self.start})

    def _receive(self) -> None:
        for rec in self.comm.collect():
            self.done[rec["rank"]] = rec["done"]
            if rec["final"]:
                self.finished.add(rec["rank"])
            if rec.get("stopped"):
                self.stopped.add(rec["rank"])

    def update(self, evaluated: int, final: bool, stopped: bool = False) -> None:
        """This rank's count; ``final``: its last post (``stopped``: it ends on a stop
        signal, its work unfinished)."""
        if self.comm.rank == 0:
            self.done[0] = evaluated
            if final:
                self.finished.add(0)
            if stopped:
                self.stopped.add(0)
            self._receive()
            self._report()
        elif final or time.monotonic() - self.last_post >= self.every_s:
            self.comm.post({"rank": self.comm.rank, "done": evaluated, "final": final,
                            "stopped": stopped})
            self.last_post = time.monotonic()

    def poll(self) -> None:
        """Rank 0, while it waits: take in the other ranks' posts, report if they moved."""
        if self.comm.rank == 0:
            before = len(self.finished), sum(self.done.values())
            self._receive()
            if (len(self.finished), sum(self.done.values())) != before:
                self._report()

    def finish(self, timeout_s: float | None = None) -> None:
        """Rank 0: wait (reporting) for every rank's final post; others: for delivery."""
        if self.comm.rank != 0:
            self.comm.settle(timeout_s)
            return
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        delay = 1e-3
        while len(self.finished) < self.comm.size:
            if deadline is not None and time.monotonic() > deadline:
                return
            time.sleep(delay)
            delay = min(2 * delay, 0.1)
            before = len(self.finished), sum(self.done.values())
            self._receive()
            if (len(self.finished), sum(self.done.values())) != before:
                self._report()


def run_sweep(spec_path: str, comm, options: RunOptions | None = None) -> RunSummary:
    """Run (or resume) a sweep on ``comm``; see the module docstring.

    Raises:
        SweepError: on every rank alike for bad input (``collective`` set) or after a
            signal (Interrupted); a rank's own failure (a part file it cannot write) is
            raised on that rank only, and the caller must abort the job.
    """
    options = options or RunOptions()
    if options.shard is not None and not 0 <= options.shard[0] < options.shard[1]:
        raise _collective(SweepError(f"shard {options.shard[0]}/{options.shard[1]}: expecting "
                                     f"I/K with 0 <= I < K"))
    if options.shard is not None and options.shard[1] > MAX_SHARDS:
        raise _collective(SweepError(f"shard {options.shard[0]}/{options.shard[1]}: at most "
                                     f"{MAX_SHARDS:,} shards"))
    if options.shard is not None and comm.size > SHARD_STRIDE:
        raise _collective(SweepError(f"shard {options.shard[0]}/{options.shard[1]}: at most "
                                     f"{SHARD_STRIDE:,} ranks per shard, got {comm.size:,}"))
    start_wall = time.monotonic()
    setup, lock = None, None
    if comm.rank == 0:
        try:
            lock, payload = _prepare(spec_path, options, comm.size)
            setup = ("ok", payload)
        except SweepError as exc:
            setup = ("error", (type(exc).__name__, str(exc)))
        except OSError as exc:  # read-only folder, disk full, ...: one line, nothing half-done
            where = exc.filename or "the run folder"
            setup = ("error", ("StoreError", f"{where}: {exc.strerror or exc}"))
    setup = comm.bcast(setup, root=0)
    if setup[0] == "error":  # every rank raises the same error: no rank is left waiting
        kind, message = setup[1]
        raise _collective({"StoreError": StoreError, "WorldError": WorldError}.get(
            kind, SweepError)(message))
    try:
        return _run(spec_path, comm, options, setup[1], start_wall)
    finally:
        if lock is not None:
            lock.release()


def _open_units(plan: Plan, segments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(units with ``start`` moved past what earlier attempts searched, mask of those with
    work left)."""
    progress, _ = unit_progress(plan.units, segments)
    units = plan.units.copy()
    units["start"] += progress
    return units, units["start"] < units["stop"]


#: units looked ahead for cases to search together (_batches)
BATCH_WINDOW = 4096


def _batches(plan: Plan, mine: np.ndarray, block_size: int):
    """This rank's units in groups to search in one call: whole, untouched cases whose
    candidate space is small and shared (same job, GPU count, strategy and space: they
    differ only in hardware) are gathered, from a window of BATCH_WINDOW units ahead, into
    groups of ``block_size // candidates``; every other unit comes alone. Yields (units,
    their cases); units come out in another order than ``mine``'s, each exactly once."""
    groups: dict[tuple, tuple[list, list]] = {}
    for lo in range(0, len(mine), BATCH_WINDOW):
        for unit in mine[lo:lo + BATCH_WINDOW]:
            case = plan.cases[int(unit["case_id"])]
            size = case.candidates
            whole = unit["start"] == 0 and unit["stop"] == size
            if not whole or 4 * size > block_size:
                yield [unit], [case]
                continue
            units, cases = groups.setdefault(case.space_key, ([], []))
            units.append(unit)
            cases.append(case)
            if len(units) >= block_size // size:
                yield units, cases
                del groups[case.space_key]
        for units, cases in groups.values():
            yield units, cases
        groups.clear()


def _run(spec_path: str, comm, options: RunOptions, setup: tuple, start_wall: float
         ) -> RunSummary:
    # resume: as rank 0 decided; kept: a complete sweep.h5 without its part files stands;
    # shown: a complete run in a folder that cannot be written, shown as it is
    text, out_str, segments, warnings, resume, kept, shown = setup
    out = Path(out_str)
    if comm.rank == 0 and options.warn is not None:
        for w in warnings:
            options.warn(w)
    spec = parse_spec(load_checked(text), str(out / SPEC_NAME),
                      max_variants=options.max_variants)
    sha = hashlib.sha256(text.encode()).hexdigest()
    cache = SpaceCache(spec.cost_model, offload=spec.offload, block_size=options.block_size)
    plan = make_plan(spec, cache)
    if shown:
        n_units, candidates = len(plan.units), int(plan.cases.candidates.sum())
        summary = RunSummary(out, plan, comm.size, 0, 0, time.monotonic() - start_wall,
                             resumed_units=n_units)
        attrs = read_results_attrs(out / RESULTS_NAME)
        summary.reduced = ReduceSummary(out / RESULTS_NAME, True, len(plan.cases), n_units,
                                        n_units, candidates,
                                        int(attrs.get("candidates_evaluated", candidates)), 0)
        return summary
    units, open_ = _open_units(plan, segments)
    if kept:
        open_[:] = False  # every unit is done: sweep.h5 says so
    if options.shard is None:
        # the work left, shared afresh among this run's ranks
        worker, workers = comm.rank, comm.size
        pending = units[open_]
        resumed = int(np.count_nonzero(~open_))
    else:
        # a fixed share of all units, so that shards starting at different times never overlap
        # (its ranks share what is left of it afresh, as a run's ranks share a run's)
        index, count = options.shard
        worker, workers = shard_worker(index, comm.rank), count * comm.size
        ours = shard_of_units(plan.units["stop"] - plan.units["start"], count) == index
        pending = units[open_ & ours]
        resumed = int(np.count_nonzero(ours & ~open_))  # this shard's share only
    owner, piece = share_units(pending["stop"] - pending["start"], comm.size)
    mine = pending[owner == comm.rank]
    share = _Share(comm, pending[owner < 0], piece[owner < 0])
    state = _State(spec.top_n, np.bincount(mine["case_id"], minlength=len(plan.cases)),
                   share.last_piece(len(plan.cases)))
    my_part = part_path(out, worker)
    if resume and my_part.exists():  # keep what this worker's part holds
        _, old_done, old_top = read_part(my_part)
        state.load(old_done, old_top)
    attrs = {"name": spec.name, "spec_sha256": sha, "rank": worker, "size": workers,
             "sweep_version": __version__}
    if options.shard is not None:
        attrs["shard"] = f"{options.shard[0]}/{options.shard[1]}"

    def flush(complete: bool) -> None:
        done, top = state.tables()
        write_part(my_part, {**attrs, "written_utc": _now(), "complete": complete}, done, top)

    sealed = [part_worker(p)[1] for p in list_parts(out, {worker})]
    seals = 1 + max([n for n in sealed if n is not None], default=-1)

    def seal_if_full() -> bool:
        """Once the final cases hold SEAL_ROWS rows, they go to a sealed part of their own
        and the rewritten part keeps the rest (a copy in both, if the rank dies between
        the two writes, counts once). Returns whether it sealed."""
        nonlocal seals
        if state.final_held < SEAL_ROWS:
            return False
        done, top = state.pop_final().tables()
        write_part(part_path(out, worker, seals), {**attrs, "written_utc": _now(),
                                                   "complete": False, "sealed": True},
                   done, top)
        seals += 1
        flush(False)
        return True

    def checkpoint() -> None:
        """Seal the finished cases once they hold SEAL_ROWS rows, else rewrite the part
        file if the last write is ``checkpoint_s`` old."""
        nonlocal last_flush
        if seal_if_full():
            last_flush = time.monotonic()
        elif time.monotonic() - last_flush >= options.checkpoint_s:
            flush(False)
            last_flush = time.monotonic()

    evaluated = 0
    busy = 0.0
    last_flush = time.monotonic()
    taken = [mine]  # this rank's units: its dealt share, then the pieces it took
    tracker = _Tracker(comm, options.progress, int((pending["stop"] - pending["start"]).sum()),
                       start_wall)
    # fault injection for the test of the abort path: the named rank fails on its first unit
    fail_rank = os.environ.get("SWEEP_TEST_FAIL_RANK")
    # a slow rank for the test of the shared tail ("RANK:SECONDS": it sleeps before each group)
    slow_rank, _, slow_s = os.environ.get("SWEEP_TEST_SLOW_RANK", "").partition(":")
    # (numba compiles the loops before the first block is done: no progress line for a
    # minute or two otherwise)
    startup = _StartupNotice(options.notice if comm.rank == 0 else None)
    with _StopFlag() as stop:
        sent = False

        def halted() -> int:
            """The signal this rank stopped on, or another rank's stop request (0: none).
            A signal of this rank's own is passed on to every other rank once."""
            nonlocal sent
            if stop.signal is not None and not sent:
                comm.send_stop(stop.signal)
                sent = True
            return stop.signal or comm.poll_stop()

        def yield_after(n: int) -> bool:  # between blocks: progress, stop, checkpoint
            startup.disarm()
            share.serve()
            tracker.update(evaluated + n, final=False)
            return bool(halted()) or time.monotonic() - last_flush >= options.checkpoint_s

        def search(units: np.ndarray) -> bool:
            """Search ``units`` (in groups where they batch); returns whether it stopped."""
            nonlocal evaluated, busy
            for batch, cases in _batches(plan, units, options.block_size):
                if fail_rank == str(comm.rank):
                    if os.environ.get("SWEEP_TEST_FAIL_KIND") == "store":  # unwritable part
                        raise StoreError(f"injected store failure on rank {comm.rank}")
                    raise RuntimeError(f"injected failure on rank {comm.rank} "
                                       f"(SWEEP_TEST_FAIL_RANK)")
                share.serve()
                if halted():
                    return True
                if slow_rank == str(comm.rank):
                    time.sleep(float(slow_s))
                if len(batch) > 1:  # whole small cases differing only in hardware: one search
                    first = cases[0]
                    t0 = time.perf_counter()
                    results = search_cases(spec.cost_model, first.job,
                                           [c.variant.hardware for c in cases],
                                           first.strategy, first.n_gpus, cache.of(first),
                                           spec.top_n, options.block_size)
                    dt = time.perf_counter() - t0
                    startup.disarm()
                    busy += dt
                    for u, result in zip(batch, results):
                        evaluated += result.evaluated
                        state.add(u, int(u["start"]), result, dt / len(batch), worker)
                    tracker.update(evaluated, final=False)
                    checkpoint()
                    if halted():
                        return True
                    continue
                unit, case = batch[0], cases[0]
                position = int(unit["start"])
                while position < unit["stop"] and not halted():
                    t0 = time.perf_counter()
                    result = search_range(spec.cost_model, case.job, case.variant.hardware,
                                          case.strategy, case.n_gpus, cache.of(case),
                                          position, int(unit["stop"]), spec.top_n,
                                          options.block_size, yield_after, cache.blocks)
                    dt = time.perf_counter() - t0
                    startup.disarm()
                    busy += dt
                    evaluated += result.evaluated
                    state.add(unit, position, result, dt, worker)
                    position = result.stop
                    tracker.update(evaluated, final=False)
                    checkpoint()
                if halted():
                    return True
            return False

        startup.arm()
        try:
            stopped_early = search(mine)
        finally:
            startup.disarm()
        if not stopped_early:
            # the shared tail: a piece at a time, while rank 0 has any left
            while (dealt := share.take(halted)) is not None:
                units_now, piece_now = dealt
                state.take(units_now, piece_now)
                taken.append(units_now)
                if search(units_now):
                    break
        share.settle()
        stopped = halted()
        if not kept:  # (kept: no part file to add to a folder that has none)
            flush(not stopped)
        tracker.update(evaluated, final=True, stopped=bool(stopped))

        def waiting() -> int:
            share.serve()
            tracker.poll()
            return halted()

        stopped = comm.agree_stop(stopped, waiting)
        share.close()
    if stopped:
        tracker.finish(timeout_s=5.0)
        again = (f"--shard {options.shard[0]}/{options.shard[1]}" if options.shard
                 else "--resume")
        raise Interrupted(f"stopped by signal {stopped} after saving progress to {out} (its "
                          f"part files); continue with 'sweep run {out / SPEC_NAME} "
                          f"--out {out} {again}' (any number of ranks)")
    tracker.finish(timeout_s=30.0)  # every final post was sent before the agreement
    mine = np.concatenate(taken)
    stats = comm.gather((evaluated, busy, int((mine["stop"] - mine["start"]).sum())), root=0)
    summary = RunSummary(out, plan, comm.size, len(mine), evaluated,
                         time.monotonic() - start_wall, resumed_units=resumed,
                         shard=options.shard)
    state = cache = None  # written out; rank 0 needs the memory for the reduction
    if comm.rank == 0:
        summary.evaluated = sum(s[0] for s in stats)
        summary.busy_s = [s[1] for s in stats]
        summary.candidates_per_rank = [s[2] for s in stats]
        if options.reduce and options.shard is None and not kept:
            # this run holds the folder lock; its plan is the stored spec's (same text)
            summary.reduced = _merge(out, (plan, text, sha))
        summary.wall_s = time.monotonic() - start_wall
    return summary

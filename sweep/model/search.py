"""Exhaustive search over a range of one case's candidate space, in bounded blocks.

``search_range`` evaluates candidates ``[start, stop)`` block by block (memory bounded by
``block_size``), keeps a running top-N and counts feasible candidates and infeasibility
reasons. It is the unit of work of a rank. Pure numpy: no MPI, files or printing.

Cases that differ only in hardware share their candidate space: a small one is searched
with the others in one block (``search_cases``), a mid-sized one case by case, where a
``BlockCache`` keeps its column blocks (and their deduplication, ``dedup.unique_rows``) for
the next case instead of writing them again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .candidates import CandidateSpace, enumerate_space
from .cost import calibrated, evaluate_columns, pack_results
from .hardware import Hardware
from .job import Job
from .rows import HardwareRows
from .schema import CANDIDATE_DTYPE, RESULT_DTYPE, Reason
from .topn import best_positions, merge_top_n

__all__ = ["SearchResult", "search_range", "search_cases", "search_case", "DEFAULT_BLOCK",
           "BlockCache", "ColumnBlock", "BLOCK_CACHE_BYTES", "BLOCK_ROW_BYTES"]

#: candidates evaluated per vectorised call: large enough to amortise numpy overhead,
#: small enough to keep a rank's memory in the tens of MB
DEFAULT_BLOCK = 65536
#: bytes a BlockCache keeps at most: a hardware grid's mid-sized spaces at one GPU count
#: (nersc-flops-capacity at 8,192 GPUs: four of 22 - 58 thousand candidates, 31 MB)
BLOCK_CACHE_BYTES = 64 * 2**20
#: bytes a kept candidate costs: its CANDIDATE columns and the inverse and first positions
#: unique_rows keeps for it
BLOCK_ROW_BYTES = 8 * (len(CANDIDATE_DTYPE.names) + 2)


class ColumnBlock(dict):
    """A column block a BlockCache keeps (what ``CandidateSpace.columns`` gives) with
    ``memo``, where pure functions of its columns (``dedup.unique_rows``) keep their results
    for the next case that reads the block. Nothing may write into a kept block's arrays
    (tests/model/test_search_batch.py evaluates kept blocks made read-only)."""

    __slots__ = ("memo",)

    def __init__(self, columns) -> None:
        super().__init__(columns)
        self.memo: dict = {}


class BlockCache:
    """Column blocks of candidate spaces, kept for the next case of the same space: cases
    that differ only in hardware (a hardware grid's variants) read the same blocks. Only
    spaces searched case by case and small enough to be met again soon are kept: more than
    ``block_size // 4`` candidates (smaller ones are searched with the other cases of their
    space in one block, ``search_cases``) and at most ``2 * block_size``; least recently
    used blocks go first, so that at most ``max_bytes`` (BLOCK_ROW_BYTES a candidate) are
    held."""

    def __init__(self, block_size: int = DEFAULT_BLOCK, max_bytes: int = BLOCK_CACHE_BYTES):
        self.min_rows, self.max_rows = block_size // 4, 2 * block_size
        self.max_bytes = max_bytes
        self.bytes = 0
        self._blocks: OrderedDict[tuple, ColumnBlock] = OrderedDict()

    def keeps(self, space: CandidateSpace) -> bool:
        """Whether blocks of ``space`` are kept."""
        return self.min_rows < space.size <= self.max_rows

    def columns(self, space: CandidateSpace, start: int, stop: int) -> dict:
        """``space.columns(start, stop)``, kept or from before when the space is kept."""
        if not self.keeps(space):
            return space.columns(start, stop)
        key = (space, int(start), int(stop))  # (the space itself: no id is reused)
        block = self._blocks.get(key)
        if block is not None:
            self._blocks.move_to_end(key)
            return block
        block = ColumnBlock(space.columns(start, stop))
        cost = BLOCK_ROW_BYTES * len(block["index"])
        if cost <= self.max_bytes:
            while self.bytes + cost > self.max_bytes:
                _, old = self._blocks.popitem(last=False)
                self.bytes -= BLOCK_ROW_BYTES * len(old["index"])
            self._blocks[key] = block
            self.bytes += cost
        return block

    def __len__(self) -> int:
        return len(self._blocks)

    def most_bytes(self, candidates: np.ndarray) -> float:
        """What the cache can come to hold over cases of these candidate counts: every kept
        space's candidates at BLOCK_ROW_BYTES, at most ``max_bytes``."""
        kept = candidates[(candidates > self.min_rows) & (candidates <= self.max_rows)]
        return min(float(self.max_bytes), BLOCK_ROW_BYTES * float(kept.sum()))


@dataclass
class SearchResult:
    """Outcome of searching part of one case."""

    top: np.ndarray  # (<= top_n,) RESULT_DTYPE, best first
    evaluated: int = 0
    feasible: int = 0
    reasons: dict[int, int] = field(default_factory=dict)  # Reason -> count (infeasible only)
    stop: int = -1  # one past the last candidate searched (< the range's end if it yielded)

    def merge(self, other: SearchResult, top_n: int) -> SearchResult:
        """Combine two results of the same case (any split of its candidates)."""
        reasons = dict(self.reasons)
        for k, v in other.reasons.items():
            reasons[k] = reasons.get(k, 0) + v
        return SearchResult(merge_top_n([self.top, other.top], top_n),
                            self.evaluated + other.evaluated, self.feasible + other.feasible,
                            reasons, stop=max(self.stop, other.stop))


def search_range(profile: str, job: Job, hw: Hardware, strategy: str, n_gpus: int,
                 space: CandidateSpace, start: int, stop: int, top_n: int,
                 block_size: int = DEFAULT_BLOCK,
                 yield_after: Callable[[int], bool] | None = None,
                 blocks: BlockCache | None = None) -> SearchResult:
    """Evaluate candidates ``[start, stop)`` of ``space`` and keep the best ``top_n``.

    ``yield_after(evaluated)`` is called after each block; if it returns True the search
    ends there and ``result.stop`` says how far it got (the caller records that part and may
    continue from it: a stop signal is honoured within one block, whatever the range).
    ``blocks``: where the space's column blocks are kept for other cases of the same space
    (the results are the same either way).
    """
    best = np.zeros(0, RESULT_DTYPE)
    evaluated = feasible = 0
    reasons: dict[int, int] = {}
    reached = stop
    partial = False
    screen = None  # (the first block's sample decides; then the block before it)
    for s in range(start, stop, block_size):
        end = min(s + block_size, stop)
        cand = blocks.columns(space, s, end) if blocks is not None else space.columns(s, end)
        cols = evaluate_columns(profile, job, hw, strategy, n_gpus, cand, scores_only=True,
                                screen=screen)
        ok = cols["feasible"]
        evaluated += len(ok)
        n_ok = int(np.count_nonzero(ok))
        screen = n_ok <= calibrated.SCREEN_MAX_FEASIBLE * len(ok)
        feasible += n_ok
        if n_ok < len(ok):  # (reason codes are a few small integers: counted, not sorted)
            counts = np.bincount(cols["reason"][~ok].astype(np.intp))
            for code in np.flatnonzero(counts).tolist():
                reasons[code] = reasons.get(code, 0) + int(counts[code])
        pos = best_positions(cols["samples_per_s"], ok, cand["index"], top_n)
        rows = _pack(cand, cols, pos)  # (feasible, best first: the first block's top-N)
        best = merge_top_n([best, rows], top_n) if len(best) else rows
        partial = partial or not cols["complete"]
        if yield_after is not None and s + block_size < stop and yield_after(evaluated):
            reached = s + block_size
            break
    if len(best) and partial:  # (some rows kept hold scores alone)
        best = _completed(profile, job, hw, strategy, n_gpus, best)
    return SearchResult(best, evaluated, feasible, reasons, stop=reached)


def search_cases(profile: str, job: Job, hws: Sequence[Hardware], strategy: str, n_gpus: int,
                 space: CandidateSpace, top_n: int, block_size: int = DEFAULT_BLOCK
                 ) -> list[SearchResult]:
    """Search the whole of ``space`` for each of several hardware variants ``hws`` (cases
    that differ only in hardware, so share one candidate space), packing ``block_size //
    space.size`` variants into each block: one cost-core call per block instead of one per
    case. Each result is the one :func:`search_range` gives that case alone.
    """
    size = space.size
    per_block = max(1, block_size // max(size, 1))
    if per_block < 4 or len(hws) == 1:  # big spaces: little to share
        return [search_range(profile, job, hw, strategy, n_gpus, space, 0, size, top_n,
                             block_size) for hw in hws]
    base = space.columns(0, size)
    out: list[SearchResult] = []
    for lo in range(0, len(hws), per_block):
        chunk = hws[lo:lo + per_block]
        k = len(chunk)
        cand = {name: np.tile(col, k) for name, col in base.items()}
        variant = np.repeat(np.arange(k, dtype=np.int64), size)
        rows_hw = HardwareRows(chunk, variant)
        cols = evaluate_columns(profile, job, rows_hw, strategy, n_gpus, cand,
                                scores_only=True, screen=None)
        ok = cols["feasible"]
        feasible = np.bincount(variant[ok], minlength=k)
        reasons: list[dict[int, int]] = [{} for _ in range(k)]
        if not ok.all():
            bad = ~ok
            pairs, counts = np.unique(variant[bad] * 256 + cols["reason"][bad].astype(np.int64),
                                      return_counts=True)
            for pair, count in zip(pairs.tolist(), counts.tolist()):
                reasons[pair // 256][pair % 256] = count
        pos = _best_positions_by_variant(cols["samples_per_s"], ok, cand["index"], k, size,
                                         top_n)
        rows = _pack(cand, cols, pos)
        if not cols["complete"]:
            rows = _completed(profile, job, rows_hw.take(pos), strategy, n_gpus, rows)
        bounds = np.searchsorted(variant[pos], np.arange(k + 1))
        for i in range(k):
            top = np.empty(bounds[i + 1] - bounds[i], RESULT_DTYPE)  # own dtype (topn.py)
            top[...] = rows[bounds[i]:bounds[i + 1]]
            out.append(SearchResult(top, size, int(feasible[i]), reasons[i], stop=size))
    return out


def _pack(cand, cols, pos) -> np.ndarray:
    """``RESULT_DTYPE`` rows of the candidates at ``pos``, with the metrics ``cols`` has (a
    scores-only evaluation: the others zero until :func:`_completed`)."""
    if cols["complete"]:
        return pack_results(cand, cols, pos)
    out = np.zeros(len(pos), RESULT_DTYPE)
    for name in CANDIDATE_DTYPE.names:
        out[name] = np.asarray(cand[name])[pos]
    for name in ("step_time_s", "samples_per_s", "reason", "feasible"):
        out[name] = np.asarray(cols[name])[pos]
    return out


def _completed(profile, job, hw, strategy, n_gpus, rows: np.ndarray) -> np.ndarray:
    """``rows`` (of a scores-only evaluation) with every metric: those candidates evaluated
    again in full (evaluation is elementwise, so a row's results do not depend on the block
    it was evaluated in; tests/model/test_fuse.py)."""
    sub = {name: rows[name] for name in CANDIDATE_DTYPE.names}
    return pack_results(sub, evaluate_columns(profile, job, hw, strategy, n_gpus, sub))


def _best_positions_by_variant(score: np.ndarray, feasible: np.ndarray, index: np.ndarray,
                               k: int, size: int, n: int) -> np.ndarray:
    """Positions of the best ``n`` feasible rows of each of ``k`` consecutive runs of
    ``size`` rows, run by run, best first within each (the order of topn.best_positions)."""
    if n <= 0:
        return np.zeros(0, np.int64)
    keep = feasible
    if size > 4 * n + 64:  # keep what reaches each run's n-th best, then sort exactly
        masked = np.where(feasible, score, -np.inf).reshape(k, size)
        kth = np.partition(masked, size - n, axis=1)[:, size - n]
        keep = feasible & (masked >= kth[:, None]).ravel()
    pos = np.flatnonzero(keep)
    run = pos // size
    pos = pos[np.lexsort((index[pos], -score[pos], run))]
    run = pos // size
    first = np.searchsorted(run, np.arange(k))
    place = np.arange(len(pos)) - first[run]
    return pos[place < n]


def search_case(profile: str, job: Job, hw: Hardware, strategy: str, n_gpus: int, top_n: int,
                block_size: int = DEFAULT_BLOCK, offload: bool = False) -> SearchResult:
    """Enumerate and search a whole case (serially); ``offload`` adds the host-tier options."""
    space = enumerate_space(profile, job, n_gpus, strategy, hw.nvlink_domain,
                            offload and hw.host_memory_bytes > 0)
    return search_range(profile, job, hw, strategy, n_gpus, space, 0, space.size, top_n,
                        block_size)


def reason_name(code: int) -> str:
    """Readable name of a reason code."""
    return Reason(code).name.lower()

"""Exhaustive search over a range of one case's candidate space, in bounded blocks.

``search_range`` evaluates candidates ``[start, stop)`` block by block (memory bounded by
``block_size``), keeps a running top-N and counts feasible candidates and infeasibility
reasons. It is the unit of work of a rank. Pure numpy: no MPI, files or printing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .candidates import CandidateSpace, enumerate_space
from .cost import evaluate_columns, pack_results
from .hardware import Hardware
from .job import Job
from .schema import RESULT_DTYPE, Reason
from .topn import best_positions, merge_top_n

__all__ = ["SearchResult", "search_range", "search_case", "DEFAULT_BLOCK"]

#: candidates evaluated per vectorised call: large enough to amortise numpy overhead,
#: small enough to keep a rank's memory in the tens of MB
DEFAULT_BLOCK = 65536


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
                 yield_after: Callable[[int], bool] | None = None) -> SearchResult:
    """Evaluate candidates ``[start, stop)`` of ``space`` and keep the best ``top_n``.

    ``yield_after(evaluated)`` is called after each block; if it returns True the search
    ends there and ``result.stop`` says how far it got (the caller records that part and may
    continue from it: a stop signal is honoured within one block, whatever the range).
    """
    best = np.zeros(0, RESULT_DTYPE)
    evaluated = feasible = 0
    reasons: dict[int, int] = {}
    reached = stop
    for s in range(start, stop, block_size):
        cand = space.columns(s, min(s + block_size, stop))
        cols = evaluate_columns(profile, job, hw, strategy, n_gpus, cand)
        ok = cols["feasible"]
        evaluated += len(ok)
        n_ok = int(np.count_nonzero(ok))
        feasible += n_ok
        if n_ok < len(ok):
            codes, counts = np.unique(cols["reason"][~ok], return_counts=True)
            for code, count in zip(codes.tolist(), counts.tolist()):
                reasons[code] = reasons.get(code, 0) + count
        pos = best_positions(cols["samples_per_s"], ok, cand["index"], top_n)
        best = merge_top_n([best, pack_results(cand, cols, pos)], top_n)
        if yield_after is not None and s + block_size < stop and yield_after(evaluated):
            reached = s + block_size
            break
    return SearchResult(best, evaluated, feasible, reasons, stop=reached)


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

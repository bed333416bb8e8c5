"""Top-N selection with a deterministic order.

Rows are ranked by throughput (``samples_per_s``, descending), ties broken by the candidate
``index`` (ascending), which is fixed by the case's enumeration. Only feasible rows enter a
top-N. Because the key is total, selecting per block, per rank, at the gather and in the
offline reduce (:func:`merge_top_n` over any grouping) gives the same table. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .schema import RESULT_DTYPE, concat_records

__all__ = ["best_positions", "select_top_n", "merge_top_n"]


def best_positions(samples_per_s: np.ndarray, feasible: np.ndarray, index: np.ndarray,
                   n: int) -> np.ndarray:
    """Positions of the best ``n`` feasible rows, best first.

    Order: ``samples_per_s`` descending, then ``index`` ascending.
    """
    pos = np.flatnonzero(feasible)
    if n <= 0 or len(pos) == 0:
        return pos[:0]
    score = samples_per_s[pos]
    if len(pos) > 4 * n + 64:
        # keep everything at least as good as the n-th best throughput, then sort exactly
        kth = np.partition(score, len(score) - n)[len(score) - n]
        keep = score >= kth
        pos, score = pos[keep], score[keep]
    order = np.lexsort((index[pos], -score))
    return pos[order[:n]]


def select_top_n(rows: np.ndarray, n: int) -> np.ndarray:
    """The best ``n`` feasible rows of a ``RESULT_DTYPE`` table, best first (a copy)."""
    pos = best_positions(rows["samples_per_s"], rows["feasible"], rows["index"], n)
    # into an array of the RESULT_DTYPE object itself: np.concatenate gives its result a
    # fresh copy of the structured dtype (4.6 KB of field tables), which a kept top-N would
    # otherwise hold once per case (measured: most of the 8 KB per case of a run)
    out = np.empty(len(pos), RESULT_DTYPE)
    out[...] = rows[pos]
    return out


def merge_top_n(tables: Iterable[np.ndarray], n: int) -> np.ndarray:
    """Merge top-N tables (of the same case) into one top-N."""
    tables = [t for t in tables if len(t)]
    if not tables:
        return np.zeros(0, dtype=RESULT_DTYPE)
    return select_top_n(concat_records(tables, RESULT_DTYPE), n)

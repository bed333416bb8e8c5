"""Top-N selection with a deterministic order.

Rows are ranked by throughput (``samples_per_s``, descending), ties broken by the candidate
``index`` (ascending), which is fixed by the case's enumeration. Only feasible rows enter a
top-N. Because the key is total, selecting per block, per rank, at the gather and in the
offline reduce (:func:`merge_top_n` over any grouping) gives the same table. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .schema import RESULT_DTYPE

__all__ = ["select_top_n", "merge_top_n", "rank_order"]


def rank_order(rows: np.ndarray) -> np.ndarray:
    """Indices that sort ``rows`` best first: samples_per_s desc, then index asc."""
    return np.lexsort((rows["index"], -rows["samples_per_s"]))


def select_top_n(rows: np.ndarray, n: int) -> np.ndarray:
    """The best ``n`` feasible rows of a block, best first (a copy)."""
    feasible = rows[rows["feasible"]]
    if n <= 0:
        return feasible[:0].copy()
    if len(feasible) > 4 * n + 64:
        # keep everything at least as good as the n-th best throughput, then sort exactly
        kth = np.partition(-feasible["samples_per_s"], n - 1)[n - 1]
        feasible = feasible[-feasible["samples_per_s"] <= kth]
    return feasible[rank_order(feasible)[:n]].copy()


def merge_top_n(tables: Iterable[np.ndarray], n: int) -> np.ndarray:
    """Merge top-N tables (of the same case) into one top-N."""
    tables = [t for t in tables if len(t)]
    if not tables:
        return np.zeros(0, dtype=RESULT_DTYPE)
    return select_top_n(np.concatenate(tables), n)

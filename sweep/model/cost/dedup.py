"""Evaluate a sub-model once per distinct key instead of once per candidate.

The per-layer model of a candidate depends only on a few columns (micro-batch, tensor
degrees, their NVLink placement); a block of 60 000 candidates typically has a few hundred
distinct layer keys. ``unique_rows`` finds them and the inverse map that gathers the
results back. Pure numpy, or from COMPILED_MIN_ROWS rows one compiled loop (numba, when fused
evaluation is on: sweep.model.cost.fuse) giving the same arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["unique_rows"]


def unique_rows(cols: Mapping[str, np.ndarray], keys: Sequence[str],
                return_first: bool = False) -> tuple:
    """Distinct rows of ``cols`` restricted to ``keys``.

    Returns:
        ``(unique, inverse)``: ``unique`` maps each key to a (U,) int64 array and
        ``cols[k] == unique[k][inverse]`` for every key; with ``return_first`` also
        ``first``, the (U,) position of each distinct row's first occurrence. A kept column
        block (``search.ColumnBlock``: its ``memo``) is deduplicated once per keys: the
        next case that reads the block gets the same arrays (not to be written into).
    """
    memo = getattr(cols, "memo", None)
    if memo is None:
        return _unique_rows(cols, keys, return_first)
    key = (tuple(keys), return_first)
    found = memo.get(key)
    if found is None:
        found = memo[key] = _unique_rows(cols, keys, return_first)
    return (dict(found[0]),) + found[1:]  # (a caller may add to its dict of distinct rows)


def _unique_rows(cols: Mapping[str, np.ndarray], keys: Sequence[str],
                 return_first: bool = False) -> tuple:
    """unique_rows without a memo."""
    arrays = [np.asarray(cols[k], dtype=np.int64) for k in keys]
    n = len(arrays[0]) if arrays else 0
    if n == 0:
        empty = np.zeros(0, np.int64)
        out = {k: empty for k in keys}
        return (out, empty, empty) if return_first else (out, empty)
    kernel = _unique_kernel() if n >= COMPILED_MIN_ROWS else None
    if kernel is not None:
        inverse = np.empty(n, np.int64)
        first = np.empty(n, np.int64)
        try:
            u = kernel(tuple(np.ascontiguousarray(a) for a in arrays), max(4 * n, 1 << 16),
                       inverse, first)
        except Exception:  # noqa: BLE001 (numba's compile or load errors: numpy from now on)
            _COMPILED["unique"] = None
        else:
            first = first[:u]
            uniq = {k: a[first] for k, a in zip(keys, arrays)}
            return (uniq, inverse, first) if return_first else (uniq, inverse)
    # mixed-radix packing into one int64 when the value ranges allow it (they almost always do)
    lows = [int(a.min()) for a in arrays]
    spans = [int(a.max()) - lo + 1 for a, lo in zip(arrays, lows)]
    bits = sum(max(s - 1, 1).bit_length() for s in spans)
    if bits <= 62:
        # the first key most significant; a table over the packed range instead of a sort
        # gives the same sorted distinct values, inverse and first occurrences as np.unique
        # in O(n + range). The range is kept within the table's limit: before a key would
        # take it past, the keys packed so far are replaced by their rank among their
        # distinct values (order kept); a key too wide even then is ranked by a sort
        limit = max(4 * n, 1 << 16)
        packed = np.zeros(n, dtype=np.int64)
        size = 1
        for a, lo, span in zip(arrays, lows, spans):
            if size > 1 and size * span > limit:
                values = _distinct_sorted(packed, size)
                packed, size = _rank(packed, values, size), len(values)
            packed *= span
            packed += a - lo
            size *= span
            if size > limit:
                values, packed = np.unique(packed, return_inverse=True)
                packed, size = packed.ravel().astype(np.int64), len(values)
        values = _distinct_sorted(packed, size)
        inverse = _rank(packed, values, size)
        first = np.full(len(values), n, dtype=np.int64)
        np.minimum.at(first, inverse, np.arange(n, dtype=np.int64))
    else:
        stacked = np.stack(arrays, axis=1)
        _, first, inverse = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
    uniq = {k: a[first] for k, a in zip(keys, arrays)}
    return (uniq, inverse.ravel(), first) if return_first else (uniq, inverse.ravel())


def _distinct_sorted(packed: np.ndarray, size: int) -> np.ndarray:
    """The distinct values of ``packed`` (each in [0, size)), ascending."""
    seen = np.zeros(size, dtype=bool)
    seen[packed] = True
    return np.flatnonzero(seen)


def _rank(packed: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Each of ``packed``'s position among ``values`` (its distinct values, ascending)."""
    lookup = np.empty(size, dtype=np.int64)
    lookup[values] = np.arange(len(values))
    return lookup[packed]


#: blocks from this many rows are deduplicated by the compiled loop when fused evaluation is on
COMPILED_MIN_ROWS = 512


def _unique_loop(keys, limit, inverse, first):  # pragma: no cover (compiled)
    """unique_rows' algorithm as one compiled loop (numba): the keys (a tuple of int64
    arrays, the first most significant) packed mixed-radix into one code per candidate;
    before a key would take the packed range past ``limit``, the codes so far are replaced
    by their rank among their distinct values (order kept), and a key wider than ``limit``
    by itself is ranked by a sort (as is the packed range if it still exceeds ``limit``).
    Each key enters as its rank among its distinct values (order kept), so the packed
    range is the product of the keys' distinct counts, not of their ranges (an MoE
    block's expert degrees, 1 - 64, are 7 powers of two).
    Writes each candidate's row's rank among the distinct rows (``inverse``) and each
    distinct row's first position (``first[:u]``); returns u."""
    k, n = len(keys), len(keys[0])
    packed = np.zeros(n, np.int64)
    size = 1
    for j in range(k):
        col = keys[j]
        lo = col[0]
        hi = col[0]
        for i in range(n):  # (min and max: reductions LLVM vectorises; the ifs it did not)
            lo = min(lo, col[i])
            hi = max(hi, col[i])
        wide = float(hi) - float(lo) + 1.0 > limit
        if wide:  # (rank this key by a sort: its distinct values, not its range)
            values = np.unique(col)
            span = len(values)
        else:
            span = hi - lo + 1
            if span == 1:  # (a constant key: no digit)
                continue
        dense = False  # (every value of the range present: its rank is value - lo)
        if not wide:  # (a key's distinct values, not its range: 1 - 64 is 7 powers of 2)
            rank = np.zeros(span, np.int64)
            if span <= 64:  # (the values present as the bits of a word: no scatter)
                present = np.uint64(0)
                for i in range(n):
                    present |= np.uint64(1) << np.uint64(col[i] - lo)
                for v in range(span):
                    if present & (np.uint64(1) << np.uint64(v)):
                        rank[v] = 1
            else:
                for i in range(n):
                    rank[col[i] - lo] = 1
            distinct = 0
            for v in range(span):
                if rank[v]:
                    rank[v] = distinct
                    distinct += 1
            dense = distinct == span
            span = distinct
        if size > 1 and span > limit // size:
            size = _rank_in_place(packed, size)
        if wide:
            ranks = np.searchsorted(values, col)
            for i in range(n):
                packed[i] = packed[i] * span + ranks[i]
        elif dense:  # (no table: arithmetic that vectorises)
            for i in range(n):
                packed[i] = packed[i] * span + (col[i] - lo)
        else:
            for i in range(n):
                packed[i] = packed[i] * span + rank[col[i] - lo]
        size *= span
        if size > limit:  # (the ranked prefix times a wide key: ranked by a sort)
            values = np.unique(packed)
            packed = np.searchsorted(values, packed)
            size = len(values)
    # each code's rank among the distinct codes, written as the inverse (with each distinct
    # row's first position) in the same pass
    lookup, u = _ranks(packed, size)
    for i in range(u):
        first[i] = n
    for i in range(n):
        r = lookup[packed[i]]
        inverse[i] = r
        if first[r] == n:
            first[r] = i
    return u


def _ranks(packed, size):  # pragma: no cover (compiled)
    """(each code's rank among the distinct codes of ``packed`` (in [0, size)), by code;
    how many there are)."""
    lookup = np.full(size, -1, np.int64)
    for i in range(len(packed)):
        lookup[packed[i]] = 0
    u = 0
    for v in range(size):
        if lookup[v] == 0:
            lookup[v] = u
            u += 1
    return lookup, u


def _rank_in_place(packed, size):  # pragma: no cover (compiled)
    """Each code of ``packed`` (in [0, size)) replaced by its rank among the distinct
    codes; returns how many there are."""
    lookup, u = _ranks(packed, size)
    for i in range(len(packed)):
        packed[i] = lookup[packed[i]]
    return u


_COMPILED: dict[str, object] = {}


def _unique_kernel():
    """_unique_loop compiled, or None: when fused evaluation is off (numba missing or
    SWEEP_FUSE=0) or the loop cannot be had (e.g. no writable cache directory); compiled as
    fuse.py compiles its loops (fuse.load_kernel)."""
    from . import fuse

    if not fuse.enabled():
        return None
    if "unique" not in _COMPILED:
        _COMPILED["unique"] = fuse.compile_loop(_ranks, _rank_in_place, _unique_loop)
    return _COMPILED["unique"]

"""Evaluate a sub-model once per distinct key instead of once per candidate.

The per-layer model of a candidate depends only on a few columns (micro-batch, tensor
degrees, their NVLink placement); a block of 60 000 candidates typically has a few hundred
distinct layer keys. ``unique_rows`` finds them and the inverse map that gathers the
results back. Pure numpy.
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
        ``first``, the (U,) position of each distinct row's first occurrence.
    """
    arrays = [np.asarray(cols[k], dtype=np.int64) for k in keys]
    n = len(arrays[0]) if arrays else 0
    if n == 0:
        empty = np.zeros(0, np.int64)
        out = {k: empty for k in keys}
        return (out, empty, empty) if return_first else (out, empty)
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

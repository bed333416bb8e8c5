"""Enumerate every parallel configuration of one case, in blocks of bounded size.

A case (job x hardware variant x GPU count x strategy) has a *candidate space*: every
DP x TP (x TP2 / CP) x PP x micro-batch x ... x NVLink placement that the profile's rules
allow. The space is held compactly as a small table of *base rows* (the parallel degrees)
times *inner axes* (options such as the NVLink placement tuples, valid per base row), and
``block(start, stop)`` materialises rows ``[start, stop)`` only. Every candidate has a stable
``index`` in its space, which partitions work across ranks and breaks ties in the top-N.

Pure numpy: no I/O, no MPI. With fused evaluation on (numba; sweep.model.cost.fuse), a
large block's columns are written by one compiled loop instead (the same integers, tested).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

import numpy as np

from .job import Job
from .schema import CANDIDATE_DTYPE, Recompute, empty_candidates

__all__ = ["CandidateSpace", "InnerAxis", "to_records", "enumerate_space", "divisors",
           "ordered_factorizations", "enumerate_nersc", "enumerate_calibrated",
           "last_stage_layers", "stage_layers", "FIRST_K_FRACTIONS", "first_k_layers",
           "summa_nb_options", "NERSC_STRATEGIES", "NERSC_FIELDS", "summa_models",
           "block_kind", "mamba_cp_ok"]

NERSC_STRATEGIES = ("1d", "2d", "2d-seqp")
_NV_DEGREE = {"nv_tp": "tp", "nv_tp2": "tp2", "nv_cp": "cp", "nv_dp": "dp", "nv_pp": "pp"}
#: _NV_DEGREE as CANDIDATE field positions (what the compiled columns loop reads)
_NV_FIELDS = np.array([[CANDIDATE_DTYPE.names.index(nv), CANDIDATE_DTYPE.names.index(d)]
                       for nv, d in _NV_DEGREE.items()], np.int64)


@lru_cache(maxsize=4096)
def _divisors_tuple(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


def divisors(n: int) -> np.ndarray:
    """All positive divisors of ``n``, ascending."""
    return np.array(_divisors_tuple(int(n)), dtype=np.int64)


@lru_cache(maxsize=256)
def ordered_factorizations(n: int, k: int) -> np.ndarray:
    """All ordered k-tuples of positive integers whose product is exactly ``n``, shape (K, k).

    Order: lexicographic in the first factor, then the second, ... (the nested loops over
    ``factors()`` of the NERSC code, execution.py nv_candidates_1d/2d).
    """
    if k == 1:
        return np.array([[n]], dtype=np.int64)
    rows = []
    for d in _divisors_tuple(n):
        for rest in ordered_factorizations(n // d, k - 1):
            rows.append((d, *rest))
    return np.array(rows, dtype=np.int64)


@dataclass(frozen=True)
class InnerAxis:
    """Options expanded under every base row (e.g. NVLink placements).

    ``options`` is a structured array of K options over some candidate columns; ``valid`` is a
    (P, K) mask of which options are allowed, and ``pattern`` the (B,) row of ``valid`` each
    base row takes (None: P = B, one mask per base row). Base rows that differ only in
    columns the rule ignores share a mask, so an axis costs P x K, not B x K. A value of 0
    in an ``nv_*`` column means "the whole group inside one domain" and resolves to the
    group's degree.
    """

    options: np.ndarray
    valid: np.ndarray
    pattern: np.ndarray | None = None

    @property
    def rows(self) -> np.ndarray:
        """(B,) each base row's mask (row of ``valid``)."""
        return (np.arange(len(self.valid), dtype=np.int64) if self.pattern is None
                else np.asarray(self.pattern, np.int64))

    @property
    def counts(self) -> np.ndarray:
        """(B,) valid options per base row."""
        return self.valid.sum(axis=1).astype(np.int64)[self.rows]

    @property
    def order(self) -> np.ndarray:
        """(P, K) per mask, its valid option indices first, in option order (then the others,
        never read)."""
        return self.order_and_counts()[0]

    def order_and_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(:attr:`order` as int64, (P,) valid options per mask), from one compiled pass
        over the masks once numba is loaded (a space's set-up: the argsort alone cost
        about 35 us of a 2,544-candidate case's 0.9 ms)."""
        kernel = _compiled("mask-order") if "numba" in sys.modules else None
        if kernel is not None:
            valid = np.ascontiguousarray(self.valid, np.bool_)
            order = np.empty(valid.shape, np.int64)
            counts = np.empty(valid.shape[0], np.int64)
            try:
                kernel(valid, order, counts)
                return order, counts
            except Exception:  # noqa: BLE001 (numba's compile or load errors: numpy from now on)
                _COMPILED["mask-order"] = None
        # (valid options first, each part in option order: distinct keys, so any sort gives
        # the stable order; faster than a stable sort of the mask)
        width = self.valid.shape[1]
        order = np.argsort(np.where(self.valid, 0, width) + np.arange(width), axis=1)
        return order.astype(np.int64, copy=False), self.valid.sum(axis=1).astype(np.int64)

    @staticmethod
    def by_key(options: np.ndarray, n_rows: int, key, rule) -> InnerAxis:
        """The axis over ``n_rows`` base rows whose mask depends on a base row only through
        its integer ``key`` (an (n_rows,) array, or a function giving it; e.g. a product
        of degrees): ``rule(rows)`` gives the masks of the base rows at positions ``rows``
        (one row per distinct key; every row of a small base, where finding the distinct
        keys would cost more than it saves)."""
        if n_rows < BY_KEY_MIN_ROWS:
            return InnerAxis(options=options, valid=rule(np.arange(n_rows)))
        _, first, pattern = np.unique(key() if callable(key) else key, return_index=True,
                                      return_inverse=True)
        return InnerAxis(options=options, valid=rule(first), pattern=pattern.ravel())


#: bases from this many rows share masks between rows of equal key (InnerAxis.by_key)
BY_KEY_MIN_ROWS = 1024


class CandidateSpace:
    """Base rows x inner axes; rows are materialised on demand by :meth:`columns`.

    The hot path works on *column blocks* (``dict`` of contiguous int64 arrays, one per
    CANDIDATE field): a record array's columns are strided, which costs several times more
    in the vectorised cost core. :meth:`block` packs the same rows as ``CANDIDATE_DTYPE``.
    """

    def __init__(self, base: np.ndarray, axes: list[InnerAxis] | tuple = ()) -> None:
        """``base``: the base rows as ``CANDIDATE_DTYPE``, or as an (F, B) int64 matrix
        (every CANDIDATE field's row, in the dtype's order), which the space keeps as it is:
        not to be changed afterwards."""
        if base.dtype == CANDIDATE_DTYPE:
            # (F, B) every field of every base row as int64
            self._base_matrix = np.empty((len(CANDIDATE_DTYPE.names), len(base)), np.int64)
            for i, name in enumerate(CANDIDATE_DTYPE.names):
                self._base_matrix[i] = base[name]
        elif base.dtype == np.int64 and base.ndim == 2 and len(base) == len(CANDIDATE_DTYPE):
            self._base_matrix = base
        else:
            raise TypeError("base rows must have CANDIDATE_DTYPE (or be its int64 matrix)")
        self.n_base = self._base_matrix.shape[1]
        self._base_cols = dict(zip(CANDIDATE_DTYPE.names, self._base_matrix))
        self._constant = _constant_fields(self._base_matrix)
        self.axes = list(axes)
        self._patterns = [a.rows for a in self.axes]
        ordered = [a.order_and_counts() for a in self.axes]
        self._counts = [c[p] for (_, c), p in zip(ordered, self._patterns)]
        self._orders = [o.ravel() for o, _ in ordered]
        self._widths = [a.valid.shape[1] for a in self.axes]
        self._options = [{n: a.options[n].astype(np.int64) for n in a.options.dtype.names}
                         for a in self.axes]
        sizes = np.ones(self.n_base, dtype=np.int64)
        for c in self._counts:
            sizes *= c
        self.row_sizes = sizes
        self._expert_parallel = self._constant.get("ep", 0) != 1 or any(
            "ep" in opts for opts in self._options)
        self.offsets = np.zeros(self.n_base + 1, np.int64)
        np.cumsum(sizes, out=self.offsets[1:])
        self._packed_arrays: tuple | None = None  # (what the compiled columns loop reads)

    @property
    def base(self) -> np.ndarray:
        """The base rows as ``(B,) CANDIDATE_DTYPE``."""
        return to_records(self._base_cols)

    @property
    def size(self) -> int:
        """Number of candidates in the space."""
        return int(self.offsets[-1])

    def __len__(self) -> int:
        return self.size

    def ranges_where(self, fixed: Mapping[str, int]) -> list[tuple[int, int]]:
        """The candidate ranges ``[start, stop)`` that can hold a candidate with the
        ``fixed`` field values: the runs of base rows whose own fields agree with them
        (fields an inner axis varies, the NVLink placements a 0 stands for and the expert
        ranks per domain are left to the caller's check of the columns), merged."""
        varied = {name for opts in self._options for name in opts}
        keep = np.ones(self.n_base, dtype=bool)
        for name, value in fixed.items():
            if name in varied or name in _NV_DEGREE or name in ("nv_ep", "index"):
                continue
            keep &= self._base_cols[name] == value
        rows = np.flatnonzero(keep)
        if len(rows) == 0:
            return []
        # runs of consecutive rows: one range each
        breaks = np.flatnonzero(np.diff(rows) != 1)
        starts = np.r_[rows[0], rows[breaks + 1]]
        ends = np.r_[rows[breaks], rows[-1]] + 1
        return [(int(self.offsets[a]), int(self.offsets[b])) for a, b in zip(starts, ends)
                if self.offsets[b] > self.offsets[a]]

    def columns(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Candidates ``[start, stop)`` as a column block (CANDIDATE field -> int64 array)."""
        start, stop = max(0, int(start)), min(self.size, int(stop))
        if stop <= start:
            return {n: np.zeros(0, np.int64) for n in CANDIDATE_DTYPE.names}
        g = np.arange(start, stop, dtype=np.int64)
        r0 = int(np.searchsorted(self.offsets, start, side="right")) - 1
        n = len(g)
        kernel = ranks = None
        if n >= COMPILED_COLUMNS_MIN_ROWS:
            r1 = int(np.searchsorted(self.offsets, stop - 1, side="right")) - 1
            runs = n >= RUNS_MIN_ROWS_PER_BASE * (r1 - r0 + 1)
            kernel = _compiled("columns" if runs else "columns-rows")
        if kernel is not None:  # the same rows, written by one compiled loop
            mat = np.empty((len(CANDIDATE_DTYPE.names), n), np.int64)
            try:
                packed = self._packed()
                # (the runs loop reads a base row's fields together, the other each field)
                base = packed[0] if runs else self._base_matrix
                kernel(start, r0, self.offsets, base, *packed[1:], _NV_FIELDS, mat)
            except Exception:  # noqa: BLE001 (numba's compile or load errors: numpy from now on)
                _COMPILED["columns" if runs else "columns-rows"] = None
                return self.columns(start, stop)
            out = dict(zip(CANDIDATE_DTYPE.names, mat))
            ranks = _compiled("expert-ranks") if self._expert_parallel else None
            if ranks is not None:
                try:  # (nv_ep in place: what expert_ranks_per_domain gives, one pass)
                    ranks(mat, _EXPERT_RANK_FIELDS)
                except Exception:  # noqa: BLE001 (numba's compile or load errors)
                    _COMPILED["expert-ranks"] = ranks = None
        else:
            r1 = int(np.searchsorted(self.offsets, stop - 1, side="right")) - 1
            first = self.offsets[r0:r1 + 1].copy()
            last = self.offsets[r0 + 1:r1 + 2].copy()
            first[0], last[-1] = start, stop
            row = np.repeat(np.arange(r0, r1 + 1, dtype=np.int64), last - first)
            local = g - self.offsets[row]
            out = {name: (np.full(n, self._constant[name], np.int64)
                          if name in self._constant else col[row])
                   for name, col in self._base_cols.items()}
            # innermost axis varies fastest
            for counts, pattern, order, width, options in zip(
                    self._counts[::-1], self._patterns[::-1], self._orders[::-1],
                    self._widths[::-1], self._options[::-1]):
                c = counts[row]
                j = local % c
                local //= c
                opt = order[pattern[row] * width + j]
                for name, values in options.items():
                    out[name] = values[opt]
            for nv, degree in _NV_DEGREE.items():  # (the compiled loop does this itself)
                col = out[nv]
                zero = col == 0
                if zero.any():
                    col[zero] = out[degree][zero]
        if self._expert_parallel and ranks is None:
            out["nv_ep"] = expert_ranks_per_domain(out)
        out["index"] = g
        return out

    def _packed(self) -> tuple:
        """The base rows and inner axes as the flat arrays _columns_loop reads (innermost
        axis first), built once."""
        if self._packed_arrays is None:
            names = {name: i for i, name in enumerate(CANDIDATE_DTYPE.names)}
            # (B, F): a base row's fields together (what the runs loop reads)
            base = np.ascontiguousarray(self._base_matrix.T)
            rows = self.n_base
            inner = list(zip(self._counts, self._patterns, self._orders, self._widths,
                             self._options))[::-1]
            counts = np.array([c for c, _, _, _, _ in inner], np.int64).reshape(len(inner), rows)
            pattern = np.array([p for _, p, _, _, _ in inner], np.int64).reshape(len(inner),
                                                                                   rows)
            order = np.concatenate([o for _, _, o, _, _ in inner] + [np.zeros(0, np.int64)])
            order_off = _offsets([len(o) for _, _, o, _, _ in inner])[:-1]
            width = np.array([w for _, _, _, w, _ in inner], np.int64)
            fields = [names[f] for _, _, _, _, opts in inner for f in opts]
            fields_off = _offsets([len(opts) for _, _, _, _, opts in inner])
            n_opt = np.array([len(next(iter(opts.values()))) if opts else 0
                              for _, _, _, _, opts in inner], np.int64)
            values = [v for _, _, _, _, opts in inner for v in opts.values()]
            values_off = _offsets([sum(len(v) for v in opts.values())
                                   for _, _, _, _, opts in inner])[:-1]
            self._packed_arrays = (
                base, counts, pattern, order, order_off, width, np.array(fields, np.int64),
                fields_off, np.concatenate(values + [np.zeros(0, np.int64)]).astype(np.int64),
                values_off, n_opt)
        return self._packed_arrays

    def block(self, start: int, stop: int) -> np.ndarray:
        """Candidates ``[start, stop)`` as ``(stop - start,) CANDIDATE_DTYPE``."""
        return to_records(self.columns(start, stop))


def _offsets(lengths: list[int]) -> np.ndarray:
    """[0, l0, l0 + l1, ...] as int64 (a handful of Python ints: no numpy call per sum)."""
    return np.array([0, *accumulate(lengths)], np.int64)


def _constant_fields(matrix: np.ndarray) -> dict[str, int]:
    """{field: value} of the CANDIDATE fields equal in every base row (``matrix``: (fields,
    base rows), int64)."""
    if not matrix.shape[1]:
        return {}
    same = (matrix == matrix[:, :1]).all(axis=1).tolist()
    first = matrix[:, 0].tolist()
    return {n: v for n, ok, v in zip(CANDIDATE_DTYPE.names, same, first) if ok}


#: blocks from this many rows are written by the compiled loop when fused evaluation is on
COMPILED_COLUMNS_MIN_ROWS = 1024


def _fill(out, f, lo, hi, value):  # pragma: no cover (compiled)
    """``out[f, lo:hi] = value``: a slice fill for long runs, a plain loop for short ones
    (where the slice's own set-up costs more than the stores)."""
    if hi - lo >= 32:
        out[f, lo:hi] = value
    else:
        for i in range(lo, hi):
            out[f, i] = value


def _columns_loop(start, r, offsets, base, counts, pattern, order, order_off, width, fields,
                  fields_off, values, values_off, n_opt, nv_fields,
                  out):  # pragma: no cover (compiled)
    """CandidateSpace.columns' rows (compiled by numba; ``r`` the base row of ``start``),
    written in runs of equal values: under a base row, inner axis ``a`` (innermost first)
    holds each option for ``inner`` consecutive rows (the product of the counts of the
    axes inside it) and cycles through its options (in the order of the base row's mask,
    ``pattern``); a base row's own fields hold for all its rows. Each run is a fill, not a
    per-row gather. An NVLink placement left 0 takes its group's degree (``nv_fields``:
    pairs of rows of ``out``), as it is written when the degree is the base row's.
    ``base``: (base rows, fields)."""
    n = out.shape[1]
    stop = start + n
    n_fields = base.shape[1]
    n_axes = counts.shape[0]
    # the axis whose option each field holds: -1 the base row; where two axes write one
    # field the outermost axis's option stands (as the numpy loop's last write does)
    owner = np.full(n_fields, -1, np.int64)
    for a in range(n_axes):
        for q in range(fields_off[a], fields_off[a + 1]):
            owner[fields[q]] = a
    # an NVLink placement's group degree, where it is a base row's field (its 0s are then
    # resolved as they are written; the others after)
    degree_of = np.full(n_fields, -1, np.int64)
    resolved = np.zeros(nv_fields.shape[0], np.bool_)
    for p in range(nv_fields.shape[0]):
        if owner[nv_fields[p, 1]] < 0:
            degree_of[nv_fields[p, 0]] = nv_fields[p, 1]
            resolved[p] = True
    table = np.empty(max(width.max(), 1) if n_axes else 1, np.int64)
    last = offsets.shape[0] - 2  # (the last base row)
    while r <= last and offsets[r] < stop:
        lo = max(start, offsets[r])
        hi = min(stop, offsets[r + 1])
        if hi > lo:
            for f in range(n_fields):
                if owner[f] < 0:
                    value = base[r, f]
                    if value == 0 and degree_of[f] >= 0:
                        value = base[r, degree_of[f]]
                    _fill(out, f, lo - start, hi - start, value)
            p0 = lo - offsets[r]  # the block's part of the base row: positions [p0, p1)
            p1 = hi - offsets[r]
            shift = lo - start - p0  # (out's column of position p)
            inner = 1
            for a in range(n_axes):
                c = counts[a, r]
                at_order = order_off[a] + pattern[a, r] * width[a]
                k = n_opt[a]
                for q in range(fields_off[a], fields_off[a + 1]):
                    f = fields[q]
                    if owner[f] != a:
                        continue
                    at = values_off[a] + (q - fields_off[a]) * k
                    for d in range(c):  # the field's value under each of the row's options
                        table[d] = values[at + order[at_order + d]]
                        if table[d] == 0 and degree_of[f] >= 0:
                            table[d] = base[r, degree_of[f]]
                    run = p0 // inner  # (the run of position p0, and its option)
                    digit = run % c
                    if inner == 1:  # (runs of one row: the options in turn)
                        column = out[f]
                        for i in range(p0 + shift, p1 + shift):
                            column[i] = table[digit]
                            digit += 1
                            if digit == c:
                                digit = 0
                        continue
                    p = p0
                    while p < p1:
                        end = min(p1, (run + 1) * inner)
                        _fill(out, f, p + shift, end + shift, table[digit])
                        p = end
                        run += 1
                        digit += 1
                        if digit == c:
                            digit = 0
                inner *= c
        r += 1
    for p in range(nv_fields.shape[0]):
        if resolved[p]:
            continue
        nv, degree = nv_fields[p, 0], nv_fields[p, 1]
        for i in range(n):
            if out[nv, i] == 0:
                out[nv, i] = out[degree, i]


def _columns_rows_loop(start, r, offsets, base, counts, pattern, order, order_off, width,
                       fields, fields_off, values, values_off, n_opt, nv_fields,
                       out):  # pragma: no cover (compiled)
    """_columns_loop's rows row by row, for blocks of small base rows (a few candidates
    each, where a run's set-up costs more than its stores): first each row's base row and,
    per inner axis (innermost first), the option its position under the base row selects
    - the positions' mixed-radix digits counted up row by row, an odometer, instead of
    divided out of each index; then each column written in one pass; last, an NVLink
    placement left 0 takes its group's degree. ``base``: (fields, base rows)."""
    n = out.shape[1]
    n_axes = counts.shape[0]
    last = offsets.shape[0] - 2  # (the last base row)
    row = np.empty(n, np.int64)
    opt = np.empty((n_axes, n), np.int64)
    digit = np.zeros(n_axes, np.int64)
    if n:
        local = start - offsets[r]
        for a in range(n_axes):
            c = counts[a, r]
            digit[a] = local % c
            local //= c
    for i in range(n):
        row[i] = r
        for a in range(n_axes):
            opt[a, i] = order[order_off[a] + pattern[a, r] * width[a] + digit[a]]
        a = 0
        while a < n_axes:  # the next position: the innermost digit first, carrying
            digit[a] += 1
            if digit[a] < counts[a, r]:
                break
            digit[a] = 0
            a += 1
        if a == n_axes:  # past the base row's last position: the next row with any
            r += 1
            while r < last and offsets[r + 1] == offsets[r]:
                r += 1
    written = np.zeros(base.shape[0], np.bool_)
    # (where two axes write one column, the outermost axis's option stands, as the numpy
    # loop's last write does)
    for a in range(n_axes - 1, -1, -1):
        k = n_opt[a]
        for q in range(fields_off[a], fields_off[a + 1]):
            f = fields[q]
            if written[f]:
                continue
            written[f] = True
            at = values_off[a] + (q - fields_off[a]) * k
            for i in range(n):
                out[f, i] = values[at + opt[a, i]]
    for f in range(base.shape[0]):
        if not written[f]:
            for i in range(n):
                out[f, i] = base[f, row[i]]
    for p in range(nv_fields.shape[0]):
        nv, degree = nv_fields[p, 0], nv_fields[p, 1]
        for i in range(n):
            if out[nv, i] == 0:
                out[nv, i] = out[degree, i]


#: blocks whose base rows hold at least this many of the block's candidates on average
#: are written in runs (_columns_loop), others row by row (_columns_rows_loop)
RUNS_MIN_ROWS_PER_BASE = 32


_COMPILED: dict[str, object] = {}


def _nv_masks_loop(degrees, factors, factor_of, nvs, out):  # pragma: no cover (compiled)
    """_nv_axis's masks, compiled: for base row r (``degrees``: (groups, rows)), out[r, 0]
    whether its groups fit in one domain of ``nvs`` together; else out[r, 1 + t] whether
    each factor of placement t (``factors[factor_of[t]]``) divides its group's degree (a
    remainder per distinct factor, as the numpy rule takes)."""
    n_groups, n_rows = degrees.shape
    n_factors = factors.shape[0]
    whole = np.empty((n_groups, n_factors), np.bool_)
    for r in range(n_rows):
        total = 1
        for g in range(n_groups):
            total *= degrees[g, r]
        fits = total <= nvs
        out[r, 0] = fits
        for g in range(n_groups):
            for f in range(n_factors):
                whole[g, f] = degrees[g, r] % factors[f] == 0
        for t in range(factor_of.shape[0]):  # (without branches: rows alternate unpredictably)
            ok = not fits
            for g in range(n_groups):
                ok &= whole[g, factor_of[t, g]]
            out[r, 1 + t] = ok


def _mask_order_loop(valid, order, counts):  # pragma: no cover (compiled)
    """InnerAxis.order_and_counts: each row of ``order`` the positions of the row's True
    entries of ``valid``, then of its False ones, each in ascending order; ``counts`` the
    True entries."""
    for r in range(valid.shape[0]):
        k = 0
        for j in range(valid.shape[1]):
            if valid[r, j]:
                order[r, k] = j
                k += 1
        counts[r] = k
        for j in range(valid.shape[1]):
            if not valid[r, j]:
                order[r, k] = j
                k += 1


def _expert_ranks_loop(out, fields):  # pragma: no cover (compiled)
    """expert_ranks_per_domain of every row of ``out`` (fields, rows), written to its nv_ep
    row: the same integer arithmetic, one pass instead of seven numpy ones. ``fields``: the
    positions of nv_tp, nv_cp, nv_dp, etp, ep and nv_ep."""
    tp, cp, dp, etp, ep, nv_ep = fields[0], fields[1], fields[2], fields[3], fields[4], fields[5]
    for i in range(out.shape[1]):
        value = out[tp, i] * out[cp, i] * out[dp, i] // max(out[etp, i], 1)
        out[nv_ep, i] = min(max(value, 1), max(out[ep, i], 1))


#: what _expert_ranks_loop reads and writes, as CANDIDATE field positions
_EXPERT_RANK_FIELDS = np.array([CANDIDATE_DTYPE.names.index(f) for f in (
    "nv_tp", "nv_cp", "nv_dp", "etp", "ep", "nv_ep")], np.int64)


def _compiled(name: str):
    """A compiled loop of this module ("columns": _columns_loop, "columns-rows":
    _columns_rows_loop, "nv-masks": _nv_masks_loop, "expert-ranks": _expert_ranks_loop,
    "mask-order": _mask_order_loop), or
    None: when fused evaluation is off (numba missing or SWEEP_FUSE=0) or the loop cannot be
    had (e.g. no writable cache directory). Compiled as fuse.py compiles its loops: from a
    module file in its cache directory (SWEEP_CACHE_DIR), with numba's on-disk cache beside
    it."""
    from .cost import fuse

    if not fuse.enabled():
        return None
    if name not in _COMPILED:
        functions = {"columns": (_fill, _columns_loop), "columns-rows": (_columns_rows_loop,),
                     "nv-masks": (_nv_masks_loop,), "expert-ranks": (_expert_ranks_loop,),
                     "mask-order": (_mask_order_loop,)}[name]
        _COMPILED[name] = fuse.compile_loop(*functions)
    return _COMPILED[name]


def expert_ranks_per_domain(cols: dict[str, np.ndarray]) -> np.ndarray:
    """EP ranks of one expert-parallel group inside one NVLink domain, from the attention
    mesh's placement. Megatron-Core orders the expert mesh etp fastest, then ep, over the
    same ranks as the attention mesh tp, cp, dp (parallel_state.py RankGenerator, order
    "tp-cp-ep-dp-pp"), so the nv_tp x nv_cp x nv_dp GPUs of a domain hold
    (that many / etp) consecutive EP ranks, at least 1 and at most ep."""
    inside = cols["nv_tp"] * cols["nv_cp"] * cols["nv_dp"]
    return np.clip(inside // np.maximum(cols["etp"], 1), 1, np.maximum(cols["ep"], 1))


def to_records(cols: dict[str, np.ndarray], positions: np.ndarray | None = None) -> np.ndarray:
    """Pack a column block (optionally only ``positions``) into ``CANDIDATE_DTYPE``."""
    n = len(cols["index"]) if positions is None else len(positions)
    out = np.empty(n, CANDIDATE_DTYPE)
    for name in CANDIDATE_DTYPE.names:
        col = cols[name]
        out[name] = col if positions is None else col[positions]
    return out


# --------------------------------------------------------------------------------------------
# NERSC 2024 rules (reference/nersc2024_model.md section 8; execution.py of
# transformer-perf-estimates): tp | h and tp | e, pp | L, dp | gbs, mbs | gbs/dp with
# (mbs * l) % tp' == 0, minimum shards, SUMMA nb powers of two, NVLink placement tuples.
# --------------------------------------------------------------------------------------------

def summa_nb_options(tp1: int, tp2: int, e: int) -> list[int]:
    """SUMMA panel counts (execution.py summa_nb_candidates).

    Powers of two times start = max(tp1, tp2) strictly below e / start; keep those with
    e % nb == 0 and e / nb >= 512; if e / start < 512 only nb = start.
    """
    start = max(tp1, tp2)
    ks = []
    k = 0
    while (1 << k) < e // start:
        ks.append(k)
        k += 1
    nb_range = [start << k for k in ks] or [start]
    if e / nb_range[0] < 512:
        return [nb_range[0]]
    return [c for c in nb_range if e % c == 0 and e // c >= 512]


#: the neutral candidate (empty_candidates' defaults) as an (F, 1) int64 column
_NEUTRAL_COLUMN = np.array(empty_candidates(1).tolist(), np.int64).reshape(-1, 1)


def _row_key(base, fields: tuple[str, ...]) -> np.ndarray:
    """(B,) int64 equal for two base rows exactly when they agree on ``fields`` (the
    fields' offsets from their least values, in mixed radix). ``base``: records or
    columns (field -> (B,) array)."""
    key = np.zeros(len(base[fields[0]]) if fields else len(base), np.int64)
    span = 1
    for f in fields:
        col = base[f].astype(np.int64)
        if len(col):
            col -= col.min()
        radix = int(col.max(initial=0)) + 1
        if span * radix >= 2**62:  # (would overflow: each value's rank instead)
            values, col = np.unique(col, return_inverse=True)
            radix = len(values)
        if span * radix >= 2**62:  # (still: the key so far by its rank too)
            values, key = np.unique(key, return_inverse=True)
            span = len(values)
        key = key.ravel() * radix + col.ravel()
        span *= radix
    return key


@lru_cache(maxsize=256)
def _nv_options(nvs: int, groups: tuple[str, ...]) -> tuple[np.ndarray, ...]:
    """_nv_axis's options (read-only: shared by every space of this domain size and
    groups), the ordered factorisations, the domain's divisors and each factor's position
    among them."""
    tuples = ordered_factorizations(nvs, len(groups)).copy()  # (not its cached array)
    nv_names = ["nv_" + g for g in groups]
    options = np.zeros(len(tuples) + 1, dtype=[(n, "i4") for n in nv_names])
    for i, n in enumerate(nv_names):
        options[n][1:] = tuples[:, i]  # option 0 = all zeros = "each group whole"
    factors = divisors(nvs)  # (every tuple's entries are among them)
    factor_of = np.searchsorted(factors, tuples)
    for a in (options, tuples, factors, factor_of):
        a.flags.writeable = False
    return options, tuples, factors, factor_of


def _nv_axis(base, nvs: int, groups: tuple[str, ...]) -> InnerAxis:
    """NVLink placements: the whole job in one domain if it fits, else every ordered
    factorisation of the domain size whose factors divide the group degrees. ``base``:
    records or columns (field -> (B,) array)."""
    options, tuples, factors, factor_of = _nv_options(nvs, groups)

    def rule(rows: np.ndarray) -> np.ndarray:
        # compiled once numba is loaded (by a search's first compiled loop): a process that
        # only plans (status, reduce) does not load it for the ~0.1 ms a space this saves
        kernel = _compiled("nv-masks") if "numba" in sys.modules else None
        if kernel is not None:  # (one call, where the numpy below makes about forty)
            out = np.empty((len(rows), len(tuples) + 1), dtype=np.bool_)
            degrees = np.stack([base[g][rows] for g in groups], dtype=np.int64)
            try:
                kernel(degrees, factors, factor_of, nvs, out)
                return out
            except Exception:  # noqa: BLE001 (numba's compile or load errors: numpy from now on)
                _COMPILED["nv-masks"] = None
        degrees = [base[g][rows].astype(np.int64) for g in groups]
        total = degrees[0].copy()
        for d in degrees[1:]:
            total *= d
        fits = total <= nvs
        divides = np.ones((len(rows), len(tuples)), dtype=bool)
        for i, d in enumerate(degrees):  # (a remainder per distinct factor, not per tuple)
            divides &= ((d[:, None] % factors[None, :]) == 0)[:, factor_of[:, i]]
        return np.concatenate([fits[:, None], divides & ~fits[:, None]], axis=1)

    return InnerAxis.by_key(options, len(base[groups[0]]), lambda: _row_key(base, groups), rule)


#: the CANDIDATE fields enumerate_nersc sets (the others keep empty_candidates' values)
NERSC_FIELDS = frozenset(("dp", "tp", "tp2", "cp", "pp", "mbs", "nb", *_NV_DEGREE))


def enumerate_nersc(job: Job, n_gpus: int, strategy: str, nvlink_domain: int) -> CandidateSpace:
    """Every candidate the NERSC solver evaluates for one case (same set, no duplicates).

    Args:
        job: the workload (uses hidden e, heads h, layers L, seq l, global batch).
        n_gpus: GPU count n.
        strategy: ``1d`` (Megatron TP), ``2d`` (SUMMA) or ``2d-seqp`` (TP x context parallel).
        nvlink_domain: GPUs per NVLink domain.
    """
    if strategy not in NERSC_STRATEGIES:
        raise ValueError(f"unknown nersc2024 strategy {strategy!r}")
    e, h, L, l, gbs = job.hidden, job.n_heads, job.n_layers, job.seq_len, job.global_batch
    n = int(n_gpus)
    pairs: list[tuple[int, int]] = []
    for tp1 in _divisors_tuple(n):
        if h % tp1 or e % tp1:
            continue
        if strategy == "1d":
            if (3 * e) // tp1 >= 128:
                pairs.append((tp1, 1))
            continue
        if e // tp1 < 128:
            continue
        for tp2 in _divisors_tuple(n // tp1):
            if strategy == "2d" and e % tp2:
                continue
            if l // tp2 < 128:
                continue
            pairs.append((tp1, tp2))
    # (pair, pp) combinations: pp | min(n / tp, L), n % (tp pp) == 0, L % pp == 0, dp | gbs
    combos = []
    for i, (tp1, tp2) in enumerate(pairs):
        tp = tp1 * tp2
        for pp in _divisors_tuple(min(n // tp, L)):
            dp = n // (tp * pp)
            if n % (tp * pp) == 0 and L % pp == 0 and dp <= gbs and gbs % dp == 0:
                combos.append((i, tp1, tp2, pp, dp))
    cmb = np.array(combos, dtype=np.int64).reshape(-1, 5)
    tp1, tp2, pp, dp = cmb[:, 1], cmb[:, 2], cmb[:, 3], cmb[:, 4]
    # micro-batch: mbs | gbs / dp and (mbs * l) % shard == 0, where shard is what the
    # sequence is split over (1d: tp, 2d: tp2, 2d-seqp: tp1 * tp2)
    shard = {"1d": tp1, "2d": tp2, "2d-seqp": tp1 * tp2}[strategy]
    mbs_all = divisors(gbs)
    ok = ((gbs // dp)[:, None] % mbs_all[None, :] == 0) & (
        (mbs_all[None, :] * l) % shard[:, None] == 0)
    ci, mi = np.nonzero(ok)
    # SUMMA panel counts per (tp1, tp2) pair (2d only)
    nb_lists = [summa_nb_options(a, b, e) if strategy == "2d" else [1] for a, b in pairs]
    width = max((len(x) for x in nb_lists), default=1)
    nb_table = np.zeros((len(pairs), width), dtype=np.int64)
    for i, x in enumerate(nb_lists):
        nb_table[i, :len(x)] = x
    pair_of_row = cmb[ci, 0]
    ri, ni = np.nonzero(nb_table[pair_of_row] > 0)
    # (the base rows as CandidateSpace's int64 matrix, built in place: no record array)
    matrix = np.repeat(_NEUTRAL_COLUMN, len(ri), axis=1)
    base = dict(zip(CANDIDATE_DTYPE.names, matrix))
    rows_c = ci[ri]
    base["tp"][:], base["pp"][:], base["dp"][:] = tp1[rows_c], pp[rows_c], dp[rows_c]
    base["mbs"][:] = mbs_all[mi[ri]]
    base["nb"][:] = nb_table[pair_of_row[ri], ni]
    if strategy == "2d":
        base["tp2"][:] = tp2[rows_c]
    elif strategy == "2d-seqp":
        base["cp"][:] = tp2[rows_c]
    groups = {"1d": ("tp", "dp", "pp"), "2d": ("tp", "tp2", "dp", "pp"),
              "2d-seqp": ("tp", "cp", "dp", "pp")}[strategy]
    return CandidateSpace(matrix, [_nv_axis(base, nvlink_domain, groups)])


# --------------------------------------------------------------------------------------------
# calibrated profile: Megatron-style rules plus the knobs of production stacks
# --------------------------------------------------------------------------------------------

#: fractions of a stage's layers tried with first-k recompute (k rounded, 0 < k < layers)
FIRST_K_FRACTIONS = (0.25, 0.5, 0.75)


def first_k_layers(stage: int) -> list[int]:
    """The first-k recompute depths searched for stages of ``stage`` layers: a quarter, half
    and three quarters of them, rounded, strictly between 0 and ``stage``."""
    return sorted({int(round(stage * q)) for q in FIRST_K_FRACTIONS} - {0, stage})


def block_kind(job: Job) -> str:
    """What makes a job's blocks more than SUMMA's dense multi-head ones (summa_models)."""
    return ("hybrid Mamba-2" if job.is_hybrid else "MoE" if job.is_moe else
            "compressed sparse attention" if job.attention == "csa" else
            "hyper-connection" if job.hc_streams else
            "16-bit attention" if job.bf16_attention else "MLA")


def summa_models(job: Job) -> bool:
    """Whether the calibrated profile's 2d strategy (SUMMA) models the job's blocks: dense
    multi-head ones only, not mixture-of-experts, MLA or csa blocks, hyper-connections or
    hybrids."""
    return not (job.is_moe or job.attention != "mha" or job.is_hybrid or job.hc_streams
                or job.bf16_attention)


def _degree_combos(job: Job, n: int, strategy: str) -> list[tuple[int, int, int, int, int]]:
    """(tp, second, pp, dp, nb) with tp x second x pp x dp = n; ``second`` is cp (1d) or
    tp2 (2d), nb the SUMMA panel count (1 for 1d)."""
    H, Kv, f, e, s, B = (job.n_heads, job.n_kv_heads, job.ffn_hidden, job.hidden,
                         job.seq_len, job.global_batch)
    rows: list[tuple[int, int, int, int, int]] = []
    if strategy == "2d" and not summa_models(job):
        return rows
    for tp in _divisors_tuple(n):
        # heads and the MLP split evenly; KV heads split or replicated (Megatron GQA); an MoE
        # block's shared expert splits like the MLP
        if H % tp or f % tp or (Kv % tp and tp % Kv) or job.shared_ffn_hidden % tp:
            continue
        # a Mamba-2 mixer splits its heads and its groups over TP (Megatron-Core
        # mamba_mixer.py: ngroups % tp == 0)
        if job.mamba_layers and (job.mamba_heads % tp or job.mamba_groups % tp):
            continue
        # compressed sparse attention runs at TP 1 (Megatron-LM dev 35f36c7
        # deepseek_v4_hybrid_attention.py L86 - 88: notes 29)
        if job.attention == "csa" and tp > 1:
            continue
        for second in _divisors_tuple(n // tp):
            # a Mamba-2 layer under context parallelism holds a head shard of the whole
            # sequence: cp divides its heads on the TP rank, and its groups there or cp
            # theirs (Megatron-Core mamba_context_parallel.py)
            if strategy == "1d" and second > 1 and not mamba_cp_ok(job, tp, second):
                continue
            # (csa's compressors and indexer under context parallelism: not modelled)
            if job.attention == "csa" and second > 1:
                continue
            if strategy == "1d":
                # ring attention splits each sequence into 2 cp load-balanced chunks
                if second > 1 and s % (2 * second):
                    continue
                panels = [1]
            else:
                # SUMMA: tokens over tp2 and weight rows over tp2 split evenly
                if s % second or e % second or f % second or (H * job.head_dim) % second:
                    continue
                # a 1 x 1 grid broadcasts nothing: more panels would only split its GEMMs
                # into more launches of the same total work, never faster than one panel
                panels = summa_nb_options(tp, second, e) if tp * second > 1 else [1]
            for pp in _divisors_tuple(n // (tp * second)):
                dp = n // (tp * second * pp)
                # a hybrid's stages split its pattern's layers evenly (Megatron-Core
                # hybrid_layer_allocation: the pattern's length a multiple of pp)
                if job.is_hybrid and job.n_layers % pp:
                    continue
                if not bf16_ends_fit(job, pp):
                    continue
                if B % dp == 0 and last_stage_layers(job, pp) >= 1:
                    rows.extend((tp, second, pp, dp, nb) for nb in panels)
    return rows


def bf16_ends_fit(job: Job, pp: int) -> bool:
    """Whether an fp8 / MXFP8 job's 16-bit first and last layers fit its pipeline stages:
    each at most n_layers // pp (Megatron-Core transformer_config.py L1531 - 1556,
    max_bf16_layers_per_pipeline_stage)."""
    if job.dtype not in ("fp8", "mxfp8"):
        return True
    return max(job.bf16_first_layers, job.bf16_last_layers) <= job.n_layers // pp


def mamba_cp_ok(job: Job, tp: int, cp: int) -> bool:
    """Whether a job's Mamba-2 layers split over cp context-parallel ranks at tensor
    parallelism tp (Megatron-LM d98e8a6 megatron/core/ssm/mamba_context_parallel.py L106 -
    133: the TP rank's heads a multiple of cp; its groups a multiple or a divisor of cp)."""
    if not job.mamba_layers or cp == 1:
        return True
    heads, groups = job.mamba_heads // tp, job.mamba_groups // tp
    if not groups:  # (tp does not divide the groups: the TP rule's to say)
        return True
    return heads % cp == 0 and (groups % cp == 0 or cp % groups == 0)


def stage_layers(n_layers: int, pp: int, slots: bool) -> tuple[int, int, int]:
    """(first, middle, last) layers of ``pp`` pipeline stages when every stage but the last
    holds ceil(items / pp) (items: the layers, plus the embedding and the LM head as one
    each with ``slots``, taken from the first and the last stage). The cost core's
    ``layers_first`` / ``layers`` / ``layers_last`` (cost/calibrated.py) are the same rule,
    vectorized."""
    slot = 1 if slots and pp > 1 else 0
    items = n_layers + 2 * slot
    per = -(-items // pp)
    return per - slot, per, items - (pp - 1) * per - slot


def last_stage_layers(job: Job, pp: int) -> int:
    """Layers the last of ``pp`` pipeline stages holds (stage_layers, with
    ``embedding_slots``); below 1, some stage holds no layer, which the stacks refuse."""
    return stage_layers(job.blocks, pp, bool(job.embedding_slots and job.vocab))[2]


def enumerate_calibrated(job: Job, n_gpus: int, nvlink_domain: int,
                         host_memory: bool = False, strategy: str = "1d") -> CandidateSpace:
    """Every candidate of the ``calibrated`` profile for one case.

    Base rows: TP (divides heads and the MLP width; KV heads split or replicated), CP (1d:
    2 cp divides the sequence) or TP2 (2d SUMMA: divides the sequence and the weight
    widths; panels nb as the NERSC rule), PP (uneven stages allowed, each with a layer),
    DP (divides the global batch), micro-batch (divides the per-replica batch), virtual
    stages (divide the stage's layers, micro-batches a multiple of pp: Megatron's interleaved
    schedule), and the recompute policy (none, selective, per-op, full, first-k for k = 1/4,
    1/2, 3/4 of the stage). Inner axes: sequence parallelism and TP overlap ((0,0), (1,0),
    (1,1) when 1d tp > 1: overlap needs SP), the CP K/V exchange (ring or all-gather, when
    cp > 1), ZeRO stage 0-3 and FSDP hybrid shard groups (powers of two below dp), offload
    sets (when asked for and the hardware has a second memory tier), and the NVLink
    placement. Forward-only jobs drop recompute, ZeRO and virtual stages.
    """
    if strategy not in ("1d", "2d"):
        raise ValueError(f"unknown calibrated strategy {strategy!r}")
    n = int(n_gpus)
    L, B = job.blocks, job.global_batch
    degrees: list[tuple[int, ...]] = []  # (tp, second, pp, dp, nb, vpp) of each part
    micro: list[np.ndarray] = []  # its micro-batch sizes (each under every policy)
    pols: list[np.ndarray] = []  # its recompute policies, (k, 2)
    for tp, second, pp, dp, nb in _degree_combos(job, n, strategy):
        local = B // dp
        mbs = np.array(_divisors_tuple(local), dtype=np.int64)
        stage = -(-L // pp)
        # virtual stages split a full stage's layers evenly; the last stage may hold fewer
        # (Megatron-Core's pipeline_model_parallel_layout places any layer count per
        # virtual stage, e.g. DeepSeek-V3's 61 layers on 4 x 4 virtual stages of 4 and a
        # last one of 1 in Megatron-Bridge's recipes)
        # (a hybrid pattern without stage separators is not interleaved: Megatron-Core
        # hybrid_layer_allocation select_pipeline_segment)
        vpps = list(_divisors_tuple(stage)) if pp > 1 and job.training \
            and not job.is_hybrid else [1]
        policies: list[tuple[int, int]] = [(Recompute.NONE, 0)]
        if job.training:
            # (torchtitan's per-op policy is not a hybrid, csa or DSA stack's: Megatron-Core
            # runs those)
            policies += [(Recompute.SELECTIVE, 0)] + ([] if job.is_hybrid or job.dsa
                                                      or job.attention == "csa" else [
                (Recompute.OP_SAC, 0)]) + [(Recompute.FULL, 0)]
            policies += [(Recompute.FIRST_K, k) for k in first_k_layers(stage)]
        pol = np.array(policies, dtype=np.int64)
        for v in vpps:
            # interleaving needs the micro-batch count to be a multiple of pp
            ok = mbs if v == 1 else mbs[(local // mbs) % pp == 0]
            if len(ok):
                degrees.append((tp, second, pp, dp, nb, v))
                micro.append(ok)
                pols.append(pol)
    # the parts' rows: each micro-batch size under every policy, parts in order
    lengths = np.array([len(m) * len(p) for m, p in zip(micro, pols)], np.int64)
    base = empty_candidates(int(lengths.sum()))
    if len(degrees):
        per_part = np.array(degrees, np.int64)
        for i, name in enumerate(("tp", "cp" if strategy == "1d" else "tp2", "pp", "dp", "nb",
                                  "vpp")):
            base[name] = np.repeat(per_part[:, i], lengths)
        base["mbs"] = np.concatenate([np.repeat(m, len(p)) for m, p in zip(micro, pols)])
        policy_rows = np.concatenate([np.tile(p, (len(m), 1)) for m, p in zip(micro, pols)])
        base["recompute"], base["recompute_layers"] = policy_rows[:, 0], policy_rows[:, 1]
    # (absorbed MLA, DSA's, needs sequence parallelism under TP as MoE layers do:
    # absorbed_mla.py L171 - 173)
    axes = [_sp_axis(base, strategy == "1d", job.is_moe or job.dsa),
            _cp_comm_axis(base, not job.dsa),
            _zero_axis(base, job.training, job.precision_aware_optimizer)]
    if job.is_moe:
        axes.append(_expert_axis(base, job))
    if host_memory and job.training:
        # (whole-activation offload, bit 2, is cpu_offloading: Megatron-Core refuses it with
        # fine-grained offloading, transformer_config.py)
        axes.append(_offload_axis(base, fine_grained=bool(job.offload_modules)))
    groups = ("tp", "cp", "dp", "pp") if strategy == "1d" else ("tp", "tp2", "dp", "pp")
    # a job fills its NVLink domains in equal parts: 256 GPUs of NVL72 racks run as four
    # domains of 64 (the largest domain share dividing the GPU count; as sweep validate
    # places measured runs)
    filled = max(d for d in _divisors_tuple(n) if d <= max(int(nvlink_domain), 1))
    axes.append(_nv_axis(base, filled, groups))
    return CandidateSpace(base, axes)


def _cp_comm_axis(base: np.ndarray, ring: bool = True) -> InnerAxis:
    """K/V exchange of context parallelism: 0 ring, 1 all-gather (only when cp > 1); without
    ``ring`` (DeepSeek sparse attention: Megatron-Core refuses another cp_comm_type,
    transformer_config.py L3162 - 3177) the all-gather alone when cp > 1."""
    options = np.zeros(2, dtype=[("cp_comm", "i4")])
    options["cp_comm"] = (0, 1)
    split = base["cp"] > 1
    return InnerAxis.by_key(options, len(base), split.astype(np.int64),
                            lambda rows: np.stack([~split[rows] | ring, split[rows]], 1))


def _sp_axis(base: np.ndarray, megatron: bool = True, sp_required: bool = False
             ) -> InnerAxis:
    """(sp, tp_overlap): (0, 0) always; (1, 0) and (1, 1) when Megatron tp > 1. Where tp > 1
    needs sequence parallelism (``sp_required``: MoE models, Megatron-Core moe_layer.py
    MoELayer refuses tensor parallelism without it; DSA's absorbed MLA likewise): (0, 0) only
    when tp = 1."""
    options = np.array([(0, 0), (1, 0), (1, 1)], dtype=[("sp", "i4"), ("tp_overlap", "i4")])
    tp_on = (base["tp"] > 1) & megatron

    def rule(rows: np.ndarray) -> np.ndarray:
        on = tp_on[rows]
        plain = ~on if sp_required else np.ones_like(on)
        return np.stack([plain, on, on], axis=1)

    return InnerAxis.by_key(options, len(base), tp_on.astype(np.int64), rule)


def _expert_axis(base: np.ndarray, job: Job) -> InnerAxis:
    """(ep, etp, a2a_overlap) of an MoE job, exhaustively: in Megatron-Core's parallel
    folding the expert mesh etp x ep x edp covers the tp x cp x dp GPUs of a stage (MoE
    Parallel Folding, arXiv 2504.14960; parallel_state.py initialize_model_parallel), so
    etp x ep divides tp x cp x dp, ep divides the experts (arguments.py) and etp the expert
    width. The all-to-all overlap (overlap_moe_expert_parallel_comm) needs ep > 1, a
    training job, one stage or interleaved stages, and no full or first-k recompute
    (transformer_config.py __post_init__)."""
    # (fine-grained offloading of the fused grouped MLP needs Transformer Engine's op
    # fuser, which runs expert tensor parallelism 1 only: experts.py _is_fused_impl_supported)
    etps = (1,) if "fused_group_mlp" in job.offload_modules else \
        _divisors_tuple(job.moe_ffn_hidden)
    triples = [(a, b, o) for a in _divisors_tuple(job.n_experts)
               for b in etps for o in (0, 1) if o == 0 or a > 1]
    options = np.array(triples, dtype=[("ep", "i4"), ("etp", "i4"), ("a2a_overlap", "i4")])
    mesh = base["tp"].astype(np.int64) * base["cp"] * base["dp"]
    overlap_ok = job.training & ((base["pp"] == 1) | (base["vpp"] > 1)) & ~np.isin(
        base["recompute"], (Recompute.FULL, Recompute.FIRST_K))
    size = (options["ep"].astype(np.int64) * options["etp"])[None, :]
    no_overlap = (options["a2a_overlap"] == 0)[None, :]

    def rule(rows: np.ndarray) -> np.ndarray:
        return (mesh[rows, None] % size == 0) & (no_overlap | overlap_ok[rows, None])

    return InnerAxis.by_key(options, len(base), mesh * 2 + overlap_ok, rule)


def _zero_axis(base: np.ndarray, training: bool, distributed_only: bool = False
               ) -> InnerAxis:
    """(zero, shard_group): ZeRO 0-3 over the whole data x context group (when it has more
    than one GPU), and FSDP hybrid shard over groups of 2, 4, ... of the dp ranks (powers of
    two dividing dp, below it). Forward-only jobs: ZeRO 0 only. ``distributed_only`` (the
    precision-aware optimizer: Megatron-Core optimizer/__init__.py "only supported with
    distributed optimizer"): no ZeRO 0 where the group has more than one GPU."""
    dp_max = int(base["dp"].max()) if len(base) else 1
    groups = [g for g in (2 ** i for i in range(1, 31)) if g < dp_max]
    options = np.zeros(4 + len(groups), dtype=[("zero", "i4"), ("shard_group", "i4")])
    options["zero"][:4] = np.arange(4)
    options["zero"][4:] = 3
    options["shard_group"][4:] = groups
    dp = base["dp"].astype(np.int64)
    replicas = dp * base["cp"]
    g = np.array(groups, dtype=np.int64)[None, :]

    def rule(rows: np.ndarray) -> np.ndarray:
        valid = np.ones((len(rows), len(options)), dtype=bool)
        valid[:, 1:4] = training & (replicas[rows, None] > 1)
        if training and distributed_only:
            valid[:, 0] = replicas[rows] == 1
        valid[:, 4:] = training & (dp[rows, None] % g == 0) & (g < dp[rows, None])
        return valid

    return InnerAxis.by_key(options, len(base), lambda: _row_key(base, ("dp", "cp")), rule)


def _offload_axis(base: np.ndarray, fine_grained: bool = False) -> InnerAxis:
    """Offload bit masks 0-7 (1 weights, 2 activations, 4 optimizer state); with the job's
    fine-grained activation offloading, no whole-activation offload (bit 2)."""
    masks = [m for m in range(8) if not (fine_grained and m & 2)]
    options = np.zeros(len(masks), dtype=[("offload", "i4")])
    options["offload"] = masks
    return InnerAxis.by_key(options, len(base), np.zeros(len(base), np.int64),
                            lambda rows: np.ones((len(rows), len(masks)), dtype=bool))


def enumerate_space(profile: str, job: Job, n_gpus: int, strategy: str,
                    nvlink_domain: int, host_memory: bool = False) -> CandidateSpace:
    """The candidate space of one case under a cost profile's search rules."""
    if profile == "nersc2024":
        return enumerate_nersc(job, n_gpus, strategy, nvlink_domain)
    if profile == "calibrated":
        return enumerate_calibrated(job, n_gpus, nvlink_domain, host_memory, strategy)
    raise KeyError(f"unknown cost profile {profile!r}")

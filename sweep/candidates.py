"""Enumerate every parallel configuration of one case, in blocks of bounded size.

A case (job x hardware variant x GPU count x strategy) has a *candidate space*: every
DP x TP (x TP2 / CP) x PP x micro-batch x ... x NVLink placement that the profile's rules
allow. The space is held compactly as a small table of *base rows* (the parallel degrees)
times *inner axes* (options such as the NVLink placement tuples, valid per base row), and
``block(start, stop)`` materialises rows ``[start, stop)`` only. Every candidate has a stable
``index`` in its space, which partitions work across ranks and breaks ties in the top-N.

Pure numpy: no I/O, no MPI.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .job import Job
from .schema import CANDIDATE_DTYPE, empty_candidates

__all__ = ["CandidateSpace", "InnerAxis", "divisors", "ordered_factorizations", "enumerate_nersc",
           "summa_nb_options", "NERSC_STRATEGIES"]

NERSC_STRATEGIES = ("1d", "2d", "2d-seqp")
_NV_DEGREE = {"nv_tp": "tp", "nv_tp2": "tp2", "nv_cp": "cp", "nv_dp": "dp", "nv_pp": "pp"}


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
    (B, K) mask saying which options each base row admits. A value of 0 in an ``nv_*`` column
    means "the whole group inside one domain" and resolves to the group's degree.
    """

    options: np.ndarray
    valid: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        return self.valid.sum(axis=1).astype(np.int64)

    @property
    def order(self) -> np.ndarray:
        # per base row, the valid option indices first (stable, so in option order)
        return np.argsort(~self.valid, axis=1, kind="stable")


class CandidateSpace:
    """Base rows x inner axes; rows are materialised on demand by :meth:`block`."""

    def __init__(self, base: np.ndarray, axes: list[InnerAxis] | tuple = ()) -> None:
        if base.dtype != CANDIDATE_DTYPE:
            raise TypeError("base rows must have CANDIDATE_DTYPE")
        self.base = base
        self.axes = list(axes)
        self._counts = [a.counts for a in self.axes]
        self._orders = [a.order for a in self.axes]
        sizes = np.ones(len(base), dtype=np.int64)
        for c in self._counts:
            sizes *= c
        self.row_sizes = sizes
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    @property
    def size(self) -> int:
        """Number of candidates in the space."""
        return int(self.offsets[-1])

    def __len__(self) -> int:
        return self.size

    def block(self, start: int, stop: int) -> np.ndarray:
        """Candidates ``[start, stop)`` as ``(stop - start,) CANDIDATE_DTYPE``."""
        start, stop = max(0, int(start)), min(self.size, int(stop))
        if stop <= start:
            return empty_candidates(0)
        g = np.arange(start, stop, dtype=np.int64)
        row = np.searchsorted(self.offsets, g, side="right") - 1
        local = g - self.offsets[row]
        out = self.base[row]
        # innermost axis varies fastest
        for axis, counts, order in zip(self.axes[::-1], self._counts[::-1], self._orders[::-1]):
            c = counts[row]
            j = local % c
            local //= c
            opt = order[row, j]
            for name in axis.options.dtype.names:
                out[name] = axis.options[name][opt]
        for nv, degree in _NV_DEGREE.items():
            col = out[nv]
            zero = col == 0
            if zero.any():
                col[zero] = out[degree][zero]
        out["index"] = g
        return out

    def blocks(self, block_size: int):
        """Iterate over the whole space in blocks of at most ``block_size`` rows."""
        for s in range(0, self.size, block_size):
            yield self.block(s, s + block_size)


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


def _nv_axis(base: np.ndarray, nvs: int, groups: tuple[str, ...]) -> InnerAxis:
    """NVLink placements: the whole job in one domain if it fits, else every ordered
    factorisation of the domain size whose factors divide the group degrees."""
    tuples = ordered_factorizations(nvs, len(groups))
    nv_names = ["nv_" + g for g in groups]
    options = np.zeros(len(tuples) + 1, dtype=[(n, "i4") for n in nv_names])
    for i, n in enumerate(nv_names):
        options[n][1:] = tuples[:, i]  # option 0 = all zeros = "each group whole"
    total = np.ones(len(base), dtype=np.int64)
    for g in groups:
        total *= base[g]
    fits = total <= nvs
    divides = np.ones((len(base), len(tuples)), dtype=bool)
    for i, g in enumerate(groups):
        divides &= (base[g][:, None] % tuples[None, :, i]) == 0
    valid = np.concatenate([fits[:, None], divides & ~fits[:, None]], axis=1)
    return InnerAxis(options=options, valid=valid)


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
    rows: list[tuple[int, ...]] = []
    for tp1, tp2 in pairs:
        tp = tp1 * tp2
        shard = {"1d": tp1, "2d": tp2, "2d-seqp": tp}[strategy]  # what (mbs * l) must divide
        nbs = summa_nb_options(tp1, tp2, e) if strategy == "2d" else [1]
        for pp in _divisors_tuple(min(n // tp, L)):
            if n % (tp * pp) or L % pp:
                continue
            dp = n // (tp * pp)
            if dp > gbs or gbs % dp:
                continue
            for mbs in _divisors_tuple(gbs // dp):
                if (mbs * l) % shard:
                    continue
                for nb in nbs:
                    rows.append((tp1, tp2, pp, dp, mbs, nb))
    base = empty_candidates(len(rows))
    if rows:
        arr = np.array(rows, dtype=np.int64)
        base["tp"], base["pp"], base["dp"], base["mbs"], base["nb"] = (
            arr[:, 0], arr[:, 2], arr[:, 3], arr[:, 4], arr[:, 5])
        if strategy == "2d":
            base["tp2"] = arr[:, 1]
        elif strategy == "2d-seqp":
            base["cp"] = arr[:, 1]
    groups = {"1d": ("tp", "dp", "pp"), "2d": ("tp", "tp2", "dp", "pp"),
              "2d-seqp": ("tp", "cp", "dp", "pp")}[strategy]
    return CandidateSpace(base, [_nv_axis(base, nvlink_domain, groups)])

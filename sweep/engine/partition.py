"""Share work units among ranks by candidate count. Pure numpy.

Units are kept in plan order and cut into ``chunks x n_ranks`` contiguous runs of about
equal estimated cost, dealt to the ranks in turn: each rank touches few cases (few
candidate spaces to enumerate, small top-N tables), one big case is split across ranks and
many small ones are packed together, and every rank gets a share of every part of the plan,
so costs the estimate misses (one job's candidates cost more than another's, measured up to
1.45x with one contiguous run per rank) even out. The estimated cost of a unit is its
candidate count plus a fixed per-unit overhead (enumeration, bookkeeping) in candidates.

With more than one rank, the last ``SHARED_FRACTION`` of the plan (by estimated cost) is not
dealt in advance: it is cut into pieces (``shared_pieces_per_rank``) that ranks take, in order,
when their own share is done (``share_units``; the runner hands them out). A rank on a
slower or busier core, or given the costlier candidates, then takes fewer pieces instead of
finishing last: the static share alone left the two ranks of a 2-core VM 1 - 12 % apart
in busy time on nersc-flops-capacity (docs/speed.md, "Strong scaling").
"""

from __future__ import annotations

import numpy as np

__all__ = ["assign_units", "shard_of_units", "shard_worker", "SHARD_STRIDE", "MAX_SHARDS",
           "imbalance", "unit_progress", "UNIT_OVERHEAD", "CHUNKS", "share_units",
           "SHARED_FRACTION", "SHARED_CHUNKS", "shared_pieces_per_rank"]

#: per-unit fixed cost, in candidate-equivalents (measured: ~3.6 ms per unit at ~2 M
#: candidates per second)
UNIT_OVERHEAD = 8192
#: contiguous runs per rank
CHUNKS = 8


def assign_units(sizes: np.ndarray, n_ranks: int, overhead: int = UNIT_OVERHEAD,
                 chunks: int = CHUNKS) -> np.ndarray:
    """Rank of each unit: ``chunks`` contiguous runs of near-equal cost per rank, dealt out.

    Args:
        sizes: (U,) candidates per unit, in plan order.
        n_ranks: number of ranks (>= 1).
        overhead: per-unit cost in candidates.
        chunks: runs per rank (1: one contiguous block each).

    Returns:
        (U,) int64 rank in [0, n_ranks).
    """
    if n_ranks < 1 or chunks < 1:
        raise ValueError("expecting n_ranks >= 1 and chunks >= 1")
    cost = np.asarray(sizes, dtype=np.float64) + overhead
    if len(cost) == 0:
        return np.zeros(0, np.int64)
    return _runs(cost, n_ranks * chunks) % n_ranks


def _runs(cost: np.ndarray, runs: int) -> np.ndarray:
    """(U,) which of ``runs`` contiguous runs of near-equal total ``cost`` each unit falls
    in: the one that holds its midpoint."""
    end = np.cumsum(cost)
    middle = end - cost / 2
    return np.clip(np.floor(middle / end[-1] * runs).astype(np.int64), 0, runs - 1)


#: share of the estimated cost left to ranks that finish their own share first: enough to
#: absorb one core running 25 % slower than the other (a 2-core VM with both cores busy)
SHARED_FRACTION = 0.3
#: pieces of the shared tail per rank (each ~2 % of a rank's work at SHARED_FRACTION 0.3:
#: the most the ranks' finishing times can differ by, besides one unit's cost), up to
#: SHARED_PIECES_MAX pieces in all
SHARED_CHUNKS = 16
#: rank 0 answers every request for a piece between blocks of its own search (a receive
#: and a send each): past 64 ranks the pieces per rank shrink (to 2 from 512 ranks) so that the
#: requests stay about 2 per rank over the tail instead of 16
SHARED_PIECES_MAX = 1024


def shared_pieces_per_rank(n_ranks: int) -> int:
    """Pieces of the shared tail per rank on ``n_ranks`` ranks: SHARED_CHUNKS up to 64
    ranks, then fewer, at least 2 (each rank can still take one more piece than another)."""
    return max(2, min(SHARED_CHUNKS, SHARED_PIECES_MAX // max(n_ranks, 1)))


def share_units(sizes: np.ndarray, n_ranks: int, overhead: int = UNIT_OVERHEAD,
                chunks: int = CHUNKS, shared: float = SHARED_FRACTION,
                shared_chunks: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Units dealt in advance (:func:`assign_units` on the plan's head) and the plan's tail
    cut into pieces of near-equal cost, taken in order by whichever rank asks first.

    Args:
        sizes: (U,) candidates per unit, in plan order.
        n_ranks: number of ranks (>= 1); one rank shares nothing.
        overhead: per-unit cost in candidates.
        chunks: runs per rank of the dealt head.
        shared: share of the total cost in the tail, in [0, 1).
        shared_chunks: pieces of the tail per rank (>= 1; default
            ``shared_pieces_per_rank(n_ranks)``).

    Returns:
        (U,) int64 rank of each dealt unit (-1: in the tail), and (U,) int64 piece of each
        tail unit (0, 1, ... in the order they are handed out; -1: dealt).
    """
    if shared_chunks is None:
        shared_chunks = shared_pieces_per_rank(n_ranks)
    if not 0.0 <= shared < 1.0 or shared_chunks < 1:
        raise ValueError("expecting 0 <= shared < 1 and shared_chunks >= 1")
    cost = np.asarray(sizes, dtype=np.float64) + overhead
    owner = np.full(len(cost), -1, np.int64)
    piece = np.full(len(cost), -1, np.int64)
    if n_ranks == 1 or shared == 0.0 or len(cost) == 0:
        owner[:] = assign_units(sizes, n_ranks, overhead, chunks)
        return owner, piece
    middle = np.cumsum(cost) - cost / 2  # a unit belongs where its midpoint lies
    head = middle < (1.0 - shared) * cost.sum()
    owner[head] = assign_units(np.asarray(sizes)[head], n_ranks, overhead, chunks)
    cut = _runs(cost[~head], n_ranks * shared_chunks)
    piece[~head] = np.unique(cut, return_inverse=True)[1]  # numbered without gaps
    return owner, piece


#: worker ids a shard owns: rank r of shard I is worker I * SHARD_STRIDE + r (its part file
#: part-<worker>.h5), so shards started on different numbers of ranks never share a file
SHARD_STRIDE = 100_000
#: shards a run may be cut into: every worker id fits the int32 ``rank`` column of a part
#: file's /units table (store.DONE_DTYPE)
MAX_SHARDS = (2**31 - 1) // SHARD_STRIDE - 1


def shard_of_units(sizes: np.ndarray, shards: int) -> np.ndarray:
    """Shard of each unit of a plan run as ``shards`` shards: the partition of *all* units
    among the shards, fixed whichever shards have run and on however many ranks each (a
    shard's ranks share its units as a run's ranks share a run's)."""
    return assign_units(sizes, shards)


def shard_worker(index: int, rank: int) -> int:
    """Worker id (part file number) of rank ``rank`` of shard ``index``."""
    return index * SHARD_STRIDE + rank


def imbalance(loads: np.ndarray) -> float:
    """max / mean - 1 of per-rank loads (0 = perfectly balanced)."""
    loads = np.asarray(loads, dtype=np.float64)
    if len(loads) == 0 or loads.mean() == 0:
        return 0.0
    return float(loads.max() / loads.mean() - 1.0)


def unit_progress(units: np.ndarray, done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How far each work unit has got, from the finished *segments* of part files.

    A segment is a record ``(unit_id, start, stop)`` of candidates searched: a whole unit,
    or the part of one finished before a stop signal or a checkpoint (the rest is searched
    later from there, possibly by another rank or run). A unit's progress is the length of
    the contiguous stretch of segments from its start; it is complete when that equals its
    size. Copies of a segment (the same unit in parts of two layouts) count once.

    Args:
        units: (U,) plan units (``unit_id`` = position, ``start``, ``stop``).
        done: (D,) segments, each inside its unit (checked by the caller).

    Returns:
        (U,) candidates done from each unit's start, and (D,) a mask of the segments whose
        counts to add up: no two kept segments overlap.
    """
    n = len(units)
    if len(done) == 0:
        return np.zeros(n, np.int64), np.zeros(0, bool)
    uid = done["unit_id"].astype(np.int64)
    # units are disjoint stretches of one line of all candidates; segments sorted on it
    size = (units["stop"] - units["start"]).astype(np.int64)
    offset = np.concatenate([[0], np.cumsum(size)[:-1]])
    g_start = offset[uid] + (done["start"] - units["start"][uid])
    g_stop = offset[uid] + (done["stop"] - units["start"][uid])
    order = np.lexsort((-g_stop, g_start))
    uid, g_start, g_stop = uid[order], g_start[order], g_stop[order]
    reach = np.maximum.accumulate(g_stop)  # furthest candidate covered so far
    before = np.concatenate([[-1], reach[:-1]])
    first = np.r_[True, uid[1:] != uid[:-1]]
    # a gap: the unit's first segment does not begin at its start, or a later one begins
    # past everything before it
    gap = np.where(first, g_start > offset[uid], g_start > before)
    group = np.cumsum(first) - 1  # which unit's run of segments
    gaps = np.cumsum(gap)
    firsts = np.flatnonzero(first)
    chain = gaps == (gaps - gap)[firsts][group]  # no gap from the unit's start up to here
    progress = np.zeros(n, np.int64)
    np.maximum.at(progress, uid[chain], g_stop[chain] - offset[uid[chain]])
    keep = np.zeros(len(done), bool)
    keep[order] = g_start >= before
    return np.minimum(progress, size), keep

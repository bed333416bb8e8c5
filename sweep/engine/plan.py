"""Cases and work units of a spec: what ``sweep plan`` prints and ``sweep run`` executes.

A *case* is job x hardware variant x strategy x GPU count, numbered in that nesting order
(the GPU count varies fastest). Each case's candidate space is cut into *work units* of at
most ``unit_size`` candidates; units are what ranks are given and what part files record as
done. Both numberings depend only on the spec, so a run can be resumed with any rank count.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import SpecError, SweepError
from ..model.candidates import CandidateSpace, block_kind, enumerate_space, summa_models
from ..model.cost import NERSC_SCORES_MIN_ROWS, unmodelled
from ..model.cost.calibrated import unsupported_job_precision
from ..model.job import Job
from ..model.search import DEFAULT_BLOCK, BlockCache
from .partition import SHARED_FRACTION
from .spec import SweepSpec
from .variants import Variant, Variants

__all__ = ["Case", "Cases", "Plan", "make_plan", "UNIT_DTYPE", "SpaceCache", "estimate_memory",
           "measure_working_set", "rss_bytes", "refuse_over", "SEAL_ROWS", "warm_up",
           "WARM_UP_ROWS", "batched", "batched_units", "search_unit"]

#: one row per work unit
UNIT_DTYPE = np.dtype([("unit_id", "i8"), ("case_id", "i4"), ("start", "i8"), ("stop", "i8")])


@dataclass(frozen=True)
class Case:
    """One case: a job on a hardware variant with a strategy and a GPU count."""

    case_id: int
    job: Job
    variant: Variant
    strategy: str
    n_gpus: int
    candidates: int

    @property
    def space_key(self) -> tuple:
        """What the candidate space depends on (not bandwidths, capacities or FLOP rates)."""
        hw = self.variant.hardware
        return (self.job, self.n_gpus, self.strategy, hw.nvlink_domain, hw.host_memory_bytes > 0)


class SpaceCache:
    """Candidate spaces by space key (many variants share one space)."""

    def __init__(self, profile: str, max_entries: int = 256, offload: bool = False,
                 block_size: int = DEFAULT_BLOCK) -> None:
        self.profile = profile
        self.offload = offload  # offload options where the hardware has a host tier
        self.max_entries = max_entries
        self._spaces: dict[tuple, CandidateSpace] = {}
        #: column blocks of mid-sized spaces, kept for the next variant's case
        self.blocks = BlockCache(block_size)

    def get(self, job: Job, n_gpus: int, strategy: str, nvlink_domain: int,
            host_memory: bool = False) -> CandidateSpace:
        key = (job, n_gpus, strategy, nvlink_domain, host_memory)
        space = self._spaces.get(key)
        if space is None:
            if len(self._spaces) >= self.max_entries:
                self._spaces.pop(next(iter(self._spaces)))
            space = enumerate_space(self.profile, job, n_gpus, strategy, nvlink_domain,
                                    host_memory and self.offload)
            self._spaces[key] = space
        return space

    def of(self, case: Case) -> CandidateSpace:
        return self.get(*case.space_key)


class Cases(Sequence[Case]):
    """The cases of a plan by id, each built when asked for: ``case_id`` is the position in
    jobs x variants x strategies x GPU counts (GPU count fastest); only the candidate count
    of each case is held (8 bytes a case)."""

    def __init__(self, spec: SweepSpec, variants: Variants, candidates: np.ndarray) -> None:
        self.spec, self.variants = spec, variants
        self.shape = (len(spec.jobs), len(variants), len(spec.strategies), len(spec.gpus))
        self.candidates = candidates  # (N,) int64

    def __len__(self) -> int:
        return len(self.candidates)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"case {i} of {len(self)}")
        j, v, s, g = np.unravel_index(i, self.shape)
        return Case(i, self.spec.jobs[j], self.variants[int(v)], self.spec.strategies[s],
                    self.spec.gpus[g], int(self.candidates[i]))

    def variant_ids(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Variant id of cases ``[start, stop)`` (vectorised)."""
        ids = np.arange(start, len(self) if stop is None else stop, dtype=np.int64)
        return np.unravel_index(ids, self.shape)[1].astype(np.int64)


@dataclass
class Plan:
    """Everything a run will do: variants and cases by id (built on demand) and the work
    units (a table)."""

    spec: SweepSpec
    variants: Variants
    cases: Cases
    units: np.ndarray  # (U,) UNIT_DTYPE

    @property
    def total_candidates(self) -> int:
        return int(self.cases.candidates.sum())


def make_plan(spec: SweepSpec, cache: SpaceCache | None = None) -> Plan:
    """Expand a spec into variants, cases (with candidate counts) and work units, without
    building every variant: a case's candidate count depends on its variant only through
    the NVLink domain and whether there is a host memory tier, found once per combination
    of the grid axes that set them (Variants.per_variant).

    Raises:
        SpecError: a GPU count of the spec has no candidate for any job and strategy.
    """
    for job in spec.jobs:  # refused by name, never costed as a dense model
        why = unmodelled(job, spec.cost_model)
        if why:
            raise SpecError(spec.source, "jobs", f"job {job.name}: {why}")
        if spec.cost_model == "calibrated" and "1d" not in spec.strategies and \
                not summa_models(job):
            raise SpecError(spec.source, "strategies", f"job {job.name} has "
                            f"{block_kind(job)} blocks, which only the 1d "
                            f"strategy models (SUMMA, 2d, is modelled for dense multi-head "
                            f"blocks only): add 1d")
    cache = cache or SpaceCache(spec.cost_model, offload=spec.offload)
    variants = Variants(spec)
    space_of, keys = variants.per_variant(
        frozenset({"nvlink_domain", "host_memory_bytes"}),
        lambda hw: (hw.nvlink_domain, hw.host_memory_bytes > 0))
    # sizes[job, distinct space key, strategy, GPU count]
    sizes = np.array([[[[cache.get(job, n, strategy, domain, host).size for n in spec.gpus]
                        for strategy in spec.strategies] for domain, host in keys]
                      for job in spec.jobs], dtype=np.int64)
    counts = sizes[:, space_of].reshape(-1)  # (J, V, S, G) in case order
    if spec.cost_model == "calibrated":  # low-precision GEMMs need tensor cores for them
        for job in spec.jobs:
            which, whys = variants.per_variant(
                frozenset({"matrix_flops_per_s", "generation"}),
                lambda hw, job=job: unsupported_job_precision(job, hw) is not None)
            bad = np.flatnonzero(np.asarray(whys, dtype=bool)[which])
            if len(bad):
                why = unsupported_job_precision(job, variants[int(bad[0])].hardware)
                raise SpecError(spec.source, "jobs", f"job {job.name}: {why}")
    cases = Cases(spec, variants, counts)
    useful = counts.reshape(cases.shape).any(axis=(0, 1, 2))
    for n, ok in zip(spec.gpus, useful):
        if not ok:
            raise SpecError(spec.source, "gpus", f"{n} GPUs has no valid configuration for any "
                            f"job and strategy of this spec (degrees must divide the GPU "
                            f"count, heads, hidden size, layers and global batch)")
    per_case = -(-counts // spec.unit_size)  # ceil
    case_of = np.repeat(np.arange(len(counts), dtype=np.int64), per_case)
    first_unit = np.concatenate([[0], np.cumsum(per_case)[:-1]]).astype(np.int64)
    k = np.arange(len(case_of), dtype=np.int64) - first_unit[case_of]
    units = np.zeros(len(case_of), UNIT_DTYPE)
    units["unit_id"] = np.arange(len(case_of))
    units["case_id"] = case_of
    units["start"] = k * spec.unit_size
    units["stop"] = np.minimum((k + 1) * spec.unit_size, counts[case_of])
    return Plan(spec, variants, cases, units)


#: top-N rows (plus finished units) a rank holds before it seals them into a part file of
#: their own (part-<rank>-<n>.h5) and starts afresh (runner.py): a rank's memory for
#: results stays under SEAL_ROWS x RUN_BYTES_PER_ROW whatever the number of its cases
SEAL_ROWS = 100_000
#: bytes a rank holds per row of results it keeps (a top-N row or a finished work unit:
#: the per-case top-N arrays, the unit records and, at a checkpoint, the part file's tables
#: and its HDF5 image); a rank keeps at most SEAL_ROWS rows before it seals them
#: into a part file of their own (measured with /usr/bin/time on scale-80k-variants and
#: scale-1m-variants)
RUN_BYTES_PER_ROW = 930
#: what the reduction holds per work unit (the finished-unit records of every part, sorted
#: and deduplicated) and per case (its counts and the plan's candidate counts), beyond one
#: slice of reduce.ROWS_PER_SLICE rows of each table
REDUCE_BYTES_PER_UNIT = 300
REDUCE_BYTES_PER_CASE = 80
#: bytes of one slice of the reduction: ROWS_PER_SLICE rows of /top and /cases with their
#: copies while merged and written (fitted with the two above to `sweep reduce` alone:
#: scale-80k-variants 130 MB, scale-1m-variants 450 MB, /usr/bin/time)
REDUCE_SLICE_BYTES = 60e6
#: bytes of a /cases row with a base's 67 hardware columns (scale-80k-variants: 737)
CASES_ROW_BYTES = 740
#: what loading MPI adds to a rank (MPICH 5 via mpi4py: 15 MB measured)
MPI_BYTES = 16 * 2**20


def estimate_memory(plan: Plan, ranks: int, base_bytes: float, plan_bytes: float,
                    working_bytes: float, mpi_bytes: float = MPI_BYTES,
                    startup_bytes: float = 0.0) -> dict:
    """Peak memory per rank of running ``plan`` on ``ranks`` ranks (pure arithmetic).

    ``base_bytes`` is the process before planning (interpreter, numpy, h5py, sweep),
    ``plan_bytes`` what building the plan added (the work-unit table, candidate counts and
    spaces: every rank builds it), ``startup_bytes`` what loading the compiled loops of
    fused evaluation adds (numba, LLVM: bench.estimate_search_seconds measures it; 0
    without), ``working_bytes`` the cost core's peak over one block,
    ``mpi_bytes`` what MPI adds on more than one rank (0 if ``base_bytes`` was measured with
    it). A rank holds its results up to SEAL_ROWS rows (every case with candidates
    counted with its full top-N and one work unit: an upper bound), then seals them to disk,
    so its memory does not grow with the number of cases; it keeps the column blocks of
    mid-sized spaces for the next case (search.BlockCache: at most BLOCK_CACHE_BYTES, and
    at most every such case's candidates); rank 0 also merges the part files,
    in slices, holding every finished work unit (REDUCE_BYTES_PER_UNIT) and a few numbers
    per case, and the results file itself if it is small enough to be built in memory
    (store.IMAGE_BYTES). Returns bytes: ``rank`` (any rank but 0), ``rank0`` and ``serial``
    (one rank that also reduces).
    """
    from .store import COMPRESSED_FRACTION, DONE_DTYPE, IMAGE_BYTES, TOP_DTYPE

    with_candidates = int(np.count_nonzero(plan.cases.candidates))
    rows = with_candidates * plan.spec.top_n
    blocks = BlockCache().most_bytes(plan.cases.candidates)
    fixed = base_bytes + plan_bytes + startup_bytes + working_bytes + blocks

    # (a rank seals its finished cases once they hold SEAL_ROWS rows: with a top_n of that
    # order, up to SEAL_ROWS rows plus the case that crossed it, the one being searched and
    # a search's top-N merged into it, top_n rows each)
    def held(share: float) -> float:
        return RUN_BYTES_PER_ROW * min(share, SEAL_ROWS + 3 * plan.spec.top_n)

    units = len(plan.units)
    image = (rows * TOP_DTYPE.itemsize + len(plan.cases) * CASES_ROW_BYTES
             + units * DONE_DTYPE.itemsize)  # the results file's tables, uncompressed
    compressed = COMPRESSED_FRACTION * image
    reduce = (REDUCE_BYTES_PER_UNIT * units + REDUCE_BYTES_PER_CASE * len(plan.cases)
              + REDUCE_SLICE_BYTES + (compressed if compressed <= IMAGE_BYTES else 0.0))
    mpi = mpi_bytes if ranks > 1 else 0.0
    # a rank's dealt share, and at most all of the shared tail (partition.share_units)
    most = 1.0 if ranks <= 1 else (1.0 - SHARED_FRACTION) / ranks + SHARED_FRACTION
    run = held((rows + units) * most)
    # rank 0 does not get all of its run's memory back before it reduces (measured: the
    # peak is about the sum)
    return {"rank": fixed + mpi + run, "rank0": fixed + mpi + run + reduce,
            "serial": fixed + held(rows + units) + reduce, "ranks": ranks, "rows": rows,
            "blocks": blocks}


def measure_working_set(plan, cache, cases: int = 3) -> float:
    """Peak bytes the cost core allocates over one block (``DEFAULT_BLOCK`` candidates) of
    the ``cases`` largest candidate spaces of ``plan``, traced by tracemalloc (numpy reports
    its buffers to it): what a rank needs on top of its plan and results while it searches.
    A small space fills its block with variants, as a run batches them (search_cases): at
    most as many as the plan has (one: the case alone, as a run searches it - a block of 936
    copies of a 70-candidate case ran compiled loops the run never loads: ~90 s on a fresh
    cache)."""
    import tracemalloc

    from ..model.search import DEFAULT_BLOCK, search_cases, search_range

    # the largest cases first (a bounded look: many cases share a space)
    ranked = np.argsort(-plan.cases.candidates, kind="stable")[:4096]
    seen, peak = set(), 0
    for case in (plan.cases[int(i)] for i in ranked if plan.cases.candidates[i] > 0):
        key = case.space_key
        if key in seen:
            continue
        seen.add(key)
        tracemalloc.start()
        try:
            if 4 * case.candidates <= DEFAULT_BLOCK:
                copies = min(DEFAULT_BLOCK // case.candidates, len(plan.cases.variants))
                search_cases(plan.spec.cost_model, case.job, [case.variant.hardware] * copies,
                             case.strategy, case.n_gpus, cache.of(case), plan.spec.top_n)
            else:
                search_range(plan.spec.cost_model, case.job, case.variant.hardware,
                             case.strategy, case.n_gpus, cache.of(case), 0,
                             min(case.candidates, DEFAULT_BLOCK), plan.spec.top_n)
            peak = max(peak, tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        if len(seen) >= cases:
            break
    return float(peak)


#: rows of a unit searched to warm up (estimate_search_seconds): past every threshold from
#: which a compiled loop runs (NERSC_SCORES_MIN_ROWS is the largest)
WARM_UP_ROWS = 2 * NERSC_SCORES_MIN_ROWS


def _batched_rule(start, stop, size):
    """A unit ``[start, stop)`` of a case of ``size`` candidates is searched with other
    cases of its space in one block: a small case, whole (runner._batches)."""
    from ..model.search import DEFAULT_BLOCK

    return (start == 0) & (stop == size) & (4 * size <= DEFAULT_BLOCK)


def batched(plan, unit) -> bool:
    """Whether a rank searches work unit ``unit`` with other cases of its space in one block
    (search_unit)."""
    return bool(_batched_rule(unit["start"], unit["stop"],
                              plan.cases[int(unit["case_id"])].candidates))


def batched_units(plan) -> np.ndarray:
    """:func:`batched` of every work unit of ``plan`` at once (a mask)."""
    units = plan.units
    return _batched_rule(units["start"], units["stop"], plan.cases.candidates[units["case_id"]])


def search_unit(plan, cache, unit, stop: int | None = None) -> int:
    """Search work unit ``unit`` of ``plan`` as a rank does (its spaces enumerated in
    ``cache``): a small whole case in the block of cases of its space it would share
    (search_cases), anything else alone (search_range; up to ``stop`` if given). Returns
    the cases searched together."""
    from ..model.search import DEFAULT_BLOCK, search_cases, search_range

    case = plan.cases[int(unit["case_id"])]
    size = case.candidates
    if stop is None and batched(plan, unit):
        batch = [case]
        for cid in range(case.case_id + 1, min(case.case_id + 4 * DEFAULT_BLOCK // size,
                                               len(plan.cases))):
            other = plan.cases[cid]
            if other.space_key == case.space_key:
                batch.append(other)
            if len(batch) >= DEFAULT_BLOCK // size:
                break
        search_cases(plan.spec.cost_model, case.job, [c.variant.hardware for c in batch],
                     case.strategy, case.n_gpus, cache.of(case), plan.spec.top_n)
        return len(batch)
    search_range(plan.spec.cost_model, case.job, case.variant.hardware, case.strategy,
                 case.n_gpus, cache.of(case), int(unit["start"]),
                 int(unit["stop"]) if stop is None else stop, plan.spec.top_n,
                 blocks=cache.blocks)
    return 1


def warm_up(plan, cache, unit) -> tuple[float, float]:
    """Search work unit ``unit`` of ``plan`` once as a rank would - its first WARM_UP_ROWS
    candidates, or a small case's whole block with the other cases of its space (whose
    hardware varies by row: other compiled loops) - so that the first calls trace, compile
    or load (from the on-disk cache) the compiled loops such a search runs. Returns (CPU
    seconds, resident bytes added: numba, LLVM and the loops' code, about 125 MB on a fresh
    process, plus what the search's own arrays left in the heap - an upper bound)."""
    rss, start = rss_bytes(), time.process_time()
    if batched(plan, unit):
        search_unit(plan, cache, unit)
    else:
        search_unit(plan, cache, unit,
                    min(int(unit["stop"]), int(unit["start"]) + WARM_UP_ROWS))
    return time.process_time() - start, max(0.0, rss_bytes() - rss)


def rss_bytes() -> float:
    """This process's resident memory (Linux /proc; the peak so far elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = float(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource  # not on every platform

        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024.0


def refuse_over(memory: dict, limit_bytes: float | None) -> None:
    """``--max-memory``: SweepError (exit 2) when rank 0's estimated peak (it also reduces)
    in ``memory`` (from :func:`estimate_memory`) exceeds ``limit_bytes``."""
    if limit_bytes is not None and memory["rank0"] > limit_bytes:
        raise SweepError(f"--max-memory: the run needs about {memory['rank0'] / 1e9:.3g} GB "
                         f"on rank 0 of {memory['ranks']} (with the reduction), more than "
                         f"{limit_bytes / 1e9:.3g} GB; use fewer variants or a smaller "
                         f"top_n, or more ranks where the search is what needs it (sweep "
                         f"plan --ranks N estimates it)")

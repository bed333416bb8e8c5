"""``sweep bench``: candidates evaluated per core-second on fixed workloads.

Each workload is one whole case, searched exactly as a rank searches it (enumeration, cost
evaluation in blocks, top-10 selection). Time is the process CPU time of one core (the
search is single-threaded), best of ``repeat`` measurements (a workload shorter than 0.2 s
repeated within each, as timeit does; the workloads' measurements take turns, so that each
workload's are spread over the whole bench), so a loaded machine reads slower, not faster. The
standard workloads are the gpt3_1T spaces of the NERSC study on B200 with an NVLink domain
of 8 at 4096 GPUs, and the calibrated profile's space of Llama 3 8B on 64 H100;
the mixture-of-experts workload, DeepSeek-V3 on 64 GPUs of a GB200 NVL72 (expert parallelism
included), and the many-case workload, 400 hardware variants of one small space (what a
hardware grid costs per case; searched together in blocks, as a run does), are timed and
reported on their own;
``full`` adds Llama 3 405B on 2048 H100 (calibrated) and the whole NERSC reproduction (3
systems x 3 NVLink sizes x 2 models x 3 strategies x 13 GPU counts).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import __version__
from ..engine.catalog import load_hardware, load_job
from ..engine.plan import batched, search_unit, warm_up
from ..errors import SweepError
from ..model.candidates import enumerate_space
from ..model.cost import fuse
from ..model.search import search_cases

__all__ = ["Workload", "STANDARD", "MOE", "MANY_CASES", "CALIBRATED_LARGE", "nersc_reproduction",
           "run_bench", "estimate_search_seconds", "pps_sample"]


@dataclass(frozen=True)
class Workload:
    """A set of cases timed together."""

    name: str
    profile: str
    #: (job, hardware, nvlink, strategy, gpus) or with a 6th item: hardware fields to
    #: replace, ((field, value), ...)
    cases: tuple[tuple, ...]


STANDARD = tuple(
    Workload(f"gpt3_1T {s} B200 nvs8 4096", "nersc2024",
             (("gpt3_1T", "nersc-B200", 8, s, 4096),))
    for s in ("1d", "2d", "2d-seqp")) + (
    Workload("llama3_8b calibrated H100 nvs8 64", "calibrated",
             (("llama3_8b", "H100-SXM", 8, "1d", 64),)),)
#: mixture of experts: expert parallelism, expert TP, the all-to-all overlap and their
#: placement multiply the space (reported on its own line)
MOE = Workload("deepseek_v3 calibrated GB200 nvs72 64", "calibrated",
               (("deepseek_v3", "GB200-NVL72", 72, "1d", 64),))
#: a hybrid Mamba-2 / latent-MoE job with MTP depths of their own (Nemotron 3 Super): the
#: per-layer terms of a main block and of a depth, the routed experts at the latent width
HYBRID = Workload("nemotron_3_super calibrated GB200 nvs72 64", "calibrated",
                  (("nemotron_3_super", "GB200-NVL72", 72, "1d", 64),))
#: DeepSeek sparse attention at 128K tokens (GLM-5): context parallelism with the all-gather,
#: the indexer's terms, EP; with --full or --only
DSA = Workload("glm5 calibrated GB200 nvs72 64", "calibrated",
               (("glm5", "GB200-NVL72", 72, "1d", 64),))
#: many cases that differ only in hardware (issue 19): gpt3_1T 1d on B200 at 8192 GPUs
#: over a 20 x 20 grid of HBM bandwidth (0.5 - 16 TB/s) and capacity (80 - 1000 GB), as a
#: hardware-grid spec expands; one enumeration shared, as in a run (SpaceCache). Its
#: per-case cost is reported as microseconds per case.
MANY_CASES = Workload(
    "gpt3_1T 1d B200 nvs8 8192, 400 HBM variants", "nersc2024",
    tuple(("gpt3_1T", "nersc-B200", 8, "1d", 8192,
           (("hbm_bytes_per_s", float(bw)), ("hbm_capacity_bytes", float(cap))))
          for bw in np.linspace(0.5e12, 16e12, 20) for cap in np.linspace(80e9, 1000e9, 20)))
#: the calibrated profile at production scale (with --full)
CALIBRATED_LARGE = Workload("llama3_405b calibrated H100 nvs8 2048", "calibrated",
                            (("llama3_405b", "H100-SXM", 8, "1d", 2048),))


def nersc_reproduction() -> Workload:
    """Every space of the NERSC study (what its outputs/*.npy were computed from)."""
    cases = tuple((m, f"nersc-{g}", nvs, s, 2**k)
                  for g in ("A100", "H200", "B200") for nvs in (4, 8, 64)
                  for m in ("gpt3_1T", "vit_era5") for s in ("1d", "2d", "2d-seqp")
                  for k in range(2, 15))
    return Workload("NERSC study, all 702 cases", "nersc2024", cases)


#: a measurement of a shorter workload repeats it until it has run this long (CPU seconds)
MIN_MEASURED_S = 0.2


class _Timer:
    """One workload ready to time: loaded, run once (its first calls trace and load the
    compiled loops), and each measurement's loop count, as timeit measures a statement:
    a workload that runs under MIN_MEASURED_S is repeated until it has run that long
    (loops of more and more runs until one does; that one is the first measurement), and
    its mean counts (a single 2 ms run reads the allocator's warm-up, not what a rank
    searching case after case spends on each)."""

    def __init__(self, w: Workload, wanted: int) -> None:
        loaded = []
        for job_name, hw_name, nvs, strategy, n, *fields in w.cases:
            hw = dataclasses.replace(load_hardware(hw_name), nvlink_domain=nvs,
                                     **dict(fields[0] if fields else ()))
            loaded.append((load_job(job_name), hw, strategy, n))
        # variants of one space share its enumeration and are searched together, as in a
        # run (SpaceCache, runner._batches)
        groups: dict[tuple, list] = {}
        for job, hw, strategy, n in loaded:
            groups.setdefault((job, n, strategy, hw.nvlink_domain), []).append(hw)

        def run() -> int:
            count = 0
            for (job, n, strategy, nvs), hws in groups.items():
                space = enumerate_space(w.profile, job, n, strategy, nvs)
                search_cases(w.profile, job, hws, strategy, n, space, 10)
                count += space.size * len(hws)
            return count

        self.run, self.wanted = run, wanted
        start, loading = time.process_time(), fuse.startup_seconds()
        self.count = run()
        first = time.process_time() - start
        if fuse.startup_seconds() > loading:
            # (its first calls traced or loaded compiled loops: what it costs a run is
            # measured by the runs that follow; `--only` puts a workload first)
            first = 0.0
        self.times: list[float] = []
        self.loops = 1
        if first < 1.0:  # (the first run's tracing and loading of compiled loops: more runs)
            # loops of more runs until one lasts MIN_MEASURED_S (as timeit's autorange does:
            # timed alone, a second run may still load a compiled loop, and set too few)
            while True:
                start = time.process_time()
                for _ in range(self.loops):
                    run()
                spent = time.process_time() - start
                if spent >= MIN_MEASURED_S:
                    break
                # (what this loop's runs say it takes, 5 % more, at most 10x more runs a
                # step: a clock too coarse for a loop reads 0 s)
                self.loops = min(10 * self.loops, max(self.loops + 1, int(np.ceil(
                    1.05 * MIN_MEASURED_S * self.loops / max(spent, 1e-9)))))
            self.times.append(spent / self.loops)  # (the last of them is a measurement)
        else:  # (a second or more: the warm-up run is a measurement)
            self.times.append(first)

    def measure(self) -> None:
        """One more measurement, if the workload wants one."""
        if len(self.times) >= self.wanted:
            return
        start = time.process_time()
        for _ in range(self.loops):
            self.run()
        self.times.append((time.process_time() - start) / self.loops)


def _time_workloads(workloads: list[Workload], repeats: list[int]) -> list[tuple[int, float]]:
    """(candidates, CPU seconds of one run) of each workload: the best of its ``repeats``
    measurements. The measurements take turns, one of each workload per round (after a
    warm-up run that may count as one), so that each workload's measurements are spread
    over the whole bench: a slow phase of a shared machine (on a cloud VM, seconds to
    minutes of a noisy neighbour) then slows some of them, not all."""
    timers = [_Timer(w, r) for w, r in zip(workloads, repeats)]
    for _ in range(max(repeats, default=0)):
        for t in timers:
            t.measure()
    return [(t.count, min(t.times)) for t in timers]


def run_bench(repeat: int = 5, full: bool = False, only: Sequence[str] = ()) -> dict:
    """Time the workloads; returns a JSON-ready report. ``only``: the workloads whose name
    contains one of these (case-insensitive), among all of them (--full's too); a summary
    whose workloads were not run is None.

    Raises:
        SweepError: ``only`` matches no workload (with the names).
    """
    every = list(STANDARD) + [MOE, HYBRID, MANY_CASES, CALIBRATED_LARGE, DSA,
                              nersc_reproduction()]
    if only:
        workloads = [w for w in every if any(o.lower() in w.name.lower() for o in only)]
        if not workloads:
            raise SweepError(f"--only {' '.join(only)}: no workload matches; workloads: "
                             + "; ".join(w.name for w in every))
    else:
        workloads = every if full else every[:len(STANDARD) + 3]
    rows = []
    repeats = [1 if w is CALIBRATED_LARGE or len(w.cases) > 500
               else min(repeat, 3) if len(w.cases) > 10 else repeat for w in workloads]
    for w, (count, seconds) in zip(workloads, _time_workloads(workloads, repeats)):
        rows.append({"workload": w.name, "profile": w.profile, "cases": len(w.cases),
                     "candidates": count, "cpu_seconds": seconds,
                     "candidates_per_core_second": count / seconds if seconds > 0 else 0.0,
                     "us_per_case": 1e6 * seconds / len(w.cases)})
    std = [r for r in rows if r["workload"] in {w.name for w in STANDARD}]
    std_s = sum(r["cpu_seconds"] for r in std)
    total = sum(r["candidates"] for r in std) / std_s if std and std_s > 0 else None
    by_name = {r["workload"]: r for r in rows}
    moe, many = by_name.get(MOE.name), by_name.get(MANY_CASES.name)
    hybrid = by_name.get(HYBRID.name)
    fused = ("on: numba " + importlib.metadata.version("numba")) if fuse.enabled() else (
        "off: SWEEP_FUSE=0" if fuse.available() else "off: numba not installed")
    return {"sweep_version": __version__, "python": platform.python_version(), "fused": fused,
            "numpy": np.__version__, "machine": platform.machine(),
            "processor": platform.processor() or platform.machine(), "repeat": repeat,
            "workloads": rows, "standard_candidates_per_core_second": total,
            "moe_candidates_per_core_second": moe and moe["candidates_per_core_second"],
            "hybrid_candidates_per_core_second":
                hybrid and hybrid["candidates_per_core_second"],
            "many_case_candidates_per_core_second": many and many["candidates_per_core_second"],
            "many_case_us_per_case": many and many["us_per_case"]}


def pps_sample(sizes: np.ndarray, samples: int) -> np.ndarray:
    """Indices of ``samples`` draws, probability proportional to size: the items holding the
    points ``(j + 1/2) / samples`` of the cumulative size (systematic sampling, so an item of
    size c is drawn floor or ceil of ``samples * c / total`` times), in a fixed shuffled
    order. Pure."""
    sizes = np.asarray(sizes, dtype=np.float64)
    points = (np.arange(samples) + 0.5) / samples * sizes.sum()
    picked = np.searchsorted(np.cumsum(sizes), points, side="right")
    return picked[np.random.default_rng(0).permutation(samples)]


def estimate_search_seconds(plan, cache, samples: int = 24, budget_s: float = 1.0) -> dict:
    """Core-seconds of search the plan needs on this machine (``sweep plan``'s estimate).

    Whole work units are drawn with probability proportional to their candidate count (a
    systematic sample at evenly spaced points of the plan's cumulative candidates, taken in a
    fixed shuffled order so that stopping at ``budget_s`` of CPU time keeps it spread over
    the plan) and searched exactly as a rank searches them, their spaces already enumerated
    as ``make_plan`` leaves them in ``cache``. The total is the Hansen-Hurwitz estimator
    ``C / m * sum(t_i / c_i)`` (C candidates in the plan, m units timed, t_i CPU seconds of a
    unit of c_i candidates): unbiased for sampling with replacement proportional to size, so
    cheap and costly parts of a plan (profiles, strategies, layer-key reuse) count as often
    as they occur.
    """
    units = plan.units
    sizes = (units["stop"] - units["start"]).astype(np.float64)
    total = float(sizes.sum())
    if total == 0:
        return {"core_seconds": 0.0, "units_timed": 0, "cpu_seconds": 0.0,
                "startup_seconds": 0.0, "startup_bytes": 0.0}
    picked = pps_sample(sizes, samples)

    warmed: set = set()
    startup = {"cpu_s": 0.0, "bytes": 0.0}

    def warm_once(unit) -> None:
        """A unit searched once, untimed (warm_up: its first rows, or a small case's block),
        before the first unit of its job and strategy, searched alone or batched, is timed:
        those first calls trace, compile or load from the cache the compiled loops such a
        search runs (about a second on a cold process) - a cost paid once per process, not
        per candidate; so is the memory they add."""
        case = plan.cases[int(unit["case_id"])]
        key = (plan.spec.cost_model, case.job, case.strategy, batched(plan, unit))
        if key in warmed:
            return
        warmed.add(key)
        cpu_s, grown = warm_up(plan, cache, unit)
        startup["cpu_s"] += cpu_s
        startup["bytes"] += grown

    seconds: dict[int, float] = {}
    ratios = []
    spent = 0.0
    for u in picked:
        if u not in seconds:
            warm_once(units[u])
            start, compiled = time.process_time(), fuse.startup_seconds()
            together = search_unit(plan, cache, units[u])
            # a graph the warm-up did not meet (other layouts further into the unit) is
            # traced and compiled here: start-up, not search (seconds a loop on a cold cache)
            compiled = fuse.startup_seconds() - compiled
            startup["cpu_s"] += compiled
            took = max(time.process_time() - start - compiled, 0.0)
            spent += took
            seconds[u] = took / together
        ratios.append(seconds[u] / sizes[u])
        if spent >= budget_s:
            break
    return {"core_seconds": total * float(np.mean(ratios)), "units_timed": len(seconds),
            "cpu_seconds": spent, "startup_seconds": startup["cpu_s"],
            "startup_bytes": startup["bytes"]}


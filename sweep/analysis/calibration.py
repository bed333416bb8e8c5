"""Fitting the ``calibrated`` profile's parameters on measured runs.

Per GPU generation, the time parameters (cost/calibrated.py PARAMETERS: GEMM, attention and
HBM efficiencies, per-kernel overhead, NVLink and scale-out efficiencies, fp8 efficiency)
minimise the mean absolute log error of the published metrics, each source weighted equally
so that no single benchmark table dominates. The two memory parameters (reserve, allocator
cache) minimise the log error of measured (reported) peak memory, with a penalty for every run
whose feasibility the model gets wrong; feasibility uses the required memory, without cache.
Parameters stay within physical bounds, and a weak prior (PRIOR_WEIGHT) pulls each time
parameter towards its physical centre (cost/calibrated.py DEFAULT_PARAMETERS) wherever the runs
leave it undetermined. Every fit starts from those centres (the three MoE parameters also from
the best point of a small grid over their ranges, the better fit kept), so it depends on the
code and the data only. Leave-one-source-out re-fits without a source (from the same centres:
nothing of the held-out source enters) and predicts it.

The cases come from sweep.analysis.express through the data contract
(sweep.analysis.measured: Case, metric_of); :class:`Evaluator` evaluates them all in one
call for each trial of parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..model.cost import calibrated
from ..model.cost.calibrated import DEFAULT_PARAMETERS
from ..model.hardware import CALIBRATION_BOUNDS
from ..model.schema import CANDIDATE_DTYPE, Reason
from .measured import Case, metric_of

__all__ = ["BOUNDS", "fit", "load_ranges", "outside_ranges", "exercised", "FitResult",
           "predictions", "TIME_PARAMETERS", "GENERATIONS", "fill_generations",
           "write_calibration", "log_prior", "PRIOR_WEIGHT", "Evaluator"]

#: GPU generations in order; one without measured runs borrows its nearest fitted neighbour's
#: time parameters (newer first on a tie)
GENERATIONS = ("volta", "ampere", "hopper", "blackwell")

#: physical bounds of each parameter (efficiencies are fractions of a datasheet peak); a
#: hardware or calibration file is held to them too (model/hardware.py)
BOUNDS = dict(CALIBRATION_BOUNDS)
TIME_PARAMETERS = ("gemm_eff", "attn_eff", "fused_attn_eff", "hbm_eff", "kernel_us", "nvl_eff",
                   "net_eff", "fp8_eff", "fp4_eff")
#: mixture-of-experts parameters: fitted on a generation's MoE runs after its dense ones,
#: with the dense parameters held (an MoE run also exercises every dense mechanism)
MOE_PARAMETERS = ("grouped_gemm_eff", "expert_us", "a2a_eff")
MEMORY_PARAMETERS = ("reserve_GiB", "allocator_cache")
#: the parameters calibrated.layer_terms' per-layer terms / routed experts' terms do not
#: read (calibrated.layer_terms; a test moves each and compares)
NOT_IN_LAYER_TERMS = frozenset(MOE_PARAMETERS + MEMORY_PARAMETERS)
NOT_IN_ROUTED_TERMS = frozenset(MEMORY_PARAMETERS)
#: a run predicted more than 50 % off counts as this error and no more: such rows are outside
#: what the model expresses (e.g. DeepSpeed ZeRO-3 of 2021, 2-4x slower than any physical
#: account), and they should not drag the physical parameters (a redescending loss)
OUTLIER_LOG_ERROR = float(np.log(1.5))
#: penalty (in log-error units, spread over all runs) for a run whose feasibility the model
#: gets wrong
FEASIBILITY_PENALTY = 2.0
#: weight of the prior: each time parameter adds PRIOR_WEIGHT x log(value / centre)^2 to the
#: objective (the source-balanced mean |log error|, about 0.07 at the fit). A parameter at
#: twice or half its centre costs 0.0024, as much as moving every prediction by 0.24 %: the
#: runs override it wherever they say something; it decides only the directions they leave
#: flat (a Gaussian prior in log space, i.e. ridge regularisation of the log-parameters)
PRIOR_WEIGHT = 0.005
#: a parameter outside its cited physical range pays RANGE_WEIGHT x |log(value / bound)|:
#: leaving it by 10 % costs as much as moving every prediction by 1 %, so the fit leaves a
#: range only where the runs insist (and `calibrate` reports it: a missing mechanism)
RANGE_WEIGHT = 0.1
#: kernel_us may be 0: its prior is on log((value + 1 us) / (centre + 1 us))
PRIOR_OFFSET = {"kernel_us": 1.0}
#: Powell is restarted from its own result while that still improves the objective
MAX_RESTARTS = 5
#: points per parameter of the grid the MoE fit scans for a second start: its objective has
#: more than one basin (fast expert GEMMs with a slow all-to-all, or the reverse), and Powell
#: from the prior centre alone stayed in whichever it met first (on the Blackwell runs the
#: worse one, 0.202 against 0.183, when a hardware file changed)
MOE_GRID_POINTS = 4


class Evaluator:
    """Every option of every case in one stacked context; re-evaluated for new parameters."""

    def __init__(self, cases: Sequence[Case]) -> None:
        self.cases = list(cases)
        contexts, columns, owner = [], [], []
        for i, case in enumerate(self.cases):
            ctx = calibrated.make_context(case.job, case.hw, case.hw.calibration)
            for opt in case.options:
                contexts.append(ctx)
                columns.append(opt)
                owner.append(i)
        self.x = calibrated.stack_contexts(contexts)
        self.c = {k: np.array([o[k] for o in columns]) for k in CANDIDATE_DTYPE.names}
        self.owner = np.array(owner)
        self.generation = np.array([self.cases[i].hw.generation for i in owner])
        # per case: its measured memory counts live tensors only (torch max_memory_allocated)
        self.allocated = np.array([c.mem_definition == "allocated" for c in self.cases], bool)
        # the per-layer terms of the current parameters, and the parameters set since
        self._layers: tuple | None = None
        self._moved: set[str] = set()

    def set_parameters(self, params: Mapping[str, Mapping[str, float]]) -> None:
        """Overwrite calibration entries: {generation or 'memory': {parameter: value}}."""
        keys = {"kernel_us": ("kernel_s", 1e-6), "reserve_GiB": ("reserve_bytes", 2.0**30),
                "grouped_gemm_eff": ("grouped_eff", 1.0), "expert_us": ("expert_s", 1e-6)}
        for gen, values in params.items():
            mask = np.ones(len(self.owner), bool) if gen == "memory" else self.generation == gen
            for k, v in values.items():
                name, scale = keys.get(k, (k, 1.0))
                self.x[name][mask] = v * scale
                self._moved.add(k)

    def layer_terms(self) -> tuple:
        """calibrated.layer_terms of the current parameters: reused while only parameters
        they do not read moved (the MoE fit's, the memory fit's: most of an MoE row's
        evaluation is its per-layer terms)."""
        if self._layers is None or self._moved - NOT_IN_LAYER_TERMS:
            self._layers = calibrated.layer_terms(self.x, self.c)
        elif self._moved - NOT_IN_ROUTED_TERMS and self._layers[1] is not None:
            self._layers = calibrated.layer_terms(self.x, self.c, lay=self._layers[0])
        self._moved = set()
        return self._layers

    def run(self) -> dict[str, np.ndarray]:
        """Per case: predicted step time (best feasible option), memory, feasibility."""
        out = calibrated.evaluate(self.x, self.c, layers=self.layer_terms())
        step, mem, reported = out["step_time_s"], out["mem_bytes"], out["mem_reported_bytes"]
        feasible = out["reason"] == Reason.OK
        # best option per case: feasible first, then the fastest
        order = np.lexsort((step, ~feasible, self.owner))
        _, first = np.unique(self.owner[order], return_index=True)
        chosen = order[first]
        # the memory to compare with the measured figure, as the source counts it
        compared = np.where(self.allocated, out["mem_allocated_bytes"][chosen],
                            reported[chosen])
        return {"step_time_s": step[chosen], "mem_bytes": mem[chosen],
                "mem_reported_bytes": compared, "feasible": feasible[chosen],
                "option": chosen}


@dataclass
class FitResult:
    """Fitted parameters: {generation: {name: value}} plus ``memory``."""

    parameters: dict[str, dict[str, float]]
    rows: dict[str, int]  # rows used per generation (and memory)
    objective: dict[str, float]


def fill_generations(params: Mapping[str, Mapping[str, float]],
                     generations: Sequence[str] = GENERATIONS) -> tuple[dict, dict[str, str]]:
    """``params`` plus every generation it lacks, copied from the nearest fitted one.

    Returns the completed parameters and {generation: the generation it was copied from}.
    """
    out = {k: dict(v) for k, v in params.items()}
    borrowed: dict[str, str] = {}
    fitted = [g for g in GENERATIONS if g in params]
    for gen in generations:
        if gen in out or gen not in GENERATIONS or not fitted:
            continue
        i = GENERATIONS.index(gen)
        donor = min(fitted, key=lambda g: (abs(GENERATIONS.index(g) - i),
                                           -GENERATIONS.index(g)))
        out[gen] = dict(params[donor])
        borrowed[gen] = donor
    return out, borrowed


def predictions(ev: Evaluator) -> tuple[np.ndarray, dict]:
    """Predicted published metric of every case (NaN for OOM rows) and the raw outputs."""
    out = ev.run()
    pred = np.array([float(metric_of(c, out["step_time_s"][i])) if c.metric else np.nan
                     for i, c in enumerate(ev.cases)])
    return pred, out


def log_prior(names: Sequence[str], theta: Sequence[float],
              centres: Mapping[str, float] | None = None) -> float:
    """PRIOR_WEIGHT x the sum of squared log-ratios of the parameters to their centres
    (default: DEFAULT_PARAMETERS)."""
    centres = DEFAULT_PARAMETERS if centres is None else centres
    total = 0.0
    for name, value in zip(names, theta):
        off = PRIOR_OFFSET.get(name, 0.0)
        total += np.log((value + off) / (centres[name] + off)) ** 2
    return PRIOR_WEIGHT * float(total)


def range_penalty(names: Sequence[str], theta: Sequence[float],
                  ranges: Mapping[str, tuple[float, float]]) -> float:
    """RANGE_WEIGHT x the sum of |log-ratios| of each parameter to the nearer end of its
    cited physical range, for the parameters outside it (0 inside). Linear, not squared: a
    parameter the runs barely care about stays on the bound instead of creeping past it."""
    total = 0.0
    for name, value in zip(names, theta):
        if name not in ranges:
            continue
        low, high = ranges[name]
        off = PRIOR_OFFSET.get(name, 0.0)
        if value < low:
            total += np.log((low + off) / (value + off))
        elif value > high:
            total += np.log((value + off) / (high + off))
    return RANGE_WEIGHT * float(total)


def _time_objective(ev: Evaluator, gen: str, names: Sequence[str], weights: np.ndarray,
                    measured: np.ndarray, centres: Mapping[str, float] | None = None,
                    ranges: Mapping[str, tuple[float, float]] | None = None):
    def objective(theta: np.ndarray) -> float:
        ev.set_parameters({gen: dict(zip(names, theta))})
        pred, _ = predictions(ev)
        err = np.abs(np.log(pred / measured))
        err = np.minimum(np.where(np.isfinite(err), err, OUTLIER_LOG_ERROR), OUTLIER_LOG_ERROR)
        return (float(np.sum(weights * err)) + log_prior(names, theta, centres)
                + range_penalty(names, theta, ranges or {}))
    return objective


def load_ranges() -> dict[str, dict[str, tuple[float, float, str]]]:
    """{generation: {parameter: (low, high, source)}} from the catalog's ranges file."""
    from ..engine.catalog import RANGES_FILE, REPO_ROOT, read_yaml

    raw = read_yaml(REPO_ROOT / "hardware" / RANGES_FILE) or {}
    return {gen: {name: (float(e["range"][0]), float(e["range"][1]), str(e["source"]))
                  for name, e in entries.items()} for gen, entries in raw.items()}


def bounds_of(gen: str, name: str, ranges: Mapping) -> tuple[float, float]:
    """The fit's bounds for ``name`` in ``gen``: its cited physical range, else BOUNDS."""
    entry = ranges.get(gen, {}).get(name)
    return (entry[0], entry[1]) if entry else BOUNDS[name]


def centre_of(gen: str, name: str, ranges: Mapping) -> float:
    """Where the fit starts and its prior pulls: the physical centre (DEFAULT_PARAMETERS) if
    inside the range, else the range's geometric middle."""
    low, high = bounds_of(gen, name, ranges)
    centre = DEFAULT_PARAMETERS[name]
    if low <= centre <= high:
        return centre
    return float(np.sqrt(max(low, 1e-3) * high))


def outside_ranges(params: Mapping[str, Mapping[str, float]],
                   ranges: Mapping) -> dict[str, list[str]]:
    """{generation: [parameters outside their cited physical range]}."""
    out: dict[str, list[str]] = {}
    for gen, values in params.items():
        for name, value in values.items():
            entry = ranges.get(gen, {}).get(name)
            if entry and not entry[0] - 1e-9 <= value <= entry[1] + 1e-9:
                out.setdefault(gen, []).append(name)
    return out


def exercised(name: str, cases: Sequence[Case]) -> bool:
    """Whether any of ``cases`` depends on parameter ``name`` (fp8_eff: an fp8 / MXFP8 GEMM,
    fp4_eff: an NVFP4 one;
    attn_eff / fused_attn_eff: FlashAttention-2-class / fused attention)."""
    if name == "fp8_eff":
        return any(c.job.dtype in ("fp8", "mxfp8") for c in cases)
    if name == "fp4_eff":
        return any(c.job.dtype == "nvfp4" for c in cases)
    if name == "attn_eff":
        return any(c.job.attention_kernel == "flash" for c in cases)
    if name == "fused_attn_eff":
        return any(c.job.attention_kernel == "fused" for c in cases)
    return True


def _source_weights(cases: Sequence[Case]) -> np.ndarray:
    sources = [c.source for c in cases]
    counts = {s: sources.count(s) for s in set(sources)}
    w = np.array([1.0 / counts[s] for s in sources])
    return w / w.sum()


def _minimize(objective, start: np.ndarray, bounds: Sequence[tuple[float, float]],
              tol: float = 1e-3):
    try:
        from scipy.optimize import minimize
    except ImportError:  # pragma: no cover - scipy is in the validate / test extras
        from ..errors import SweepError, install_hint

        raise SweepError(f"calibration needs scipy: {install_hint('validate')}") from None
    options = {"xtol": tol, "ftol": tol * 1e-2, "maxfev": 4000}
    best = minimize(objective, start, method="Powell", bounds=bounds, options=options)
    # the mean |log error| has kinks where Powell's line searches stall: a restart from the
    # result, with fresh directions, moves on from them
    for _ in range(MAX_RESTARTS):
        again = minimize(objective, best.x, method="Powell", bounds=bounds, options=options)
        if again.fun > best.fun - tol * 1e-3:
            break
        best = again
    return best.x, float(best.fun)


def _onto_bounds(objective, theta: np.ndarray, limits: Sequence[tuple[float, float]],
                 tol: float = 1e-6) -> np.ndarray:
    """``theta`` with each parameter that ended within 1 % outside its range put on the
    bound, where that does not raise the objective by more than ``tol`` (Powell stops near
    the kink of the range penalty rather than on it)."""
    theta = np.array(theta, dtype=float)
    best = objective(theta)
    for i, (low, high) in enumerate(limits):
        bound = low if theta[i] < low else high if theta[i] > high else None
        if bound is None or abs(np.log(theta[i] / bound)) > 0.01:
            continue
        trial = theta.copy()
        trial[i] = bound
        value = objective(trial)
        if value <= best + tol:
            theta, best = trial, value
    return theta


def _rounded(objective, theta: np.ndarray) -> list[float]:
    """``theta`` to 4 decimals for the file, unless that changes the objective (a memory
    reserve fitted up to where a run just fits must not be rounded past it): then to 6, or
    not at all."""
    best = objective(theta)
    for decimals in (4, 6):
        short = np.round(theta, decimals)
        if objective(short) <= best + 1e-6:  # kinks of the |log error| move it by less
            return [float(v) for v in short]
    return [float(v) for v in theta]


def _fit_moe(gen: str, timed: Sequence[Case], dense: Mapping[str, float], ranges: Mapping,
             within_ranges: bool, tol: float, rows: dict, objective: dict) -> dict[str, float]:
    """MOE_PARAMETERS of ``gen`` fitted on its MoE runs with its dense parameters held
    (the same objective: source-balanced mean |log error|, prior, range penalty); recorded
    in ``rows`` / ``objective`` under "<gen> MoE"."""
    ev = Evaluator(timed)
    ev.set_parameters({gen: dict(dense)})
    names = list(MOE_PARAMETERS)
    centres = {n: centre_of(gen, n, ranges) for n in names}
    limits = [bounds_of(gen, n, ranges if within_ranges else {}) for n in names]
    prior = centres if within_ranges else {n: DEFAULT_PARAMETERS[n] for n in names}
    physical = {n: bounds_of(gen, n, ranges) for n in names if n in ranges.get(gen, {})}
    measured = np.array([c.measured for c in timed])
    objective_moe = _time_objective(ev, gen, names, _source_weights(timed), measured, prior,
                                    physical)
    x0 = np.array([prior[n] for n in names])
    theta, value = _minimize(objective_moe, x0, limits, tol)
    # a second start from the best point of a grid over the physical ranges (else the
    # bounds; geometric spacing), the better of the two kept: deterministic, and no worse
    # than the centre's alone
    axes = [np.geomspace(max(low, 1e-3), high, MOE_GRID_POINTS + 2)[1:-1]
            for low, high in (physical.get(n, lim) for n, lim in zip(names, limits))]
    grid = np.array(np.meshgrid(*axes, indexing="ij")).reshape(len(names), -1).T
    values = np.array([objective_moe(g) for g in grid])
    # (a point whose objective is not a number cannot be the best; if none is, the centre)
    start = grid[int(np.nanargmin(values))] if np.isfinite(values).any() else x0
    other, other_value = _minimize(objective_moe, start, limits, tol)
    if other_value < value or (np.isnan(value) and not np.isnan(other_value)):
        theta, value = other, other_value
    theta = _onto_bounds(objective_moe, theta,
                         [physical.get(n, (-np.inf, np.inf)) for n in names])
    rows[f"{gen} MoE"] = len(timed)
    objective[f"{gen} MoE"] = value
    return dict(zip(names, _rounded(objective_moe, theta)))


#: per-generation fits by (generation, the ids of its runs, tol, within_ranges)
_GENERATION_FITS: dict[tuple, tuple[dict, dict, dict]] = {}


def _fit_generation(gen: str, timed: Sequence[Case], moe_timed: Sequence[Case],
                    ranges: Mapping, within_ranges: bool, tol: float
                    ) -> tuple[dict[str, float], dict[str, int], dict[str, float]]:
    """(parameters, rows, objective) of one generation: its time parameters fitted on its
    dense runs, then its MoE parameters on its MoE runs with those held."""
    rows: dict[str, int] = {}
    objective: dict[str, float] = {}
    if not timed:  # MoE runs only: the dense parameters at their centres
        params = {n: round(centre_of(gen, n, ranges), 4) for n in TIME_PARAMETERS
                  if n != "fused_attn_eff"}
        params.update(_fit_moe(gen, moe_timed, params, ranges, within_ranges, tol, rows,
                               objective))
        return params, rows, objective
    ev = Evaluator(timed)
    centres = {n: centre_of(gen, n, ranges) for n in TIME_PARAMETERS}
    limits = {n: bounds_of(gen, n, ranges if within_ranges else {}) for n in TIME_PARAMETERS}
    prior = centres if within_ranges else DEFAULT_PARAMETERS
    # parameters no run exercises stay at their centres; fp8_eff / fp4_eff only where the
    # generation has a range for them (the tensor cores), fused_attn_eff never: left out,
    # make_context then uses attn_eff for it
    fixed = {n: centres[n] for n in TIME_PARAMETERS if not exercised(n, timed)
             and n != "fused_attn_eff"
             and (n not in ("fp8_eff", "fp4_eff") or n in ranges.get(gen, {}))}
    names = [n for n in TIME_PARAMETERS if exercised(n, timed)]
    ev.set_parameters({gen: fixed})
    x0 = np.array([prior[n] for n in names])
    measured = np.array([c.measured for c in timed])
    physical = {n: bounds_of(gen, n, ranges) for n in names if n in ranges.get(gen, {})}
    objective_gen = _time_objective(ev, gen, names, _source_weights(timed), measured,
                                    prior, physical)
    theta, value = _minimize(objective_gen, x0, [limits[n] for n in names], tol)
    theta = _onto_bounds(objective_gen, theta,
                         [physical.get(n, (-np.inf, np.inf)) for n in names])
    params = {**dict(zip(names, _rounded(objective_gen, theta))),
              **{n: round(v, 4) for n, v in fixed.items()}}
    params = {n: params[n] for n in TIME_PARAMETERS if n in params}
    rows[gen] = len(timed)
    objective[gen] = value
    if moe_timed:
        params.update(_fit_moe(gen, moe_timed, params, ranges, within_ranges, tol, rows,
                               objective))
    return params, rows, objective


def fit(cases: Sequence[Case], tol: float = 1e-3, within_ranges: bool = False) -> FitResult:
    """Fit every generation present in ``cases`` (time), then the memory parameters,
    starting from the prior centres (DEFAULT_PARAMETERS): the result depends on the cases
    only. ``within_ranges``: bound each parameter by its cited physical range
    (hardware/parameter_ranges.yaml) instead of the generic BOUNDS, and centre its prior
    inside that range. Parameters no case exercises take the centre of their range."""
    params: dict[str, dict[str, float]] = {}
    rows: dict[str, int] = {}
    objective: dict[str, float] = {}
    ranges = load_ranges()
    for gen in sorted({c.hw.generation for c in cases}):
        timed = [c for c in cases if c.hw.generation == gen and c.metric and not c.job.is_moe]
        moe_timed = [c for c in cases if c.hw.generation == gen and c.metric and c.job.is_moe]
        if not timed and not moe_timed:
            continue
        # the same runs give the same fit: leave-one-source-out folds that keep a
        # generation's runs reuse its fit (_GENERATION_FITS, per process)
        key = (gen, tuple(c.row.get("id", id(c)) for c in timed + moe_timed), tol,
               within_ranges)
        if key not in _GENERATION_FITS:
            _GENERATION_FITS[key] = _fit_generation(gen, timed, moe_timed, ranges,
                                                    within_ranges, tol)
        gen_params, gen_rows, gen_objective = _GENERATION_FITS[key]
        params[gen] = dict(gen_params)
        rows.update(gen_rows)
        objective.update(gen_objective)
    # memory: measured peaks and feasibility, with the time parameters just fitted
    mem_cases = [c for c in cases if c.mem_measured_bytes or c.oom or c.metric]
    ev = Evaluator(mem_cases)
    ev.set_parameters(params)
    measured = np.array([c.mem_measured_bytes or np.nan for c in mem_cases])
    oom = np.array([c.oom for c in mem_cases])
    has_mem = np.isfinite(measured)

    def mem_objective(theta: np.ndarray) -> float:
        ev.set_parameters({"memory": dict(zip(MEMORY_PARAMETERS, theta))})
        out = ev.run()
        err = np.abs(np.log(out["mem_reported_bytes"][has_mem] / measured[has_mem]))
        wrong = np.count_nonzero(out["feasible"] == oom)
        return float(err.mean() if err.size else 0.0) + FEASIBILITY_PENALTY * wrong / len(oom)

    x0 = np.array([DEFAULT_PARAMETERS[n] for n in MEMORY_PARAMETERS])
    theta, value = _minimize(mem_objective, x0, [BOUNDS[n] for n in MEMORY_PARAMETERS], tol)
    params["memory"] = dict(zip(MEMORY_PARAMETERS, _rounded(mem_objective, theta)))
    rows["memory"] = int(has_mem.sum())
    objective["memory"] = value
    return FitResult(params, rows, objective)


def write_calibration(path, result: FitResult, data) -> None:
    """Write ``hardware/calibration.yaml``: the parameters per generation and a ``fitted``
    block saying on what: ``data``, one CSV path or several (their names joined by " + ",
    the sha256 of their bytes in order); atomically: a temporary file renamed over the old
    one."""
    import datetime
    import hashlib
    import os
    from pathlib import Path

    import yaml

    from ..model.cost.calibrated import MEMORY_PARAMETERS as MEMORY_MEANING
    from ..model.cost.calibrated import PARAMETERS as MEANING

    path = Path(path)
    files = [Path(data)] if isinstance(data, (str, Path)) else [Path(d) for d in data]
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
    params, borrowed = fill_generations(result.parameters)
    header = ["# Parameters of the calibrated cost profile per GPU generation (the `generation`",
              "# key of a hardware file); a hardware file may override any of them under",
              "# `calibration:`. Written by `sweep calibrate --write`; do not edit by hand.", "#"]
    header += [f"#   {k}: {v}" for k, v in {**MEANING, **MEMORY_MEANING}.items()]
    body = {"fitted": {
        "data": " + ".join(f.name for f in files), "data_sha256": digest,
        "date": datetime.date.today().isoformat(),
        "method": "per generation: Powell minimisation, from the prior centres, of the "
                  "source-balanced mean |log error| of the published metric plus a weak "
                  f"log-space prior (weight {PRIOR_WEIGHT}) and {RANGE_WEIGHT} x |log(value / "
                  "bound)| outside each cited physical range (the MoE parameters also from the "
                  f"best point of a {MOE_GRID_POINTS}-per-axis grid over their ranges, the "
                  "better fit kept); memory: |log error| of measured "
                  "peaks plus a penalty per wrong feasibility (sweep/analysis/calibration.py)",
        "rows": dict(result.rows),
        "borrowed": {g: f"no measured runs: {d} values" for g, d in borrowed.items()},
        # parameters outside their cited physical range (hardware/parameter_ranges.yaml):
        # each stands for a mechanism the model lacks
        "outside_range": {g: ", ".join(v) for g, v in
                          outside_ranges(params, load_ranges()).items() if g in result.rows},
    }}
    for gen in GENERATIONS:
        if gen in params:
            body[gen] = params[gen]
    body["memory"] = params["memory"]
    text = "\n".join(header) + "\n" + yaml.safe_dump(body, sort_keys=False, width=100)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)

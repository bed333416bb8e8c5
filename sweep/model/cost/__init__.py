"""The analytical cost core: a block of candidates in, a block of results out.

``evaluate(profile, job, hw, strategy, n_gpus, candidates)`` returns a ``RESULT_DTYPE``
array: the candidates with their iteration time and its breakdown, throughput, MFU/HFU,
memory per GPU and its breakdown, and a feasibility flag with a reason code.
``evaluate_columns`` returns the same as a dict of columns, which the search uses so that
only the top-N rows are ever packed into records. Everything in this package is pure
numpy, vectorised over candidates: no MPI, files, logging or printing.

Profiles:

* ``nersc2024`` - the published model of arXiv 2410.00273, defects included (nersc2024.py);
* ``calibrated`` - our model of real training stacks, calibrated on measured runs
  (calibrated.py, kernels.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..hardware import Hardware
from ..job import Job
from ..rows import HardwareRows
from ..schema import CANDIDATE_DTYPE, METRIC_FIELDS, RESULT_DTYPE, Reason
from . import calibrated, fuse, nersc2024
from .flops import model_flops_per_iteration

__all__ = ["evaluate", "evaluate_columns", "pack_results", "op_table", "PROFILES",
           "strategies", "model_flops_per_iteration", "unmodelled"]

#: profile -> strategies it can evaluate
PROFILES: dict[str, tuple[str, ...]] = {"nersc2024": nersc2024.STRATEGIES,
                                        "calibrated": calibrated.STRATEGIES}

# the kept traces' fingerprint, taken with the model's modules just read (fuse.py: a source
# edited while this process runs must not file the old code's traces under its name)
fuse.freeze_fingerprint()


def unmodelled(job: Job, profile: str = "calibrated") -> str | None:
    """Why ``profile`` cannot cost ``job`` (None: it can). The calibrated profile models
    mixture-of-experts layers, MLA attention and multi-token prediction; the published
    ``nersc2024`` model has dense multi-head blocks only, and refuses the others by name
    rather than costing them as a dense model."""
    if profile != "nersc2024":
        return None
    if job.is_moe:
        return ("mixture-of-experts layers are not modelled by the nersc2024 profile "
                f"({job.n_experts} experts, top-{job.top_k}); use the calibrated profile")
    if job.is_hybrid:
        return ("hybrid Mamba-2 / Transformer models are not modelled by the nersc2024 "
                "profile; use the calibrated profile")
    if job.attention != "mha" or job.hc_streams:
        what = {"mla": "multi-head latent attention (MLA)",
                "csa": "compressed sparse attention (csa)"}.get(job.attention,
                                                                "hyper-connections")
        return f"{what} is not modelled by the nersc2024 profile; use the calibrated profile"
    if job.mtp_layers:
        return ("multi-token-prediction layers are not modelled by the nersc2024 profile; "
                "use the calibrated profile")
    if job.dtype not in ("bf16", "fp16"):
        return f"nersc2024 models 16-bit training only; job {job.name} uses {job.dtype}"
    # the study's block (NERSC model sections 3 - 4): Q, K, V as 3 x hidden with
    # hidden // n_heads a head, and a two-matrix GELU MLP with biases
    if job.attention_width != job.hidden or job.n_kv_heads != job.n_heads:
        return (f"nersc2024 models multi-head attention with n_heads x head_dim = hidden and "
                f"n_kv_heads = n_heads; job {job.name} has n_heads x head_dim = "
                f"{job.n_heads} x {job.head_dim}, hidden = {job.hidden}, n_kv_heads = "
                f"{job.n_kv_heads}")
    if job.mlp != "gelu":
        return (f"nersc2024 models a two-matrix GELU MLP; job {job.name} has mlp: {job.mlp} "
                f"(use the calibrated profile)")
    # the study times a training step with every query attending to the whole sequence
    # (causal or not: its attention is the full square, docs/model.md): a forward-only or
    # windowed job would be timed as that step and counted otherwise in MFU
    other = ("training: false (forward only)" if not job.training else
             f"sliding_window: {job.sliding_window}" if job.sliding_window else None)
    if other:
        return (f"nersc2024 times a training step of full-sequence attention; job "
                f"{job.name} has {other} (use the calibrated profile)")
    return None


def strategies(profile: str) -> tuple[str, ...]:
    """Strategies a profile knows (raises KeyError for an unknown profile)."""
    return PROFILES[profile]


#: the nersc2024 profile ranks on step time and memory alone from this many rows of a block
NERSC_SCORES_MIN_ROWS = 16384


#: metrics evaluate_columns computes itself from the others
_DERIVED = ("feasible", "reason", "samples_per_s", "tokens_per_s", "model_flops", "mfu", "hfu")
#: the other metrics (all float64): 0 where a profile leaves one out
_FLOAT_METRICS = tuple(name for name, _, _, _ in METRIC_FIELDS if name not in _DERIVED)


def evaluate_columns(profile: str, job: Job, hw: Hardware, strategy: str, n_gpus: int,
                     candidates: Mapping[str, np.ndarray], scores_only: bool = False,
                     screen: bool | None = False) -> dict[str, np.ndarray]:
    """Evaluate a block of candidates of one case; every METRIC column as an array.

    Args:
        profile: cost-model profile name (a key of :data:`PROFILES`).
        job: the workload.
        hw: the hardware variant, or a :class:`~sweep.model.rows.HardwareRows` giving
            each candidate row its variant (cases that differ only in hardware).
        strategy: a strategy of the profile.
        n_gpus: GPU count of the case (= dp * tp * tp2 * cp * pp of every candidate).
        candidates: a column block (CANDIDATE field -> (n,) array) or ``CANDIDATE_DTYPE``.
        scores_only: what a search ranks by is enough: ``samples_per_s``, ``reason`` and
            ``feasible`` are always there; the other metrics may be missing, and then
            ``complete`` is False (evaluate the rows kept again, in full).
        screen: (calibrated, scores only, fused evaluation on, blocks from
            calibrated.SCREEN_MIN_ROWS rows) step times for the rows that fit in memory
            only, the others inf and their ``samples_per_s`` 0 (True), for every row
            (False), or as a sample of the block says (None): the rows that fit get the same
            numbers either way (what a search ranks).
    """
    n = len(candidates["index"])
    if profile == "nersc2024":
        # (on scores alone only in large blocks: the rows a search keeps are evaluated
        # again in full, which a small block's saving does not repay)
        scores_only = scores_only and n >= NERSC_SCORES_MIN_ROWS
        cols = nersc2024.evaluate(job, hw, strategy, candidates, scores_only=scores_only)
        capacity = hw.hbm_capacity_bytes
        peak = hw.matrix_peak("fp16")
        if scores_only and "hardware_flops" not in cols:  # step time and memory alone
            step = np.broadcast_to(cols["step_time_s"], (n,))
            reason = np.where(np.broadcast_to(cols["mem_bytes"], (n,)) > capacity,
                              np.int8(Reason.OUT_OF_MEMORY), np.int8(Reason.OK))
            return {"step_time_s": step, "samples_per_s": job.global_batch / step,
                    "reason": reason, "feasible": reason == Reason.OK, "complete": False}
    elif profile == "calibrated":
        if isinstance(hw, HardwareRows):  # rows of several variants (search_cases)
            x = calibrated.make_row_context(job, hw, strategy)
            columns = {k: candidates[k] for k in CANDIDATE_DTYPE.names}
            cols = calibrated.evaluate(x, dict(columns, variant=hw.row), scores_only, screen)
        else:
            x = calibrated.make_context(job, hw, hw.calibration, strategy)
            cols = calibrated.evaluate(x, candidates, scores_only, screen)
        if scores_only and "mem_bytes" not in cols:
            step = np.broadcast_to(cols["step_time_s"], (n,))
            reason = np.broadcast_to(cols["reason"], (n,)).astype(np.int8)
            return {"step_time_s": step, "samples_per_s": job.global_batch / step,
                    "reason": reason, "feasible": reason == Reason.OK, "complete": False}
        capacity = np.inf  # calibrated.evaluate sets its own reasons (HBM and host tiers)
        peak = x["peak16_flops_per_s"]
    else:
        raise KeyError(f"unknown cost profile {profile!r}")
    # (the metrics a profile leaves out are 0: float64 rows of one block of zeros; those
    # set below are not filled first)
    missing = [name for name in _FLOAT_METRICS if name not in cols]
    zeros = np.zeros((len(missing), n))
    for name, row in zip(missing, zeros):
        cols[name] = row
    for name in _FLOAT_METRICS:
        v = cols[name]
        if type(v) is not np.ndarray or v.shape != (n,):
            cols[name] = np.broadcast_to(v, (n,))
    step = cols["step_time_s"]
    cols["samples_per_s"] = job.global_batch / step
    cols["tokens_per_s"] = job.global_batch * job.seq_len / step
    cols["model_flops"] = np.full(n, model_flops_per_iteration(job, job.training) / n_gpus)
    step_peak = step * peak
    cols["mfu"] = cols["model_flops"] / step_peak
    cols["hfu"] = cols["hardware_flops"] / step_peak
    oom = cols["mem_bytes"] > capacity
    cols["reason"] = np.where(oom, np.int8(Reason.OUT_OF_MEMORY),
                              cols.get("reason", np.int8(Reason.OK))).astype(np.int8)
    cols["feasible"] = cols["reason"] == Reason.OK
    cols["complete"] = True
    return cols


def pack_results(candidates: Mapping[str, np.ndarray], metrics: Mapping[str, np.ndarray],
                 positions: np.ndarray | None = None) -> np.ndarray:
    """``RESULT_DTYPE`` rows from candidate and metric columns (optionally only ``positions``)."""
    n = len(candidates["index"]) if positions is None else len(positions)
    out = np.empty(n, RESULT_DTYPE)
    for name in CANDIDATE_DTYPE.names:
        col = np.asarray(candidates[name])
        out[name] = col if positions is None else col[positions]
    for name, _, _, _ in METRIC_FIELDS:
        col = np.asarray(metrics[name])
        out[name] = col if positions is None else col[positions]
    return out


def evaluate(profile: str, job: Job, hw: Hardware, strategy: str, n_gpus: int,
             candidates: Mapping[str, np.ndarray]) -> np.ndarray:
    """Evaluate a block of candidates of one case; ``(n,) RESULT_DTYPE``.

    Infeasible rows have ``feasible = False`` and a :class:`~sweep.model.schema.Reason`.
    """
    return pack_results(candidates,
                        evaluate_columns(profile, job, hw, strategy, n_gpus, candidates))


def op_table(profile: str, job: Job, hw: Hardware, strategy: str,
             candidates: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Per-op rows of the iteration time (rows sum to ``step_time_s``); see the profile."""
    if profile == "nersc2024":
        return nersc2024.op_table(job, hw, strategy, candidates)
    if profile == "calibrated":
        return calibrated.op_table(calibrated.make_context(job, hw, hw.calibration, strategy),
                                   candidates)
    raise KeyError(f"unknown cost profile {profile!r}")

"""The analytical cost core: a block of candidates in, a block of results out.

``evaluate(profile, job, hw, strategy, n_gpus, candidates)`` returns a ``RESULT_DTYPE``
array: the candidates with their iteration time and its breakdown, throughput, MFU/HFU,
memory per GPU and its breakdown, and a feasibility flag with a reason code. Everything in
this package is pure numpy, vectorised over candidates: no MPI, files, logging or printing.

Profiles:

* ``nersc2024`` - the published model of arXiv 2410.00273, defects included (nersc2024.py).
"""

from __future__ import annotations

import numpy as np

from ..hardware import Hardware
from ..job import Job
from ..schema import RESULT_DTYPE, Reason
from . import nersc2024
from .flops import model_flops_per_iteration

__all__ = ["evaluate", "PROFILES", "strategies", "model_flops_per_iteration"]

#: profile -> strategies it can evaluate
PROFILES: dict[str, tuple[str, ...]] = {"nersc2024": nersc2024.STRATEGIES}


def strategies(profile: str) -> tuple[str, ...]:
    """Strategies a profile knows (raises KeyError for an unknown profile)."""
    return PROFILES[profile]


def evaluate(profile: str, job: Job, hw: Hardware, strategy: str, n_gpus: int,
             candidates: np.ndarray) -> np.ndarray:
    """Evaluate a block of candidates of one case.

    Args:
        profile: cost-model profile name (a key of :data:`PROFILES`).
        job: the workload.
        hw: the hardware variant.
        strategy: a strategy of the profile.
        n_gpus: GPU count of the case (= dp * tp * tp2 * cp * pp of every candidate).
        candidates: ``(n,) CANDIDATE_DTYPE``.

    Returns:
        ``(n,) RESULT_DTYPE``; infeasible rows have ``feasible = False`` and a reason.
    """
    if profile == "nersc2024":
        cols = nersc2024.evaluate(job, hw, strategy, candidates)
        capacity = hw.hbm_capacity_bytes
        peak = hw.matrix_peak("fp16")
    else:
        raise KeyError(f"unknown cost profile {profile!r}")
    out = np.zeros(len(candidates), RESULT_DTYPE)
    for name in candidates.dtype.names:
        out[name] = candidates[name]
    for name, values in cols.items():
        out[name] = values
    step = out["step_time_s"]
    out["samples_per_s"] = job.global_batch / step
    out["tokens_per_s"] = job.global_batch * job.seq_len / step
    out["model_flops"] = model_flops_per_iteration(job) / n_gpus
    out["mfu"] = out["model_flops"] / (step * peak)
    out["hfu"] = out["hardware_flops"] / (step * peak)
    oom = out["mem_bytes"] > capacity
    out["reason"] = np.where(oom, Reason.OUT_OF_MEMORY, out["reason"])
    out["feasible"] = out["reason"] == Reason.OK
    return out

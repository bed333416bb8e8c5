"""The record types passed between pipeline stages, declared once.

``CANDIDATE_DTYPE`` is one parallel configuration; ``RESULT_DTYPE`` is a candidate plus
everything the cost core computes for it. Both are numpy structured dtypes, so a block of
candidates is one array, and the ``/top`` table of the HDF5 output is the same array.
"""

from __future__ import annotations

import enum
import operator

import numpy as np

__all__ = ["CANDIDATE_FIELDS", "CANDIDATE_DTYPE", "METRIC_FIELDS", "RESULT_DTYPE", "Reason",
           "Recompute", "UNITS", "empty_candidates", "empty_results", "concat_records"]

#: (name, numpy type, meaning); candidate = one parallel configuration of one case
CANDIDATE_FIELDS = [
    ("index", "i8", "position in the case's candidate space (stable; the tie-break key)"),
    ("dp", "i4", "data-parallel degree"),
    ("tp", "i4", "tensor-parallel degree (1D Megatron TP, or the first SUMMA grid dim)"),
    ("tp2", "i4", "second SUMMA grid dimension (2D tensor parallel); 1 otherwise"),
    ("cp", "i4", "context (sequence) parallel degree; 1 = none"),
    ("pp", "i4", "pipeline-parallel stages"),
    ("mbs", "i4", "micro-batch size, sequences"),
    ("nb", "i4", "SUMMA panels per GEMM (2D only); 1 otherwise"),
    ("vpp", "i4", "virtual pipeline stages per GPU (interleaved 1F1B); 1 = plain 1F1B"),
    ("nv_tp", "i4", "GPUs of one TP group inside one NVLink domain"),
    ("nv_tp2", "i4", "GPUs of one tp2 group inside one NVLink domain"),
    ("nv_cp", "i4", "GPUs of one CP group inside one NVLink domain"),
    ("nv_dp", "i4", "GPUs of one DP group inside one NVLink domain"),
    ("nv_pp", "i4", "GPUs of one PP group inside one NVLink domain"),
    ("recompute", "i1", "activation recompute: 0 none, 1 selective (attention core), 2 full, "
                        "3 first-k layers, 4 per-op (attention and every other GEMM output kept)"),
    ("recompute_layers", "i4", "layers per stage recomputed when recompute = 3"),
    ("zero", "i1", "ZeRO stage 0-3 (3 = FSDP full shard)"),
    ("shard_group", "i4", "GPUs a ZeRO/FSDP shard spans (HSDP); 0 = the whole DP group"),
    ("sp", "i1", "Megatron sequence parallelism in the TP region (0/1)"),
    ("tp_overlap", "i1", "TP communication overlapped with GEMMs (0/1)"),
    ("offload", "i1", "bit mask: 1 weights, 2 activations, 4 optimizer to the second tier"),
    ("cp_comm", "i1", "context-parallel K/V exchange: 0 ring (overlapped), 1 all-gather"),
    ("ep", "i4", "expert-parallel degree (MoE); 1 otherwise"),
    ("etp", "i4", "expert tensor-parallel degree (MoE); 1 otherwise"),
    ("nv_ep", "i4", "GPUs of one EP group inside one NVLink domain (from the placement)"),
    ("a2a_overlap", "i1", "MoE all-to-all overlapped with another micro-batch's compute "
                          "(Megatron-Core overlap_moe_expert_parallel_comm) (0/1)"),
]
CANDIDATE_DTYPE = np.dtype([(n, t) for n, t, _ in CANDIDATE_FIELDS])

#: (name, numpy type, unit, meaning); per-iteration totals per GPU unless stated
METRIC_FIELDS = [
    ("feasible", "?", "", "fits in memory and is expressible"),
    ("reason", "i1", "", "Reason code (0 = OK)"),
    ("step_time_s", "f8", "s", "time of one training iteration (global batch)"),
    ("samples_per_s", "f8", "1/s", "global batch / step time"),
    ("tokens_per_s", "f8", "1/s", "global tokens per second"),
    ("mfu", "f8", "", "model FLOP utilisation (6N + attention, no recompute)"),
    ("hfu", "f8", "", "hardware FLOP utilisation (every FLOP the model executes)"),
    ("model_flops", "f8", "FLOP", "model FLOPs per GPU per iteration"),
    ("hardware_flops", "f8", "FLOP",
     "executed FLOPs per GPU per iteration (averaged over the pipeline stages)"),
    ("t_compute_s", "f8", "s", "compute time (roofline compute side)"),
    ("t_memory_s", "f8", "s", "exposed HBM time (memory-bound part beyond compute)"),
    ("t_tp_comm_s", "f8", "s", "exposed tensor-parallel communication"),
    ("t_cp_comm_s", "f8", "s", "exposed context-parallel (K/V) communication"),
    ("t_ep_comm_s", "f8", "s", "exposed expert-parallel communication (MoE token all-to-all "
                               "and expert-TP collectives)"),
    ("t_dp_comm_s", "f8", "s", "exposed data-parallel communication"),
    ("t_pp_comm_s", "f8", "s", "exposed pipeline point-to-point communication"),
    ("t_bubble_s", "f8", "s", "pipeline bubble"),
    ("t_optimizer_s", "f8", "s", "optimizer step"),
    ("t_offload_s", "f8", "s", "exposed transfers to the second memory tier"),
    ("mem_bytes", "f8", "B", "memory per GPU (the most loaded stage)"),
    ("mem_weights_bytes", "f8", "B", "weights"),
    ("mem_grads_bytes", "f8", "B", "weight gradients"),
    ("mem_optimizer_bytes", "f8", "B", "optimizer state (master weights, moments)"),
    ("mem_activations_bytes", "f8", "B", "stored activations"),
    ("mem_other_bytes", "f8", "B", "workspace, communication buffers, allocator reserve"),
]
RESULT_DTYPE = np.dtype(CANDIDATE_DTYPE.descr + [(n, t) for n, t, _, _ in METRIC_FIELDS])

#: unit of every RESULT column ('' = dimensionless or a count)
UNITS = {n: "" for n, _, _ in CANDIDATE_FIELDS} | {n: u for n, _, u, _ in METRIC_FIELDS}


class Reason(enum.IntEnum):
    """Why a candidate is infeasible (0 = it is feasible)."""

    OK = 0
    OUT_OF_MEMORY = 1  # memory per GPU exceeds HBM capacity
    OFFLOAD_CAPACITY = 2  # offloaded state exceeds the second memory tier
    NOT_EXPRESSIBLE = 3  # combination the profile cannot model


class Recompute(enum.IntEnum):
    """Activation recompute policy (column ``recompute``)."""

    NONE = 0
    SELECTIVE = 1  # Megatron selective: attention core recomputed (Korthikanti 2022 §4)
    FULL = 2  # every block recomputed from its input checkpoint
    FIRST_K = 3  # the first recompute_layers blocks of each stage fully recomputed
    OP_SAC = 4  # per-op selective: attention and every other GEMM output kept (torchtitan)


_CANDIDATE_DEFAULTS = {"tp2": 1, "cp": 1, "nb": 1, "vpp": 1, "nv_tp": 1, "nv_tp2": 1,
                       "nv_cp": 1, "nv_dp": 1, "nv_pp": 1, "ep": 1, "etp": 1, "nv_ep": 1}


def _neutral_candidate() -> np.ndarray:
    out = np.zeros(1, CANDIDATE_DTYPE)
    for k, v in _CANDIDATE_DEFAULTS.items():
        out[k] = v
    out.flags.writeable = False
    return out


#: one candidate with the neutral defaults, which empty_candidates repeats
_NEUTRAL = _neutral_candidate()


def empty_candidates(n: int) -> np.ndarray:
    """``(n,) CANDIDATE_DTYPE`` with neutral defaults (the optional degrees 1, knobs off;
    tp, dp, pp and mbs 0, for the caller to set)."""
    # (one record repeated: a fill of each default field cost 1.2 - 3x more for 300 rows,
    # 6 - 9x for 100,000)
    return np.repeat(_NEUTRAL, operator.index(n))


def empty_results(n: int) -> np.ndarray:
    """``(n,) RESULT_DTYPE`` of zeros."""
    return np.zeros(n, RESULT_DTYPE)


def concat_records(tables: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """``np.concatenate`` of structured tables of ``dtype``, in its ``dtype`` object.

    numpy promotes two structured dtypes field by field in Python on every call, even equal
    ones (``_promote_fields``: 0.12 s to join 1,300 top-N tables, 0.13 ms a pair), so the
    tables are joined as raw records of the same size and viewed back; if any table has
    another dtype (a file's, say), this is ``np.concatenate`` itself.
    """
    dtype = np.dtype(dtype)
    if not tables:
        return np.zeros(0, dtype)
    if not all(t.dtype == dtype for t in tables):
        return np.concatenate(tables)
    record = np.dtype((np.void, dtype.itemsize))
    return np.concatenate([np.ascontiguousarray(t).view(record) for t in tables]).view(dtype)

"""The ``calibrated`` profile: our model of real training stacks, calibrated on measured runs.

It keeps the structure of the NERSC model (per-op costs per layer and micro-batch, composed
into an iteration) but corrects its defects (nersc2024_model.md section 11) and models what
production stacks do: GQA/MQA, GELU or SwiGLU MLPs, LayerNorm or RMSNorm, causal or full
attention computed by FlashAttention or materialized, embedding + LM head + loss on the
first/last pipeline stage, activation recompute (none, selective, per-op, full, first-k
layers), Megatron sequence parallelism, TP communication overlap, context parallelism (ring
or all-gather of K and V), 2D SUMMA tensor parallelism, pipeline 1F1B and interleaved
schedules, ZeRO-1/2/3 and FSDP (full and hybrid shard), bf16 and fp8 GEMMs, the Adam step,
offload to a second memory tier, and forward-only inference.

Hardware efficiency is physical: GEMM time from tile and wave quantization (kernels.py),
memory-bound ops at an achievable HBM fraction, hierarchical ring collectives over the NVLink
domain and the NICs, fixed per-kernel overhead. A few parameters per GPU generation are
calibrated on public measured runs (``hardware/calibration.yaml``; sweep.analysis.calibration).

Everything here is vectorised over candidates, and the evaluation context ``x`` (job,
hardware, calibration numbers; SI units: FLOP/s, B/s, s, bytes, named in the keys) may itself
hold arrays, one entry per candidate: that is how ``sweep validate`` evaluates every measured
run in one call. Pure numpy.

Sources cited below: Korthikanti et al. 2022 (arXiv 2205.05198) "K22"; Narayanan et al. 2021
(arXiv 2104.04473) "N21"; Rajbhandari et al. 2020, ZeRO (arXiv 1910.02054); Zhao et al. 2023,
PyTorch FSDP (arXiv 2304.11277); Dao 2023, FlashAttention-2 (arXiv 2307.08691); Liu et al.
2023, Ring Attention (arXiv 2310.01889); NVIDIA NCCL performance notes (ring bus bandwidth).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from ..hardware import GENERATION_DEFAULTS, Hardware
from ..job import CSA_RATIO, Job
from ..rows import HardwareRows
from ..schema import Reason, Recompute
from . import csa, dsa, moe
from .dedup import unique_rows
from .flops import csa_keys_per_query, dsa_keys_per_query
from .fuse import Gathered, as_array, fused, map_leaves
from .fuse import enabled as fuse_enabled
from .kernels import (
    FLASH_KV_BLOCK,
    collective_s,
    flash_attention_s,
    gemm_passes_s,
    gemm_s,
    memory_s,
    p2p_s,
)

__all__ = ["evaluate", "op_table", "make_context", "make_row_context", "stack_contexts",
           "STRATEGIES", "DEFAULT_PARAMETERS", "PARAMETERS", "TP_OVERLAP_RESIDUAL",
           "ADAM_BYTES_PER_PARAM"]

#: 1d: Megatron tensor parallelism (with context parallelism as a degree of its own);
#: 2d: SUMMA over a tp x tp2 grid
STRATEGIES = ("1d", "2d")

#: the generation's typical values of hardware facts a file may leave out (hardware.py
#: GENERATION_DEFAULTS, with their sources): sustained GEMM fraction, FLOPs per exponential
SUSTAINED_FRACTION = GENERATION_DEFAULTS["matrix_sustained_fraction"]
FLOPS_PER_EXP = GENERATION_DEFAULTS["matrix_flops_per_exp"]


#: calibrated parameters (per GPU generation) and their meaning
PARAMETERS = {
    "gemm_eff": "fraction of the GPU's sustained best-shape GEMM rate a training GEMM reaches",
    "attn_eff": "fraction of the 16-bit tensor peak FlashAttention-2-class kernels sustain",
    "fused_attn_eff": "fraction of the 16-bit tensor peak fused attention (cuDNN via "
                      "Transformer Engine, FlashAttention-3) sustains",
    "hbm_eff": "fraction of HBM bandwidth memory-bound kernels sustain",
    "kernel_us": "fixed cost per kernel (launch, tail, framework), microseconds",
    "nvl_eff": "fraction of NVLink bandwidth a ring collective sustains",
    "net_eff": "fraction of scale-out NIC bandwidth a ring collective sustains",
    "fp8_eff": "fp8 / MXFP8 GEMM throughput relative to the fp8 peak x gemm_eff (scaling, "
               "casts)",
    "fp4_eff": "NVFP4 GEMM throughput relative to the fp4 peak x gemm_eff",
    "grouped_gemm_eff": "fraction of the sustained GEMM rate the grouped expert GEMMs of an "
                        "MoE layer reach (many small GEMMs in one launch)",
    "expert_us": "host time to prepare one expert's GEMM in a grouped linear (split or "
                 "quantize its input, its weight and gradient buffers), microseconds",
    "a2a_eff": "fraction of the link bandwidth (NVLink, or the NICs) the MoE token "
               "all-to-all sustains per GPU",
}
#: memory parameters (all generations): reserved bytes and allocator overhead
MEMORY_PARAMETERS = {
    "reserve_GiB": "CUDA context, NCCL and library workspaces, GiB",
    "allocator_cache": "freed blocks the caching allocator keeps, as a fraction of activation "
                       "memory: in reported (nvidia-smi / max reserved) memory, not in what a "
                       "run needs",
}
#: the parameters' physical centres: the values before any fit and the centres of the weak
#: prior the fit keeps (calibration.py PRIOR_WEIGHT). Round figures of what the hardware
#: sustains in isolation: training GEMMs about 3/4 of the best shape's rate;
#: FlashAttention-2 50 - 73 % of the A100 peak (Dao 2023, abstract); streaming kernels about
#: 80 % of the HBM datasheet bandwidth; a few microseconds per kernel launch; NCCL ring bus
#: bandwidth (nccl-tests' busbw) about 3/4 of NVLink's and 85 % of a NIC's line rate; fp8
#: GEMMs 70 % of peak x gemm_eff (scaling, casts); a 2 GiB reserve and a 10 % allocator cache
DEFAULT_PARAMETERS = {"gemm_eff": 0.75, "attn_eff": 0.5, "fused_attn_eff": 0.5, "hbm_eff": 0.8,
                      "kernel_us": 5.0, "nvl_eff": 0.75, "net_eff": 0.85, "fp8_eff": 0.7,
                      "fp4_eff": 0.7, "grouped_gemm_eff": 0.75, "expert_us": 20.0,
                      "a2a_eff": 0.7,
                      "reserve_GiB": 2.0, "allocator_cache": 0.1}

#: GEMM precisions below 16 bits: per-tensor scaled fp8 (Transformer Engine delayed or
#: current scaling) and the block-scaled formats of Blackwell's tensor cores
LOW_PRECISION = ("fp8", "mxfp8", "nvfp4")
#: bytes of scale per element of a block-scaled tensor: MXFP8, one E8M0 scale per 32 elements
#: (OCP Microscaling Formats spec v1.0, section 5.1); NVFP4, one E4M3 scale per 16 elements
#: (NVIDIA, "Pretraining LLMs with NVFP4", arXiv 2509.25149, section 2; the per-tensor fp32
#: scale is negligible)
SCALE_BYTES = {"fp8": 0.0, "mxfp8": 1.0 / 32.0, "nvfp4": 1.0 / 16.0}
#: bytes per element of the low-precision values
VALUE_BYTES = {"fp8": 1.0, "mxfp8": 1.0, "nvfp4": 0.5}
#: copies a cast writes: per-tensor fp8 casts once (its transpose is a cheap fp8 transpose,
#: counted in the 3 B per element the model has charged since its first calibration);
#: block-scaled formats quantize along the reduction dimension, so the transposed operand of
#: the backward GEMMs is quantized again from the 16-bit source, a row-wise and a
#: column-wise copy (Transformer Engine docs, "Using FP8 with Transformer Engine": MXFP8
#: and NVFP4 recipes; arXiv 2509.25149 section 4.1)
COPIES = {"fp8": 1.0, "mxfp8": 2.0, "nvfp4": 2.0}
#: GPU generations whose fp8 tensor cores take only the TN layout, so per-tensor fp8 keeps a
#: transposed copy next to the row-wise one for the backward GEMMs (Hopper; Blackwell's
#: take any layout: Transformer Engine quantizer.cpp, with_transpose = columnwise_usage &&
#: !is_non_tn_fp8_gemm_supported; docs fp8_current_scaling.rst, "Blackwell hardware supports
#: multiple GEMM layouts natively, eliminating the need for explicit transposes")
TN_ONLY_FP8 = ("hopper",)
#: low-precision copies of a linear layer's input kept for its backward (the weight-gradient
#: GEMM): one, in the layout that GEMM reads (Transformer Engine's Linear / LayerNormLinear /
#: LayerNormMLP save the quantized input rather than the 16-bit one when fp8 is on)
SAVED_COPIES = {"fp8": 1.0, "mxfp8": 1.0, "nvfp4": 1.0}
#: fp8 with blockwise scaling (DeepSeek-V3's recipe; TE Float8BlockScaling): one fp32 scale
#: per 1 x 128 block of activations and gradients, per 128 x 128 block of weights (the
#: latter negligible), and a 1D-scaled tensor cannot be transposed, so its column-wise copy
#: is quantized again from the 16-bit source, both usages in one pass (TE docs,
#: fp8_blockwise_scaling.rst, "Scaling factors", "Handling transposes")
BLOCKWISE_SCALE_BYTES = 4.0 / 128.0
#: blockwise fp8's copies of a 1D-scaled input: row- and column-wise, as the block-scaled
#: formats' (COPIES); a weight's 128 x 128 blocks are transposed with their scales
BLOCKWISE_COPIES = 2.0
#: blockwise fp8 GEMMs on Hopper against per-tensor fp8 ones: "on Hopper, block-scaled
#: GEMMs are software-emulated" (TE docs, fp8_blockwise_scaling.rst). TE's benchmark on an
#: H200 NVL (hidden 4096, FFN 16384, 15,872 tokens; docs/examples/gemm_profiling, "Worked
#: Example: 5B Model on H200"), per-layer GEMM time: per-tensor fp8 16.785 ms with inputs
#: pre-quantized, 20.285 ms with current scaling's casts (~6 B an element) and 18.978 ms
#: with delayed scaling's (~4 B: 2.19 ms); blockwise 22.882 ms, whose casts move ~4 B an
#: element in one pass as delayed's do: its GEMMs about 20.7 ms, 16.785 / 20.7 = 0.81
BLOCKWISE_HOPPER_GEMM = 0.81


def _blockwise(job: Job) -> bool:
    """Whether ``job`` runs fp8 with blockwise scaling."""
    return job.dtype == "fp8" and job.fp8_scaling == "blockwise"


def _scale_bytes(job: Job) -> float:
    """Bytes of scale per element of the job's low-precision copies (SCALE_BYTES; blockwise
    fp8: an fp32 scale per 128)."""
    return BLOCKWISE_SCALE_BYTES if _blockwise(job) else SCALE_BYTES[job.dtype]


def unsupported_precision(dtype: str, hw: Hardware) -> str | None:
    """Why ``hw`` cannot run GEMMs in ``dtype`` (None: it can). fp8 needs fp8 tensor cores
    (Hopper, Ada, Blackwell: an ``fp8`` peak in the hardware file); MXFP8 and NVFP4 need
    block-scaled ones (Blackwell: an ``fp4`` peak). Never a silent fallback to another
    format's peak."""
    if dtype == "fp8" and "fp8" not in hw.matrix_flops_per_s:
        return f"fp8 needs fp8 tensor cores; hardware {hw.name!r} has no fp8 peak"
    # bf16 tensor cores arrived with Ampere (NVIDIA A100 Tensor Core GPU Architecture
    # whitepaper, "BF16"): a Volta GPU's fp16 peak is not a bf16 one
    if dtype == "bf16" and "bf16" not in hw.matrix_flops_per_s and hw.generation == "volta":
        return (f"bf16 needs bf16 tensor cores (Ampere or later); hardware {hw.name!r} is a "
                f"Volta GPU without them (train it in fp16: dtype fp16)")
    if dtype in ("mxfp8", "nvfp4") and "fp4" not in hw.matrix_flops_per_s:
        return (f"{dtype} needs block-scaled tensor cores (Blackwell); hardware {hw.name!r} "
                f"has none (its file gives no matrix_tflops.fp4, the key that declares them)")
    return None


def unsupported_job_precision(job: Job, hw: Hardware) -> str | None:
    """unsupported_precision of the job's dtype, or of its Mamba-2 out_proj's own format
    (mamba_out_dtype, a low-precision job's), or DSA's kernels on a GPU before Hopper,
    naming the key."""
    why = unsupported_precision(job.dtype, hw)
    if why:
        return f"dtype: {why}"
    if job.dsa and job.dtype == "fp32":
        return "dtype: DeepSeek sparse attention's fused kernels are 16-bit; fp32 is not run"
    if job.dsa and hw.generation in dsa.BEFORE_HOPPER:
        # (Megatron-Core's fused DSA kernels need SM90 or newer, dsa_cudnn_kernels.py L340 -
        # 345; before it an unfused fallback materialises every score)
        return (f"index_topk: DeepSeek sparse attention's fused kernels need Hopper or newer; "
                f"{hw.name} is {hw.generation}")
    if job.mamba_out_dtype and job.dtype in LOW_PRECISION and job.mamba_layers:
        why = unsupported_precision(job.mamba_out_dtype, hw)
        if why:
            return f"mamba_out_dtype: {why}"
    return None


def low_precision(dtype: str, hw: Hardware) -> tuple[float, float]:
    """(bytes per element of the low-precision copy of a GEMM operand, scales included;
    tensor peak FLOP/s of the format) for a job's dtype; (0, 0) for 16/32-bit jobs.

    MXFP8 runs at the fp8 tensor rate and NVFP4 at the fp4 rate (B200 / GB200 / GB300
    datasheets); both need block-scaled tensor cores, which a hardware file declares with an
    ``fp4`` peak.

    Raises:
        ValueError: the hardware has no tensor cores for the format (unsupported_precision).
    """
    if dtype not in LOW_PRECISION:
        return 0.0, 0.0
    why = unsupported_precision(dtype, hw)
    if why:
        raise ValueError(why)
    peak = hw.matrix_flops_per_s["fp4" if dtype == "nvfp4" else "fp8"]
    copies = 2.0 if dtype == "fp8" and hw.generation in TN_ONLY_FP8 else COPIES[dtype]
    return copies * (VALUE_BYTES[dtype] + SCALE_BYTES[dtype]), peak


def saved_input_bytes(job: Job) -> float:
    """Bytes per element of the linear-layer inputs a job keeps for its backward pass: the
    low-precision copy with its scales (SAVED_COPIES) when the job computes its GEMMs below
    16 bits and its stack saves them so (Job.lp_saved_inputs), else the 16/32-bit value."""
    if job.dtype in LOW_PRECISION and job.lp_saved_inputs:
        return SAVED_COPIES[job.dtype] * (VALUE_BYTES[job.dtype] + _scale_bytes(job))
    return 4.0 if job.dtype == "fp32" else 2.0


#: share of a TP collective left exposed when it is overlapped with GEMMs (the first chunk
#: of a pipelined ring; Wang et al. 2023, "Overlap communication with dependent computation")
TP_OVERLAP_RESIDUAL = 0.15
#: the Mamba-2 SSD scan's rate as a fraction of the 16-bit tensor peak, for its FLOPs as
#: Megatron counts them (7 d_inner N a token): the Triton chunk_scan kernel of mamba-ssm
#: 2.2.6 runs 90 - 110 TFLOP/s on an H800 (batch 8, 80 heads of 64, N 128, chunk 256, 1K -
#: 32K tokens; tile-ai/tilelang benchmark/mamba2/README.md @4d8e609), 2.6 MFLOP a token by
#: that benchmark's count; with chunk_state (1.3 MFLOP a token at about the same rate) and
#: the three lighter kernels, the forward runs ~4.6 MFLOP (Megatron's count) a token in the
#: time of ~4.4 MFLOP at 100 TFLOP/s: ~0.10 of the 989 TFLOP/s peak (notes section 27)
SSD_EFF = 0.10
#: the SSD backward over its forward: ssd_combined.py's backward reruns four of the five
#: forward kernels (cumsum, C B^T, chunk states, state passing) and then runs two gradient
#: matmuls per forward one (state-spaces/mamba mamba_ssm/ops/triton/ssd_combined.py
#: _mamba_chunk_scan_combined_bwd), as FlashAttention's backward does (FLASH_BWD_FACTOR)
SSD_BWD_FACTOR = 2.5
#: kernels of the fused convolution and scan: forward cumsum, C B^T, chunk states, state
#: passing, chunk scan and the causal convolution; backward those rerun but the scan, and
#: nine gradient kernels (ssd_combined.py)
SSD_KERNELS_F = 6.0
SSD_KERNELS_B = 14.0
#: Adam with fp32 master weights: read grad, m, v, w (4 x 4 B), write m, v, w (3 x 4 B),
#: write the 16-bit copy (2 B) (ZeRO paper section 3.1 state sizes)
ADAM_BYTES_PER_PARAM = 30.0
#: fp32 master weights + Adam m and v (ZeRO, section 3.1: K = 12)
OPTIMIZER_STATE_BYTES = 12.0
#: bytes a value of an optimizer state's format (TE FusedAdam: fp8 is E4M3 with one fp32
#: scale a tensor)
STATE_VALUE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
#: a step's traffic for a non-fp32 state the fused kernel cannot read as it is, bytes a value
#: (fused_adam.py get_unscaled_state, the fp32 kernel, _apply_scale): fp8 dequantized to fp32
#: (1 + 4), read and written by the kernel (8), its absolute maximum (4), quantized back
#: (4 + 1); fp16 widened (2 + 4) and multiplied by its scale (8), the kernel, aminmax, divided
#: (8), narrowed (4 + 2); bf16 (both moments not bf16: no fuse_unscale) widened (2 + 4), the
#: kernel, narrowed to a temporary (4 + 2) and copied (2 + 2)
SCALED_STATE_STEP_BYTES = {"fp8": 22.0, "fp16": 40.0, "bf16": 24.0}


def optimizer_bytes(job: Job) -> tuple[float, float, float]:
    """Adam's state held per parameter (master weights and moments; under ZeRO-3 the
    moments alone, the fp32 shards being the master copy) and the bytes its step moves per
    parameter, with Megatron-Core's precision-aware optimizer or without it."""
    if not job.precision_aware_optimizer:
        return OPTIMIZER_STATE_BYTES, 8.0, ADAM_BYTES_PER_PARAM
    # Transformer Engine's FusedAdam keeps the master weights unless an fp32 master meets
    # an fp8 recipe other than delayed scaling, whose fp32 main params Megatron-Core keeps
    # (optimizer_config.py use_precision_aware_optimizer_no_fp8_or_ds_fp8; optimizer/
    # __init__.py passes master_weights=True, use_decoupled_grad=True only then)
    low = job.dtype in ("fp8", "mxfp8", "nvfp4")
    te_master = (job.main_params_dtype != "fp32" or not low
                 or (job.dtype == "fp8" and job.fp8_scaling == "delayed"))
    # an fp32 master of a bf16 parameter as its 16 low bits ("Works only when param type is
    # BF16 and master weight type is FP32": fused_adam.py store_param_remainders)
    remainders = (te_master and job.store_param_remainders and job.main_params_dtype == "fp32"
                  and (job.dtype == "bf16" or (job.dtype == "fp8" and not job.lp_params)))
    master_b = 2.0 if remainders or job.main_params_dtype == "fp16" else 4.0
    m_b, v_b = STATE_VALUE_BYTES[job.exp_avg_dtype], STATE_VALUE_BYTES[job.exp_avg_sq_dtype]
    # the step (fused_adam.py step): TE reads the gradient buffer as it is held
    # (decoupled_grad, a view: distrib_optimizer.py), Megatron-Core's fp32 main params an
    # fp32 copy of it, as Adam does without the option (the copy's widening of 16-bit
    # gradients, shard_model_grad.float(), 6 bytes, is counted on neither path: counted on
    # both it moved the Hopper fit to gemm_eff 0.72, below its range: notes section 33)
    grad_b = (2.0 if job.grad_dtype == "bf16" else 4.0) if te_master else 4.0
    if remainders:  # int16 remainders and the bf16 parameter, each read and written
        master_step = 8.0
    elif master_b == 4.0:  # fp32 master read and written, the 16-bit parameter written
        master_step = 10.0
    else:  # fp16 master: scaled as a state, and the parameter written
        master_step = SCALED_STATE_STEP_BYTES["fp16"] + 2.0
    fused = job.exp_avg_dtype == job.exp_avg_sq_dtype == "bf16"  # (fuse_unscale)
    moments = sum(2.0 * STATE_VALUE_BYTES[d] if d == "fp32" or fused else
                  SCALED_STATE_STEP_BYTES[d] for d in (job.exp_avg_dtype, job.exp_avg_sq_dtype))
    return master_b + m_b + v_b, m_b + v_b, grad_b + master_step + moments


# ------------------------------------------------------------------------------ context

def make_context(job: Job, hw: Hardware, params: Mapping[str, float],
                 strategy: str = "1d") -> dict[str, float]:
    """Numbers the model needs, in SI, from a job, a hardware variant, parameters and the
    strategy (1d or 2d)."""
    p = {**DEFAULT_PARAMETERS, **params}
    blockwise = _blockwise(job)
    if blockwise and unsupported_precision("mxfp8", hw) is None:
        # Blackwell runs the blockwise recipe as MXFP8 (TE docs, fp8_blockwise_scaling.rst,
        # "Supported devices": "emulated with MXFP8"; the 1 x 128 power-of-two scales
        # become E8M0 ones of 32-element blocks)
        job = dataclasses.replace(job, dtype="mxfp8", fp8_scaling="delayed")
        blockwise = False
    fp8 = job.dtype in LOW_PRECISION
    lp_copy, peak_lp = low_precision(job.dtype, hw)
    if blockwise:  # (Hopper) both usages quantized from 16 bits, fp32 scales
        lp_copy = BLOCKWISE_COPIES * (VALUE_BYTES["fp8"] + BLOCKWISE_SCALE_BYTES)
    # GEMM peak of the job's 16-bit (or fp32 -> TF32) datatype; fp8 GEMMs use peak8
    if job.dtype == "fp32":
        peak16 = hw.matrix_flops_per_s.get("tf32", hw.matrix_peak("bf16"))
    else:
        peak16 = hw.matrix_peak("fp16" if job.dtype == "fp16" else "bf16")
    # bf16 tensor FLOPs per SFU exponential at this variant's tensor peak (a swept peak
    # moves it; the exponential rate stays the hardware file's)
    flops_per_exp = hw.matrix_peak("bf16") / hw.exp_per_s if hw.exp_per_s > 0 else 0.0
    H = job.n_heads
    mla = job.attention == "mla"
    csa_job = job.attention == "csa"
    if csa_job:
        # DeepSeek-V4's compressed sparse attention (sweep.model.cost.csa): one key-and-
        # value head of head_dim for H query heads; the projections' outputs into the
        # attention (q_a, q_b, kv), and the inputs cast for the job's format other than the
        # norm's output: q_b's (the latent) and o_b's (o_a's einsum runs in 16 bits); every
        # weight on each GPU (TP 1), the compressors', indexers' and hyper-connections'
        # shared evenly among the layers
        kv_heads, d_attn = 1, float(job.head_dim)
        D = job.head_dim
        w_qkv = job.q_lora_rank + H * D + D
        w_o = job.q_lora_rank + job.o_groups * job.o_lora_rank
        p_attn_rep = 0
    elif mla:
        # multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 section 2.1; Megatron-Core
        # multi_latent_attention.py): every head has its own key and value after the
        # up-projections, keys dn + dr wide and values dv; the attention kernels see the
        # mean of the two widths (4 b h q kv d FLOPs = 2 b h q kv (d_qk + d_v))
        d_qk, dv = job.qk_nope_head_dim + job.qk_rope_head_dim, job.v_head_dim
        kv_heads, d_attn = H, (d_qk + dv) / 2.0
        w_qkv, w_o = H * (2 * d_qk + dv), H * dv
        # down-projections (queries, and keys/values with the shared RoPE key) replicated
        # over TP; the up-projections and the output projection sharded
        p_attn_rep = job.hidden * (job.q_lora_rank + job.kv_lora_rank + job.qk_rope_head_dim)
    else:
        kv_heads, d_attn = job.n_kv_heads, float(job.head_dim)
        w_qkv, w_o = (H + 2 * job.n_kv_heads) * job.head_dim, H * job.head_dim
        p_attn_rep = 0
    opt_state_b, opt_state_z3_b, adam_step_b = optimizer_bytes(job)
    x = {
        # job
        "L": job.blocks, "e": job.hidden, "f": job.ffn_hidden, "H": H,
        "Kv": kv_heads, "d": d_attn, "V": job.vocab, "s": job.seq_len,
        # widths of the query/key/value projections' output and of the output projection's
        # input; weights of the attention block sharded over TP and replicated
        "w_qkv": float(w_qkv), "w_o": float(w_o),
        # (the weights some layers hold, a layer's mean: csa's compressors and indexers, at
        # TP 1; DSA's indexers, duplicated over TP: dsa.py DSAIndexer parallel_mode
        # "duplicated")
        "p_attn_tp": float(job.attention_params() - p_attn_rep + (
            0.0 if job.dsa else job.compressor_params() / job.n_layers)
            + job.hc_params_per_layer()),
        "p_attn_rep": float(p_attn_rep + (job.compressor_params() / job.n_layers
                                          if job.dsa else 0.0)),
        "mla": float(mla), "q_lora": float(job.q_lora_rank), "kv_lora": float(job.kv_lora_rank),
        # compressed sparse attention (csa.py): its output projection, the shares of
        # ratio-4 and ratio-128 layers, the indexer, the average keys a query attends to
        # (flops.csa_keys_per_query) and the indexer's effective top k; hyper-connections'
        # residual streams (0: none)
        "csa": float(csa_job), "o_lora": float(job.o_lora_rank),
        "o_groups": float(job.o_groups),
        "csa_frac": job.csa_layers / job.n_layers, "hca_frac": job.hca_layers / job.n_layers,
        "ih": float(job.index_heads), "idim": float(job.index_head_dim),
        "itopk_eff": float(min(job.index_topk, job.seq_len // CSA_RATIO)),
        "csa_keys": _csa_mean_keys(job), "hc": float(job.hc_streams),
        # (an MTP depth's csa layer attends to its window alone: Megatron-Bridge's bridge
        # appends compress ratio 0 for it, deepseek_v4_bridge.py L455 - 465)
        "mtp_csa_keys": (csa_keys_per_query(job, executed=True)[0] if csa_job else 0.0),
        # DeepSeek sparse attention (dsa.py): the mean keys a query attends to, the stored
        # top-k list's entries
        "dsa": float(job.dsa), "dsa_keys": dsa_keys_per_query(job) if job.dsa else 0.0,
        # (IndexShare: the share of layers computing their top-k; the indexer's loss)
        "idx_share": job.indexer_share, "idx_shared": float(job.index_topk_freq > 1),
        "idx_group": float(job.index_topk_freq if job.dsa else 1),
        "idx_loss": float(job.index_loss),
        "dsa_topk_width": dsa.topk_width(job.index_topk, job.seq_len) if job.dsa else 0.0,
        "d_qk": float(job.qk_nope_head_dim + job.qk_rope_head_dim),
        "d_rope": float(job.qk_rope_head_dim), "d_v": float(job.v_head_dim),
        # hybrid Mamba-2 / Transformer models: attention and Mamba-2 layers per block (a
        # block: one FFN layer of the pattern; 1 and 0 for attention + FFN blocks) and the
        # mixer's widths (_mamba_mixer)
        "n_attn": job.attention_layers / job.blocks, "n_mamba": job.mamba_layers / job.blocks,
        "hybrid": float(job.is_hybrid), "tp_async_bwd": float(job.tp_async_bwd),
        "m_inner": float(job.mamba_inner), "m_heads": float(job.mamba_heads),
        "m_state": float(job.mamba_state), "m_groups": float(job.mamba_groups),
        "m_in_width": float(job.mamba_in_width),
        # one Mamba-2 mixer's weights without its layer's pre-norm (Job.mamba_params)
        "p_mamba": float(job.mamba_params() - (2 if job.norm == "layernorm" else 1)
                         * job.hidden if job.mamba_layers else 0),
        # mixture of experts (n_experts = 0: dense)
        "moe": float(job.is_moe), "E": float(job.n_experts), "topk": float(job.top_k),
        "fe": float(job.moe_ffn_hidden), "fs": float(job.shared_ffn_hidden),
        "p_experts": float(job.routed_expert_params()),  # one block's, all experts
        # a latent MoE (moe.py _latent_projections): the experts' token width, the latent
        # size (0: none) and the two projections' weights
        "em": float(job.moe_width), "latent": float(job.moe_latent_size),
        "p_latent": float(job.latent_projection_params()),
        "first_dense": float(job.first_k_dense), "moe_step": float(job.moe_layer_step),
        "capacity": job.capacity_factor, "imbalance": max(job.moe_imbalance, 1.0),
        "flex": float(job.moe_dispatcher == "flex"), "mtp": float(job.mtp_layers),
        # a hybrid's MTP depth: its attention and Mamba-2 layers (Job.mtp_mixers); one
        # depth's weights shared by all (mtp_shared)
        "mtp_attn": float(job.mtp_mixers[0]), "mtp_mamba": float(job.mtp_mixers[1]),
        "mtp_shared": float(job.mtp_shared),
        "last_moe": float(job.last_layer_is_moe),
        # cheap modules recomputed on top of the candidate's policy
        "rc_norm": float(job.recompute_norms), "rc_moe_act": float(job.recompute_moe_act),
        "rc_moe": float(job.recompute_moe and job.is_moe),
        "rc_mla_up": float(job.recompute_mla_up and (mla or csa_job)),
        "B": job.global_batch, "causal": float(job.causal), "swiglu": float(job.mlp == "swiglu"),
        "rmsnorm": float(job.norm == "rmsnorm"), "rope": float(job.position == "rope"),
        "flash": float(job.attention_kernel in ("flash", "fused")),
        "fused_attn": float(job.attention_kernel == "fused"), "fused": float(job.fused_kernels),
        "bias": float(job.bias), "dropout": float(job.dropout), "tied": float(job.tied_embeddings),
        "mlp_drop": float(job.dropout and job.mlp_dropout),
        # sliding-window attention on a share of the layers; RoPE unfused (YaRN's attention
        # scale); SwiGLU inputs clamped; experts with biases (GPT-OSS: _layer, moe.py)
        "window": float(job.sliding_window),
        "win_frac": 0.0 if csa_job else job.windowed_layer_fraction,  # (csa: its own keys)
        "rope_unfused": float(job.position == "rope" and job.rope_mscale != 1.0),
        "clamp": float(job.swiglu_clamp > 0), "expert_bias": float(job.bias and job.is_moe),
        "fp8": float(fp8), "act_bytes": 4.0 if job.dtype == "fp32" else 2.0,
        "saved_in_bytes": saved_input_bytes(job),
        "lp_norm_cast": float(job.lp_norm_cast),
        "block_scaled": float(job.dtype in ("mxfp8", "nvfp4") or blockwise),
        "blockwise": float(blockwise),
        "current_scaling": float(job.dtype == "fp8" and job.fp8_scaling in ("current",
                                                                            "rowwise")),
        "rowwise_scaling": float(job.dtype == "fp8" and job.fp8_scaling == "rowwise"),
        # weights held only as their low-precision copies (fp8 / MXFP8 parameters; NVFP4
        # weights stay 16-bit with a quantized copy: Megatron-Bridge sets fp8_param for
        # FP8 and MXFP8 recipes only)
        "lp_params": float(job.lp_params and job.dtype in ("fp8", "mxfp8")),
        "offload_act_layers": float(job.offload_act_layers),
        # fine-grained activation offloading: which modules' inputs (offload_modules)
        **{key: float(name in job.offload_modules.split("+")) for key, name in (
            ("off_attn_norm", "attn_norm"), ("off_qkv", "qkv_linear"), ("off_core", "core_attn"),
            ("off_proj", "attn_proj"), ("off_mlp_norm", "mlp_norm"), ("off_fc1", "expert_fc1"),
            ("off_moe_act", "moe_act"), ("off_group_mlp", "fused_group_mlp"))},
        # bytes of gradient per parameter held, and sent by data-parallel collectives
        "grad_bytes": {"fp32": 4.0, "bf16": 2.0, "mixed": 6.0}[job.grad_dtype],
        "grad_comm_bytes": 2.0 if job.grad_dtype == "bf16" else 4.0,
        # Adam's state per parameter (ZeRO 0 - 2; ZeRO-3) and its step's traffic
        "opt_state_bytes": opt_state_b, "opt_state_z3_bytes": opt_state_z3_b,
        "adam_step_bytes": adam_step_b,
        "grad_accum_bytes": job.grad_accum_bytes,
        "embedding_slots": float(job.embedding_slots),
        "pp_overlap": float(job.pp_overlap),
        "dp_overlap": float(job.dp_overlap), "training": float(job.training),
        "fused_loss": float(job.fused_loss), "summa": float(strategy == "2d"),
        "buffers_bytes": job.buffers_GiB * 2.0**30,
        "zero3_live_params": job.zero3_live_params or np.inf,
        "grad_bucket_params": job.grad_bucket_params or np.inf,
        # hardware
        "peak16_flops_per_s": peak16,
        "peak8_flops_per_s": peak_lp, "lp_copy_bytes": lp_copy,
        # the weights' copies: blockwise fp8 scales a weight per 128 x 128 block, whose
        # copy is transposed rather than quantized again (TE docs, fp8_blockwise_scaling.rst)
        "lp_weight_copy_bytes": (BLOCKWISE_COPIES * (VALUE_BYTES["fp8"]
                                                     + BLOCKWISE_SCALE_BYTES / 128.0)
                                 if blockwise else lp_copy),
        # what a low-precision GEMM reads of each input: one quantized copy with its scales
        # (the operands of the job's GEMM format; 16/32-bit jobs: the activations' width)
        "gemm_operand_bytes": (VALUE_BYTES[job.dtype] + _scale_bytes(job) if fp8
                               else (4.0 if job.dtype == "fp32" else 2.0)),
        # off the tensor cores a GEMM runs on the fp32 FMA units: PyTorch multiplies 16-bit
        # matrices with fp32 accumulation (ATen CUDABlas.cpp: cublasGemmEx /
        # cublasGemmStridedBatchedEx with compute type CUDA_R_32F)
        "vpeak_flops_per_s": hw.vector_peak("fp32"),
        "hbm_Bps": hw.hbm_bytes_per_s, "hbm_bytes": hw.hbm_capacity_bytes,
        "nvl_Bps": hw.nvlink_bytes_per_s, "nvl_lat_s": hw.nvlink_latency_s,
        "net_Bps": hw.scaleout_bytes_per_s, "net_lat_s": hw.scaleout_latency_s,
        "nvl_half_bytes": hw.nvlink_half_bandwidth_per_rank_bytes,
        "net_half_bytes": hw.scaleout_half_bandwidth_per_rank_bytes,
        "nics": hw.nics_per_gpu, "sm_count": float(hw.sm_count),
        "tile_m": float(hw.gemm_tile[0]), "tile_n": float(hw.gemm_tile[1]),
        # the softmax's exponentials against the tensor cores (kernels.flash_attention_s):
        # this GPU's ratio and its generation's, at which the attention efficiencies hold
        "flops_per_exp": flops_per_exp,
        "flops_per_exp_ref": FLOPS_PER_EXP.get(hw.generation, flops_per_exp),
        "host_cap_bytes": hw.host_memory_bytes, "host_Bps": hw.host_link_bytes_per_s,
        # calibration
        "gemm_eff": p["gemm_eff"], "attn_eff": p["attn_eff"], "hbm_eff": p["hbm_eff"],
        "gemm_sustained": hw.sustained_fraction,
        # a generation fitted without fused-attention runs (Volta, Ampere: no FA3; cuDNN's
        # fused attention there is FlashAttention-2-class) uses attn_eff for both
        "fused_attn_eff": params.get("fused_attn_eff", p["attn_eff"]),
        "kernel_s": p["kernel_us"] * 1e-6, "nvl_eff": p["nvl_eff"], "net_eff": p["net_eff"],
        # MoE: grouped expert GEMMs and the token all-to-all (a generation fitted without
        # MoE runs uses its dense GEMM efficiency and the default all-to-all efficiency)
        "grouped_eff": params.get("grouped_gemm_eff", p["gemm_eff"]),
        "expert_s": p["expert_us"] * 1e-6, "a2a_eff": p["a2a_eff"],
        "fp8_eff": p["fp8_eff"], "nvfp4": float(job.dtype == "nvfp4"),
        # a generation fitted without NVFP4 runs uses fp8_eff for it too
        "fp4_eff": params.get("fp4_eff", p["fp8_eff"]),
        "reserve_bytes": p["reserve_GiB"] * 2.0**30,
        "allocator_cache": p["allocator_cache"],
    }
    # the MTP depths' own GEMM format, 16 bits under a low-precision recipe: with mtp_bf16
    # (Megatron-Bridge's keep_mtp_spec_in_bf16), and under NVFP4 always (Megatron-Core
    # d98e8a6 multi_token_prediction.py L1385 - 1394: MTP runs in the global fp8 context
    # only, "ignoring FP4 in MTP layers"); else the job's own entries (_mtp_context)
    own = fp8 and job.mtp_layers > 0 and (job.mtp_bf16 or job.dtype == "nvfp4")
    # per-layer precision (Megatron-Core first_last_layers_bf16: get_fp8_context /
    # get_fp4_context give the first and last layers no quantization context): the blocks
    # among them and their entries (B16_PREFIX: _layer_terms and _routed_terms cost the
    # blocks in 16 bits too, _combine places them on the edge stages); per module, the
    # attention projections and a latent MoE's projections (a quantization recipe's
    # overrides: _layer, moe._latent_projections)
    share = job.bf16_block_share if fp8 else 0.0
    sixteen = bool(share) or (fp8 and (job.bf16_attention or job.bf16_latent))
    x16 = make_context(dataclasses.replace(
        job, dtype="bf16", mtp_bf16=False, bf16_first_layers=0, bf16_last_layers=0,
        bf16_attention=False, bf16_latent=False), hw, params, strategy) \
        if (own or sixteen) else x
    x.update({MTP16_PREFIX + k: (x16 if own else x)[k] for k in PRECISION_KEYS})
    x.update({B16_PREFIX + k: (x16 if sixteen else x)[k] for k in PRECISION_KEYS})
    # a Mamba-2 out_proj in a format of its own (mamba_out_dtype, a low-precision job's:
    # _mamba_mixer); a 16-bit block's in 16 bits (_b16_context)
    out_dtype = job.mamba_out_dtype if fp8 and job.mamba_layers else ""
    if not out_dtype or out_dtype == job.dtype:
        xo = x
    elif out_dtype == "bf16" and x16 is not x:
        xo = x16
    else:
        xo = make_context(dataclasses.replace(
            job, dtype=out_dtype, mamba_out_dtype="", mtp_bf16=False, bf16_first_layers=0,
            bf16_last_layers=0, bf16_attention=False, bf16_latent=False), hw, params, strategy)
    x.update({MAMBA_OUT_PREFIX + k: xo[k] for k in PRECISION_KEYS})
    x["mtp_bf16"] = float(own)
    first16, last16 = job.bf16_end_blocks if fp8 else (0, 0)
    x.update(bf16_share=share, bf16_first_blocks=float(first16),
             bf16_last_blocks=float(last16), bf16_attn=float(fp8 and job.bf16_attention),
             bf16_latent=float(fp8 and job.bf16_latent))
    return x


def _csa_mean_keys(job: Job) -> float:
    """Keys a query of a csa job's average layer attends to (0 for other attention):
    flops.csa_keys_per_query weighted by the window-only, ratio-4 and ratio-128 layers."""
    if job.attention != "csa":
        return 0.0
    k0, k4, k128 = csa_keys_per_query(job, executed=True)
    n4, n128 = job.csa_layers, job.hca_layers
    return ((job.n_layers - n4 - n128) * k0 + n4 * k4 + n128 * k128) / job.n_layers


#: the context entries that follow the job's GEMM format (make_context of a low-precision
#: job and of the same job in bf16 differ in these alone)
PRECISION_KEYS = ("fp8", "nvfp4", "block_scaled", "blockwise", "current_scaling",
                  "rowwise_scaling", "saved_in_bytes", "peak8_flops_per_s", "lp_copy_bytes",
                  "lp_weight_copy_bytes", "gemm_operand_bytes")
#: their values for the MTP depths (mtp_bf16)
MTP16_PREFIX = "mtp16:"
#: and for the blocks of the bf16_first_layers and bf16_last_layers
B16_PREFIX = "b16:"
#: and for a Mamba-2 out_proj (mamba_out_dtype)
MAMBA_OUT_PREFIX = "mo:"


def make_row_context(job: Job, hw: HardwareRows, strategy: str = "1d") -> dict:
    """The context of a block holding candidates of several hardware variants (rows of
    ``hw``): each entry the variant's value per row, or the plain value where every variant
    has the same (job constants always). Evaluate it with the block's columns plus
    ``variant`` = ``hw.row``, so that the per-layer terms are still deduplicated."""
    contexts = [make_context(job, h, h.calibration, strategy) for h in hw.variants]
    out: dict = {}
    for k, first in contexts[0].items():
        values = [ctx[k] for ctx in contexts]
        same = all(v == first for v in values[1:])
        out[k] = first if same else as_array(values, dtype=np.float64)[hw.row]
    return out


def stack_contexts(contexts: Sequence[Mapping[str, float]]) -> dict[str, np.ndarray]:
    """One context whose entries are arrays (one value per context), for batch evaluation."""
    return {k: np.array([c[k] for c in contexts], dtype=np.float64) for k in contexts[0]}


#: the embedding table is padded to a multiple of this times the TP degree, so that every
#: vocabulary shard is tensor-core aligned (Megatron-LM --make-vocab-size-divisible-by, 128)
VOCAB_PAD = 128


def padded_vocab(vocab, t):
    """Vocabulary rows after Megatron's padding to a multiple of VOCAB_PAD x TP."""
    unit = VOCAB_PAD * as_array(t, dtype=np.float64)
    return np.ceil(as_array(vocab, dtype=np.float64) / unit) * unit


# ------------------------------------------------------------------------------ one layer

def _summa_gemm(M, N, K, x, c, peak, eff, nb, t, t2):
    """One GEMM (M x K)(K x N) as 2D SUMMA on a t x t2 grid with nb panels (van de Geijn and
    Watts 1997): local output (M/t2 x N/t); per panel a local GEMM, a broadcast of the A
    panel along the grid row (t) and of the B panel along the column (t2). Pipelined: only
    the first panel's broadcasts are exposed unless communication outlasts the GEMMs
    (nersc2024_model.md section 4). Backward: dgrad and wgrad panels, twice the broadcasts
    (broadcast and reduce of each operand). Returns (fwd compute, bwd compute, fwd exposed
    comm, bwd exposed comm) with M the local tokens."""
    ab = x["act_bytes"]
    ob = x["gemm_operand_bytes"]
    comp_f = nb * gemm_s(M, N / t, K / nb, x, peak, eff, operand_bytes=ob)
    comp_b = nb * (gemm_s(M, K / t, N / nb, x, peak, eff, operand_bytes=ob)
                   + gemm_s(K / t2, N / t, M * t2 / nb, x, peak, eff, operand_bytes=ob))
    tau = (collective_s("broadcast", M * K / nb * ab, t, c["nv_tp"], x)
           + collective_s("broadcast", K / nb * N / t * ab, t2, c["nv_tp2"], x))
    exp_f = tau + np.maximum(nb * tau - comp_f, 0.0)
    exp_b = 2 * tau + np.maximum(2 * nb * tau - comp_b, 0.0)
    return comp_f, comp_b, exp_f, exp_b


def _gemm_rate(x):
    """(peak FLOP/s of the job's GEMM format, efficiency of a training GEMM on it)."""
    lp_eff = np.where(x["nvfp4"] > 0, x["fp4_eff"], x["fp8_eff"]) \
        * np.where(x["blockwise"] > 0, BLOCKWISE_HOPPER_GEMM, 1.0)
    peak_lin = np.where(x["fp8"] > 0, x["peak8_flops_per_s"] * lp_eff,
                        x["peak16_flops_per_s"])
    # a training GEMM reaches gemm_eff of what the GPU sustains on its best shape
    return peak_lin, x["gemm_eff"] * x["gemm_sustained"]


def _attention_gemms(x, T, Ta, t, peak, eff, gemm_each, gemm_b_each, flops_each):
    """([forward], [backward], [FLOPs]) of a block's QKV and output projections (the first
    two of the plain GEMMs given), MLA's (_mla_projections) or csa's (csa.projections:
    recompute_mla_up re-runs its q_b) where the job has them, and the up-projections'
    forward recompute_mla_up re-runs."""
    f, b, fl = list(gemm_each[:2]), list(gemm_b_each[:2]), list(flops_each[:2])
    mla_up_f = 0.0
    if np.any(x["mla"] > 0):
        mla = _mla_projections(x, T, Ta, t, peak, eff)
        f[0], b[0], fl[0] = (np.where(x["mla"] > 0, new, old) for new, old in
                             zip(mla[:3], (f[0], b[0], fl[0])))
        mla_up_f = np.where(x["mla"] > 0, mla[3], 0.0)
        if np.any(x["dsa"] > 0):  # (DSA: the indexer's linears, dsa.projections)
            idx = dsa.projections(x, T, peak, eff)
            f[0], b[0], fl[0] = (np.where(x["dsa"] > 0, old + new, old) for new, old in
                                 zip(idx, (f[0], b[0], fl[0])))
    if np.any(x["csa"] > 0):
        proj = csa.projections(x, T, peak, eff)
        row = x["csa"] > 0
        f[0], b[0], fl[0], f[1], b[1], fl[1], mla_up_f = (
            np.where(row, new, old) for new, old in zip(
                (proj["in_f"], proj["in_b"], proj["in_flops"], proj["out_f"], proj["out_b"],
                 proj["out_flops"], proj["up_f"]), (f[0], b[0], fl[0], f[1], b[1], fl[1],
                                                    mla_up_f)))
    return [f, b, fl], mla_up_f


def _mla_projections(x, T, Ta, t, peak, eff):
    """(forward time, backward time, forward FLOPs) of MLA's projections into queries, keys
    and values (Megatron-Core multi_latent_attention.py, MLASelfAttention): the
    down-projections h -> q_lora and h -> kv_lora + dr are replicated over TP and run on the
    sequence-parallel shard (Ta tokens); the up-projections q_lora -> H (dn + dr) (or h ->
    H (dn + dr) without query compression) and kv_lora -> H (dn + dv) are column-parallel on
    T tokens (DeepSeek-V2, arXiv 2405.04434, eqs. 9-13)."""
    e, H, qr, kvr = x["e"], x["H"], x["q_lora"], x["kv_lora"]
    d_qk, d_v, dr = x["d_qk"], x["d_v"], x["d_rope"]
    # (an array, so that ~ negates it: on a Python bool ~True is -2, which np.where takes
    # as true, and costed both query projections in a scalar context)
    q_compressed = as_array(qr) > 0
    ob = x["gemm_operand_bytes"]
    shapes = [(Ta, np.maximum(qr, 1.0), e), (T, H * d_qk / t, np.maximum(qr, 1.0)),
              (T, H * d_qk / t, e), (Ta, kvr + dr, e), (T, H * (d_qk - dr + d_v) / t, kvr)]
    use = [q_compressed, q_compressed, ~q_compressed, True, True]
    rates = [(peak, eff, ob)] * 5
    dsa_row = x["dsa"] > 0
    if np.any(dsa_row):
        # (DSA, absorbed: the key absorption and the value up-projection are plain 16-bit
        # einsums, absorbed_mla.py L562 - 573, L875 - 912, whatever the job's format)
        rates[4] = (np.where(dsa_row, x["peak16_flops_per_s"], peak), eff,
                    np.where(dsa_row, x["act_bytes"], ob))
    fwd = sum(np.where(u, gemm_s(M, N, K, x, p, ef, operand_bytes=o), 0.0)
              for u, (M, N, K), (p, ef, o) in zip(use, shapes, rates))
    bwd = sum(np.where(u, gemm_s(M, K, N, x, p, ef, operand_bytes=o)
                       + gemm_s(K, N, M, x, p, ef, operand_bytes=o), 0.0)
              for u, (M, N, K), (p, ef, o) in zip(use, shapes, rates))
    flops = sum(np.where(u, 2.0 * M * N * K, 0.0) for u, (M, N, K) in zip(use, shapes))
    kv_peak, _, kv_ob = rates[4]
    kv_up = gemm_s(*shapes[4], x, kv_peak, eff, operand_bytes=kv_ob)
    if np.any(dsa_row):
        # (DSA: recompute_mla_up re-runs the key absorption, not the value up-projection,
        # which sits outside the checkpoint: absorbed_mla.py L878 - 885)
        kv_up = np.where(dsa_row, gemm_s(T, H * (d_qk - dr) / t, kvr, x, kv_peak, eff,
                                         operand_bytes=kv_ob), kv_up)
    up = np.where(q_compressed, gemm_s(*shapes[1], x, peak, eff, operand_bytes=ob),
                  gemm_s(*shapes[2], x, peak, eff, operand_bytes=ob)) + kv_up
    return fwd, bwd, flops, up


def _per_tensor_casts(x, lay, ab, lp, current, w_qkv, w_o, f_up, mixers=1.0):
    """Per-tensor fp8 casts of one block as Transformer Engine runs them (delayed or current
    scaling), per micro-batch: bytes and kernels of the forward and the backward, TP
    all-reduces of an amax, and whether the SP all-gathers move the fp8 copies.

    Read from TE v2.9 (docs/notes/parameter-ranges.md, "fp8 current scaling on Hopper"):
    * QKV and fc1 inputs (the norm outputs): with delayed scaling the norm writes them in fp8
      (fused); with current scaling it writes 16 bits and the amax (normalization.cpp
      FUSED_NORM_AMAX_FP8), and a cast reads them (quantizer.cpp quantize_with_amax). With
      SP the cast is row-wise on the local shard (float8_tensor.py) and the fp8 copy is
      all-gathered; the backward gathers the saved copy again and transposes it for wgrad.
    * attention-output and fc2 inputs: cast_transpose (read 2 B, write 1 B and, on
      TN-only tensor cores, its 1-B transpose); current scaling reads them once more for
      the amax (amax_kernel).
    * backward: the gradients of the column-parallel outputs (QKV, fc1) as the plain inputs;
      those of the row-parallel ones (attention output, fc2) with SP cast on the shard,
      all-gathered in fp8, then transposed.
    * kernels: a delayed cast is one; a current one also zeroes the amax, computes it (the
      norm's is fused) and its scale (24 kernels more a block than delayed scaling), and
      with SP all-reduces the amax over the TP group (4 more launches: "about 28").
    Applies where the job's norms feed TE's quantizers (``lp_norm_cast``) and the format is
    per-tensor (``te``). The transposed copy (``lp`` - 1 B) exists on TN-only (Hopper)
    tensor cores only. ``ao`` marks torchao's per-tensor recipes, priced in ``_layer``.
    """
    T, Ta, t, sp = lay["T"], lay["Ta"], lay["t"], lay["sp"]
    e, f = x["e"], x["f"]
    v = VALUE_BYTES["fp8"]
    tr = lp - v
    mlp = np.where(f > 0, 1.0, 0.0)  # a routed-only MoE block quantizes in its experts
    # norm-fed GEMM inputs: QKV, fc1 (a hybrid block: its mixers' QKV and in_proj, with
    # w_qkv and w_o the mixers' summed widths)
    n_fed = mixers + mlp
    amax = np.where(current, ab, 0.0)
    spb = np.asarray(sp, dtype=bool)
    # the norm's own fp8 write (delayed), or a cast of its 16-bit output (current; without
    # SP that cast is a cast_transpose, which writes the transposed copy too)
    norm_cast = np.where(current, ab + v, v - ab) * Ta
    norm_tr_f = np.where(spb, 0.0, np.where(current, tr, 2.0 * tr) * T)
    norm_tr_b = np.where(spb, 2.0 * tr * T, 0.0)
    plain = (ab + amax + lp) * T * (w_o / t + f / t)
    bytes_f = n_fed * e * (norm_cast + norm_tr_f) + plain
    col_grads = (ab + amax + lp) * T * (w_qkv / t + f_up / t)
    row_grads = n_fed * e * np.where(spb, (ab + amax + v) * Ta + 2.0 * tr * T,
                                     (ab + amax + lp) * T)
    bytes_b = col_grads + row_grads + n_fed * e * norm_tr_b
    per_cast = np.where(current, 4.0, 1.0)
    has_tr = np.where(tr > 0, 1.0, 0.0)
    kernels_f = n_fed * (np.where(current, 3.0, np.where(spb, 0.0, has_tr))
                         + per_cast)
    kernels_b = 2.0 * n_fed * per_cast + n_fed * np.where(spb, 2.0 * has_tr, 0.0)
    # TE's stacks, not SUMMA's 2D blocks (which TE does not run); rowwise scaling is
    # torchao's recipe alone
    scaled_per_tensor = (x["fp8"] > 0) & (x["block_scaled"] == 0)  # (rowwise too)
    per_tensor = scaled_per_tensor & (x["rowwise_scaling"] == 0)
    te_stack = (x["lp_norm_cast"] > 0) & (not lay["summa"])
    te = per_tensor & te_stack
    reduces = np.where(te & current & spb, n_fed, 0.0)
    # torchao's tensorwise fp8 casts before the TP all-gathers too (torchtitan
    # enable_float8_tensorwise_tp: Float8ColwiseParallel, float8_tensor_parallel.py);
    # rowwise communicates in 16 bits (torchtitan docs/float8.md)
    fp8_gather = per_tensor & spb & (not lay["summa"])
    # torchao's per-tensor recipes: another stack's, or rowwise (torchao's alone)
    ao = scaled_per_tensor & (not lay["summa"]) & (
        (x["lp_norm_cast"] == 0) | (x["rowwise_scaling"] > 0))
    return {"te": te, "te_stack": te_stack, "ao": ao, "bytes_f": bytes_f, "bytes_b": bytes_b,
            "kernels_f": kernels_f, "kernels_b": kernels_b, "amax_reduces_f": reduces,
            "amax_reduces_b": reduces, "fp8_gather": fp8_gather, "fp8_inputs": n_fed}


def _hybrid(x) -> bool:
    """Whether the context holds a hybrid job's blocks (_mamba_mixer; make_context n_attn,
    n_mamba): decided on the context alone, so that an attention + FFN block's arithmetic
    is untouched."""
    return bool(np.any(as_array(x["n_mamba"]) > 0) or np.any(as_array(x["n_attn"]) != 1.0))


def _mamba_bc_width(x, t, cp):
    """Channels of B and C a Mamba-2 layer's TP rank holds per token: its G / t groups of
    state N each, or under context parallelism at least cp groups, repeated before the
    all-to-alls to head shards (Megatron-LM d98e8a6 mamba_context_parallel.py L119 - 133)."""
    return 2.0 * np.maximum(x["m_groups"] / t, cp) * x["m_state"]


def _mamba_mixer(x, T, t, peak, eff):
    """One Mamba-2 mixer layer per micro-batch on T tokens of a TP rank, without its pre-norm
    and residual (counted with the block's, _layer): the forward and backward times and
    FLOPs of its GEMMs [in_proj, out_proj] (``gemm_f``, ``gemm_b``, ``flops``), of its scan
    (``scan_f``, ``scan_b``, ``scan_flops``), its forward elementwise bytes and kernels
    (``elem_bytes``, ``kernels``) and the GEMMs' widths (``w_in``: in_proj's output,
    ``d_in``: out_proj's input).

    Megatron-Core MambaMixer (megatron/core/ssm/mamba_mixer.py; Dao and Gu 2024, arXiv
    2405.21060, section 7): in_proj h -> z, x, B, C, dt (2 d_inner + 2 G N + heads),
    column-parallel over TP (heads and groups split); the causal depthwise convolution over
    x, B, C with SiLU, the chunked SSD scan and the gating, one fused kernel sequence
    (mamba_split_conv1d_scan_combined); the gated RMSNorm over d_inner; out_proj d_inner ->
    h, row-parallel."""
    e, d_in, heads, n = x["e"], x["m_inner"], x["m_heads"], x["m_state"]
    gn = x["m_groups"] * n
    ob, ab = x["gemm_operand_bytes"], x["act_bytes"]
    w_in = x["m_in_width"]  # (z, x, B, C, dt: Job.mamba_in_width)
    shapes = [(T, w_in / t, e), (T, e, d_in / t)]
    # (out_proj in its own format where mamba_out_dtype gives one: MAMBA_OUT_PREFIX entries,
    # the job's otherwise)
    xo = dict(x, **{k: x[MAMBA_OUT_PREFIX + k] for k in PRECISION_KEYS})
    peak_o, eff_o = _gemm_rate(xo)
    rates = [(x, peak, eff, ob), (xo, peak_o, eff_o, xo["gemm_operand_bytes"])]
    gemm_f = [gemm_s(M, N, K, xr, pr, er, operand_bytes=obr)
              for (M, N, K), (xr, pr, er, obr) in zip(shapes, rates)]
    gemm_b = [gemm_s(M, K, N, xr, pr, er, operand_bytes=obr)
              + gemm_s(K, N, M, xr, pr, er, operand_bytes=obr)
              for (M, N, K), (xr, pr, er, obr) in zip(shapes, rates)]
    flops = [2.0 * M * N * K for M, N, K in shapes]
    # the scan's FLOPs as Megatron counts them, 7 d_inner N a token (Megatron-Bridge
    # training/utils/flop_utils.py, hybrid layers; notes section 27), on the TP rank's heads;
    # the SSD kernels run them as chunked matmuls at SSD_EFF of the 16-bit peak, the
    # backward SSD_BWD_FACTOR times the forward (notes section 27)
    scan_flops = 7.0 * T * d_in / t * n
    rate = x["peak16_flops_per_s"] * SSD_EFF
    scan_f = scan_flops / rate + SSD_KERNELS_F * x["kernel_s"]
    scan_b = SSD_BWD_FACTOR * scan_flops / rate + SSD_KERNELS_B * x["kernel_s"]
    # HBM passes around the scan, per token of the rank's channels: the convolution reads
    # and writes x, B, C; the scan reads x, B, C, dt and z and writes y; the gated RMSNorm
    # reads y and z and writes its output (out_proj's input)
    conv = 2.0 * (d_in + 2.0 * gn) / t
    scan = (3.0 * d_in + 2.0 * gn + heads) / t
    norm = 3.0 * d_in / t
    elem_bytes = ab * T * (conv + scan + norm)
    return {"gemm_f": gemm_f, "gemm_b": gemm_b, "flops": flops, "scan_f": scan_f,
            "scan_b": scan_b, "scan_flops": scan_flops, "elem_bytes": elem_bytes,
            "kernels": 2.0, "w_in": w_in, "d_in": d_in}  # (kernels: convolution, gated norm)


def _layer(x, c, lay):
    """Per-layer, per-micro-batch times of one pipeline stage's layer (forward, backward,
    recompute) and their breakdown, for the layout in ``lay`` (_layout): T tokens in the
    tensor-parallel region, Ta in the norm / residual region (T / t with sequence
    parallelism, K22 section 4.2.2), queries split q_split ways with K/V exchanged in a ring
    or all-gathered."""
    b, T, Ta, t, t2, sp = lay["b"], lay["T"], lay["Ta"], lay["t"], lay["t2"], lay["sp"]
    summa = lay["summa"]
    e, f, H, Kv, d, s = x["e"], x["f"], x["H"], x["Kv"], x["d"], x["s"]
    ab = x["act_bytes"]
    f_up = f * (1.0 + x["swiglu"])  # SwiGLU: gate and up projections
    # NVFP4 GEMMs reach a smaller share of their (4x bf16) peak than fp8 ones at training
    # shapes: Transformer Engine's B300 GEMM benchmark (hidden 4096, 15,872 tokens) runs
    # NVFP4 kernels at 34 % of the fp4 peak, MXFP8 at 58 %, bf16 at 66 % of theirs
    # (TE docs, "GEMM Speedups Across Precisions"); hence a parameter of its own
    peak_lin, eff = _gemm_rate(x)
    w_qkv, w_o = x["w_qkv"], x["w_o"]
    # the four GEMMs of a block as (output width, input width)
    full = [(w_qkv, e), (e, w_o), (f_up, e), (e, f)]
    if summa:
        nb = as_array(c["nb"], dtype=np.float64)
        parts = [_summa_gemm(T, N, K, x, c, peak_lin, eff, nb, t, t2) for N, K in full]
        gemm_each = [p[0] for p in parts]
        gemm_b_each = [p[1] for p in parts]
        flops_each = [2.0 * T * N / t * K for N, K in full]
        summa_f, summa_b = sum(p[2] for p in parts), sum(p[3] for p in parts)
    else:
        # Megatron TP sharding (N21 section 2.3): column-parallel QKV and up, row-parallel
        # output and down projections
        shapes = [(T, w_qkv / t, e), (T, e, w_o / t), (T, f_up / t, e), (T, e, f / t)]
        # (backward: dgrad (M x N)(N x K), wgrad (K x M)(M x N))
        gemm_each, gemm_b_each, flops_each = gemm_passes_s(shapes, x, peak_lin, eff,
                                                           x["gemm_operand_bytes"])
        att, mla_up_f = _attention_gemms(x, T, Ta, t, peak_lin, eff, gemm_each, gemm_b_each,
                                         flops_each)
        if np.any(as_array(x["bf16_attn"]) > 0):
            # (bf16_attention: the attention projections in 16 bits, their inputs not cast)
            x16 = _b16_context(x)
            peak16, eff16 = _gemm_rate(x16)
            plain = gemm_passes_s(shapes[:2], x16, peak16, eff16, x16["gemm_operand_bytes"])
            att16, up16 = _attention_gemms(x16, T, Ta, t, peak16, eff16, *plain)
            on = x["bf16_attn"] > 0
            att = [[np.where(on, a16, a) for a16, a in zip(new, old)]
                   for new, old in zip(att16, att)]
            mla_up_f = np.where(on, up16, mla_up_f)
        for i in (0, 1):
            gemm_each[i], gemm_b_each[i], flops_each[i] = att[0][i], att[1][i], att[2][i]
        # an MoE block whose only FFN is routed has no shared expert: no MLP GEMMs here
        has_mlp = f > 0
        for i in (2, 3):
            gemm_each[i] = np.where(has_mlp, gemm_each[i], 0.0)
            gemm_b_each[i] = np.where(has_mlp, gemm_b_each[i], 0.0)
    # a hybrid model's block (one FFN layer of its pattern) holds n_attn attention and
    # n_mamba Mamba-2 mixer layers, each with its own pre-norm and residual (Megatron-Core
    # hybrid stack: every pattern symbol is a layer; mamba_hybrid_layer_allocation.py);
    # an attention + FFN block is 1 and 0 of them and its two norms
    hybrid = _hybrid(x) and not summa
    qa = x["n_attn"] if hybrid else 1.0
    qm = x["n_mamba"] if hybrid else 0.0
    n_sub = qa + qm + 1.0  # pre-norms (and residuals) of the block's layers
    w_in_cast, w_out_cast = w_qkv, w_o  # widths of the mixers' GEMMs for the casts
    if hybrid:
        mix = _mamba_mixer(x, T, t, peak_lin, eff)
        for i in (0, 1):
            gemm_each[i], gemm_b_each[i], flops_each[i] = (
                qa * gemm_each[i], qa * gemm_b_each[i], qa * flops_each[i])
        gemm_each = gemm_each + [qm * g for g in mix["gemm_f"]]
        gemm_b_each = gemm_b_each + [qm * g for g in mix["gemm_b"]]
        flops_each = flops_each + [qm * v for v in mix["flops"]]
        w_in_cast, w_out_cast = qa * w_qkv + qm * mix["w_in"], qa * w_o + qm * mix["d_in"]
    # (bf16_attention: the attention projections' inputs and output gradients not cast)
    att_cast = qa * (1.0 - x["bf16_attn"])
    w_in_cast = w_in_cast - (qa - att_cast) * w_qkv
    w_out_cast = w_out_cast - (qa - att_cast) * w_o
    gemm_f, gemm_b = sum(gemm_each), sum(gemm_b_each)
    gemm_flops = sum(flops_each)
    # per-op selective recompute (torchtitan op SAC: every GEMM output saved except every
    # second one, in call order q, k, v, o, [gate, up | up], down): k, o and the up (SwiGLU)
    # or down (GELU) projection are recomputed (torchtitan, _apply_ac_to_transformer_block)
    Kv_share = x["Kv"] / (x["H"] + 2.0 * x["Kv"])
    swiglu = x["swiglu"] > 0
    op_sac_gemm = gemm_each[0] * Kv_share + gemm_each[1] + np.where(
        swiglu, gemm_each[2] / 2.0, gemm_each[3])
    op_sac_flops = flops_each[0] * Kv_share + flops_each[1] + np.where(
        swiglu, flops_each[2] / 2.0, flops_each[3])
    # attention core on the local heads and query rows, all keys
    Hl, Kvl = H / t, np.maximum(Kv / t, 1.0)
    q_len, kv_len = s / lay["q_split"], s
    causal_fraction = np.where(x["causal"] > 0, 0.5, 1.0)
    # sliding-window layers (a share win_frac of the layers, averaged over a stage's): the
    # fused kernels visit the key tiles that meet each query tile's band, the window plus one
    # tile (FlashAttention's and cuDNN's local / sliding-window masks skip the tiles outside
    # it: Dao-AILab flash-attention is_local; cudnn-frontend sliding_window_length), both
    # sides of the diagonal without causality; never more than the whole (causal) sequence
    band = np.where(x["causal"] > 0, x["window"] + FLASH_KV_BLOCK,
                    2.0 * x["window"] + FLASH_KV_BLOCK) / np.maximum(s, 1.0)
    windowed = np.minimum(band, causal_fraction)
    causal_fraction = (1.0 - x["win_frac"]) * causal_fraction + x["win_frac"] * windowed
    flash = x["flash"] > 0
    fa_f = flash_attention_s(b, Hl, q_len, kv_len, d, x, causal_fraction, False)
    fa_b = flash_attention_s(b, Hl, q_len, kv_len, d, x, causal_fraction, True)
    # materialized (Megatron core attention): two batched GEMMs, softmax and dropout over
    # the full score matrix; 5 bytes per score element stored (K22 table 2: 5 a s / h)
    batch = b * Hl
    scores = batch * q_len * kv_len
    drop = x["dropout"]
    mat_core_f = gemm_s(q_len, kv_len, d, x, x["peak16_flops_per_s"], eff, batch) + memory_s(
        scores * (2 * ab + drop * (2 * ab + 1)), x, 1 + drop)
    mat_f = mat_core_f + gemm_s(q_len, d, kv_len, x, x["peak16_flops_per_s"], eff, batch)
    mat_b = (gemm_s(q_len, d, kv_len, x, x["peak16_flops_per_s"], eff, batch)
             + gemm_s(kv_len, d, q_len, x, x["peak16_flops_per_s"], eff, batch)
             + gemm_s(q_len, kv_len, d, x, x["peak16_flops_per_s"], eff, batch)
             + gemm_s(kv_len, d, q_len, x, x["peak16_flops_per_s"], eff, batch)
             + memory_s(scores * (3 * ab + drop * (2 * ab + 1)), x, 1 + drop))
    attn_flops = 4.0 * batch * q_len * kv_len * d * np.where(flash, causal_fraction, 1.0)
    attn_flops_b = attn_flops * np.where(flash, 2.5, 2.0)
    if np.any(x["csa"] > 0) and not summa:
        # compressed sparse attention: the chosen keys and the indexer (csa.core)
        sparse = csa.core(x, b, eff)
        csa_row = x["csa"] > 0
        fa_f, fa_b, attn_flops, attn_flops_b = (np.where(csa_row, new, old) for new, old in zip(
            (sparse["f"], sparse["b"], sparse["flops"], sparse["flops_b"]),
            (fa_f, fa_b, attn_flops, attn_flops_b)))
    indexer_f = None  # (DSA: the indexer's and its loss's share of the forward, op_table)
    if np.any(x["dsa"] > 0) and not summa:
        # DeepSeek sparse attention: the chosen keys and the indexer (dsa.core)
        sparse = dsa.core(x, b, Hl, q_len, eff)
        dsa_row = x["dsa"] > 0
        indexer_f = np.where(dsa_row, sparse["f"] - sparse["attn_f"], 0.0)
        fa_f, fa_b, attn_flops, attn_flops_b = (np.where(dsa_row, new, old) for new, old in zip(
            (sparse["f"], sparse["b"], sparse["flops"], sparse["flops_b"]),
            (fa_f, fa_b, attn_flops, attn_flops_b)))
    attn_f = np.where(flash, fa_f, mat_f)
    attn_b = np.where(flash, fa_b, mat_b)
    attn_layer_f, attn_layer_b = attn_f, attn_b  # (one attention layer's: the CP ring hides
    # behind its own layer's attention)
    if hybrid:
        attn_f, attn_b, attn_flops = qa * attn_f, qa * attn_b, qa * attn_flops
        attn_flops_b = qa * attn_flops_b
    # elementwise ops: tensor passes (reads + writes) per layer forward, fused or eager
    # (rotary embedding: on the query and key heads; MLA: on the dr-wide RoPE part of every
    # query head and the one shared RoPE key)
    # (csa: the queries' and the key's RoPE part, and the inverse RoPE on the output heads)
    rope_width = np.where(x["mla"] > 0, H * x["d_rope"] + x["d_rope"] * t,
                          np.where(x["csa"] > 0, (2.0 * H + 1.0) * x["d_rope"], (H + Kv) * d))
    A, Q, F = Ta * e, T * rope_width / t, T * f / t
    fused = x["fused"] > 0
    norm_passes = np.where(fused | (x["rmsnorm"] == 0), 4.0, 14.0)  # eager RMSNorm: 5 kernels
    # (bias, dropout and residual add unfused, 4 passes more: eager kernels, or experts with
    # biases, whose TEGroupedMLP requires bias_dropout_fusion off: Megatron-Core experts.py)
    resid_passes = np.where(fused & (x["expert_bias"] == 0), 6.0,
                            6.0 + 4.0 * x["bias"] + 4.0 * drop)
    act_passes = np.where(x["swiglu"] > 0, np.where(fused, 3.0, 5.0),
                          np.where(fused, 2.0, 2.0 + 2.0 * x["bias"]))
    rope_passes = x["rope"] * np.where(fused, 2.0, 6.0)
    # YaRN's attention scale other than 1 runs Megatron-Core's unfused RoPE even with
    # apply_rope_fusion (rope_utils.py: "mscale ... not supported by TE's fused RoPE. Using
    # unfused implementation"). _apply_rotary_pos_emb_bshd: t cos, rotate_half's negation
    # and concatenation, sin, the sum and the concatenation with the pass-through part, 6
    # kernels reading 6.5 and writing 5.5 tensor widths, 10 more than the fused kernel's 2;
    # its backward (dy cos, dy sin, the negation, concatenation and sum) 10 in all
    yarn = x["rope"] * x["rope_unfused"]
    rope_passes = np.where(yarn > 0, 12.0, rope_passes)
    rope_b_extra = yarn * ab * Q * (10.0 - 2.0 * 12.0)  # (elem_b counts twice the forward)
    # (1-byte dropout masks; a dropout on the MLP's hidden activation, timm's Mlp drop1:
    # read, write and its mask)
    elem_bytes_f = ab * (A * (norm_passes + resid_passes) + F * act_passes + Q * rope_passes) \
        + drop * 2 * A + x["mlp_drop"] * F * (2 * ab + 1)
    if hybrid:  # (norm_passes, resid_passes and dropouts: two layers' worth)
        elem_bytes_f = ab * (A * (norm_passes + resid_passes) * n_sub / 2.0 + F * act_passes
                             + qa * Q * rope_passes) + drop * n_sub * A \
            + x["mlp_drop"] * F * (2 * ab + 1) + qm * mix["elem_bytes"]
        rope_b_extra = qa * rope_b_extra
    # fp8 / MXFP8 / NVFP4: inputs of the four GEMMs cast (read 2 B, write the low-precision
    # copies with their scales), again for their gradients. Transformer Engine's
    # LayerNormLinear writes the norm output (the QKV and fc1 inputs) straight in the
    # low-precision format instead of 16-bit (``with_quantized_norm``) - but not a
    # block-scaled one that must first be all-gathered for sequence parallelism
    # (transformer_engine/pytorch/module/layernorm_linear.py, _LayerNormLinear.forward).
    # Current scaling reads a tensor twice, for its amax and for the cast (TE docs
    # fp8_current_scaling.rst; torchao float8 tensorwise / rowwise: amax, then cast). TE's
    # per-tensor fp8 (lp_norm_cast) is priced pass by pass in _per_tensor_casts. A block
    # whose MLP is all routed experts has one norm-fed input here (QKV): its experts cast
    # their own after the dispatch (moe.py)
    lp, current = x["lp_copy_bytes"], x["current_scaling"] > 0
    block = x["block_scaled"] > 0
    pt = _per_tensor_casts(x, lay, ab, lp, current, w_in_cast, w_out_cast, f_up,
                           mixers=att_cast + qm)
    te, te_block = pt["te"], block & pt["te_stack"]
    n_fed = pt["fp8_inputs"]  # norm-fed GEMM inputs: QKV, and fc1 where the block has one
    # (TE's norms quantize their output for per-tensor and MXFP8 quantizers, not blockwise
    # ones: normalization.cpp, "Choose implementation", UNFUSED otherwise)
    norm_fused = (x["lp_norm_cast"] > 0) & ~(block & (sp > 0) & (t > 1)) & ~current \
        & (x["blockwise"] == 0)
    norm_fed = np.where(norm_fused, (lp - ab) * np.where(sp, Ta, T), (ab + lp) * T) \
        * n_fed * e
    cast_in = ab * np.where(current, 2.0, 1.0) + lp  # the other two GEMM inputs
    generic_f = norm_fed + cast_in * T * (w_out_cast / t + f / t)
    # elements of the four GEMMs' inputs and of their output gradients, per micro-batch
    input_elems = T * (n_fed * e + w_out_cast / t + f / t)
    grad_elems = T * (w_in_cast / t + f_up / t + n_fed * e)
    # torchao's rowwise recipe (config.py ROWWISE; float8_linear.py
    # matmul_with_hp_or_float8_args): each GEMM operand quantized from 16 bits along the
    # axis that GEMM reads, so an input or output gradient is cast a second time, from a
    # 16-bit transposed copy (roofline_utils.py: 6 B an element fused against tensorwise's
    # 4), and the two backward GEMMs run unscaled and rescale their outputs (float8_ops.py,
    # pytorch/ao#1325: read and write 2 B an element of the input gradients and of the
    # weight gradients)
    rowwise = x["rowwise_scaling"] > 0
    weight_elems = _params_per_layer(x, t)[0] if np.any(rowwise) else 0.0
    rescale_bytes = np.where(rowwise, 4.0 * (input_elems + weight_elems), 0.0)
    # backward of a block-scaled format in TE: the gradients entering the four GEMMs'
    # dgrad and wgrad quantized once each, row- and column-wise in one pass (TE's MXFP8 /
    # NVFP4 quantize kernels write both usages): the column-parallel outputs' (QKV, fc1:
    # their output widths) and the row-parallel ones' (attention output, fc2: e wide,
    # gathered in 16 bits with SP first); the saved inputs kept both copies from the forward
    block_b = (ab + lp) * grad_elems
    # torchao's per-tensor recipes (not TE's stack, not SUMMA), by torchao's own roofline
    # (torchao/testing/float8/roofline_utils.py @4e3d019, L92 - 156): an input and an output
    # gradient each cast once into both fp8 layouts, reading 2 B and writing 1 + 1, plus a
    # 2-B read for the amax that torch.compile fuses into the producing kernel; rowwise 2 B
    # more (its 16-bit transposed copy). Inputs in the forward, output gradients and
    # rowwise's rescale in the backward
    ao_bytes_per_elem = ab + np.where(x["fused"] > 0, 0.0, ab) + 2.0 * VALUE_BYTES["fp8"] \
        + np.where(rowwise, 2.0, 0.0)
    ao_f = ao_bytes_per_elem * input_elems
    ao_b = ao_bytes_per_elem * grad_elems + rescale_bytes
    # anything else (torchao's block-scaled formats, SUMMA's 2D blocks, which TE does not
    # run): the four inputs cast, the backward twice the forward (rowwise: its second casts
    # and rescale on top)
    generic_b = 2.0 * generic_f + np.where(rowwise, 2.0 * (input_elems + grad_elems), 0.0) \
        + rescale_bytes
    cast_f = x["fp8"] * np.where(te, pt["bytes_f"], np.where(pt["ao"], ao_f, generic_f))
    cast_b = x["fp8"] * np.where(te, pt["bytes_b"], np.where(
        te_block, block_b, np.where(pt["ao"], ao_b, generic_b)))
    # TE: one quantize kernel a cast (block-scaled: both usages in one; none where the norm
    # writes the copy); torch.compile fuses torchao's casts into the kernels around them
    # (torchtitan docs/float8.md: compile "required ... to fuse the float8 scaling/casting
    # kernels")
    cast_kernels_f = np.where(te, pt["kernels_f"], np.where(
        te_block, n_fed * (np.where(norm_fused, 0.0, 1.0) + 1.0), 0.0))
    cast_kernels_b = np.where(te, pt["kernels_b"], np.where(te_block, 2.0 * n_fed, 0.0))
    kernels_f = np.where(fused, 6.0, 12.0 + 4.0 * x["rmsnorm"] + 4.0 * x["rope"])
    if hybrid:
        kernels_f = kernels_f * n_sub / 2.0 + qm * mix["kernels"]
    if np.any(x["csa"] > 0) or np.any(x["hc"] > 0):
        # compressed sparse attention's norms, gated sums and scores (csa.elementwise_bytes:
        # the query norm, a gated sum per compressor, the indexer's top-k); the hyper-
        # connections' stream traffic and kernels (csa.hc_passes), two modules a layer
        csa_row = x["csa"] > 0
        elem_bytes_f = elem_bytes_f + np.where(csa_row, csa.elementwise_bytes(x, T), 0.0) \
            + ab * A * csa.hc_passes(x, fused)
        kernels_f = kernels_f + np.where(csa_row, 1.0 + 3.0 * x["csa_frac"] + x["hca_frac"],
                                         0.0) \
            + np.where(x["hc"] > 0, 2.0 * np.where(fused, csa.HC_KERNELS_FUSED,
                                                   csa.HC_KERNELS_EAGER), 0.0)
    elem_f = memory_s(elem_bytes_f + cast_f, x, kernels_f + cast_kernels_f)
    # backward ~ twice the passes of the forward's elementwise ops; the casts as counted
    elem_b = memory_s(2.0 * elem_bytes_f + rope_b_extra + cast_b, x,
                      2.0 * kernels_f + cast_kernels_b)
    if np.any(x["dsa"] > 0):
        # DeepSeek sparse attention's scores, top-k lists, indexer norm and RoPE, absorbed
        # queries (dsa.elementwise_bytes), forward only: five kernels more (norm, RoPE,
        # top-k, two copies)
        elem_f = elem_f + np.where(x["dsa"] > 0, memory_s(dsa.elementwise_bytes(x, T, t), x,
                                                          5.0), 0.0)
    if summa:
        # SUMMA broadcasts, plus the norms' row statistics (mean, variance in fp32) reduced
        # across the t GPUs holding a row's columns, twice per pass
        stats = 2.0 * collective_s("allreduce", 2.0 * T * 4.0, t, c["nv_tp"], x)
        tp_f_exp, tp_b_exp = summa_f + stats, summa_b + stats
    else:
        # 2 all-reduces (or AG + RS with SP) of the (b s, e) activation per pass (N21
        # section 2.3; K22 section 4.2.2), one more in backward with SP (re-gather)
        ar = collective_s("allreduce", T * e * ab, t, c["nv_tp"], x)
        tp_f = 2.0 * ar
        tp_b = (2.0 + np.where(sp, 1.0, 0.0)) * ar
        # (a hybrid block: the same per layer, one all-reduce or AG + RS pair each; a Mamba
        # mixer's in_proj and out_proj are column- and row-parallel as attention's)
        # per-tensor fp8 with SP: Transformer Engine quantizes the norm outputs and the
        # row-parallel output gradients on the local shard and all-gathers the fp8 copies
        # (module/base.py grad_output_preprocess; distributed.py gather_along_first_dim
        # with a Float8 quantizer): 2 of the forward's 4 collectives and 4 of the
        # backward's 6 move 1 B an element; the reduce-scatters stay 16-bit
        if np.any(pt["fp8_gather"]):
            ag_lp = collective_s("allgather", T * e * VALUE_BYTES["fp8"], t, c["nv_tp"], x)
            ag = collective_s("allgather", T * e * ab, t, c["nv_tp"], x)
            rs = collective_s("reducescatter", T * e * ab, t, c["nv_tp"], x)
            # (one fp8 gather of the two where the block's MLP is all routed experts; a
            # hybrid block's per pair of layers)
            n8 = pt["fp8_inputs"] * 2.0 / n_sub if hybrid else pt["fp8_inputs"]
            tp_f = np.where(pt["fp8_gather"], 2.0 * rs + n8 * ag_lp + (2.0 - n8) * ag, tp_f)
            tp_b = np.where(pt["fp8_gather"], 2.0 * rs + 2.0 * (n8 * ag_lp + (2.0 - n8) * ag),
                            tp_b)
        # the backward's collectives that wait on nothing but their own GEMM: without SP
        # none; with SP the row-parallel linears' output-gradient all-gathers (16-bit, or
        # per-tensor fp8 where TE gathers the fp8 copy), one all-reduce's volume
        bwd_sync = np.where(sp, ar, 0.0)
        if np.any(pt["fp8_gather"]):
            bwd_sync = np.where(pt["fp8_gather"], n8 * ag_lp + (2.0 - n8) * ag, bwd_sync)
        if hybrid:
            tp_f, tp_b = tp_f * n_sub / 2.0, tp_b * n_sub / 2.0
            bwd_sync = bwd_sync * n_sub / 2.0
        overlap = c["tp_overlap"] > 0
        tp_f_exp = np.where(overlap, np.maximum(tp_f - gemm_f, 0)
                            + TP_OVERLAP_RESIDUAL * tp_f, tp_f)
        # without userbuffers overlap, Transformer Engine's column-parallel linears
        # (QKV, fc1, a Mamba in_proj) launch their backward collectives asynchronously: the
        # input's re-gather (SP) behind the dgrad GEMM, the dgrad reduce-scatter (SP) or
        # all-reduce behind the wgrad GEMM (transformer_engine/pytorch/module/linear.py
        # _Linear backward, gather_along_first_dim / reduce_scatter_along_first_dim /
        # allreduce with async_op=True, @d0067d0 L979 - 1000, L1115 - 1135); the rest waits
        # (with SP the re-gathers move what the row-parallel gathers do, bwd_sync; the
        # reduce-scatters the rest); dgrad and wgrad of a GEMM are equal halves of its
        # backward
        bwd_alone = tp_b
        if np.any(x["tp_async_bwd"] > 0):
            half_b = (gemm_b_each[0] + gemm_b_each[2] + (gemm_b_each[4] if hybrid else 0.0)) / 2.0
            regather = np.where(sp, bwd_sync, 0.0)
            reduce = tp_b - bwd_sync - regather
            bwd_alone = np.where(x["tp_async_bwd"] > 0, bwd_sync
                                 + np.maximum(regather - half_b, 0.0)
                                 + np.maximum(reduce - half_b, 0.0), tp_b)
        tp_b_exp = np.where(overlap, np.maximum(tp_b - gemm_b, 0)
                            + TP_OVERLAP_RESIDUAL * tp_b, bwd_alone)
        if np.any(x["dsa"] > 0):
            # DSA under TP (sequence parallel): the indexer's duplicated linears all-gather
            # their inputs, the attention input and the compressed query (dsa.py L1273 -
            # 1275), and the sparse loss's target (fp32, a top-k list a query) is all-
            # reduced (dsa_cudnn_kernels.py L1816 - 1818), exposed, forward only
            gather = collective_s("allgather", T * (e + x["q_lora"]) * ab, t, c["nv_tp"], x)
            target = collective_s("allreduce", T * x["dsa_topk_width"] * dsa.SCORE_BYTES, t,
                                  c["nv_tp"], x)
            tp_f_exp = tp_f_exp + np.where((x["dsa"] > 0) & (t > 1), x["idx_share"] * (
                gather + np.where(dsa.trains(x), target, 0.0)), 0.0)
        # current scaling's amax all-reduces over the TP group (one fp32 each, blocking:
        # quantizer.cpp quantize_with_amax) are latency, never hidden
        if np.any(pt["amax_reduces_f"] > 0):
            amax_ar = collective_s("allreduce", 4.0, t, c["nv_tp"], x)
            tp_f_exp = tp_f_exp + pt["amax_reduces_f"] * amax_ar
            tp_b_exp = tp_b_exp + pt["amax_reduces_b"] * amax_ar
    # K and V of the whole sequence for the local queries: a ring passes each shard around,
    # overlapped with the attention blocks (Liu et al. 2023; backward also returns dK, dV),
    # or one all-gather before attention and a reduce-scatter of dK, dV after it, exposed
    # (Llama 3, arXiv 2407.21783 section 3.3.2)
    group, domain = lay["kv_group"], lay["kv_domain"]
    kv_full = 2.0 * b * Kvl * d * s * ab
    if np.any(x["dsa"] > 0):
        # (DSA: the absorbed latent key, kv_lora + rope wide, and the indexer's key, one
        # of each a token, all-gathered; its value is the latent key's first kv_lora
        # channels: dsa.py L1829 - 1863, L1981 - 1990)
        kv_full = np.where(x["dsa"] > 0, b * s * (x["kv_lora"] + x["d_rope"]
                                                  + x["idx_share"] * x["idim"]) * ab, kv_full)
    step = p2p_s(kv_full / group, domain >= group, x)
    ring_f = (group - 1) * step
    ring_f_exp = np.maximum(ring_f - attn_layer_f, 0) + step
    ring_b_exp = np.maximum(2 * ring_f - attn_layer_b, 0) + step
    ag = collective_s("allgather", kv_full, group, domain, x)
    kv_full_b = kv_full
    if np.any(x["dsa"] > 0):  # (DSA: an untrained indexer's key is gathered under no_grad,
        # dsa.py L1979 - 1990: its gradient is not reduce-scattered back)
        kv_full_b = np.where(dsa.trains(x) | (x["dsa"] <= 0), kv_full, b * s * (
            x["kv_lora"] + x["d_rope"]) * ab)
    rs = collective_s("reducescatter", kv_full_b, group, domain, x)
    split = group > 1
    cp_f_exp = np.where(split, np.where(lay["kv_allgather"], ag, ring_f_exp), 0.0)
    # (DSA keeps the gathered keys: its backward reduce-scatters their gradients alone,
    # dsa_cudnn_kernels.py L1973, L2264 - 2266)
    gathered_b = np.where(x["dsa"] > 0, rs, ag + rs) if np.any(x["dsa"] > 0) else ag + rs
    cp_b_exp = np.where(split, np.where(lay["kv_allgather"], gathered_b, ring_b_exp), 0.0)
    ssm_f = ssm_b = ssm_flops = 0.0
    if hybrid:
        ssm_f, ssm_b, ssm_flops = qm * mix["scan_f"], qm * mix["scan_b"], qm * mix["scan_flops"]
        # context parallelism: the block's attention layers exchange K / V as above; a
        # Mamba-2 layer trades its sequence shard for a head shard of the whole sequence
        # before the convolution and back after the scan, all-to-alls over the CP group
        # (Megatron-LM d98e8a6 megatron/core/ssm/mamba_context_parallel.py: z, x, B, C, dt
        # in, L159 - 193, the scan output out, L208; B and C repeated to cp groups when
        # the rank holds fewer, L119 - 133), exposed, the same in the backward; each moves
        # (cp - 1) / cp of its tensor, NVLink peers' share over NVLink (sweep.model.cost.moe
        # a2a_s), plus a permutation of the load-balanced chunks (a read and a write)
        into_bytes = T * ab * (2.0 * x["m_inner"] / t + _mamba_bc_width(x, t, group)
                               + x["m_heads"] / t)
        back_bytes = T * ab * x["m_inner"] / t
        share_bytes = (into_bytes + back_bytes) / np.maximum(group, 1.0)  # (to each peer)
        a2a = moe.a2a_s(share_bytes * (np.minimum(domain, group) - 1.0),
                        share_bytes * np.maximum(group - domain, 0.0), group, domain, x) \
            + 5.0 * np.where(group > domain, x["net_lat_s"], x["nvl_lat_s"])
        mamba_cp = np.where(split, a2a + memory_s(2.0 * (into_bytes + back_bytes), x, 6.0),
                            0.0)
        cp_f_exp = qa * cp_f_exp + qm * mamba_cp
        cp_b_exp = qa * cp_b_exp + qm * mamba_cp
    fwd = gemm_f + attn_f + elem_f + tp_f_exp + cp_f_exp + ssm_f
    bwd = gemm_b + attn_b + elem_b + tp_b_exp + cp_b_exp + ssm_b
    # activation recompute adds forward work to the backward pass (K22 section 5)
    r = c["recompute"]
    core_f = fa_f
    if np.any(x["dsa"] > 0):  # (DSA: the checkpointed core attention re-gathers its keys)
        core_f = fa_f + np.where(x["dsa"] > 0, cp_f_exp, 0.0)
    core_recompute = qa * np.where(flash, core_f, mat_core_f) if hybrid \
        else np.where(flash, core_f, mat_core_f)
    extra = np.select([r == Recompute.SELECTIVE, r == Recompute.FULL, r == Recompute.OP_SAC],
                      [core_recompute, fwd, elem_f + op_sac_gemm], 0.0)
    # recompute_modules on top of the policy: the two norms, MLA's up-projections
    # (Megatron-Core transformer_config.py recompute_modules layernorm, mla_up_proj)
    if np.any(x["rc_norm"] > 0) or np.any(x["rc_mla_up"] > 0):
        modules = x["rc_norm"] * memory_s(2.0 * 2.0 * Ta * e * ab, x, 2.0) \
            + x["rc_mla_up"] * (mla_up_f if not summa else 0.0)
        extra = extra + np.where(r == Recompute.FULL, 0.0, modules)
    extra_flops = np.select([r == Recompute.SELECTIVE, r == Recompute.FULL,
                             r == Recompute.OP_SAC],
                            [np.where(flash, attn_flops, attn_flops / 2.0),  # (as timed:
                             # the whole flash forward, or the score GEMM and softmax)
                             gemm_flops + attn_flops, op_sac_flops], 0.0)
    out = {"fwd": fwd, "bwd": bwd, "recompute_full": fwd, "recompute_other": extra,
           "gemm_f_each": gemm_each, "gemm_b_each": gemm_b_each, "attn_f": attn_f,
           "attn_b": attn_b,
           "compute_f": gemm_f + attn_f, "compute_b": gemm_b + attn_b,
           "memory_f": elem_f, "memory_b": elem_b, "tp_f": tp_f_exp, "tp_b": tp_b_exp,
           "cp_f": cp_f_exp, "cp_b": cp_b_exp, "flops_f": gemm_flops + attn_flops,
           "flops_b": 2.0 * gemm_flops + attn_flops_b,
           "recompute_flops": extra_flops, "mlp_flops_f": flops_each[2] + flops_each[3],
           "kv_gathered": np.where(split & lay["kv_allgather"], kv_full, 0.0)}
    if indexer_f is not None:
        out["indexer_f"] = indexer_f
    if hybrid:
        out.update(ssm_f=ssm_f, ssm_b=ssm_b, compute_f=out["compute_f"] + ssm_f,
                   compute_b=out["compute_b"] + ssm_b, flops_f=out["flops_f"] + ssm_flops,
                   flops_b=out["flops_b"] + SSD_BWD_FACTOR * ssm_flops,
                   recompute_flops=np.where(c["recompute"] == Recompute.FULL,
                                            extra_flops + ssm_flops, extra_flops))
    return out


# ------------------------------------------------------------------------------ the step

#: candidate columns the per-layer model depends on; a block of candidates has few distinct
#: combinations, so the layer model runs once per combination (sweep.model.cost.dedup)
LAYER_KEYS = ("tp", "tp2", "cp", "mbs", "nb", "sp", "tp_overlap", "cp_comm", "nv_tp",
              "nv_tp2", "nv_cp", "recompute")
#: the candidate columns an MoE block's routed experts read (_routed_terms): the tokens
#: entering the block (tp, cp, mbs, sp), the expert layout (ep, etp, nv_ep) and the attention
#: mesh's GPUs of a domain an ETP group spans (nv_tp x nv_cp x nv_dp, with etp > 1 only) -
#: not the layer's recompute, TP overlap or K/V exchange, nor a2a_overlap (what the overlap
#: hides is decided per candidate, _moe_block); a block has ~15x fewer distinct routed rows
#: than distinct rows of LAYER_KEYS and the expert layout. Its rows are told apart by
#: ROUTED_ROW_KEYS and the ETP span (the product of the last three, 0 where etp = 1)
ROUTED_ROW_KEYS = ("tp", "cp", "mbs", "sp", "ep", "etp", "nv_ep")
ROUTED_KEYS = ROUTED_ROW_KEYS + ("nv_tp", "nv_cp", "nv_dp")


def _tokens(x, c, t, cp, b):
    """(T, sp, Ta) of a 1D block: tokens per GPU (the micro-batch's sequence over cp), whether
    sequence parallelism splits the norm region over the t TP ranks, and its tokens there."""
    sp = (as_array(c["sp"]) > 0) & (t > 1)
    T = b * x["s"] / cp
    return T, sp, np.where(sp, T / t, T)


def _layout(x, c):
    """How one layer's work is split: 1D Megatron TP (tokens T per TP rank, Ta in the norm
    region, queries split over cp) or 2D SUMMA (tokens over tp2, widths over tp; queries
    over tp2 with K/V all-gathered, as the NERSC 2D strategy's attention)."""
    t, t2, cp, b = (as_array(c[k], dtype=np.float64) for k in ("tp", "tp2", "cp", "mbs"))
    s = x["s"]
    summa = bool(np.any(as_array(x.get("summa", 0.0)) > 0))
    if summa:
        T = b * s / t2
        return {"b": b, "t": t, "t2": t2, "summa": True, "T": T, "Ta": T / t,
                "sp": np.ones(np.shape(T), dtype=bool), "q_split": t2, "kv_group": t2,
                "kv_domain": as_array(c["nv_tp2"], dtype=np.float64),
                "kv_allgather": np.ones(np.shape(T), dtype=bool)}
    T, sp, Ta = _tokens(x, c, t, cp, b)
    return {"b": b, "t": t, "t2": np.ones_like(t), "summa": False, "T": T,
            "Ta": Ta, "sp": sp, "q_split": cp, "kv_group": cp,
            "kv_domain": as_array(c["nv_cp"], dtype=np.float64),
            "kv_allgather": as_array(c["cp_comm"]) > 0}


def _layer_terms(x, c):
    """Per-micro-batch times of one layer (_layer), the embedding and the LM head, and the
    activation bytes a layer keeps."""
    lo = _layout(x, c)
    t, T, Ta = lo["t"], lo["T"], lo["Ta"]
    e, ab = x["e"], x["act_bytes"]
    V = padded_vocab(x["V"], t)
    training = x["training"] > 0
    lay = _block_terms(x, c, lo)
    if np.any(as_array(x["bf16_share"]) > 0):  # (per-layer precision: _combine's stages)
        lay.update({B16_PREFIX + k: v for k, v in
                    _block_terms(_b16_context(x), c, lo).items()})
    # first stage: embedding lookup (and its gradient); last stage: final norm, LM head and
    # the cross-entropy over the vocabulary-parallel logits (Megatron vocab parallel)
    has_vocab = V > 0
    emb_f = np.where(has_vocab, memory_s(2.0 * T * e * ab, x, 1.0)
                     + collective_s("allreduce", T * e * ab, t, c["nv_tp"], x), 0.0)
    emb_b = np.where(has_vocab & training, memory_s(3.0 * T * e * ab, x, 2.0), 0.0)
    peak, eff = x["peak16_flops_per_s"], x["gemm_eff"] * x["gemm_sustained"]
    head_f = np.where(has_vocab, gemm_s(T, V / t, e, x, peak, eff)
                      + memory_s(3.0 * T * V / t * 4.0, x, 3.0), 0.0)
    head_b = np.where(has_vocab & training, gemm_s(T, e, V / t, x, peak, eff)
                      + gemm_s(e, V / t, T, x, peak, eff)
                      + memory_s(3.0 * T * V / t * 4.0, x, 3.0), 0.0)
    lay.update(emb_f=emb_f, emb_b=emb_b, head_f=head_f, head_b=head_b, T=T, Ta=Ta)
    if np.any(x["mtp"] > 0):
        # multi-token prediction's projection of [h; emb] (2e -> e, column-parallel); with
        # hyper-connections an e -> e projection of the embedding and one of each of the n
        # streams (Megatron-Bridge deepseek_v4 MTP e_proj / h_proj: notes 29), as one GEMM
        # of (1 + n) e inputs
        w_in = e * (1.0 + np.maximum(x["hc"], 1.0))
        lay.update(eh_f=gemm_s(T, e / t, w_in, x, peak, eff), eh_b=np.where(
            training, gemm_s(T, w_in, e / t, x, peak, eff)
            + gemm_s(w_in, e / t, T, x, peak, eff), 0.0))
    if _own_mtp_depth(x):
        # a hybrid's MTP depth: a block of its own mixers (mtp_pattern), not the main
        # pattern's share of them (Megatron-Core multi_token_prediction.py builds a
        # HybridStack of the depth's pattern); or a depth in its own GEMM format (mtp_bf16)
        depth = _block_terms(_mtp_context(x), c, lo)
        lay.update({MTP_PREFIX + k: v for k, v in depth.items()})
    return lay


def _b16_context(x):
    """The context of a block in 16 bits (bf16_first_layers, bf16_last_layers): its Mamba-2
    out_proj too (no quantization context, no per-module format)."""
    return dict(x, **{k: x[B16_PREFIX + k] for k in PRECISION_KEYS},
                **{MAMBA_OUT_PREFIX + k: x[B16_PREFIX + k] for k in PRECISION_KEYS})


def _blend(terms, share, share_moe=None):
    """Per-block terms of a stage whose dense blocks are ``share`` in 16 bits and whose MoE
    blocks ``share_moe`` (default the same): the job's format's and the B16_PREFIX ones mixed
    (lists, per-GEMM times, entry by entry); ``terms`` itself without 16-bit blocks."""
    if B16_PREFIX + "fwd" not in terms:
        return terms
    share_moe = share if share_moe is None else share_moe

    def mix(a, b, s):
        if isinstance(a, list):
            return [mix(u, v, s) for u, v in zip(a, b)]
        return (1.0 - s) * a + s * b
    return {k: mix(v, terms[B16_PREFIX + k], share_moe if k.startswith(MOE_PREFIX) else share)
            if B16_PREFIX + k in terms else v
            for k, v in terms.items() if not k.startswith(B16_PREFIX)}


def _b16_blocks(x, pp, v, L, layers, slot, moe_on):
    """(a function of a pipeline rank giving its 16-bit blocks and the MoE blocks among
    them, the ranks where those counts change, the model's 16-bit MoE blocks): the first bf16_first_blocks and last
    bf16_last_blocks blocks by global index (Megatron-Core fp8_utils.py
    is_first_last_bf16_layer: "layer_no is a global layer index"), the ranks holding chunks
    of layers / v item positions round-robin (interleaved stages; one chunk a rank without),
    the embedding slot item 0 - the last region counted from the end, the loss slot last,
    where the chunks leave a whole chunk or more empty at the end (so that the last rank holds
    the last blocks, as _combine's layers_last says). A region's MoE blocks spread evenly."""
    f16, l16 = x["bf16_first_blocks"], x["bf16_last_blocks"]
    chunk = np.maximum(layers / v, 1.0)
    from_end = pp * layers - (L + 2.0 * slot) >= chunk

    def before(k, rank):  # item positions < k on the rank
        q = np.floor(k / chunk + 1e-9)
        full = np.maximum(np.ceil((q - rank) / pp - 1e-9), 0.0)
        return full * chunk + np.where(np.abs(np.mod(q, pp) - rank) < 0.5, k - q * chunk, 0.0)

    def blocks(n, rank):  # blocks 0 .. n - 1 on the rank
        return before(n + slot, rank) - before(slot, rank)

    moe_first = moe.moe_layers_before(x, f16) if moe_on else 0.0
    moe_last = moe.moe_layers_before(x, L) - moe.moe_layers_before(x, L - l16) \
        if moe_on else 0.0
    moe_f, moe_l = moe_first / np.maximum(f16, 1.0), moe_last / np.maximum(l16, 1.0)

    def on_rank(rank):
        first = blocks(f16, rank)
        last = np.where(from_end, blocks(l16, pp - 1.0 - rank),
                        blocks(L, rank) - blocks(L - l16, rank))
        return first + last, first * moe_f + last * moe_l

    # (each count is a step function of the rank: full chunks on the ranks before the one
    # holding a region's partial chunk; the busiest middle rank is among these)
    def partial(n):
        return np.mod(np.floor((n + slot) / chunk + 1e-9), pp)
    last_partial = np.where(from_end, pp - 1.0 - partial(l16), partial(L))
    steps = [partial(f16), partial(f16) - 1.0, last_partial, last_partial + 1.0,
             np.mod(partial(L - l16), pp), np.mod(partial(L - l16), pp) + 1.0]
    return on_rank, steps, moe_first + moe_last


def _b16_shares(n16, moe16, n, nm):
    """(dense share, MoE share) of a stage's blocks in 16 bits: n16 16-bit blocks of which
    moe16 MoE, of n blocks of which nm MoE."""
    dense16 = np.clip(n16 - moe16, 0.0, np.maximum(n - nm, 0.0))
    return dense16 / np.maximum(n - nm, 1.0), np.clip(moe16, 0.0, nm) / np.maximum(nm, 1.0)


def _block_terms(x, c, lo):
    """One block's per-micro-batch terms (_layer), the activations it keeps under the
    candidate's policy, none and full recompute, and in an MoE job its MoE block's shared
    part (SHARED_PREFIX keys)."""
    t, T, Ta, sp, q_split = lo["t"], lo["T"], lo["Ta"], lo["sp"], lo["q_split"]
    lay = _layer(x, c, lo)
    lay.update(
        act_layer=_activation_bytes_per_layer(x, T, Ta, t, sp, q_split, c["recompute"]),
        act_none=_activation_bytes_per_layer(x, T, Ta, t, sp, q_split, Recompute.NONE),
        act_ckpt=_activation_bytes_per_layer(x, T, Ta, t, sp, q_split, Recompute.FULL),
    )
    lay["act_offload"], lay["act_offload_copy"] = _activation_bytes_per_layer(
        x, T, Ta, t, sp, q_split, c["recompute"], offloaded=True)
    if _has_moe(x):
        lay.update({SHARED_PREFIX + k: v for k, v in _shared_block(x, c, lo).items()})
    return lay


def _own_mtp_depth(x) -> bool:
    """Whether the context holds a job with multi-token prediction whose depths are blocks of
    their own (MTP_PREFIX terms): a hybrid's (its depth pattern), a csa job's (a window-only
    layer), or one whose depths run in 16 bits under a low-precision recipe (mtp_bf16)."""
    has_mtp = bool(np.any(as_array(x["mtp"]) > 0))
    return ((_hybrid(x) or bool(np.any(as_array(x["csa"]) > 0))) and has_mtp) \
        or bool(np.any(as_array(x["mtp_bf16"]) > 0))


def _mtp_context(x):
    """The context of an MTP depth: a block with the depth's attention and Mamba-2 layers
    (an attention + FFN block's are 1 and 0), a csa depth's window-only attention (no
    compressor or indexer), in the depth's GEMM format (make_context's MTP16_PREFIX entries:
    the job's own unless mtp_bf16)."""
    return dict(x, n_attn=x["mtp_attn"], n_mamba=x["mtp_mamba"], csa_frac=0.0, hca_frac=0.0,
                csa_keys=x["mtp_csa_keys"],
                **{k: x[MTP16_PREFIX + k] for k in PRECISION_KEYS})


#: keys of an MoE block's terms in the per-layer dict (the plain keys are a dense block's)
MOE_PREFIX = "moe:"
#: keys of an MTP depth's terms where it is a block of its own (a hybrid's depth pattern, a
#: depth in 16 bits: _own_mtp_depth), MoE ones MTP_PREFIX + MOE_PREFIX
MTP_PREFIX = "mtp:"


def _has_moe(x) -> bool:
    return bool(np.any(as_array(x["moe"]) > 0))


#: keys of an MoE block's attention and shared-expert terms (before the routed experts)
SHARED_PREFIX = "shared:"


def _shared_block(x, c, lo):
    """Per-micro-batch terms of an MoE block without its routed experts, with the keys of
    _layer: the attention block and the shared expert as a dense block whose MLP is the
    shared expert (no MLP when there is none); and the router, which sees every token."""
    t, T, Ta, sp, q_split = lo["t"], lo["T"], lo["Ta"], lo["sp"], lo["q_split"]
    xs = dict(x, f=x["fs"])
    lay = _layer(xs, c, lo)
    router_f, router_b = moe.router_s(x, Ta)
    policy = as_array(c["recompute"])
    # the shared expert's own tensors (recompute_moe re-runs them): what its MLP adds
    shared_mlp = 0.0
    if np.any(x["rc_moe"] > 0):
        shared_mlp = _activation_bytes_per_layer(xs, T, Ta, t, sp, q_split, Recompute.NONE) \
            - _activation_bytes_per_layer(dict(xs, f=0.0), T, Ta, t, sp, q_split,
                                          Recompute.NONE)
    lay.update(
        router_f=router_f, router_b=router_b, act_shared_mlp=shared_mlp,
        act_layer=_activation_bytes_per_layer(xs, T, Ta, t, sp, q_split, policy),
        act_none=_activation_bytes_per_layer(xs, T, Ta, t, sp, q_split, Recompute.NONE),
        act_ckpt=_activation_bytes_per_layer(xs, T, Ta, t, sp, q_split, Recompute.FULL),
    )
    lay["act_offload"], lay["act_offload_copy"] = _activation_bytes_per_layer(
        xs, T, Ta, t, sp, q_split, policy, offloaded=True, moe_block=True)
    return lay


def _moe_block(x, c, lay, r):
    """Per-micro-batch terms of one MoE block (the keys of _layer, prefixed MOE_PREFIX in
    the per-layer dict) from its shared part (_shared_block, ``lay``) and its routed experts
    (sweep.model.cost.moe.routed_experts, ``r``). The token all-to-all is exposed, or with
    a2a_overlap hidden behind the other micro-batch's backward (forward) compute of the
    same block, as Megatron-Core's combined 1F1B schedule pairs them (combined_1f1b.py;
    notes 4.5)."""
    comp_f = lay["compute_f"] + lay["router_f"] + r["compute_f"]
    comp_b = lay["compute_b"] + lay["router_b"] + r["compute_b"]
    overlap = as_array(c["a2a_overlap"]) > 0
    ep_f = np.where(overlap, np.maximum(r["ep_f"] - comp_b, 0.0), r["ep_f"])
    ep_b = np.where(overlap, np.maximum(r["ep_b"] - comp_f, 0.0), r["ep_b"])
    fwd = lay["fwd"] + lay["router_f"] + r["compute_f"] + r["memory_f"] + ep_f
    bwd = lay["bwd"] + lay["router_b"] + r["compute_b"] + r["memory_b"] + ep_b
    policy = as_array(c["recompute"])
    # the experts' offloaded tensors (offload_modules), moved as they are kept
    routed_off = np.where(policy == Recompute.FULL, 0.0, r["acts_offload"] * (1.0 - x["rc_moe"]))
    out = dict(lay)
    out.update(
        fwd=fwd, bwd=bwd, recompute_full=fwd, compute_f=comp_f, compute_b=comp_b,
        memory_f=lay["memory_f"] + r["memory_f"], memory_b=lay["memory_b"] + r["memory_b"],
        ep_f=ep_f, ep_b=ep_b, flops_f=lay["flops_f"] + r["flops_f"],
        flops_b=lay["flops_b"] + r["flops_b"], routed_gemm_f=r["gemm_f"],
        routed_gemm_b=r["gemm_b"], permute_f=r["permute_f"], permute_b=r["permute_b"],
        expert_act_f=r["act_f"], expert_act_b=r["act_b"], latent_f=r["latent_f"],
        latent_b=r["latent_b"],
        # (recompute_moe: the routed experts' tensors are recomputed from the layer input)
        # and the shared expert's: the whole MoE layer is re-run from its input
        act_layer=lay["act_layer"] + np.where(policy == Recompute.FULL, 0.0,
                                              r["acts"] * (1.0 - x["rc_moe"])
                                              - x["rc_moe"] * lay["act_shared_mlp"]),
        act_none=lay["act_none"] + r["acts"],
        act_offload=lay["act_offload"] + routed_off,
        act_offload_copy=lay["act_offload_copy"] + routed_off,
        # full recompute re-runs the whole block's forward: router, dispatch, experts and
        # combine too (Megatron-Core checkpoints whole TransformerLayers, MoE layer
        # included: transformer_block.py _checkpointed_forward); otherwise
        # recompute_moe_act re-runs the experts' activation function (recompute_modules
        # moe_act), recompute_moe the whole MoE layer: router, dispatch, routed and shared
        # experts, combine (recompute_modules moe: MoELayer checkpointed,
        # transformer_layer.py)
        recompute_other=np.where(policy == Recompute.FULL, fwd, lay["recompute_other"]
                                 + x["rc_moe_act"] * (1.0 - x["rc_moe"]) * r["act_f"]
                                 + x["rc_moe"] * (
                                     lay["router_f"] + r["compute_f"] + r["memory_f"] + ep_f
                                     + lay["gemm_f_each"][2] + lay["gemm_f_each"][3])),
        recompute_flops=np.where(policy == Recompute.FULL, lay["flops_f"] + r["flops_f"],
                                 lay["recompute_flops"] + x["rc_moe"] * (
                                     r["flops_f"] + lay["mlp_flops_f"])))
    return out


def _with_moe(x, c, lay, routed):
    """``lay`` (per-layer terms, with the shared parts) plus the MoE block's terms."""
    shared = {k[len(SHARED_PREFIX):]: v for k, v in lay.items() if k.startswith(SHARED_PREFIX)}
    out = {k: v for k, v in lay.items() if not k.startswith(SHARED_PREFIX)}
    out.update({MOE_PREFIX + k: v for k, v in _moe_block(x, c, shared, routed).items()})
    shared16 = B16_PREFIX + SHARED_PREFIX
    if any(k.startswith(shared16) for k in lay):  # (16-bit blocks: their MoE block)
        block = {k[len(shared16):]: v for k, v in lay.items() if k.startswith(shared16)}
        out = {k: v for k, v in out.items() if not k.startswith(shared16)}
        routed16 = {k[len(B16_PREFIX):]: v for k, v in routed.items()
                    if k.startswith(B16_PREFIX)}
        out.update({B16_PREFIX + MOE_PREFIX + k: v
                    for k, v in _moe_block(x, c, block, routed16).items()})
    mtp_shared = MTP_PREFIX + SHARED_PREFIX
    if any(k.startswith(mtp_shared) for k in lay):  # (an MTP depth of its own: its MoE block)
        depth = {k[len(mtp_shared):]: v for k, v in lay.items() if k.startswith(mtp_shared)}
        out = {k: v for k, v in out.items() if not k.startswith(mtp_shared)}
        routed_depth = {k[len(MTP_PREFIX):]: v for k, v in routed.items()
                        if k.startswith(MTP_PREFIX)} or routed
        out.update({MTP_PREFIX + MOE_PREFIX + k: v
                    for k, v in _moe_block(x, c, depth, routed_depth).items()})
    return out


def _routed_terms(x, c):
    """The routed experts of an MoE block for the candidates ``c`` (sweep.model.cost.moe),
    from the ROUTED_KEYS columns alone (an MoE block is 1D: SUMMA blocks are dense,
    candidates._degree_combos)."""
    t, cp, b = (as_array(c[k], dtype=np.float64) for k in ("tp", "cp", "mbs"))
    lay = {"Ta": _tokens(x, c, t, cp, b)[2]}
    out = moe.routed_experts(x, c, lay, _gemm_rate(x)[0])
    if np.any(as_array(x["bf16_share"]) > 0):  # (per-layer precision: B16_PREFIX keys)
        x16 = _b16_context(x)
        out.update({B16_PREFIX + k: v for k, v in
                    moe.routed_experts(x16, c, lay, _gemm_rate(x16)[0]).items()})
    if np.any(as_array(x["mtp_bf16"]) > 0):  # (make_context: only with MTP depths)
        # (the MTP depths' routed experts in their own GEMM format: MTP_PREFIX keys)
        xm = _mtp_context(x)
        out.update({MTP_PREFIX + k: v for k, v in
                    moe.routed_experts(xm, c, lay, _gemm_rate(xm)[0]).items()})
    return out


def _layer_terms_dedup(x, c, lazy=False, lay=None):
    """(_layer_terms, and for an MoE job _routed_terms or else None) evaluated once per
    distinct LAYER_KEYS (and ROUTED_KEYS) row and gathered back (when the context is
    scalar, i.e. one job on one hardware variant); ``lazy``: gathered by the compiled loop
    that reads them (fuse.Gathered). _combine adds the routed part to an MoE block.
    ``lay``: the first already known (the routed experts' terms alone are computed)."""
    if lay is None:
        lay = _deduplicated(_fused_layer_terms, x, c, LAYER_KEYS, lazy)
    if not _has_moe(x):
        return lay, None
    # the routed experts' rows: the placement of the attention mesh matters to them only as
    # the GPUs of a domain an ETP group spans (etp > 1; moe.routed_experts etp_domain)
    etp = as_array(c["etp"])
    span = np.where(etp > 1, as_array(c["nv_tp"]) * as_array(c["nv_cp"])
                    * as_array(c["nv_dp"]), 0)
    routed = _deduplicated(_fused_routed_terms, x, dict(c, _etp_span=span),
                           ROUTED_ROW_KEYS + ("_etp_span",), lazy, reads=ROUTED_KEYS)
    return lay, routed


#: the per-layer terms as compiled loops (fuse.py): worth it from a few dozen rows (a
#: block of the MoE space has about 50 distinct layers; their numpy calls cost 5 ms)
_fused_layer_terms = fused(_layer_terms, min_rows=32)
_fused_routed_terms = fused(_routed_terms, min_rows=32)


def _deduplicated(terms, x, c, keys, lazy=False, reads=None):
    """``terms(x, c)`` evaluated once per distinct row of the ``keys`` columns and gathered
    back: when the context is scalar (one job on one hardware variant), or when it varies by
    row only as the variant column ``c["variant"]`` does (make_row_context). ``lazy``: each
    term a fuse.Gathered (its distinct rows and where each candidate's is). ``reads``: the
    columns ``terms`` reads, taken at each distinct row's first candidate (default: the
    keys; rows with equal keys must give equal terms)."""
    n = len(as_array(c["tp"]))
    by_variant = isinstance(c, Mapping) and "variant" in c
    if n < 64 or (not by_variant and any(_per_row(v) for v in x.values())):
        return terms(x, c)
    keys = tuple(keys) + (("variant",) if by_variant else ())
    uniq, inverse, first = unique_rows(c, keys, return_first=True)
    u = len(first)
    if 2 * u > n:
        return terms(x, c)
    if reads is not None:
        uniq = {k: as_array(c[k], dtype=np.int64)[first] for k in reads}
    # (a scalar context, checked above, is every distinct row's)
    sub = terms({k: v[first] if _per_row(v) else v for k, v in x.items()} if by_variant
                else x, uniq)

    def gather(v):
        if type(v) is np.ndarray and v.shape == (u,) and v.dtype == np.float64 and \
                v.flags.c_contiguous:  # (what the compiled loops return)
            rows = v
        else:
            rows = np.ascontiguousarray(np.broadcast_to(as_array(v, dtype=np.float64), (u,)))
        return Gathered(rows, inverse) if lazy else rows[inverse]

    return {k: [gather(a) for a in v] if isinstance(v, list) else gather(v)
            for k, v in sub.items()}


def _per_row(v) -> bool:
    """A context entry with a value per row (np.ndim(v) > 0, without np.ndim's cost on the
    Python numbers most entries are)."""
    if isinstance(v, (float, int)):
        return False
    return np.ndim(v) > 0


def _params_per_layer(x, t):
    """(TP-sharded GEMM weights, replicated weights: norms, MLA's down-projections) of one
    block (an MoE block: its shared expert as the MLP; sweep.model.cost.moe adds the rest)."""
    e, f = x["e"], x["f"]
    f_up = f * (1.0 + x["swiglu"])
    gemm = x["p_attn_tp"] + e * f_up + f * e
    biases = x["bias"] * (x["w_qkv"] + np.where(f > 0, f_up, 0.0))
    norms = 2.0 * e * (2.0 - x["rmsnorm"]) + x["bias"] * 2 * e
    if _hybrid(x):
        # a hybrid block: n_attn attention and n_mamba Mamba-2 layers, a pre-norm each
        # (Job.mamba_params: in_proj, convolution, A_log, D, dt_bias, gated norm, out_proj;
        # all split over TP with the heads and groups)
        qa, qm = x["n_attn"], x["n_mamba"]
        gemm = qa * x["p_attn_tp"] + e * f_up + f * e + qm * x["p_mamba"]
        biases = x["bias"] * (qa * x["w_qkv"] + np.where(f > 0, f_up, 0.0))
        norms = (qa + qm + 1.0) * (e * (2.0 - x["rmsnorm"]) + x["bias"] * e)
        return (gemm + biases) / t, norms + qa * x["p_attn_rep"]
    return (gemm + biases) / t, norms + x["p_attn_rep"]


def _moe_block_params(x, t):
    """Weights of an MoE block on the attention mesh per GPU of a ``t``-way TP group: its
    attention, shared expert and norms (_params_per_layer with the shared width), the router
    (replicated, notes 6.1) and a latent MoE's projections (whole on every TP rank:
    Megatron-Core's "duplicated" TE Linears)."""
    w, norms = _params_per_layer(dict(x, f=x["fs"]), t)
    return w + norms + x["E"] * x["e"] + x["p_latent"]


def _tensors_per_layer(x):
    """Parameter tensors of one block: four (SwiGLU: five) weight matrices, their biases,
    two norms (weight, and bias for LayerNorm)."""
    mats = 4.0 + x["swiglu"]
    if _hybrid(x):  # (a Mamba-2 layer: in_proj, conv weight and bias, A_log, D, dt_bias,
        # gated norm, out_proj)
        qa, qm = x["n_attn"], x["n_mamba"]
        return (2.0 * qa + 2.0 + x["swiglu"]) * (1.0 + x["bias"]) + (8.0 + 2.0 * x["bias"]) * qm \
            + (qa + qm + 1.0) * (2.0 - x["rmsnorm"])
    return mats * (1.0 + x["bias"]) + 2.0 * (2.0 - x["rmsnorm"])


def layer_terms(x: Mapping, c: Mapping, lay=None) -> tuple:
    """The per-layer terms evaluate starts from: (per-layer terms, routed experts' terms or
    None), as numpy arrays; ``lay``: the first already known. Of the calibration's
    parameters (hardware/calibration.yaml) the per-layer terms read none of the MoE
    (grouped_gemm_eff, expert_us, a2a_eff) and memory ones (reserve_GiB,
    allocator_cache), the routed experts' none of the memory ones: a fit that moves those
    alone reuses them (calibration.Evaluator; tests/analysis/test_validate.py)."""
    return _layer_terms_dedup(x, c, lay=lay)


def evaluate(x: Mapping, c: Mapping, scores_only: bool = False, screen: bool | None = False,
             layers: tuple | None = None) -> dict[str, np.ndarray]:
    """Iteration time, breakdown and memory of every candidate (columns of ``c``) in context
    ``x``; returns RESULT columns, with ``reason`` set for the infeasible ones. The per-layer
    terms are found once per distinct layer (numpy); the rest, elementwise, runs as one
    compiled loop when numba is installed (fuse.py: same results). ``scores_only``: the
    compiled loop may compute ``step_time_s`` and ``reason`` alone (what a search ranks
    by; the other columns then for its best rows only). ``screen`` (scores only, compiled,
    from SCREEN_MIN_ROWS rows): the step times of the rows that fit in memory only, the
    others inf (True), of every row (False), or as a sample of the block's rows says (None;
    see SCREEN_MAX_FEASIBLE). ``layers``: layer_terms(x, c), when the caller has them."""
    if layers is None:
        layers = _layer_terms_dedup(x, c, lazy=fuse_enabled())
    lay, routed = layers
    n = len(as_array(c["tp"]))
    if scores_only and screen is not False and fuse_enabled() and n >= SCREEN_MIN_ROWS:
        screened = _screened_scores(x, c, lay, routed, n, sample=screen is None)
        if screened is not None:
            return screened
    return (_fused_scores if scores_only else _fused_results)(x, c, lay, routed)


#: scores-only blocks from this many rows may be screened (a search asks): where at most
#: SCREEN_MAX_FEASIBLE of a block fits, the reasons of every row first (the memory side of
#: the model alone: about half the scores loop's time on DeepSeek-V3 and Llama 3 8B
#: blocks) and step times for the rows that fit only (on 64 GPUs 99.5 % of DeepSeek-V3's
#: candidates do not)
SCREEN_MIN_ROWS = 8192
SCREEN_MAX_FEASIBLE = 0.25
#: every SCREEN_STRIDE-th row of a block is the sample
SCREEN_STRIDE = 32


def _screened_scores(x: Mapping, c: Mapping, lay: Mapping, routed, n: int,
                     sample: bool = True):
    """The scores of a block (step_time_s, reason) with step times computed for the rows
    that fit only (the others: inf, never ranked), or None where a ``sample`` of its rows
    says too many fit for the reasons' own pass to pay. The same numbers for the rows that
    fit: the loops compute each row alone. (A block found to fit better than guessed gets
    every row's step time: its reasons' pass wasted, no more.)"""
    if sample:
        size = -(-n // SCREEN_STRIDE)
        fits = _fused_reasons(*_rows_of((x, c, lay, routed), slice(0, n, SCREEN_STRIDE), n),
                              min_rows=1)["reason"] == Reason.OK
        if np.count_nonzero(np.broadcast_to(fits, (size,))) > SCREEN_MAX_FEASIBLE * size:
            return None
    reason = _block_reasons(x, c, lay, routed, n)
    ok = np.flatnonzero(reason == Reason.OK)
    if len(ok) > SCREEN_MAX_FEASIBLE * n:  # (picking the rows out would cost more)
        return _fused_scores(x, c, lay, routed)
    step = np.full(n, np.inf)
    if len(ok):
        step[ok] = _fused_scores(*_rows_of((x, c, lay, routed), ok, n),
                                 min_rows=1)["step_time_s"]
    return {"step_time_s": step, "reason": reason}


#: an MoE block's rows left after its first stage's memory: from this share of the block,
#: every row's reason in one pass instead
FIRST_STAGE_MAX_REST = 0.5


def _block_reasons(x: Mapping, c: Mapping, lay: Mapping, routed, n: int) -> np.ndarray:
    """Every row's reason. An MoE block's memory is the largest of three pipeline stages'
    (first, middle, last: _combine), computed three times a row: the rows over HBM on the
    first stage alone are out of memory whatever the others hold (a third of the work; 91 %
    of DeepSeek-V3's candidates on 64 GPUs), and only the rest get the whole reason. The
    same codes either way."""
    if not _has_moe(x):
        return np.broadcast_to(_fused_reasons(x, c, lay, routed)["reason"], (n,))
    over = np.broadcast_to(_fused_first_stage_over(x, c, lay, routed)["over"] > 0, (n,))
    rest = np.flatnonzero(~over)
    if len(rest) > FIRST_STAGE_MAX_REST * n:  # (picking the rows out would cost more)
        return np.broadcast_to(_fused_reasons(x, c, lay, routed)["reason"], (n,))
    reason = np.full(n, Reason.OUT_OF_MEMORY, np.int64)
    if len(rest):
        reason[rest] = _fused_reasons(*_rows_of((x, c, lay, routed), rest, n),
                                      min_rows=1)["reason"]
    return reason


def _rows_of(tree, rows, n: int):
    """``tree`` (nested dicts, lists, tuples) with every per-row leaf - an (n,) array, a
    Gathered term - taken at ``rows`` (positions, or a slice), as contiguous arrays; other
    leaves (scalars) as they are. (The terms of one dedup share their index: taken once.)"""
    taken: dict[int, tuple] = {}  # id(index) -> (the index, kept: its id stays its; taken)

    def take(v):
        if type(v) is Gathered:
            if id(v.index) not in taken:
                taken[id(v.index)] = (v.index, np.ascontiguousarray(v.index[rows]))
            return Gathered(v.values, taken[id(v.index)][1])
        if isinstance(v, np.ndarray) and v.shape == (n,):
            return np.ascontiguousarray(v[rows])
        return v

    return map_leaves(tree, take)


def _results(x: Mapping, c: Mapping, lay: Mapping, routed) -> dict[str, np.ndarray]:
    return _combine(x, c, lay, routed)[0]


def _scores(x: Mapping, c: Mapping, lay: Mapping, routed) -> dict[str, np.ndarray]:
    out = _combine(x, c, lay, routed)[0]
    return {"step_time_s": out["step_time_s"], "reason": out["reason"]}


def _reasons(x: Mapping, c: Mapping, lay: Mapping, routed) -> dict[str, np.ndarray]:
    # (the compiled loop keeps only what the reason needs: the memory side of the model)
    return {"reason": _combine(x, c, lay, routed)[0]["reason"]}


def _first_stage_over(x: Mapping, c: Mapping, lay: Mapping, routed) -> dict[str, np.ndarray]:
    # (the first pipeline stage's memory alone: over HBM there, over HBM - the reason - on
    # the stage a candidate is judged by, whose memory is the largest of its stages')
    over = _combine(x, c, lay, routed)[1]["mem_first_bytes"] > x["hbm_bytes"]
    return {"over": np.where(over, 1.0, 0.0)}


# (without numba the scores are all the results: numpy computes every column anyway)
_fused_results = fused(_results, chunked=True)
_fused_scores = fused(_scores, fallback=_results, chunked=True)
# (chunked from fewer statements: a dense model's reasons are ~160, twice as fast chunked)
_fused_reasons = fused(_reasons, chunked=True, chunk_min_statements=100)
_fused_first_stage_over = fused(_first_stage_over, chunked=True, chunk_min_statements=100)


def _step(x: Mapping, c: Mapping) -> tuple[dict[str, np.ndarray], dict]:
    """(RESULT columns, the parts op_table itemises)."""
    return _combine(x, c, *_layer_terms_dedup(x, c))


def _combine(x: Mapping, c: Mapping, lay: Mapping, routed=None
             ) -> tuple[dict[str, np.ndarray], dict]:
    """_step from the per-layer terms ``lay`` (and an MoE block's ``routed`` terms):
    elementwise over the candidates, and every decision on the context alone (so that
    fuse.py can trace it)."""
    if routed is not None:
        lay = _with_moe(x, c, lay, routed)
    dp, t, cp, pp, b = (as_array(c[k], dtype=np.float64)
                        for k in ("dp", "tp", "cp", "pp", "mbs"))
    t2 = as_array(c["tp2"], dtype=np.float64)
    v = as_array(c["vpp"], dtype=np.float64)
    L, e, B = x["L"], x["e"], x["B"]
    V = padded_vocab(x["V"], t)
    ab = x["act_bytes"]
    training = x["training"] > 0
    has_vocab = V > 0
    multi = pp > 1
    # layers per pipeline stage: a uniform split gives every stage ceil(items / p) and the
    # last stage the remainder (Megatron-DeepSpeed; BLOOM chronicle: 78 layers over 12 stages,
    # "the last stage has 1 block, while the rest have 7"); with embedding slots the
    # embedding and the LM head count as one item each (Megatron-DeepSpeed
    # --pp-partition-method type:transformer|embedding; Megatron-Core
    # account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split)
    slot = np.where(multi & has_vocab & (x["embedding_slots"] > 0), 1.0, 0.0)
    items = L + 2.0 * slot
    layers = np.ceil(items / pp)  # a middle stage: the most layers
    layers_first = layers - slot
    # (candidates.last_stage_layers is the same rule for one candidate)
    layers_last = np.maximum(items - (pp - 1.0) * layers - slot, 0.0)
    if np.any(x["idx_group"] > 1.0):
        # DSA IndexShare: stages of whole sharing groups (dsa.busiest_stage_layers;
        # Megatron-Bridge's GLM-5.2 GB200 demo, PP 6: 16 layers on its busiest stages against
        # 13 even); the middle stages take it, or the first of two; the rest keep the even
        # split's
        busiest = dsa.busiest_stage_layers(L, x["idx_group"], pp)
        grouped = multi & (x["idx_group"] > 1.0)
        two = pp == 2.0
        layers = np.where(grouped & ~two, np.maximum(layers, busiest), layers)
        layers_first = np.where(grouped & two, np.maximum(layers_first, busiest - slot),
                                layers_first)
    m = B / (dp * b)  # micro-batches per iteration
    T = lay["T"]  # tokens per GPU in the tensor-parallel region
    r = as_array(c["recompute"])
    moe_on = _has_moe(x)
    # MoE blocks on each stage (the first stage's leading blocks, the last stage's final
    # ones, and the middle stage holding the most; sweep.model.cost.moe.moe_layers_before)
    if moe_on:
        def moe_in(start, n):
            return (moe.moe_layers_before(x, np.clip(start + n, 0.0, L))
                    - moe.moe_layers_before(x, np.clip(start, 0.0, L)))
        nm_first = moe_in(0.0, layers_first)
        nm_last = moe_in(L - layers_last, layers_last)
        last_mid = layers_first + np.maximum(pp - 3.0, 0.0) * layers
        nm_mid = np.maximum(np.maximum(moe_in(layers_first, layers), moe_in(last_mid, layers)),
                            moe_in(np.maximum(last_mid - layers, layers_first), layers))
        # with MoE on every third layer or sparser, where a stage starts decides its count:
        # the busiest middle stage holds ceil(layers / step) of the middle stages' MoE blocks
        middle = moe_in(layers_first, np.maximum(L - layers_last - layers_first, 0.0))
        sparse = x["moe_step"] >= 3
        nm_mid = np.where(sparse & (pp > 2), np.maximum(nm_mid, np.minimum(
            np.ceil(layers / np.maximum(x["moe_step"], 1.0)), middle)), nm_mid)
        nm_mid = np.minimum(np.where(multi, nm_mid, nm_first), layers)
    else:
        nm_first = nm_last = nm_mid = 0.0
    # per-layer precision: the 16-bit blocks by global index (the first and last ones) on the
    # pipeline ranks holding them (_b16_blocks: chunks of interleaved stages round-robin), each
    # stage's dense and MoE blocks mixed by their 16-bit shares (_blend), the whole model's
    # for FLOPs; an MTP depth in the job's format
    has16 = B16_PREFIX + "fwd" in lay
    if has16:
        g16, steps, moe16_all = _b16_blocks(x, pp, v, L, layers, slot, moe_on)
        stages = {"first": (0.0, layers_first, nm_first), "last": (pp - 1.0, layers_last,
                                                                 nm_last)}
        shares, counts = {}, {}
        for name, (rank, n, nm) in stages.items():
            counts[name] = g16(rank)
            shares[name] = _b16_shares(*counts[name], n, nm)
        # the busiest middle rank (pp >= 3): the most 16-bit blocks among the second, the
        # second-to-last and the ranks where a count steps (_b16_blocks)
        mid_counts = (np.zeros_like(pp), np.zeros_like(pp))
        for rank in [1.0, pp - 2.0, *steps]:
            rank = np.clip(rank, 1.0, np.maximum(pp - 2.0, 1.0))
            n16, moe16 = g16(rank)
            more = n16 > mid_counts[0]
            mid_counts = (np.where(more, n16, mid_counts[0]), np.where(more, moe16,
                                                                      mid_counts[1]))
        # (one stage: the first's, its layers and MoE blocks the middle's)
        counts["mid"] = tuple(np.where(multi, s, one) for s, one in zip(mid_counts,
                                                                        counts["first"]))
        shares["mid"] = _b16_shares(*counts["mid"], layers, nm_mid)
        shares["all"] = _b16_shares(x["bf16_first_blocks"] + x["bf16_last_blocks"], moe16_all,
                                    L, moe.moe_layers_before(x, L) if moe_on else 0.0)
        lay_first, lay_last, lay_mid, lay_all = (
            _blend(lay, *shares[k]) for k in ("first", "last", "mid", "all"))
    else:
        shares = {k: (0.0, 0.0) for k in ("first", "last", "mid", "all")}
        counts = {k: (0.0, 0.0) for k in ("first", "last", "mid")}
        lay_first = lay_last = lay_mid = lay_all = lay

    def memory_view(stage, n, nm):
        """(the stage's terms, its 16-bit share of non-expert weights, of expert weights) for
        its memory: n blocks of which nm MoE (an MTP depth among them in the job's format)."""
        if not has16:
            return lay, 0.0, 0.0
        n16, moe16 = counts[stage]
        dense, moe_share = _b16_shares(n16, moe16, n, nm)
        return _blend(lay, dense, moe_share), np.minimum(n16 / np.maximum(n, 1.0), 1.0), \
            moe_share

    def mix(dense, moe_block, n, nm):
        """A per-block term summed over n blocks of which nm are MoE blocks."""
        if not moe_on:
            return dense * n
        return dense * (n - nm) + moe_block * nm

    # MTP depths: blocks of their own (MTP_PREFIX terms: a hybrid's pattern, a depth in 16
    # bits), else blocks of the last block's kind
    depth_prefix = MTP_PREFIX if MTP_PREFIX + "fwd" in lay else ""

    def per(key, n, nm, prefix="", view=None):
        """Per-block term ``key`` of _layer_terms summed over n blocks, nm of them MoE (an
        MTP depth's blocks: ``prefix`` depth_prefix), of a stage's ``view`` (default the
        job's format: an MTP depth runs in it, Megatron-Core's global quantization
        context)."""
        terms = lay if view is None else view
        return mix(terms[prefix + key], terms.get(prefix + MOE_PREFIX + key, 0.0), n, nm)

    def recompute_s(n, nm, prefix="", first_k=True, view=None):
        """Recompute time of n layers (first-k: the first k of them in full, the others'
        recompute modules; ``first_k`` False: none in full)."""
        k_full = np.where((r == Recompute.FIRST_K) & first_k,
                          np.minimum(c["recompute_layers"], n), 0.0)
        nm_k = nm * k_full / np.maximum(n, 1.0) if moe_on else 0.0
        return per("recompute_other", n - k_full, nm - nm_k, prefix, view) \
            + per("recompute_full", k_full, nm_k, prefix, view)

    def body_s(n, nm, prefix="", first_k=True, view=None):
        """Forward and backward (with recompute) of n layers, per micro-batch."""
        return per("fwd", n, nm, prefix, view) + np.where(
            training, per("bwd", n, nm, prefix, view)
            + recompute_s(n, nm, prefix, first_k, view), 0.0)

    rec = recompute_s(layers, nm_mid, view=lay_mid)
    fwd_mid = per("fwd", layers, nm_mid, view=lay_mid)
    bwd_mid = np.where(training, per("bwd", layers, nm_mid, view=lay_mid) + rec, 0.0)
    emb_f, emb_b, head_f, head_b = lay["emb_f"], lay["emb_b"], lay["head_f"], lay["head_b"]
    # weights are replicated over the context-parallel ranks too, so gradients are reduced
    # and ZeRO / FSDP shards over the data x context group (Megatron-Core's
    # data-parallel-with-context-parallel group; torchtitan's dp_shard_cp mesh)
    zero = as_array(c["zero"])
    dpc = dp * cp
    dpc_domain = as_array(c["nv_dp"], dtype=np.float64) * as_array(c["nv_cp"], np.float64)
    shard = np.where(as_array(c["shard_group"]) > 0, c["shard_group"] * cp, dpc)
    per_domain_shard = np.minimum(dpc_domain, shard)
    # ZeRO-3 / FSDP: per layer, gather the weights before forward and backward and
    # reduce-scatter the gradients, prefetched one layer ahead (Zhao et al. 2023 section 4).
    # Under pipeline parallelism the stage's weights stay gathered across micro-batches
    # (reshard_after_forward=False) and the gradients accumulate unsharded, reduce-scattered
    # once after the last micro-batch (torch.distributed.pipelining
    # backward_maybe_with_nosync): ZeRO-1's memory, ZeRO-2's communication.
    w_layer, norms_layer = _params_per_layer(x, t * t2)  # 2D SUMMA shards over both
    p_layer = w_layer + norms_layer
    # an MoE block: attention, shared expert and the router (replicated, notes 6.1) on the
    # attention mesh; its routed experts sharded over ep x etp, their gradients reduced and
    # their optimizer state sharded over the expert data-parallel group edp = tp cp dp /
    # (etp ep) (Megatron-Core distributed_data_parallel.py: expert buffers on the
    # expert-data-parallel group)
    if moe_on:
        ep = as_array(c["ep"], dtype=np.float64)
        etp = as_array(c["etp"], dtype=np.float64)
        p_layer_moe = _moe_block_params(x, t * t2)
        p_exp_layer = x["p_experts"] / (ep * etp)
        edp = dp * cp * t / (ep * etp)
        d_in = as_array(c["nv_tp"], dtype=np.float64) * as_array(c["nv_cp"], np.float64) \
            * as_array(c["nv_dp"], dtype=np.float64)
        edp_domain = np.clip(d_in / (ep * etp), 1.0, edp)
    else:
        p_layer_moe = p_exp_layer = 0.0
        edp = edp_domain = 1.0
    ag_layer = collective_s("allgather", p_layer * ab, shard, per_domain_shard, x)
    rs_layer = collective_s("reducescatter", p_layer * x["grad_comm_bytes"], shard,
                            per_domain_shard, x)
    if moe_on:
        # an MoE block gathers its own weights (attention, router, shared experts, norms:
        # not the dense FFN) over the data-parallel shards and its routed experts over the
        # expert data-parallel group: per block, the stage's mean
        ag_moe = collective_s("allgather", p_layer_moe * ab, shard, per_domain_shard, x) \
            + collective_s("allgather", p_exp_layer * ab, edp, edp_domain, x)
        rs_moe = collective_s("reducescatter", p_layer_moe * x["grad_comm_bytes"], shard,
                              per_domain_shard, x) \
            + collective_s("reducescatter", p_exp_layer * x["grad_comm_bytes"], edp,
                           edp_domain, x)
        ag_layer = mix(ag_layer, ag_moe, layers, nm_mid) / layers
        rs_layer = mix(rs_layer, rs_moe, layers, nm_mid) / layers
    fsdp = (zero == 3) & (shard > 1) & (pp == 1)
    # (without overlap every gather and reduce-scatter is exposed)
    over = x["dp_overlap"] > 0
    fwd_avg = fwd_mid / layers if moe_on else lay_mid["fwd"]
    bwd_avg = per("bwd", layers, nm_mid, view=lay_mid) / layers if moe_on else lay_mid["bwd"]
    fsdp_f = np.where(fsdp, np.where(over, layers * np.maximum(ag_layer - fwd_avg, 0)
                                     + ag_layer, layers * ag_layer), 0.0)
    fsdp_b = np.where(fsdp & training, np.where(
        over, layers * np.maximum(ag_layer + rs_layer - bwd_avg, 0) + rs_layer,
        layers * (ag_layer + rs_layer)), 0.0)
    # gradient accumulation outside the weight-gradient GEMMs (job key grad_accum_bytes):
    # after every micro-batch, a memory-bound pass over the stage's parameters, one kernel
    # per parameter tensor (autograd's in-place add; DeepSpeed BF16Optimizer's cast + add)
    accum_on = training & (x["grad_accum_bytes"] > 0)
    accum_layer = np.where(accum_on, memory_s(x["grad_accum_bytes"] * p_layer, x,
                                              _tensors_per_layer(x)), 0.0)
    accum_vocab = np.where(accum_on & has_vocab,
                           memory_s(x["grad_accum_bytes"] * V * e / t, x, 1.0), 0.0)
    accum_moe = np.where(accum_on, memory_s(x["grad_accum_bytes"] * (p_layer_moe + p_exp_layer),
                                            x, _tensors_per_layer(x) + 3.0), 0.0) \
        if moe_on else 0.0
    fsdp_fb = fsdp_f + fsdp_b  # (FSDP only without pipeline stages)
    body_first = body_s(layers_first, nm_first, view=lay_first) \
        + mix(accum_layer, accum_moe, layers_first, nm_first) + fsdp_fb
    edge_first = emb_f + emb_b + accum_vocab  # (in the first rank's first chunk)
    first = body_first + edge_first
    # multi-token prediction (DeepSeek-V3 section 2.2; Megatron-Core
    # multi_token_prediction.py): on the last stage, per depth one more block of the last
    # block's kind, the projection of [h; emb] (2e -> e, column-parallel) and one more LM
    # head and loss; first-k recompute leaves the depths alone (Megatron-Core d98e8a6
    # multi_token_prediction.py L1630 - 1634: recompute_method block "is not supported for
    # MTP yet. Skipping recompute.")
    if np.any(x["mtp"] > 0):
        mtp_s = body_s(x["mtp"], x["mtp"] * x["last_moe"], depth_prefix, first_k=False) \
            + x["mtp"] * (head_f + head_b + lay["eh_f"] + lay["eh_b"])
    else:
        mtp_s = 0.0
    body_last = body_s(layers_last, nm_last, view=lay_last) \
        + mix(accum_layer, accum_moe, layers_last, nm_last) + fsdp_fb
    edge_last = head_f + head_b + accum_vocab + mtp_s  # (in the last rank's last chunk)
    last = body_last + edge_last
    mid = body_s(layers, nm_mid, view=lay_mid) + mix(accum_layer, accum_moe, layers, nm_mid) \
        + fsdp_fb
    single = mid + emb_f + emb_b + head_f + head_b + (2.0 - x["tied"]) * accum_vocab + mtp_s
    # (two stages have no middle one: an MoE job's blocks differ from stage to stage, and
    # with embedding slots a phantom middle stage held one layer more than either real one)
    mid_bound = np.where(pp == 2, 0.0, mid)
    t_max = np.where(multi, np.maximum(np.maximum(first, last), mid_bound), single)
    t_avg = np.where(multi, (first + last + np.maximum(pp - 2, 0) * mid) / pp, single)
    # the stage that bounds the steady state (ties: first, then last), and its layers
    first_slowest = ~multi | (first >= np.maximum(last, mid_bound))
    last_slowest = ~multi | (~first_slowest & (last >= mid_bound))
    n_slow = np.where(first_slowest, layers_first, np.where(last_slowest, layers_last, layers))
    nm_slow = np.where(first_slowest, nm_first, np.where(last_slowest, nm_last, nm_mid)) \
        if moe_on else 0.0
    lay_slow = _blend(lay, *(np.where(first_slowest, f, np.where(last_slowest, la, mi))
                             for f, la, mi in zip(shares["first"], shares["last"],
                                                  shares["mid"])))
    # 1F1B: m micro-batches on the slowest stage plus the fill and drain, shortened by v
    # virtual stages per GPU: bubble (p - 1) / (v m) of the work (N21 eq. 2 and 3)
    steady = m * t_max
    bubble = np.where(multi, (pp - 1) / v * t_avg, 0.0)
    # interleaved stages: Megatron-Core runs each rank's chunks in a fixed order
    # (schedules.py get_schedule_table: p micro-batches of chunk 0, then of chunk 1, ...),
    # so the ranks move through the chunk positions together and a micro-batch takes, per
    # position, the slowest rank's chunk - not the slowest rank's sum, when one chunk holds
    # the LM head and the MTP depths (a dependency replay of that order, whose sends never
    # block, is up to 21 % faster on uneven layouts, median 6.6 %, and equal on balanced
    # ones; docs/model.md). The difference counts as bubble.
    bubble = bubble + np.where(multi & (v > 1), m * np.maximum(_chunked_s(
        v, pp, (layers_first, body_first, edge_first), (layers, mid),
        (layers_last, body_last, edge_last)) - t_max, 0.0), 0.0)
    # pipeline p2p: the stage-boundary activation (scatter-gather over TP ranks, N21 4.1),
    # forward and backward, at every virtual stage boundary of every micro-batch
    # (hyper-connections: the n streams)
    p2p_bytes = T * e * ab / t * np.maximum(x["hc"], 1.0)
    p2p_one = p2p_s(p2p_bytes, c["nv_pp"] > 1, x)
    # interleaved schedules can overlap it with the next chunk's compute (Megatron-Core
    # overlap_p2p_comm, on by default for interleaving): then only the pipeline fill and drain
    # and any excess over a chunk's forward stay exposed
    p2p_overlapped = (x["pp_overlap"] > 0) & (v > 1)
    p2p_exposed_s = np.where(p2p_overlapped, (pp - 1.0) * p2p_one
                             + v * m * np.maximum(p2p_one - fwd_mid / v, 0.0), v * m * p2p_one)
    p2p = np.where(multi, (1.0 + training) * p2p_exposed_s, 0.0)
    # data parallelism: ZeRO-0 all-reduces the gradients; ZeRO-1/2 (and FSDP under PP)
    # reduce-scatter them and all-gather the updated weights (ZeRO section 7); FSDP's hybrid
    # shard all-reduces the gradient shards across replicas (Zhao et al. 2023 section 3.2.2)
    vocab_params = np.where(has_vocab, V * e / t, 0.0) * np.where(multi, 1.0, 2.0 - x["tied"])
    # the first stage (the last holds as much)
    p_edge = mix(p_layer, p_layer_moe, layers_first, nm_first) + vocab_params
    p_mid = mix(p_layer, p_layer_moe, layers, nm_mid)
    p_stage = np.maximum(p_edge, p_mid)
    has_mtp = bool(np.any(x["mtp"] > 0))
    # the last stage: its blocks (MoE: not the first's), the LM head and the logits
    has_last = moe_on or has_mtp or bool(np.any(x["V"] > 0))
    if has_last:
        p_last = mix(p_layer, p_layer_moe, layers_last, nm_last) + vocab_params
    # multi-token prediction (DeepSeek-V3 section 2.2; Megatron-Core
    # multi_token_prediction.py MultiTokenPredictionLayer: enorm, hnorm, eh_proj,
    # transformer_layer, final_layernorm; embedding and output head shared with the main
    # model): per depth, on the stage with the LM head, one block of the last block's kind
    # (its routed experts: nm_mtp), the projection [h; emb] 2e -> e (column-parallel) and
    # three norms
    # (a depth of its own: its own mixers' weights; mtp_shared: one depth's weights for all,
    # Megatron-Core mtp_use_repeated_layer builds one layer and runs it mtp_layers times)
    if has_mtp:
        last_moe = x["last_moe"] if moe_on else 0.0
        p_depth, p_depth_moe = p_layer, p_layer_moe
        if depth_prefix:
            xm = _mtp_context(x)
            p_depth = sum(_params_per_layer(xm, t * t2))
            if moe_on:
                p_depth_moe = _moe_block_params(xm, t * t2)
        weight_sets = np.where(x["mtp_shared"] > 0, np.minimum(x["mtp"], 1.0), x["mtp"])
        p_mtp = weight_sets * (mix(p_depth, p_depth_moe, 1.0, last_moe) + 2.0 * e * e / t
                               + 3.0 * e)
        nm_mtp = x["mtp"] * last_moe if moe_on else 0.0
        nm_mtp_weights = weight_sets * last_moe if moe_on else 0.0
        p_stage = np.maximum(p_stage, np.where(multi, p_last, p_edge) + p_mtp)
    else:
        p_mtp = nm_mtp = nm_mtp_weights = 0.0
    grad_vol = p_stage * x["grad_comm_bytes"]
    replicas = dpc / shard
    replica_domain = np.maximum(dpc_domain / shard, 1.0)
    stagewise = (zero == 1) | (zero == 2) | ((zero == 3) & (pp > 1))
    t_grad = np.select(
        [zero == 0, fsdp],
        [collective_s("allreduce", grad_vol, dpc, dpc_domain, x),
         collective_s("allreduce", grad_vol / shard, replicas, replica_domain, x)],
        collective_s("reducescatter", grad_vol, shard, per_domain_shard, x))
    t_param = np.where(stagewise,
                       collective_s("allgather", p_stage * ab, shard, per_domain_shard, x), 0.0)
    if moe_on:
        # the routed experts' gradients over the expert data-parallel group: all-reduced, or
        # reduce-scattered and the updated weights all-gathered (distributed optimizer)
        p_exp_stage = np.maximum(np.maximum(nm_first, nm_mid), nm_last) * p_exp_layer
        if has_mtp:
            p_exp_stage = np.maximum(p_exp_stage, (np.where(multi, nm_last, nm_first)
                                                   + nm_mtp_weights) * p_exp_layer)
        exp_vol = p_exp_stage * x["grad_comm_bytes"]
        t_grad = t_grad + np.where(
            zero == 0, collective_s("allreduce", exp_vol, edp, edp_domain, x),
            collective_s("reducescatter", exp_vol, edp, edp_domain, x))
        t_param = t_param + np.where(
            zero >= 1, collective_s("allgather", p_exp_stage * ab, edp, edp_domain, x), 0.0)
        exp_shard = np.where(zero >= 1, edp, 1.0)
    else:
        p_exp_stage, exp_shard = 0.0, 1.0
    # overlapped with the backward (forward) of the last (first) micro-batch, bucket by bucket;
    # the last bucket, one layer's share, is always exposed
    bwd_window = bwd_mid + fsdp_b
    dp_exp = np.where(over, np.maximum(t_grad - bwd_window, 0) + t_grad / layers, t_grad) + \
        np.where(over, np.maximum(t_param - fwd_mid, 0) + t_param / layers, t_param)
    dp_exp = np.where(training, dp_exp, 0.0)
    # optimizer step on this GPU's share of the states (ZeRO >= 1 shards them)
    p_opt = np.where(zero >= 1, p_stage / shard, p_stage)
    t_opt = np.where(training, memory_s(x["adam_step_bytes"] * (p_opt + p_exp_stage / exp_shard),
                                        x, 10.0), 0.0)
    # offload to the second memory tier (Calculon-style): optimizer states streamed in and
    # out every step; activations and weights per layer, hidden behind that layer's compute
    off = as_array(c["offload"])
    host_Bps = np.maximum(x["host_Bps"], 1.0)
    opt_state = x["opt_state_bytes"] * (p_opt + p_exp_stage / exp_shard)
    t_off = np.where(off & 4, 2.0 * opt_state / host_Bps, 0.0)
    act_layer, layer_s = lay_mid["act_layer"], lay_mid["fwd"] + lay_mid["bwd"]
    t_off = t_off + np.where(off & 2, layers * m * np.maximum(
        2.0 * act_layer / host_Bps - layer_s, 0.0), 0.0)
    t_off = t_off + np.where(off & 1, layers * m * np.maximum(
        2.0 * p_layer * ab / host_Bps - layer_s, 0.0), 0.0)
    # the job's own activation offloading (offload_act_layers), on a side stream likewise
    n_offloaded = np.minimum(x["offload_act_layers"], np.maximum(layers - 1.0, 0.0))
    t_off = t_off + np.where(training, n_offloaded * m * np.maximum(
        2.0 * act_layer / host_Bps - layer_s, 0.0), 0.0)
    # fine-grained activation offloading (offload_modules): the copies to the host never
    # hold up compute (a slow one only delays freeing memory); each block's reload is waited
    # for one group ahead of its backward (fine_grained_activation_offload.py: no inflight
    # cap by default, the reload's wait per group), so what a block's copy back outlasts of
    # the block's backward is exposed (the mean block of the stage; not the blocks fully
    # recomputed, nor the one kept on the GPU)
    copy_block = per("act_offload_copy", layers, nm_mid, view=lay_mid) / np.maximum(layers, 1.0)
    fine_blocks = layers - np.where(r == Recompute.FIRST_K,
                                    np.minimum(c["recompute_layers"], layers), 0.0) - 1.0
    t_off = t_off + np.where(training, np.maximum(fine_blocks, 0.0) * m * np.maximum(
        copy_block / host_Bps - bwd_avg, 0.0), 0.0)
    step = steady + bubble + p2p + dp_exp + t_opt + t_off
    # breakdown on the slowest stage: its m micro-batches split by kind; the rest is bubble
    per_layer_b = np.where(training, 1.0, 0.0)
    def slow(kind):
        return m * (per(kind + "_f", n_slow, nm_slow, view=lay_slow)
                    + per_layer_b * per(kind + "_b", n_slow, nm_slow, view=lay_slow))

    compute, memory_t, tp_t, cp_t = slow("compute"), slow("memory"), slow("tp"), slow("cp")
    ep_t = m * nm_slow * (lay_slow[MOE_PREFIX + "ep_f"]
                          + per_layer_b * lay_slow[MOE_PREFIX + "ep_b"]) if moe_on else 0.0
    fsdp_t = m * (fsdp_f + fsdp_b)
    # recompute, vocabulary, stage imbalance
    other = steady - compute - memory_t - tp_t - cp_t - ep_t - fsdp_t
    # executed FLOPs per GPU (the HFU numerator), averaged over the pipeline stages as the
    # model FLOPs are over the GPUs: every block with its recompute (first-k: the first k
    # blocks of each stage once more forward), the MTP depths (a block of the last kind,
    # the [h; emb] projection 2e -> e and one more LM head each: DeepSeek-V3 section 2.2,
    # lay's eh_f / eh_b GEMMs), the LM head GEMMs (forward and two backward)
    head_flops = np.where(has_vocab, 2.0 * T * V / t * e * (1.0 + 2.0 * training), 0.0)
    nm_all = moe.moe_layers_before(x, L) if moe_on else 0.0
    k = np.where(r == Recompute.FIRST_K, as_array(c["recompute_layers"], dtype=np.float64), 0.0)
    k_all = np.where(multi, np.minimum(k, layers_first) + np.minimum(k, layers_last)
                     + np.maximum(pp - 2.0, 0.0) * np.minimum(k, layers), np.minimum(k, L))
    blocks_flops = per("flops_f", L, nm_all, view=lay_all) + np.where(
        training, per("flops_b", L, nm_all, view=lay_all)
        + per("recompute_flops", L, nm_all, view=lay_all)
        + per("flops_f", k_all, nm_all * k_all / np.maximum(L, 1.0) if moe_on else 0.0,
              view=lay_all), 0.0)
    mtp_flops = x["mtp"] * (  # (first-k does not re-run them: mtp_s)
        per("flops_f", 1.0, x["last_moe"], depth_prefix) + np.where(
            training, per("flops_b", 1.0, x["last_moe"], depth_prefix)
            + per("recompute_flops", 1.0, x["last_moe"], depth_prefix), 0.0)
        + head_flops + 2.0 * T * (1.0 + np.maximum(x["hc"], 1.0)) * e * e / t
        * (1.0 + 2.0 * training))
    flops = m * (blocks_flops + mtp_flops + head_flops) / pp
    # memory: the first stage (the embedding; one stage: the LM head and the logits too, and
    # the MTP depths and their logits while the losses run); with embedding slots a middle
    # stage holds one layer more and no vocabulary, and may be the larger; the last stage
    # holds the LM head and the logits (Megatron-Core: the output layer on the last stage)
    on_one = np.where(multi, 0.0, 1.0) if has_mtp else 0.0
    # (MTP depths of their own keep their own blocks' activations: what they keep beyond a
    # main block's, in those jobs' rows of the context)
    depth_acts = 0.0
    if depth_prefix:
        kind = MOE_PREFIX if moe_on else ""
        own = (x["hybrid"] > 0) | (x["mtp_bf16"] > 0) | (x["csa"] > 0)
        depth_acts = np.where(own, x["mtp"] * (
            lay[MTP_PREFIX + kind + "act_layer"] - lay[kind + "act_layer"]), 0.0)
    view, w16, e16 = memory_view("first", layers_first + on_one * x["mtp"],
                                 nm_first + on_one * nm_mtp)
    mem = _memory(x, c, T, t, layers_first + on_one * x["mtp"], m, p_layer,
                  p_edge + on_one * p_mtp, shard, view, ~multi, nm_first + on_one * nm_mtp,
                  (nm_first + on_one * nm_mtp_weights) * p_exp_layer, exp_shard,
                  heads=1.0 + on_one * x["mtp"], p_vocab=vocab_params,
                  p_layer_moe=p_layer_moe, extra_acts=on_one * depth_acts,
                  recomputable=layers_first if has_mtp else None,
                  nm_weights=nm_first + on_one * nm_mtp_weights if has_mtp else None,
                  share16=w16, share16_exp=e16)
    mem_first = mem["mem_bytes"]  # (the others only ever replace it by a larger one)
    # (when no candidate has embedding slots, a middle stage never holds more: fewer
    # weights and no logits)
    if moe_on or np.any((x["embedding_slots"] > 0) & (x["V"] > 0)):
        # (MoE: a middle stage of MoE blocks may hold more than a first stage of dense ones)
        view, w16, e16 = memory_view("mid", layers, nm_mid)
        mem_mid = _memory(x, c, T, t, layers, m, p_layer, p_mid, shard, view, False,
                          nm_mid, nm_mid * p_exp_layer, exp_shard, p_layer_moe=p_layer_moe,
                          middle_stage=True, share16=w16, share16_exp=e16)
        larger = (mem_mid["mem_bytes"] > mem["mem_bytes"]) & (pp != 2)  # (none with two)
        mem = {k: np.where(larger, mem_mid[k], v) for k, v in mem.items()}
    if has_last:
        # the last blocks (MoE: all MoE, where the first may be dense), the LM head and the
        # logits, one micro-batch in flight (1F1B); with multi-token prediction also the MTP
        # depths and their logits
        view, w16, e16 = memory_view("last", layers_last + x["mtp"], nm_last + nm_mtp)
        mem_last = _memory(x, c, T, t, layers_last + x["mtp"], m, p_layer, p_last + p_mtp,
                           shard, view, True, nm_last + nm_mtp,
                           (nm_last + nm_mtp_weights) * p_exp_layer, exp_shard,
                           last_stage=True, heads=1.0 + x["mtp"], p_vocab=vocab_params,
                           p_layer_moe=p_layer_moe, extra_acts=depth_acts,
                           recomputable=layers_last if has_mtp else None,
                           nm_weights=nm_last + nm_mtp_weights if has_mtp else None,
                           share16=w16, share16_exp=e16)
        larger = multi & (mem_last["mem_bytes"] > mem["mem_bytes"])
        mem = {k: np.where(larger, mem_last[k], v) for k, v in mem.items()}
    out = {
        "step_time_s": step, "t_compute_s": compute + np.maximum(other, 0.0),
        "t_memory_s": memory_t + np.minimum(other, 0.0), "t_tp_comm_s": tp_t,
        "t_cp_comm_s": cp_t, "t_ep_comm_s": ep_t, "t_dp_comm_s": dp_exp + fsdp_t,
        "t_pp_comm_s": p2p,
        "t_bubble_s": bubble, "t_optimizer_s": t_opt, "t_offload_s": t_off,
        "hardware_flops": flops,
    }
    reported_kinds = ("mem_reported_bytes", "mem_allocated_bytes")
    out.update({k: v for k, v in mem.items() if k not in ("host_bytes", *reported_kinds)})
    over_hbm = mem["mem_bytes"] > x["hbm_bytes"]
    over_host = mem.pop("host_bytes") > x["host_cap_bytes"]
    for k in reported_kinds:
        out[k] = mem.pop(k)
    out["reason"] = np.where(over_hbm, Reason.OUT_OF_MEMORY,
                             np.where(over_host, Reason.OFFLOAD_CAPACITY,
                                      np.where(tp_overlap_split(c), Reason.NOT_EXPRESSIBLE,
                                               Reason.OK)))
    parts = {"lay": lay_slow, "layers": layers, "m": m, "rec": rec, "training": training,
             "emb": emb_f + emb_b, "head": head_f + head_b, "fsdp": fsdp_f + fsdp_b,
             "accum_layer": accum_layer, "accum_vocab": accum_vocab, "n_slow": n_slow,
             "rec_slow": recompute_s(n_slow, nm_slow, view=lay_slow),
             "first_slowest": first_slowest,
             "nm_slow": nm_slow, "mtp": mtp_s, "accum_moe": accum_moe,
             "last_slowest": last_slowest, "first": first, "last": last, "mid": mid,
             "multi": multi, "mem_first_bytes": mem_first}
    return out, parts


def tp_overlap_split(c: Mapping) -> np.ndarray:
    """Candidates (columns, or one row) that overlap TP communication with the TP group
    across NVLink domains, which the stacks cannot run (Reason.NOT_EXPRESSIBLE): Transformer
    Engine's userbuffers move the data over CUDA IPC / multicast between the TP group's GPUs
    (TE issue #1071, "only possible with single-node tensor-parallelism"; NVLink domains
    larger than a node since TE 2.2, PR #1470)."""
    return (as_array(c["tp_overlap"]) > 0) \
        & (as_array(c["nv_tp"], dtype=np.float64) < as_array(c["tp"], dtype=np.float64))


def op_table(x: Mapping, c: Mapping) -> list[dict[str, np.ndarray]]:
    """Per-iteration seconds of every op on the slowest pipeline stage (its micro-batches x
    layers), then the bubble, p2p, data-parallel, optimizer and offload rows: they add up to
    ``step_time_s``. Each row: name, time_s, compute_s, memory_s, tp_comm_s, cp_comm_s,
    ep_comm_s, other_s (no FLOPs or bytes per op: the nersc2024 op table has those; the
    totals are the results' hardware_flops and mem_* columns)."""
    out, p = _step(x, c)
    lay, m = p["lay"], p["m"]
    bwd = np.where(p["training"], 1.0, 0.0)
    first_slowest, last_slowest = p["first_slowest"], p["last_slowest"]
    reps = m * p["n_slow"]
    zero = np.zeros(np.shape(out["step_time_s"]))
    rows = []

    def add(name, time_s, kind="compute_s"):
        row = {"name": name, "time_s": time_s, "compute_s": zero, "memory_s": zero,
               "tp_comm_s": zero, "cp_comm_s": zero, "ep_comm_s": zero, "other_s": zero}
        row[kind] = time_s
        rows.append(row)

    # per-block terms over the slowest stage's blocks, nm of them MoE blocks (whose MLP is
    # the shared expert, and whose routed part has rows of its own)
    nm = p["nm_slow"]
    dense_reps = m * (p["n_slow"] - nm)
    moe_reps = m * nm
    moe_lay = {k[len(MOE_PREFIX):]: v for k, v in lay.items() if k.startswith(MOE_PREFIX)}
    moe_on = bool(moe_lay)

    def both(key, i=None):
        dense = lay[key] if i is None else lay[key][i]
        if not moe_on:
            return reps * dense
        other = moe_lay[key] if i is None else moe_lay[key][i]
        return dense_reps * dense + moe_reps * other

    names = ("QKV projection", "attention output projection", "MLP up (and gate)", "MLP down",
             "Mamba in_proj", "Mamba out_proj")
    for i, name in enumerate(names[:len(lay["gemm_f_each"])]):
        add(name, both("gemm_f_each", i) + bwd * both("gemm_b_each", i))
    if "ssm_f" in lay:
        add("Mamba convolution and SSD scan", both("ssm_f") + bwd * both("ssm_b"))
    if moe_on:
        for name, key, kind in (("MoE router", "router", "compute_s"),
                                ("MoE token permute / unpermute", "permute", "memory_s"),
                                ("MoE expert GEMMs (grouped)", "routed_gemm", "compute_s"),
                                ("MoE expert activation and casts", "expert_act", "memory_s"),
                                ("MoE latent projections", "latent", "compute_s")):
            if key == "latent" and not np.any(as_array(x["latent"]) > 0):
                continue
            add(name, moe_reps * (moe_lay[key + "_f"] + bwd * moe_lay[key + "_b"]), kind)
        add("EP all-to-all and ETP collectives (exposed)",
            moe_reps * (moe_lay["ep_f"] + bwd * moe_lay["ep_b"]), "ep_comm_s")
    indexer = both("indexer_f") if "indexer_f" in lay else 0.0
    add("attention core", both("attn_f") - indexer + bwd * both("attn_b"))
    if "indexer_f" in lay:  # (DSA: the indexer's scores, top-k and loss; its linears are QKV's)
        add("DSA indexer: scores, top-k, loss", indexer)
    add("norms, activations, residuals", both("memory_f") + bwd * both("memory_b")
        - (moe_reps * (moe_lay["permute_f"] + moe_lay["expert_act_f"] + bwd * (
            moe_lay["permute_b"] + moe_lay["expert_act_b"])) if moe_on else 0.0),
        "memory_s")
    add("TP communication (exposed)", both("tp_f") + bwd * both("tp_b"), "tp_comm_s")
    add("CP communication (exposed)", both("cp_f") + bwd * both("cp_b"), "cp_comm_s")
    add("activation recompute", m * bwd * p["rec_slow"])
    add("embedding", m * np.where(first_slowest, p["emb"], 0.0), "memory_s")
    add("LM head and loss", m * np.where(last_slowest, p["head"], 0.0))
    add("multi-token prediction", m * np.where(last_slowest, p["mtp"], 0.0))
    add("FSDP weight gathers (exposed)", m * p["fsdp"], "other_s")
    vocab_stages = np.where(p["multi"], np.where(first_slowest | last_slowest, 1.0, 0.0),
                            2.0 - x["tied"])
    accum = p["accum_layer"] * p["n_slow"] if not moe_on else (
        p["accum_layer"] * (p["n_slow"] - nm) + p["accum_moe"] * nm)
    add("gradient accumulation", m * (accum + vocab_stages * p["accum_vocab"]),
        "memory_s")
    for name, key in (("pipeline bubble", "t_bubble_s"), ("pipeline p2p", "t_pp_comm_s"),
                      ("data-parallel comm", None), ("optimizer step", "t_optimizer_s"),
                      ("offload traffic", "t_offload_s")):
        value = out[key] if key else out["t_dp_comm_s"] - m * p["fsdp"]
        add(name, value, "memory_s" if key == "t_optimizer_s" else "other_s")
    return rows


# ------------------------------------------------------------------------------ memory

def _activation_bytes_per_layer(x, T, Ta, t, sp, cp, recompute, offloaded=False,
                                moe_block=False):
    """Activations one layer keeps for its backward, per micro-batch, by recompute policy
    (per-op accounting in the spirit of K22 table 2 and section 5); queries split cp ways.
    With ``offloaded``: (what fine-grained offloading takes off the GPU, what it copies) of
    a dense block's or (``moe_block``) an MoE block's shared part."""
    e, f, H, Kv, d, s = x["e"], x["f"], x["H"], x["Kv"], x["d"], x["s"]
    ab, drop = x["act_bytes"], x["dropout"]
    # inputs of linear layers are kept in the GEMMs' low-precision format when the stack
    # saves them so (saved_input_bytes); GEMM outputs and norm inputs stay 16-bit
    sb = x["saved_in_bytes"]
    f_up = f * (1.0 + x["swiglu"])
    # norm outputs feeding qkv / up (sharded with SP), unless recomputed (recompute_norms)
    gemm_in = np.where(sp, Ta, T) * e * sb * (1.0 - x["rc_norm"])
    # (bf16_attention: the attention projections' inputs kept in 16 bits)
    sb_attn = np.where(x["bf16_attn"] > 0, ab, sb)
    gemm_in_attn = np.where(sp, Ta, T) * e * sb_attn * (1.0 - x["rc_norm"])
    norm_in = 2.0 * Ta * e * ab
    masks = drop * 2.0 * Ta * e
    # (MLA: also the latent vectors, inputs of the up-projections, on every TP rank)
    # (recompute_mla_up: the up-projected queries, keys and values are recomputed from them)
    core_in = T * x["w_qkv"] / t * ab * (1.0 - x["rc_mla_up"])  # (core attention's q, k, v)
    qkv = core_in + Ta * (x["q_lora"] + x["kv_lora"] + x["d_rope"]) * ab
    attn_out = T * x["w_o"] / t * sb_attn  # the output projection's input
    dsa_core = 0.0
    if np.any(x["dsa"] > 0):  # (DeepSeek sparse attention's own: dsa.saved_bytes)
        kept = dsa.saved_bytes(x, T, Ta, t, cp)
        qkv = np.where(x["dsa"] > 0, kept["qkv"], qkv)
        dsa_core = np.where(x["dsa"] > 0, kept["core"], 0.0)
    if np.any(x["csa"] > 0):  # (compressed sparse attention's own: csa.saved_bytes)
        kept = csa.saved_bytes(dict(x, saved_in_bytes=sb_attn), T)
        qkv = np.where(x["csa"] > 0, kept["qkv"], qkv)
        attn_out = np.where(x["csa"] > 0, kept["out"], attn_out)
    batch = T / (s / cp) * H / t
    scores = batch * (s / cp) * s
    flash = x["flash"] > 0
    core = np.where(flash, batch * (s / cp) * 4.0, scores * (ab + drop * (1 + ab)))
    # fc1's output, fc2's input; a dropout on the hidden activation keeps its 1-byte mask
    # (timm's Mlp drop1; K22 table 2 counts dropout after attention and the MLP alone)
    mlp = T * f_up / t * ab + T * f / t * sb + x["mlp_drop"] * T * f / t
    full = norm_in + masks + gemm_in + gemm_in_attn + qkv + attn_out + core + mlp + dsa_core
    r = as_array(recompute)
    # fine-grained activation offloading (Megatron-Core offload_modules; every tensor autograd
    # saves inside a listed module goes to the host after the forward:
    # fine_grained_activation_offload.py, fine_grained_activation_offloading.md). attn_norm
    # and mlp_norm are separate modules only where the norm is not fused into the next linear
    # (Transformer Engine's LayerNormLinear: gpt_layer_specs.py, hybrid_layer_specs.py; the
    # norms are IdentityOp otherwise): before MLA's down-projections and before an MoE
    # layer. qkv_linear: a fused norm's input and output (layernorm_linear.py inputmat,
    # ln_out), or MLA's down-projections' input and latents. core_attn: q, k, v and the
    # softmax statistics (or scores), and a copy of its output, which stays on the GPU unless
    # attn_proj, whose input it is, goes too; under selective recompute core attention is
    # checkpointed, nothing of it offloaded (attention.py _checkpointed_attention_forward)
    mla = x["kv_lora"] > 0
    norm_in_1 = Ta * e * ab
    latents = Ta * (x["q_lora"] + x["kv_lora"] + x["d_rope"]) * ab
    core_kept = core_in + core
    o_16 = T * x["w_o"] / t * ab
    off_attn = x["off_attn_norm"] * np.where(mla, norm_in_1, 0.0) \
        + x["off_qkv"] * (gemm_in_attn + np.where(mla, latents, norm_in_1))
    off_mlp = x["off_mlp_norm"] * norm_in_1 * float(moe_block)
    core_mem, core_copy = x["off_core"] * core_kept, x["off_core"] * (core_kept + o_16)
    proj = x["off_proj"] * attn_out
    # the score matrix is recomputed (DSA: the core attention's own tensors)
    selective = full - np.where(flash, 0.0, core) - dsa_core
    checkpoint = Ta * e * ab  # full recompute keeps each layer's input
    # per-op SAC keeps the block input, the attention output (and its softmax statistics)
    # and every other GEMM output: q, v and the gate (SwiGLU: then down) or up projection
    q_v = T * (H + Kv) * d / t * ab
    mlp_saved = T * f / t * ab + np.where(x["swiglu"] > 0, Ta * e * ab, 0.0)
    op_sac = checkpoint + q_v + T * x["w_o"] / t * ab \
        + np.where(flash, batch * (s / cp) * 4.0, 0.0) \
        + mlp_saved
    if _hybrid(x):
        # a hybrid block: n_attn attention layers' tensors, each layer's norm input and
        # output, and per Mamba-2 layer what mamba_split_conv1d_scan_combined saves (the
        # in_proj output z x B C dt and the scan output; the convolution and chunk states
        # are recomputed in its backward: ssd_combined.py), the gated RMSNorm's input
        # (layernorm_gated.py LayerNormFn) and out_proj's input
        qa, qm = x["n_attn"], x["n_mamba"]
        n_sub = qa + qm + 1.0
        d_in = x["m_inner"]
        # (under context parallelism after the all-to-alls: B and C repeated up to cp
        # groups)
        mamba = T * ((2.0 * d_in / t + _mamba_bc_width(x, t, cp) + x["m_heads"] / t) * ab
                     + 2.0 * d_in / t * ab + d_in / t * x[MAMBA_OUT_PREFIX + "saved_in_bytes"])
        full = n_sub / 2.0 * (norm_in + masks) + (n_sub - qa) * gemm_in + qa * (
            gemm_in_attn + qkv + attn_out + core) + mlp + qm * mamba
        selective = full - qa * np.where(flash, 0.0, core)
        # (a hybrid's attention layers fuse their norm; the Mamba-2 mixers are not offloaded)
        off_attn = x["off_qkv"] * (gemm_in_attn + norm_in_1)
        off_attn, core_mem, core_copy, proj = (qa * v for v in (off_attn, core_mem,
                                                                core_copy, proj))
    if np.any(as_array(x["hybrid"]) > 0):
        # (a hybrid's layers are checkpointed one by one: every layer's input, an MTP
        # depth of one attention and one FFN layer too - Megatron-Core checkpoints a depth's
        # hidden states and decoder input, multi_token_prediction.py L1606 - 1619;
        # torchtitan's per-op policy is not a hybrid stack's: all kept)
        hybrid_row = x["hybrid"] > 0
        checkpoint = np.where(hybrid_row, x["n_attn"] + x["n_mamba"] + 1.0, 1.0) * Ta * e * ab
        op_sac = np.where(hybrid_row, full, op_sac)
    if np.any(as_array(x["hc"]) > 0):
        # hyper-connections (Megatron-Core d98e8a6 hyper_connection.py): a layer's input is
        # its n streams; each of its two modules keeps them (for the mappings' and the
        # aggregate's backward) and its sublayer's output (for H_post's)
        n = x["hc"]
        streams = np.where(n > 0, 2.0 * (n + 1.0) * Ta * e * ab, 0.0)
        full, selective = full + streams, selective + streams
        checkpoint = np.where(n > 0, n * Ta * e * ab, checkpoint)
    if offloaded:  # (a recomputed layer keeps its input alone: nothing offloaded)
        with_core = np.where((r == Recompute.NONE) | (r == Recompute.FIRST_K), 1.0, 0.0)
        rest = np.where(r == Recompute.SELECTIVE, 1.0, with_core) * (off_attn + off_mlp + proj)
        return rest + with_core * core_mem, rest + with_core * core_copy
    return np.select([r == Recompute.NONE, r == Recompute.SELECTIVE, r == Recompute.FULL,
                      r == Recompute.OP_SAC], [full, selective, checkpoint, op_sac], full)


def _in_flight(pp, v, m, k):
    """Micro-batches whose activations pipeline rank ``k`` of ``pp`` holds at its peak:
    its warm-up forward passes and the steady state's first (Megatron-Core schedules.py
    get_pp_rank_microbatches: p - k - 1, or with v interleaved chunks 2 (p - k - 1) +
    (v - 1) p chunk passes of 1/v of the stage each), at most m; one without a pipeline."""
    return np.where(pp > 1, np.minimum(np.where(
        v > 1, (2.0 * (pp - k - 1.0) + (v - 1.0) * pp + 1.0) / v, pp - k), m), 1.0)


def _chunked_s(v, pp, first, mid, last):
    """A micro-batch's time in the steady state of interleaved 1F1B: per chunk position,
    the slowest rank's chunk, summed over the v positions. ``first`` and ``last`` are
    (layers, their time, the time of what sits at the edge: embedding / LM head, loss, MTP
    depths), ``mid`` (layers, time) of a middle rank (none with two ranks). Chunks: a rank
    spreads its layers over its v chunks, one more in the first ones; the last rank fills
    its chunks as the others' largest and keeps what is left in its last chunk, with the
    head (Megatron-Bridge's DeepSeek-V3 layouts, e.g. 61 layers on 4 x 4:
    [E + 4 t] [4 t] x 14 [t + MTP + loss], recipes/deepseek/deepseek_v3.py
    _get_deepseek_v3_pipeline_layout); the embedding sits in the first rank's first chunk.
    Over positions 0 .. v - 2 every rank's chunk sizes fall in steps, so their maxima are a
    base level plus the maximum of boxes that start at position 0, summed in closed form
    (_boxes_max_sum), plus the last rank's one partial chunk where it rises above the
    others; positions 0 and v - 1 add the edges."""
    n_f, t_f, edge_f = first
    n_m, t_m = mid
    n_l, t_l, edge_l = last
    has_mid = pp > 2
    per_f = t_f / np.maximum(n_f, 1.0)  # per layer
    per_m = np.where(has_mid, t_m / np.maximum(n_m, 1.0), 0.0)
    per_l = t_l / np.maximum(n_l, 1.0)
    q_f, q_m = np.floor(n_f / v), np.floor(n_m / v)
    r_f, r_m = n_f - q_f * v, np.where(has_mid, n_m - q_m * v, 0.0)
    size = np.ceil(np.maximum(n_f, np.where(has_mid, n_m, 0.0)) / v)  # the largest chunk
    base = np.maximum(per_f * q_f, per_m * q_m)  # the others' smaller chunks
    # the last rank: full chunks, then one with the rest (before its last position)
    full = np.minimum(np.floor(n_l / np.maximum(size, 1.0)), v - 1.0)
    part = np.where(full < v - 1.0, n_l - full * size, 0.0)
    boxes = [(np.maximum(height - base, 0.0), width) for height, width in (
        (per_f * (q_f + 1.0), r_f), (per_m * (q_m + 1.0), r_m), (per_l * size, full))]
    (d1, w1), (d2, w2), (d3, w3) = ((d * (w > 0), w) for d, w in boxes)
    # the last rank's partial chunk, at position `full`: what it adds where it rises above
    # the others' chunks there
    rest = np.maximum(per_l * part - base
                      - np.maximum(d1 * (full < w1), d2 * (full < w2)), 0.0)
    top0 = base + np.maximum(np.maximum(d1, d2), d3) + rest * (full == 0)  # position 0
    emb = np.maximum(per_f * (q_f + (r_f > 0)) + edge_f - top0, 0.0)
    # position v - 1: the last rank's rest and its head, or the others' smaller chunks
    tail = np.maximum(base, per_l * np.maximum(n_l - (v - 1.0) * size, 0.0) + edge_l)
    return (v - 1.0) * base + _boxes_max_sum([(d1, w1), (d2, w2), (d3, w3)]) + rest + emb \
        + tail


def _boxes_max_sum(boxes):
    """Sum over integer positions x >= 0 of max_k d_k [x < w_k], for boxes (d_k >= 0, w_k):
    inclusion-exclusion over the subsets S of boxes, (-1)^(|S|+1) min_S d min_S w (the
    maximum of non-negative numbers: the alternating sum of the minima of the subsets)."""
    total = 0.0
    for size in range(1, len(boxes) + 1):
        for subset in itertools.combinations(boxes, size):
            d = functools.reduce(np.minimum, [b[0] for b in subset])
            w = functools.reduce(np.minimum, [b[1] for b in subset])
            total = total + (d * w if size % 2 else -(d * w))
    return total


def _memory(x, c, T, t, layers, m, p_layer, p_stage, shard, lay, vocab_stage, nm=0.0,
            p_exp=0.0, exp_shard=1.0, last_stage=False, heads=1.0, p_vocab=0.0,
            p_layer_moe=0.0, middle_stage=False, extra_acts=0.0, recomputable=None,
            nm_weights=None, share16=0.0, share16_exp=0.0):
    """Bytes per GPU on a stage of ``layers`` layers and ``p_stage`` weights: weights,
    gradients, optimizer state (ZeRO sharding), activations of the micro-batches in flight
    (as many as its pipeline rank holds), logits if ``vocab_stage`` (of ``heads`` LM heads: the
    main one and the MTP depths'), reserve. Of the layers, ``nm`` are MoE blocks, whose
    routed experts add ``p_exp`` weights with gradients and optimizer state sharded
    ``exp_shard`` ways (the expert data-parallel group); an MoE block's other weights are
    ``p_layer_moe`` (a dense block's ``p_layer``). Of ``p_stage``, ``p_vocab`` are the
    embedding's or the LM head's, kept in 16 bits alone. ``extra_acts``: activation bytes
    per micro-batch kept beyond ``layers`` blocks of ``lay`` (a hybrid's MTP depths);
    ``recomputable``: the blocks first-k recompute may checkpoint (default all; not the MTP
    depths); ``nm_weights``: the MoE blocks whose routed weights ``p_exp`` holds (default nm;
    MTP depths sharing one set count once); ``share16`` / ``share16_exp``: the share of its
    blocks' weights / routed experts in 16-bit blocks (bf16_first_layers, bf16_last_layers:
    16-bit weights, no low-precision copy - Megatron-Core builds them outside
    fp8_model_init)."""
    ab, g_b = x["act_bytes"], x["grad_bytes"]
    training = x["training"] > 0
    zero = as_array(c["zero"])
    pp = as_array(c["pp"], dtype=np.float64)
    v = as_array(c["vpp"], dtype=np.float64)
    # the 16-bit weights and their low-precision copy, or that copy alone (lp_params)
    w_lp = ab * (1.0 - x["lp_params"]) + x["fp8"] * x["lp_weight_copy_bytes"]
    w_b = (1.0 - share16) * w_lp + share16 * ab
    w_b_exp = (1.0 - share16_exp) * w_lp + share16_exp * ab
    # ZeRO (Rajbhandari et al. 2020, section 5): stage 1 shards optimizer state, 2 also the
    # gradients, 3 also the weights; FSDP's sharded fp32 params are the master weights, and
    # it holds two layers gathered (prefetch) - or the whole stage under PP
    # (DeepSpeed caps what is gathered at stage3_max_live_parameters and the unsharded
    # gradients at reduce_bucket_size elements: DeepSpeed configuration docs, ZeRO section)
    moe_on = _has_moe(x)  # (not nm's shape: a dense job's MTP depth makes it an array)
    # the largest block of the stage (its kinds: dense, MoE or both), what the per-block
    # buffers below hold
    p_block = np.where(nm >= layers, p_layer_moe, np.where(
        nm > 0, np.maximum(p_layer, p_layer_moe), p_layer)) if moe_on else p_layer
    fsdp_pp = (zero == 3) & (pp > 1)
    gathered = np.where(fsdp_pp, p_stage * ab,
                        np.minimum(2 * p_block, x["zero3_live_params"]) * ab)
    # (the low-precision copies are of the blocks' linear layers, Transformer Engine's
    # modules: the embedding and the output layer stay 16-bit, as their GEMMs run)
    weights = np.where(zero == 3, p_stage * 4.0 / shard + gathered,
                       (p_stage - p_vocab) * w_b + p_vocab * ab)
    grads = np.select([fsdp_pp, zero >= 2],
                      [p_stage * g_b, p_stage * g_b / shard
                       + np.minimum(p_block, x["grad_bucket_params"]) * g_b],
                      p_stage * g_b)
    opt_shard = np.where(zero >= 1, shard, 1.0)
    opt_b = np.where(zero == 3, x["opt_state_z3_bytes"], x["opt_state_bytes"])
    optimizer = opt_b * p_stage / opt_shard
    if moe_on:
        # routed experts (notes 6.1): the same ZeRO stage over the expert data-parallel group
        # (ZeRO-3: the fp32 shards, and the 16-bit experts gathered: the stage's under
        # pipeline parallelism, else two blocks' as for the other weights; their gradients
        # under PP accumulate unsharded over the micro-batches, as the other weights')
        nm_w = nm if nm_weights is None else nm_weights
        exp_gathered = np.where(fsdp_pp, p_exp, 2.0 * p_exp / np.maximum(nm_w, 1.0)) * ab
        weights = weights + np.where(zero == 3, p_exp * 4.0 / exp_shard + exp_gathered,
                                     p_exp * w_b_exp)
        grads = grads + np.where((zero >= 2) & ~fsdp_pp, p_exp * g_b / exp_shard, p_exp * g_b)
        optimizer = optimizer + opt_b * p_exp / exp_shard
    grads = np.where(training, grads, 0.0)
    optimizer = np.where(training, optimizer, 0.0)
    # micro-batches in flight on pipeline rank k: its warm-up forward passes and the steady
    # state's first (Megatron-Core schedules.py get_pp_rank_microbatches: p - k - 1, or
    # interleaved 2 (p - k - 1) + (v - 1) p chunks of 1/v of the stage each), at most m:
    # the first stage p, interleaved p + (p - 1) / v = p (1 + (p-1)/(p v)) (K22 section
    # 4.2.3); a middle stage as rank 1, the most of them; the last stage 1 (its backward
    # follows each forward), interleaved p - (p - 1) / v. Recomputing layers also need one
    # layer's full working set (Megatron-LM theoretical_memory_usage.py)
    in_flight = _in_flight(pp, v, m, pp - 1.0 if last_stage else (1.0 if middle_stage else 0.0))
    r = as_array(c["recompute"])
    k_full = np.where(r == Recompute.FIRST_K, np.minimum(
        c["recompute_layers"], layers if recomputable is None else recomputable), 0.0)
    act_layer, none_layer, ckpt_layer = lay["act_layer"], lay["act_none"], lay["act_ckpt"]
    if moe_on:
        # per block, the mean over the stage's dense and MoE blocks; the backward's working
        # set is the larger kind's
        share = nm / np.maximum(layers, 1.0)
        none_moe = lay[MOE_PREFIX + "act_none"]
        act_layer = act_layer * (1.0 - share) + lay[MOE_PREFIX + "act_layer"] * share
        ckpt_layer = ckpt_layer * (1.0 - share) + lay[MOE_PREFIX + "act_ckpt"] * share
        none_mean = none_layer * (1.0 - share) + none_moe * share
        none_layer = np.where(nm >= layers, none_moe, np.where(
            nm > 0, np.maximum(none_layer, none_moe), none_layer))
    else:
        none_mean = none_layer
    stored = np.where(r == Recompute.FIRST_K, k_full * ckpt_layer + (layers - k_full) * none_mean,
                      layers * act_layer)
    # activations of the first offload_act_layers layers copied to host memory after their
    # forward and back before their backward (Megatron-Core cpu_offloading_num_layers); the
    # last layer's stay, its backward starts at once
    offloaded = np.minimum(x["offload_act_layers"], np.maximum(layers - 1.0, 0.0)) * act_layer
    stored = stored - offloaded + extra_acts
    # fine-grained (offload_modules): the listed modules' tensors of every block not fully
    # recomputed, of every micro-batch in flight, but one group of each module kept on the
    # GPU an iteration, and on the last pipeline stage one a micro-batch (the offload
    # manager's post_warmup_callback and should_bulk_offload)
    off_block = lay["act_offload"]
    if moe_on:
        off_block = off_block * (1.0 - share) + lay[MOE_PREFIX + "act_offload"] * share
    kept_blocks = np.maximum(layers - k_full, 0.0)
    fine_off = off_block * np.maximum(
        kept_blocks * in_flight - (in_flight if last_stage else 1.0), 0.0)
    # backward: the gradients of one layer's activations, and for recomputed layers the
    # recomputed activations themselves, which replace their checkpoint while they are live
    working = none_layer + np.where((r == Recompute.FULL) | (r == Recompute.FIRST_K),
                                    none_layer - ckpt_layer, 0.0) + lay["kv_gathered"]
    acts = np.where(training, stored * in_flight - fine_off + working, none_layer)
    # logits of the last stage while the loss runs: fp32 softmax and its gradient, or with a
    # fused cross-entropy the 16-bit logits and their in-place gradient; an MTP depth's loss
    # is computed in the forward and kept for the backward (Megatron-Core
    # multi_token_prediction.py, MTPLossAutoScaler): the other heads' saved softmax (or
    # 16-bit logits) is live while the first loss's gradient is formed
    logit_bytes = np.where(x["fused_loss"] > 0, ab * (1.0 + training), 4.0 * (1.0 + training))
    saved_bytes = np.where(training, np.where(x["fused_loss"] > 0, ab, 4.0), 0.0)
    logits = np.where(vocab_stage & (x["V"] > 0), T * padded_vocab(x["V"], t) / t * (
        logit_bytes + (heads - 1.0) * saved_bytes), 0.0)
    off = as_array(c["offload"])
    host = np.where(off & 4, optimizer, 0.0) + np.where(off & 2, acts, 0.0) \
        + np.where(off & 1, weights, 0.0) \
        + np.where(training, offloaded * in_flight + fine_off, 0.0)
    optimizer = np.where(off & 4, 0.0, optimizer)
    acts = np.where(off & 2, 2 * act_layer, acts)
    weights = np.where(off & 1, 2 * p_block * ab, weights)
    activations = acts + logits
    other = np.broadcast_to(as_array(x["reserve_bytes"] + x["buffers_bytes"], dtype=np.float64),
                            np.shape(activations))
    total = weights + grads + optimizer + activations + other
    return {"mem_bytes": total, "mem_weights_bytes": weights, "mem_grads_bytes": grads,
            "mem_optimizer_bytes": optimizer, "mem_activations_bytes": activations,
            "mem_other_bytes": other, "host_bytes": host,
            # what nvidia-smi / torch.cuda.max_memory_reserved report: plus allocator cache
            "mem_reported_bytes": total + x["allocator_cache"] * activations,
            # what torch.cuda.max_memory_allocated reports: the tensors alone, without the
            # CUDA context, NCCL's own buffers and workspaces (the reserve) or the cached
            # free blocks (PyTorch docs, "CUDA semantics: memory management")
            "mem_allocated_bytes": total - x["reserve_bytes"]}

"""Kernel-level time models of the ``calibrated`` profile, broadcastable over candidates.

Every argument may be a scalar or an array; ``x`` is the evaluation context (job, hardware
and calibration numbers, see calibrated.make_context), whose entries may themselves be arrays
(one per measured run when validating). Pure numpy.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .fuse import as_array

__all__ = ["gemm_s", "gemm_passes_s", "flash_attention_s", "softmax_exp_factor", "memory_s", "collective_s",
           "p2p_s", "K_TILE", "EXP_EXPOSED", "FLASH_BWD_FACTOR", "FLASH_KV_BLOCK"]

#: depth of the k-loop tile of tensor-core GEMM kernels (elements): K is padded to it
K_TILE = 64
#: FlashAttention-2 backward FLOPs / forward FLOPs: 5 GEMMs (with the recomputed scores)
#: against 2 (Dao 2023, arXiv 2307.08691, section 3.2)
FLASH_BWD_FACTOR = 2.5
#: 16-bit tensor-core GEMMs need every dimension to be a multiple of 8 elements (16 bytes);
#: otherwise cuBLAS falls back to kernels running at the (fp32-accumulating) vector peak
#: (NVIDIA, Matrix Multiplication Background User's Guide, "Tensor Core Requirements")
TC_ALIGN = 8
#: FlashAttention head dimensions are padded to a multiple of this (its kernel templates)
FLASH_HEAD_ALIGN = 32
#: query rows per FlashAttention thread block (parallelised over batch x heads x blocks)
FLASH_Q_BLOCK = 128
#: keys per tile of the fused attention kernels' inner loop (FlashAttention-2/3 and cuDNN
#: use 64 - 128 at head dimensions 64 - 128): a sliding window is visited tile by tile
FLASH_KV_BLOCK = 128
#: share of the softmax exponentials' special-function-unit time that the tensor-core work
#: does not hide: the one number that gives cuDNN's measured GB300 / GB200 attention speed-up
#: from the doubled exponential rate alone, forward 1.18 (this model: 1.179) and backward
#: 1.08 (1.080) at equal tensor peaks (bf16, causal, d = 128, s = 8192, 64 / 8 heads; cuDNN
#: 9.22: forward 1856 / 1574, backward 1435 / 1332 TFLOP/s; NVIDIA/cudnn-frontend
#: benchmark/sdpa_benchmark_training/results/llama3.1/{gb200,gb300}); FA4 (arXiv 2603.05451)
#: finds B200's forward pass as bound by the exponentials as by the MMAs at d = 128
EXP_EXPOSED = 0.436


def _ceil_div(a, b):
    """ceil(a / b), at least 1 (an empty dimension still occupies one tile)."""
    return np.maximum(np.ceil(as_array(a, dtype=np.float64) / b), 1.0)


def _wave_efficiency(tiles, sm):
    """Fraction of SM slots doing work: tiles / (waves x SMs) (NVIDIA, Matrix Multiplication
    Background User's Guide, "wave quantization")."""
    waves = np.ceil(tiles / sm)
    return tiles / np.maximum(waves * sm, 1.0)


def gemm_s(m, n, k, x: Mapping, peak, efficiency, batch=1.0, operand_bytes=None,
           out_bytes=None) -> np.ndarray:
    """Time of ``batch`` GEMMs (m x k)(k x n) on tensor cores.

    Math time 2mnk / (peak x efficiency x padding x waves): m, n are padded to the output
    tile and k to the k-tile (NVIDIA GEMM guide, "tile quantization"); among the kernel's
    tile and its halves the one with the best wave efficiency is taken, as cuBLAS heuristics
    do. The roofline against the operands' HBM traffic, plus one kernel's fixed overhead:
    the two inputs at ``operand_bytes`` an element (default the activations' 16 or 32 bits;
    a low-precision GEMM's quantized copies), the output at ``out_bytes`` (default the
    activations' width; 0 for a fused kernel that reduces its products on chip).
    """
    m, n, k = (as_array(v, dtype=np.float64) for v in (m, n, k))
    tm, tn, sm = x["tile_m"], x["tile_n"], x["sm_count"]
    best = 0.0
    for fm, fn in ((1, 1), (1, 2), (2, 2)):  # tile, half-width tile, quarter tile
        tiles_m, tiles_n = _ceil_div(m, tm / fm), _ceil_div(n, tn / fn)
        pad = (m * n) / (tiles_m * (tm / fm) * tiles_n * (tn / fn))
        waves = _wave_efficiency(batch * tiles_m * tiles_n, sm)
        best = np.maximum(best, pad * waves)
    k_pad = k / (_ceil_div(k, K_TILE) * K_TILE)
    aligned = (np.mod(n, TC_ALIGN) == 0) & (np.mod(k, TC_ALIGN) == 0)
    peak = np.where(aligned, peak, np.minimum(peak, x["vpeak_flops_per_s"]))
    flops = 2.0 * batch * m * n * k
    # (an empty GEMM, e.g. the LM head of a job without vocabulary, takes no math time)
    t_math = flops / np.maximum(peak * efficiency * best * k_pad, 1e-300)
    ab = x["act_bytes"]
    ob = ab if operand_bytes is None else operand_bytes
    out = ab if out_bytes is None else out_bytes
    t_mem = batch * (ob * (m * k + k * n) + out * m * n) / (x["hbm_Bps"] * x["hbm_eff"])
    return np.maximum(t_math, t_mem) + x["kernel_s"]


def gemm_passes_s(shapes, x: Mapping, peak, efficiency, operand_bytes=None) -> tuple:
    """([forward], [backward], [FLOPs]) of GEMMs (M, N, K): forward (M x K)(K x N), backward
    its dgrad (M x N)(N x K) and wgrad (K x M)(M x N) (gemm_s each)."""
    ob = operand_bytes
    fwd = [gemm_s(M, N, K, x, peak, efficiency, operand_bytes=ob) for M, N, K in shapes]
    bwd = [gemm_s(M, K, N, x, peak, efficiency, operand_bytes=ob)
           + gemm_s(K, N, M, x, peak, efficiency, operand_bytes=ob) for M, N, K in shapes]
    return fwd, bwd, [2.0 * M * N * K for M, N, K in shapes]


def flash_attention_s(b, heads, q_len, kv_len, head_dim, x: Mapping, causal_fraction,
                      backward: bool) -> np.ndarray:
    """FlashAttention time: 4 b h q kv d FLOPs forward (QK^T and PV) times the causal fraction,
    2.5x that backward; at the matrix peak times the calibrated attention efficiency, the head
    dimension padded to its template and the thread blocks quantized over SMs."""
    flops = 4.0 * b * heads * q_len * kv_len * head_dim * causal_fraction
    if backward:
        flops = flops * FLASH_BWD_FACTOR
    d_pad = head_dim / (_ceil_div(head_dim, FLASH_HEAD_ALIGN) * FLASH_HEAD_ALIGN)
    blocks = b * heads * _ceil_div(q_len, FLASH_Q_BLOCK)
    # FlashAttention-2-class kernels (flash-attn 2, PyTorch SDPA) or the warp-specialised
    # fused kernels of Hopper and Blackwell (cuDNN fused attention via Transformer Engine,
    # FlashAttention-3): on H100 the latter sustain about twice the former (FA3 paper,
    # arXiv 2407.08608, figures 5-7: FA2 vs FA3 / cuDNN)
    kernel_eff = np.where(x["fused_attn"] > 0, x["fused_attn_eff"], x["attn_eff"])
    eff = kernel_eff * d_pad * _wave_efficiency(blocks, x["sm_count"])
    # (the exponentials against the MMAs of the padded head: one per score either way)
    padded = _ceil_div(head_dim, FLASH_HEAD_ALIGN) * FLASH_HEAD_ALIGN
    return flops * softmax_exp_factor(padded, x, backward) / (
        x["peak16_flops_per_s"] * eff) + x["kernel_s"]


def softmax_exp_factor(head_dim, x: Mapping, backward: bool):
    """Attention time with the softmax's exponentials against the same at head dimension
    128 on the generation's reference GPU, where the calibrated attention efficiencies are
    measured: (1 + g r) / (1 + g r_ref), r the exponentials' SFU time over the MMA time.
    One exponential per score element against 4 d MMA FLOPs forward and 2.5 x that backward,
    so r = FLOPs per exponential / (4 d) forward, / (10 d) backward (EXP_EXPOSED = g). Small
    heads pay more (GPT-OSS, d = 64); Blackwell Ultra's doubled exponentials pay less."""
    per_score = 4.0 * (FLASH_BWD_FACTOR if backward else 1.0)
    ratio = x["flops_per_exp"] / (per_score * head_dim)
    ratio_ref = x["flops_per_exp_ref"] / (per_score * 128.0)
    return (1.0 + EXP_EXPOSED * ratio) / (1.0 + EXP_EXPOSED * ratio_ref)


def memory_s(nbytes, x: Mapping, kernels=1.0) -> np.ndarray:
    """Memory-bound kernels: bytes / (HBM bandwidth x achievable fraction) + launches."""
    return as_array(nbytes, dtype=np.float64) / (x["hbm_Bps"] * x["hbm_eff"]) \
        + kernels * x["kernel_s"]


def _bandwidth(group, per_domain, x: Mapping):
    """Per-GPU ring bandwidth of a group with ``per_domain`` members in each NVLink domain.

    Inside one domain: NVLink. Spanning domains: every ring crosses each domain boundary, and
    NCCL runs one ring per NIC, so a domain's members share per_domain x NICs of scale-out
    bandwidth; the slower of the two tiers bounds the ring (NCCL bus-bandwidth model).
    """
    nvl = x["nvl_Bps"] * x["nvl_eff"]
    net = x["net_Bps"] * x["net_eff"] * x["nics"] * per_domain
    one_domain = per_domain >= group
    return np.where(one_domain, nvl, np.where(per_domain <= 1, net, np.minimum(nvl, net)))


def collective_s(kind: str, nbytes, group, per_domain, x: Mapping) -> np.ndarray:
    """Ring all-gather / reduce-scatter ((n-1)/n V / B), all-reduce (twice that) or
    broadcast (V / B) of a buffer of ``nbytes`` (the full, un-sharded size) over ``group``
    GPUs, at the bus bandwidth NCCL reaches for that size, plus (n-1) steps of latency (the
    scale-out latency once the group spans domains). Zero for a group of one.
    """
    n = as_array(group, dtype=np.float64)
    g = np.minimum(as_array(per_domain, dtype=np.float64), n)
    bw = _bandwidth(n, g, x)
    one_domain = g >= n
    lat = np.where(one_domain, x["nvl_lat_s"], x["net_lat_s"])
    # NCCL reaches its peak bus bandwidth only on large buffers: each of a ring's steps
    # first fills a pipeline of chunks, so a ring of n runs at half its peak at a buffer of
    # S_h = n x (half-bandwidth bytes per rank). Charged as min(S, S_h) bytes more: busbw =
    # peak x S / (S + S_h) from S_h up (fits nccl-tests all_reduce_perf curves from 16 MiB up
    # within 2-8 % rms on 8x A100, H100, B200 and 4x GB200; per rank S_h / n is 2-5 MiB, and
    # 72-rank NVL72 rings fit the same ~3.5-4 MiB; docs/notes/parameter-ranges.md) and
    # peak / 2 below it, where the latency term takes over
    half = n * np.where(one_domain, x["nvl_half_bytes"], x["net_half_bytes"])
    nbytes = as_array(nbytes, dtype=np.float64)
    wire = nbytes + np.minimum(nbytes, half)
    if kind == "broadcast":
        # pipelined ring broadcast: the whole buffer crosses every link once (NCCL's
        # broadcast bus bandwidth equals its algorithm bandwidth)
        t = wire / bw + (n - 1.0) * lat
    else:
        factor = {"allgather": 1.0, "reducescatter": 1.0, "allreduce": 2.0}[kind]
        t = factor * ((n - 1.0) / np.maximum(n, 1.0) * wire / bw + (n - 1.0) * lat)
    return np.where((n > 1) & (nbytes > 0), t, 0.0)


def p2p_s(nbytes, inside_domain, x: Mapping) -> np.ndarray:
    """One point-to-point send: latency + bytes / link bandwidth (NVLink or one NIC)."""
    nvl = x["nvl_lat_s"] + nbytes / (x["nvl_Bps"] * x["nvl_eff"])
    net = x["net_lat_s"] + nbytes / (x["net_Bps"] * x["net_eff"] * np.maximum(x["nics"], 1e-9))
    return np.where(inside_domain, nvl, net)

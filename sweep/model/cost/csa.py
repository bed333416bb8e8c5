"""DeepSeek-V4's compressed sparse attention and hyper-connections in the ``calibrated``
profile, vectorised over candidates. Pure numpy.

A csa layer (Megatron-Core ``experimental_attention_variant`` ``dsv4_hybrid``; Megatron-
Bridge v0.6.0 ``models/deepseek/deepseek_v4_bridge.py`` L408 - 475 and
``training/utils/flop_utils.py`` L878 - 968; docs/notes/moe-research.md section 29, which
cites the Megatron-LM dev sources): queries h -> q_lora (norm) -> H heads of width D with a
per-head norm and RoPE on d_r of it; one key-and-value head h -> D (norm; K = V: multi-query
attention); a sliding window of W tokens on every layer; ratio-4 layers add compressed entries
(two h -> 2 D compressor linears, a softmax-gated sum over two overlapping windows of 4
tokens) of which an indexer picks the top k per query (indexer: its own compressor, q_lora ->
heads x width queries, h -> heads weights, scores of every query against the s / 4 entries),
ratio-128 layers add every compressed entry (two h -> D linears); sparse attention over the
chosen keys with D-wide QK and PV; output: the inverse RoPE, o_groups grouped einsums of
H D / g -> o_lora (a plain 16-bit parameter), then g o_lora -> h. Megatron-Core runs it at
TP 1 (candidates._degree_combos).

The cost model evaluates one average layer (the job's shares of window-only, ratio-4 and
ratio-128 layers), as it averages GPT-OSS's windowed and full layers.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..job import CSA_RATIO
from .kernels import flash_attention_s, gemm_passes_s, gemm_s

__all__ = ["HC_KERNELS_EAGER", "HC_KERNELS_FUSED", "core", "elementwise_bytes", "hc_passes",
           "projections", "saved_bytes", "sparse_slowdown"]

#: bytes of one indexer score (fp32) and of one chosen key's index (int32)
SCORE_BYTES, INDEX_BYTES = 4.0, 4.0
#: the sparse attention kernels against dense ones, from cuDNN's kernel benchmarks on GB200
#: at s = 4096, bf16 (NVIDIA/cudnn-frontend): dense causal attention at DeepSeek-V3's heads
#: reaches 1406 TFLOPS forward and 1057 backward of the 2500 peak (benchmark/
#: sdpa_benchmark_training/results/dsv3/gb200/dsv3_20260424_101009.csv @60e572b); the
#: sparse kernels at DeepSeek-V4-Pro's shape (128 heads, 1152 keys, K = V 512 wide) 1346
#: forward (compute-bound, as dense) and 786 backward (benchmark/dsa/results/deepseek_v4/
#: gb200/deepseek_v4_20260928_122733.csv @07b4346): the backward's atomics and gathers cost
#: 1057 / 786 = 1.34x even where its keys' bytes do not bound it
DENSE_KERNEL_FRACTION_F, DENSE_KERNEL_FRACTION_B = 1406.0 / 2500.0, 1057.0 / 2500.0
SPARSE_BWD_SLOWDOWN = 1057.0 / 786.0
#: bytes moved per query and chosen key, in units of the key's row (K = V, head_dim wide):
#: read once forward; backward read again and its gradient accumulated (fp32: twice the
#: row's 16-bit width)
GATHER_ROWS_F, GATHER_ROWS_B = 1.0, 3.0
#: kernels of one hyper-connection module pass with Megatron-Core's fused mHC kernels
#: (use_fused_mhc: mappings with their Sinkhorn normalization, the aggregate, the residual
#: merge); without them the Sinkhorn's 20 iterations (mhc_sinkhorn_iterations, Megatron-
#: Bridge deepseek_v4_bridge.py L478) run as two small kernels each, plus the projection,
#: the norm, the gates, the aggregate, the mixing bmm, the expansion and the add
HC_KERNELS_FUSED, HC_KERNELS_EAGER = 3.0, 7.0 + 2.0 * 20.0


def _gemms(shapes, x, peak, eff, ob, share=1.0):
    """(forward, backward, forward FLOPs) of GEMMs (M, N, K) summed (kernels.gemm_passes_s),
    taken ``share`` times."""
    return tuple(share * sum(part) for part in gemm_passes_s(shapes, x, peak, eff, ob))


def _compressor_widths(x: Mapping):
    """Elements a token's compressors write on the average layer: a ratio-4 layer's two
    linears 2 D wide and its indexer's two 2 x width, a ratio-128 layer's two D wide."""
    D = x["d"]
    return x["csa_frac"] * (2.0 * 2.0 * D + 2.0 * 2.0 * x["idim"]) + x["hca_frac"] * 2.0 * D


def projections(x: Mapping, T, peak, eff) -> dict:
    """The layer's GEMMs on T tokens: into the attention (q_a, q_b, kv, the compressors and
    the indexer's linears, in the job's GEMM format) and out of it (the grouped o_a einsum
    in 16 bits, o_b in the job's format); ``up_f``: q_b's forward, which recompute_mla_up
    (Megatron-Core recompute_modules mla_up_proj) re-runs."""
    e, H, D, ql = x["e"], x["H"], x["d"], x["q_lora"]
    ob = x["gemm_operand_bytes"]
    q_b = (T, H * D, ql)
    base = _gemms([(T, ql, e), q_b, (T, D, e)], x, peak, eff, ob)
    # ratio-4 layers: two h -> 2 D compressor linears, the indexer's two h -> 2 width ones,
    # its queries and head weights; ratio-128: two h -> D
    idx = x["idim"]
    ratio4 = _gemms([(T, 2.0 * D, e), (T, 2.0 * D, e), (T, 2.0 * idx, e), (T, 2.0 * idx, e),
                     (T, x["ih"] * idx, ql), (T, x["ih"], e)], x, peak, eff, ob, x["csa_frac"])
    ratio128 = _gemms([(T, D, e), (T, D, e)], x, peak, eff, ob, x["hca_frac"])
    g, ol = np.maximum(x["o_groups"], 1.0), x["o_lora"]  # (1: rows without csa)
    peak16, ab = x["peak16_flops_per_s"], x["act_bytes"]
    o_a = gemm_s(T, ol, H * D / g, x, peak16, eff, batch=g, operand_bytes=ab)
    o_a_b = 2.0 * gemm_s(T, H * D / g, ol, x, peak16, eff, batch=g, operand_bytes=ab)
    o_b = _gemms([(T, e, g * ol)], x, peak, eff, ob)
    into = [a + b + c for a, b, c in zip(base, ratio4, ratio128)]
    return {"in_f": into[0], "in_b": into[1], "in_flops": into[2],
            "out_f": o_a + o_b[0], "out_b": o_a_b + o_b[1],
            "out_flops": 2.0 * T * H * D * ol + o_b[2],
            "up_f": gemm_s(*q_b, x, peak, eff, operand_bytes=ob)}


def sparse_slowdown(x: Mapping) -> tuple:
    """(forward, backward) time of the sparse attention kernels over a dense kernel's at the
    same FLOPs. One query's H heads share the chosen keys' rows (K = V, one head), so a key
    brings 4 H D FLOPs forward (10 H D backward) for D x 2 bytes read (three times that
    backward: GATHER_ROWS_*): where those bytes at the HBM rate take longer than the FLOPs at
    a dense kernel's rate (DENSE_KERNEL_FRACTION_* of the 16-bit peak), the kernel runs at
    the bytes' pace - DeepSeek-V4-Flash's 64 heads on GB200, whose cuDNN kernels reach 829
    TFLOPS forward and 605 backward against Pro's 1346 and 786 (cuDNN benchmarks above);
    the backward never faster than SPARSE_BWD_SLOWDOWN."""
    H, ab = x["H"], x["act_bytes"]
    # bytes the HBM moves per FLOP of the 16-bit peak; bytes the kernel reads per FLOP
    hw_bytes_per_flop = x["hbm_Bps"] * x["hbm_eff"] / x["peak16_flops_per_s"]
    kernel_bytes_per_flop_f = GATHER_ROWS_F * ab / (4.0 * np.maximum(H, 1.0))
    kernel_bytes_per_flop_b = GATHER_ROWS_B * ab / (10.0 * np.maximum(H, 1.0))
    slow_f = np.maximum(1.0, DENSE_KERNEL_FRACTION_F * kernel_bytes_per_flop_f
                        / hw_bytes_per_flop)
    slow_b = np.maximum(SPARSE_BWD_SLOWDOWN, DENSE_KERNEL_FRACTION_B * kernel_bytes_per_flop_b
                        / hw_bytes_per_flop)
    return slow_f, slow_b


def core(x: Mapping, b, eff) -> dict:
    """Sparse attention and the indexer's scores per micro-batch of b sequences: H query
    heads against the layer's average keys per query (flops.csa_keys_per_query: window,
    plus chosen or all compressed entries; context entry ``csa_keys``), D wide for QK and
    PV, at the fused attention kernels' rate (whatever the job's attention_kernel: FlashMLA's
    or cuDNN's sparse forward, cuDNN's sparse backward are fused kernels) times
    sparse_slowdown; the indexer's scores (s queries x s / 4 entries x heads x width, bf16 with
    fp32 output) on the ratio-4 layers, causal (the blocks past the diagonal skipped), its
    backward (trained by its KL loss, run in the forward pass in Megatron-Core) twice its
    forward."""
    s, H, D = x["s"], x["H"], x["d"]
    keys = x["csa_keys"]
    slow_f, slow_b = sparse_slowdown(x)
    fused = dict(x, fused_attn=1.0)  # (every sparse kernel is a fused one)
    attn_f = slow_f * flash_attention_s(b, H, s, keys, D, fused, 1.0, False)
    attn_b = slow_b * flash_attention_s(b, H, s, keys, D, fused, 1.0, True)
    attn_flops = 4.0 * b * H * s * keys * D
    peak16 = x["peak16_flops_per_s"]
    entries = s / CSA_RATIO
    index_f = x["csa_frac"] * gemm_s(s, entries / 2.0, x["idim"], x, peak16, eff,
                                     batch=b * x["ih"])
    index_flops = x["csa_frac"] * 2.0 * b * x["ih"] * s * entries / 2.0 * x["idim"]
    return {"f": attn_f + index_f, "b": attn_b + 2.0 * index_f,
            "flops": attn_flops + index_flops, "flops_b": 2.5 * attn_flops + 2.0 * index_flops}


def elementwise_bytes(x: Mapping, T) -> np.ndarray:
    """Forward memory traffic of the layer's attention beyond the projections and the
    RoPE (calibrated._layer counts those): the per-head query norm (read and write H D),
    the compressors' gated sums (read both linears' outputs), and on ratio-4 layers the
    indexer's fp32 scores written and read by the top-k (s / 4 a query)."""
    ab, H, D = x["act_bytes"], x["H"], x["d"]
    q_norm = 2.0 * H * D * ab
    gates = ab * _compressor_widths(x)
    scores = x["csa_frac"] * 2.0 * x["s"] / CSA_RATIO * SCORE_BYTES
    return T * (q_norm + gates + scores)


def saved_bytes(x: Mapping, T) -> dict:
    """What a layer keeps for its backward, per micro-batch: ``qkv`` the queries after q_b
    (unless recompute_mla_up), the latent q_lora and the key-and-value head, the
    compressors' outputs and the ratio-4 layers' chosen indices; ``out`` the inputs of o_a
    (H D, 16 bits: its einsum is not the job's GEMM format) and o_b (g o_lora, at the
    saved-input width)."""
    ab, sb, H, D = x["act_bytes"], x["saved_in_bytes"], x["H"], x["d"]
    qkv = H * D * ab * (1.0 - x["rc_mla_up"]) + (x["q_lora"] + D) * ab \
        + ab * _compressor_widths(x) + x["csa_frac"] * x["itopk_eff"] * INDEX_BYTES
    out = H * D * ab + x["o_groups"] * x["o_lora"] * sb
    return {"qkv": T * qkv, "out": T * out}


def hc_passes(x: Mapping, fused) -> np.ndarray:
    """Tensor passes (reads + writes, in units of one model-wide activation) the hyper-
    connections add to a layer's forward beyond a plain residual's 3 per sublayer (read two,
    write one), over its two sublayers (Megatron-Core d98e8a6 hyper_connection.py
    HyperConnectionModule, n streams): the mappings read the n streams, the aggregate reads
    them and writes one, the merge H_res x + H_post^T y reads n + 1 and writes n: 4 n + 2
    fused (use_fused_mhc); unfused the norm and the projection read the streams apart and
    the merge runs as a bmm, an expansion and an add, 7 n + 2. Zero without streams."""
    n = x["hc"]
    per_sublayer = np.where(fused, 4.0 * n + 2.0, 7.0 * n + 2.0) - 3.0
    return np.where(n > 0, 2.0 * per_sublayer, 0.0)

"""DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5) in the ``calibrated`` profile,
vectorised over candidates. Pure numpy.

A DSA layer is an MLA layer (multi_latent_attention, absorbed) whose queries attend to the
index_topk earlier tokens an indexer picks (Megatron-LM d98e8a6 megatron/core/transformer/
experimental_attention_variant/dsa.py, absorbed_mla.py, dsa_cudnn_kernels.py; the facts and
their lines: docs/notes/moe-research.md section 32):

* the indexer (DSAIndexer): linear_wq_b q_lora -> heads x width from the compressed query,
  linear_wk h -> width (LayerNorm), linear_weights_proj h -> heads; every linear duplicated
  over TP and its inputs detached (no gradient into the trunk: weight gradients only); fp32
  scores sum_h w_h ReLU(q_h . k) of each query against every earlier token, bf16 operands,
  then the top k (cuDNN indexer_forward, a radix top-k);
* absorbed MLA over the chosen keys: H heads, QK 576 = kv_lora + rope wide against the one
  shared latent row, PV 512 = kv_lora wide (FlashMLA sparse forward, cuDNN sparse
  backward); the query absorption and the value up-projection are the MLA up-projections'
  FLOPs (calibrated._mla_projections);
* the indexer's KL loss on the chosen keys (use_sparse_loss, GLM-5): in the forward pass the
  attention logits over the chosen keys are recomputed for every head (QK only, with the
  forward's LSE) and the indexer's backward runs at once, its gradients kept for the
  backward pass (dsa_cudnn_kernels.py FusedIndexerSparseAttnFunc L2147 - 2337).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .kernels import TC_ALIGN, gemm_s

__all__ = ["KERNEL_FRACTION", "core", "elementwise_bytes", "kernel_fraction", "projections",
           "saved_bytes", "topk_width"]

#: bytes of one indexer score (fp32) and of one chosen key's index (int32)
SCORE_BYTES, INDEX_BYTES = 4.0, 4.0
#: the top-k list is padded to a multiple of this many entries (dsa_cudnn_kernels.py
#: L340 - 345, L887 - 892)
TOPK_ALIGN = 512.0
#: the sparse kernels' rate, forward and backward, as fractions of the 16-bit tensor peak,
#: FLOPs as the benchmarks count them (forward 2 H k (576 + 512) a query, backward 2.5x):
#: Blackwell from cuDNN's DSA benchmark at GLM-5's shape (64 heads, top 2048, s = 4096) on
#: GB200, 1026 and 668 TFLOPS of 2500 (NVIDIA/cudnn-frontend benchmark/dsa/results/glm53/
#: gb200/glm53_20260928_124257.csv @07b111f); Hopper: FlashMLA's sparse prefill forward, up
#: to 640 TFLOPS on H800 (deepseek-ai/FlashMLA README, 2025-09-29, DeepSeek-V3.2's 128 heads)
#: and cuDNN's sparse backward at GLM-5's shape on H200, 370 TFLOPS (glm53/h200/
#: glm53_20260928_143653.csv), both of 989.4; other generations (no FlashMLA) Hopper's
KERNEL_FRACTION = {"blackwell": (1026.0 / 2500.0, 668.0 / 2500.0),
                   "hopper": (640.0 / 989.4, 370.0 / 989.4)}


def kernel_fraction(generation: str) -> tuple[float, float]:
    """KERNEL_FRACTION of a generation; a GPU before Hopper, where the fused kernels do not
    run (the job is refused: calibrated.unsupported_job_precision), Hopper's."""
    return KERNEL_FRACTION.get(generation, KERNEL_FRACTION["hopper"])
#: the kernels run the local query heads padded to a multiple of 64 (dsa_cudnn_kernels.py
#: L348 - 399: 64 on SM90, 64 or 128 on SM100)
HEAD_ALIGN = 64.0


def _aligned(n):
    """``n`` rounded up to a multiple of the tensor cores' alignment (kernels.TC_ALIGN)."""
    return np.ceil(n / TC_ALIGN) * TC_ALIGN


def topk_width(job_topk: int, seq_len: int) -> float:
    """Entries of one query's stored top-k list: min(index_topk, s) padded to TOPK_ALIGN."""
    k = min(job_topk, seq_len)
    return float(-(-k // int(TOPK_ALIGN)) * TOPK_ALIGN) if k else 0.0


def projections(x: Mapping, T, peak, eff):
    """(forward, backward, forward FLOPs) of the indexer's three linears on T tokens, in the
    job's GEMM format, duplicated on every TP rank over the whole sequence shard (under
    sequence parallelism the inputs are gathered first, dsa.py L1273 - 1275); backward the
    weight gradients alone (the inputs are detached, L1886 - 1888)."""
    ih, idim, e, ql = x["ih"], x["idim"], x["e"], x["q_lora"]
    ob = x["gemm_operand_bytes"]
    shapes = [(T, ih * idim, ql), (T, idim, e), (T, ih, e)]
    fwd = sum(gemm_s(M, N, K, x, peak, eff, operand_bytes=ob) for M, N, K in shapes)
    wgrad = sum(gemm_s(K, N, M, x, peak, eff, operand_bytes=ob) for M, N, K in shapes)
    flops = sum(2.0 * M * N * K for M, N, K in shapes)
    return fwd, wgrad, flops


def core(x: Mapping, b, heads, q_len, eff) -> dict:
    """The sparse attention and the indexer per micro-batch of b sequences on ``heads``
    local query heads and q_len local queries (context parallelism: a zigzag shard of the
    sequence against every earlier token, gathered): ``f`` / ``b`` forward / backward time,
    ``flops`` / ``flops_b`` executed FLOPs.

    * attention: 2 H k (576 + 512) FLOPs a query forward, k the mean chosen keys
      (flops.dsa_keys_per_query), 2.5x backward, at the measured kernel fractions
      (KERNEL_FRACTION), heads padded to HEAD_ALIGN;
    * training, in the forward: the KL target's logits over the chosen keys (QK only, 2 H k
      576) at the forward rate; the indexer's backward on the stored top-k lists (its query,
      weight and key gradients: 3 x 2 heads x width a query and list entry, the heads padded
      to 64 and the whole padded list: it has no top-k length, dsa_cudnn_kernels.py L1470 -
      1499) at the GEMM rate;
    * the indexer's scores, 2 x heads x width FLOPs per query and earlier token (s / 2 on
      average), at the 16-bit GEMM rate, summed over the heads on chip (one fp32 matrix
      written: elementwise_bytes).
    FLOPs as executed, without padding."""
    s, H_pad = x["s"], np.ceil(heads / HEAD_ALIGN) * HEAD_ALIGN
    keys, d_qk, d_v = x["dsa_keys"], x["kv_lora"] + x["d_rope"], x["kv_lora"]
    peak16 = x["peak16_flops_per_s"]
    queries = b * q_len
    per_head = 2.0 * queries * keys * (d_qk + d_v)
    attn_f = H_pad * per_head / (peak16 * x["dsa_frac_f"]) + x["kernel_s"]
    attn_b = 2.5 * H_pad * per_head / (peak16 * x["dsa_frac_b"]) + x["kernel_s"]
    training = x["training"] > 0
    target_f = np.where(training, H_pad * 2.0 * queries * keys * d_qk
                        / (peak16 * x["dsa_frac_f"]), 0.0)
    ih, idim = x["ih"], x["idim"]
    # (the mean key counts as GEMM widths, rounded up to the tensor cores' alignment: an
    # average of whole rows, not a misaligned operand)
    scores = gemm_s(q_len, _aligned(s / 2.0), idim, x, peak16, eff, batch=b * ih, out_bytes=0.0)
    index_b = np.where(training, 3.0 * gemm_s(
        q_len, _aligned(x["dsa_topk_width"]), idim, x, peak16, eff,
        batch=b * np.maximum(ih, HEAD_ALIGN), out_bytes=0.0), 0.0)
    attn_flops = heads * per_head
    index_flops = 2.0 * queries * ih * idim * s / 2.0
    index_b_flops = np.where(training, 3.0 * 2.0 * queries * ih * idim * keys
                             + 2.0 * heads * queries * keys * d_qk, 0.0)
    return {"f": attn_f + target_f + scores + index_b, "b": attn_b,
            "flops": attn_flops + index_flops + index_b_flops, "flops_b": 2.5 * attn_flops,
            "attn_f": attn_f}


def elementwise_bytes(x: Mapping, T, t) -> np.ndarray:
    """Forward memory traffic of a DSA layer beyond MLA's, for T tokens on a rank of TP t
    (forward only: the backward runs the sparse kernels and scales the kept indexer
    gradients, dsa_cudnn_kernels.py L2295 - 2337):
    the indexer's fp32 scores written and read by the top-k (s / 2 earlier tokens a query
    on average), its top-k list written, its key's LayerNorm and the RoPE on its queries'
    and key's rotary part (read and write), and the absorbed query (H / t x 576) assembled
    from its two parts (read and write)."""
    ab, ih, idim, dr = x["act_bytes"], x["ih"], x["idim"], x["d_rope"]
    scores = 2.0 * SCORE_BYTES * x["s"] / 2.0
    index_list = x["dsa_topk_width"] * INDEX_BYTES
    indexer = 2.0 * ab * (idim + (ih + 1.0) * dr)
    absorbed = 2.0 * ab * x["H"] / t * (x["kv_lora"] + dr)
    return T * (scores + index_list + indexer + absorbed)


def saved_bytes(x: Mapping, T, Ta, t, cp) -> dict:
    """What a DSA layer keeps for its backward, per micro-batch on T local tokens (Ta with
    sequence parallelism) of a rank of TP t and CP cp (absorbed MLA saves no per-head keys
    or values: absorbed_mla.py L562 - 582; dsa_cudnn_kernels.py L2264 - 2274): ``qkv`` the
    queries after q_b (the absorption's input) and the absorbed ones (H / t x 576) unless
    recompute_mla_up re-runs them (absorbed_mla.py L671 - 677), the latent key on the SP
    shard, the compressed query and the attention input on all T tokens (the indexer's
    duplicated linears keep their gathered inputs: dsa.py L1273 - 1275; the input's SP
    shard is counted with the block's), and the attention's latent output (H / t x 512,
    the value up-projection's input); ``core``, what
    checkpointing the core attention (selective recompute) drops: the key row of every
    token (576, gathered under CP), the stored top-k lists (int32) and the indexer's
    gradients computed in the forward (its queries' and weights' per local token, its
    key's per gathered token, 16-bit); the LSE is the fused attention's (calibrated)."""
    ab, H, dr, kvr = x["act_bytes"], x["H"], x["d_rope"], x["kv_lora"]
    queries = H / t * (x["d_qk"] + kvr + dr) * ab * (1.0 - x["rc_mla_up"])
    qkv = T * (queries + x["q_lora"] * ab + H / t * kvr * ab) + Ta * (kvr + dr) * ab \
        + (T - Ta) * x["e"] * ab
    gathered = T * cp * (kvr + dr + x["idim"]) * ab
    local = T * (x["dsa_topk_width"] * INDEX_BYTES + (x["ih"] * x["idim"] + x["ih"]) * ab)
    return {"qkv": qkv, "core": gathered + local}

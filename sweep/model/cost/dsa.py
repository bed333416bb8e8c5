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
  backward pass (dsa_cudnn_kernels.py FusedIndexerSparseAttnFunc L2147 - 2337); none with
  index_loss false;
* IndexShare (GLM-5.2): the layers reusing another's top-k hold no indexer; the indexer's
  costs count on the computing layers' share (an average layer, as csa's kinds of layer).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .csa import DENSE_KERNEL_FRACTION_B, DENSE_KERNEL_FRACTION_F, SPARSE_BWD_SLOWDOWN
from .kernels import TC_ALIGN, gemm_s

__all__ = ["BEFORE_HOPPER", "busiest_stage_layers", "core", "elementwise_bytes", "projections",
           "saved_bytes", "sparse_kernels_s", "topk_width", "trains"]

#: bytes of one indexer score (fp32) and of one chosen key's index (int32)
SCORE_BYTES, INDEX_BYTES = 4.0, 4.0
#: the top-k list is padded to a multiple of this many entries (dsa_cudnn_kernels.py
#: L340 - 345, L887 - 892)
TOPK_ALIGN = 512.0
#: The sparse kernels gather each query's chosen key rows (576 x 2 bytes, K = V), no reuse
#: between queries but what the L2 catches, and run H heads of MMAs on them: a kernel takes
#: the longer of its FLOPs at a compute-bound fraction of the 16-bit peak and its row
#: gathers (FlashMLA's own analysis of MLA kernels, deepseek-ai/FlashMLA docs/20250422-new-
#: kernel-deep-dive.md: FLOPs / bytes ~ 2 H). Compute-bound fractions: forward a dense fused
#: kernel's, cuDNN's causal attention at DeepSeek-V3's heads on GB200, 1406 of 2500 TFLOPS
#: (csa.DENSE_KERNEL_FRACTION_F); backward cuDNN's sparse backward where it is compute-bound,
#: at DeepSeek-V4-Pro's 128 heads on GB200, 786 of 2500 (benchmark/dsa/results/deepseek_v4/
#: gb200/deepseek_v4_20260928_122733.csv @07b4346)
COMPUTE_FRACTION_F = DENSE_KERNEL_FRACTION_F
COMPUTE_FRACTION_B = DENSE_KERNEL_FRACTION_B / SPARSE_BWD_SLOWDOWN
#: the row gathers' time a query and key, forward and backward (the backward gathers the rows
#: again and accumulates their fp32 gradients), in reads of the row at the HBM's nominal
#: rate: cuDNN's DSA benchmark at GLM-5's shape on GB200 bound by them (64 heads, QK 576, PV
#: 512, every query 2048 keys, NVIDIA/cudnn-frontend benchmark/dsa/results/glm53/gb200/
#: glm53_20260928_124257.csv @07b111f) at its longest sequence, s = 32K (9.784 ms forward,
#: 38.307 ms backward: 32768 x 2048 x 1152 bytes at 8 TB/s, 1.01 and 3.97 times), whose
#: 38 MB of key rows outgrow the L2 more than the shorter ones' (at s = 4096, 4.7 MB, the
#: kernels run 8 % faster: the model is 8 % slow there). Long-context training (128K, 151 MB
#: a CP rank's gathered rows) lies beyond the benchmark; on H200 its backward at 32K is 25 %
#: slower than this gives (100.8 ms measured, 75.1 compute-bound in the model)
ROW_READS_F = 9.784e-3 * 8e12 / (32768.0 * 2048.0 * 1152.0)
ROW_READS_B = 38.307e-3 * 8e12 / (32768.0 * 2048.0 * 1152.0)
#: generations before Hopper: the fused DSA kernels need SM90 or newer (dsa_cudnn_kernels.py
#: L340 - 345); there an unfused fallback materialises every score (jobs refused)
BEFORE_HOPPER = ("volta", "ampere")
#: the kernels run the local query heads padded to a multiple of 64 (dsa_cudnn_kernels.py
#: L348 - 399: 64 on SM90, 64 or 128 on SM100)
HEAD_ALIGN = 64.0


def _aligned(n):
    """``n`` rounded up to a multiple of the tensor cores' alignment (kernels.TC_ALIGN)."""
    return np.ceil(n / TC_ALIGN) * TC_ALIGN


def busiest_stage_layers(layers, freq, pp):
    """IndexShare under pipeline parallelism: every stage starts on a layer computing its
    top-k (Megatron-Core refuses cross-stage sharing, dsa.py L1961 - 1972), so stages hold
    whole groups of ``freq`` layers and the busiest holds freq x ceil(layers / (freq pp))."""
    return freq * np.ceil(layers / (freq * pp))


def topk_width(job_topk: int, seq_len: int) -> float:
    """Entries of one query's stored top-k list: min(index_topk, s) padded to TOPK_ALIGN."""
    k = min(job_topk, seq_len)
    return float(-(-k // int(TOPK_ALIGN)) * TOPK_ALIGN) if k else 0.0


def trains(x: Mapping):
    """Whether the indexer's KL loss runs (a training job with index_loss)."""
    return (x["training"] > 0) & (x["idx_loss"] > 0)


def projections(x: Mapping, T, peak, eff):
    """(forward, backward, forward FLOPs) of the indexer's three linears on T tokens, in the
    job's GEMM format, duplicated on every TP rank over the whole sequence shard (under
    sequence parallelism the inputs are gathered first, dsa.py L1273 - 1275); backward the
    weight gradients alone (the inputs are detached, L1886 - 1888), none when the loss does
    not train the indexer; on the share of the layers that compute their top-k
    (IndexShare: a layer reusing another's builds no indexer, L1580 - 1584)."""
    ih, idim, e, ql = x["ih"], x["idim"], x["e"], x["q_lora"]
    ob, share = x["gemm_operand_bytes"], x["idx_share"]
    shapes = [(T, ih * idim, ql), (T, idim, e), (T, ih, e)]
    fwd = sum(gemm_s(M, N, K, x, peak, eff, operand_bytes=ob) for M, N, K in shapes)
    wgrad = sum(gemm_s(K, N, M, x, peak, eff, operand_bytes=ob) for M, N, K in shapes)
    flops = sum(2.0 * M * N * K for M, N, K in shapes)
    return share * fwd, share * np.where(trains(x), wgrad, 0.0), share * flops


def sparse_kernels_s(x: Mapping, queries, keys, heads) -> tuple:
    """(forward, backward, the loss target's logits) time of the sparse attention kernels
    for ``queries`` queries of ``heads`` heads (padded to HEAD_ALIGN), ``keys`` chosen keys
    each: the longer of the FLOPs (2 H k (576 + 512) forward, 2.5x backward, 2 H k 576 for
    the target's QK) at COMPUTE_FRACTION_* of the 16-bit peak and the key rows' gathers
    (ROW_READS_* x (kv_lora + rope) x 2 bytes a query and key, the target's once more as the
    forward's) at the HBM's nominal rate, plus a kernel's launch."""
    H_pad = np.ceil(heads / HEAD_ALIGN) * HEAD_ALIGN
    d_qk, d_v = x["kv_lora"] + x["d_rope"], x["kv_lora"]
    qk_flops = 2.0 * queries * keys * H_pad * d_qk
    flops_f = qk_flops * (d_qk + d_v) / d_qk
    rows = queries * keys * d_qk * 2.0 / x["hbm_Bps"]  # (16-bit rows: the kernels' only)
    peak16 = x["peak16_flops_per_s"]
    fwd = np.maximum(flops_f / (peak16 * COMPUTE_FRACTION_F), ROW_READS_F * rows)
    bwd = np.maximum(2.5 * flops_f / (peak16 * COMPUTE_FRACTION_B), ROW_READS_B * rows)
    target = np.maximum(qk_flops / (peak16 * COMPUTE_FRACTION_F), ROW_READS_F * rows)
    return fwd + x["kernel_s"], bwd + x["kernel_s"], target + x["kernel_s"]


def core(x: Mapping, b, heads, q_len, eff) -> dict:
    """The sparse attention and the indexer per micro-batch of b sequences on ``heads``
    local query heads and q_len local queries (context parallelism: a zigzag shard of the
    sequence against every earlier token, gathered): ``f`` / ``b`` forward / backward time,
    ``flops`` / ``flops_b`` executed FLOPs.

    * attention: 2 H k (576 + 512) FLOPs a query forward, k the mean chosen keys
      (flops.dsa_keys_per_query), 2.5x backward (sparse_kernels_s);
    * the indexer's scores, 2 x heads x width FLOPs per query and earlier token (s / 2 on
      average), at the 16-bit GEMM rate, summed over the heads on chip (one fp32 matrix
      written: elementwise_bytes);
    * when its loss trains the indexer, in the forward: the KL target's logits over the
      chosen keys (QK only, 2 H k 576) at the forward rate; the indexer's backward on the
      stored top-k lists (its query, weight and key gradients: 3 x 2 heads x width a query
      and list entry, the heads padded to 64 and the whole padded list: it has no top-k
      length, dsa_cudnn_kernels.py L1470 - 1499) at the GEMM rate; and under IndexShare the
      sparse forward once more for the loss's LSE (FusedQKTopKWithSparseLossFunc, L2376 -
      2472);
    the indexer's parts on the share of the layers that compute their top-k. FLOPs as
    executed, without padding."""
    s, share = x["s"], x["idx_share"]
    keys, d_qk, d_v = x["dsa_keys"], x["kv_lora"] + x["d_rope"], x["kv_lora"]
    peak16 = x["peak16_flops_per_s"]
    queries = b * q_len
    attn_f, attn_b, target = sparse_kernels_s(x, queries, keys, heads)
    loss_on = trains(x)
    ih, idim = x["ih"], x["idim"]
    # (the mean earlier tokens as a GEMM width, rounded up to the tensor cores' alignment:
    # an average of whole rows, not a misaligned operand)
    scores = gemm_s(q_len, _aligned(s / 2.0), idim, x, peak16, eff, batch=b * ih, out_bytes=0.0)
    index_b = 3.0 * gemm_s(q_len, _aligned(x["dsa_topk_width"]), idim, x, peak16, eff,
                           batch=b * np.maximum(ih, HEAD_ALIGN), out_bytes=0.0)
    loss = target + index_b + np.where(x["idx_shared"] > 0, attn_f, 0.0)
    attn_flops = 2.0 * queries * keys * heads * (d_qk + d_v)
    index_flops = 2.0 * queries * ih * idim * s / 2.0
    loss_flops = 3.0 * 2.0 * queries * ih * idim * keys + 2.0 * heads * queries * keys * d_qk \
        + np.where(x["idx_shared"] > 0, attn_flops, 0.0)
    return {"f": attn_f + share * (scores + np.where(loss_on, loss, 0.0)), "b": attn_b,
            "flops": attn_flops + share * (index_flops + np.where(loss_on, loss_flops, 0.0)),
            "flops_b": 2.5 * attn_flops, "attn_f": attn_f}


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
    return T * (x["idx_share"] * (scores + index_list + indexer) + absorbed)


def saved_bytes(x: Mapping, T, Ta, t, cp) -> dict:
    """What a DSA layer keeps for its backward, per micro-batch on T local tokens (Ta with
    sequence parallelism) of a rank of TP t and CP cp (absorbed MLA saves no per-head keys
    or values: absorbed_mla.py L562 - 582; dsa_cudnn_kernels.py L2264 - 2274): ``qkv`` the
    queries after q_b (the absorption's input) and the absorbed ones (H / t x 576) unless
    recompute_mla_up re-runs them (absorbed_mla.py L671 - 677), the latent key on the SP
    shard and the compressed query, on all T tokens where the loss trains the indexer (its
    duplicated linears keep their gathered inputs, the attention input's too: dsa.py L1273
    - 1275; the input's SP shard is counted with the block's), and the attention's latent
    output (H / t x 512, the value up-projection's input); ``core``, what checkpointing the
    core attention (selective recompute) drops: the key row of every token (576, gathered
    under CP), the stored top-k lists (int32; every layer its own copy, IndexShare's too:
    dsa_cudnn_kernels.py L1988 - 1992, L2547) and, with the loss, the indexer's gradients
    computed in the forward (its queries' and weights' per local token, its key's per
    gathered token, 16-bit), on the share of the layers computing their top-k; the LSE is
    the fused attention's (calibrated)."""
    ab, H, dr, kvr = x["act_bytes"], x["H"], x["d_rope"], x["kv_lora"]
    share, loss_on = x["idx_share"], np.where(trains(x), 1.0, 0.0)
    queries = H / t * (x["d_qk"] + kvr + dr) * ab * (1.0 - x["rc_mla_up"])
    gathered_in = (T - Ta) * (x["q_lora"] + x["e"]) * ab * share * loss_on
    qkv = T * (queries + H / t * kvr * ab) + Ta * (x["q_lora"] + kvr + dr) * ab + gathered_in
    grads = T * (cp * x["idim"] + x["ih"] * x["idim"] + x["ih"]) * ab * loss_on
    core = T * cp * (kvr + dr) * ab + T * x["dsa_topk_width"] * INDEX_BYTES + share * grads
    return {"qkv": qkv, "core": core}

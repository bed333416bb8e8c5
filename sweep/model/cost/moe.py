"""Mixture-of-experts layers of the ``calibrated`` profile: routing, token dispatch and the
grouped expert GEMMs, vectorised over candidates. Pure numpy.

One MoE block is the attention block and the shared expert (a dense MLP, costed by
calibrated._layer with the shared width) plus the *routed* part costed here, following
Megatron-Core's MoE layer (``megatron/core/transformer/moe``: router.py, token_dispatcher.py,
experts.py, moe_utils.py; NVIDIA/Megatron-LM@d98e8a64) in the parallel folding of Liu et
al. 2025 (arXiv 2504.14960): the attention mesh TP x CP x DP and the expert mesh
ETP x EP x EDP cover the same GPUs of a pipeline stage. Research notes with every
formula's derivation: docs/notes/moe-research.md (sections cited as "notes 3.2" etc.).

Symbols: T_l tokens entering the block on one GPU (the sequence-parallel shard), k experts
per token, E experts, f_e one expert's FFN width, ep / etp the expert-parallel and expert
tensor-parallel degrees, g the EP ranks inside one NVLink domain, h_m the width of the
tokens the experts see (the model width, or a latent MoE's latent size: Job.moe_width).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .fuse import as_array
from .kernels import TC_ALIGN, collective_s, gemm_s, memory_s

__all__ = ["routed_experts", "router_s", "rows_sent", "tokens_per_expert", "a2a_bytes",
           "a2a_s", "distinct_fraction", "moe_layers_before"]

#: rows of each expert's GEMM input padded to this multiple when the grouped GEMMs run in
#: fp8 (16) or a block-scaled format (32) (Megatron-Core moe_utils.py
#: get_align_size_for_quantization; fp8_utils.py get_fp8_align_size)
FP8_ROW_ALIGN, BLOCK_SCALED_ROW_ALIGN = 16.0, 32.0
#: bytes per router score element kept and moved: fp32 logits and probabilities (Megatron
#: moe_router_dtype fp32) and a one-byte routing map (notes 3.1)
ROUTER_BYTES_PER_SCORE = 9.0


def moe_layers_before(x: Mapping, i) -> np.ndarray:
    """MoE blocks among the first ``i`` blocks: after first_dense dense blocks, the last of
    every moe_step blocks (Job.moe_layers is the same rule for i = n_layers)."""
    i = as_array(i, dtype=np.float64)
    n = np.floor(np.maximum(i - x["first_dense"], 0.0) / np.maximum(x["moe_step"], 1.0))
    return np.where(x["moe"] > 0, n, 0.0)


def tokens_per_expert(x: Mapping, T_l, ep, etp) -> np.ndarray:
    """Rows each local expert's GEMMs process per micro-batch on the busiest GPU (notes 3.3
    and 3.4). Dropless: the even share etp x ep x T_l x k / E, times the statistical spread
    of random routing (the most loaded of ep ranks: Binomial(n, 1/ep) with n = etp x ep x
    T_l x k token copies, mean + sqrt(2 ln ep) standard deviations) and the job's
    moe_imbalance. With a capacity factor, every expert is padded to its capacity
    ceil(T_l k cf / E) per source rank (Megatron get_capacity, pad_to_capacity). Padded to
    the row alignment of fp8 / block-scaled grouped GEMMs."""
    k, E = x["topk"], np.maximum(x["E"], 1.0)
    copies = etp * T_l * k  # token copies one EP rank receives on average
    spread = 1.0 + np.sqrt(2.0 * np.log(np.maximum(ep, 1.0)) * (1.0 - 1.0 / ep)
                           / np.maximum(copies, 1.0))
    dropless = ep * copies / E * spread * x["imbalance"]
    padded = etp * ep * np.ceil(T_l * k * x["capacity"] / E)
    rows = np.where(x["capacity"] > 0, padded, dropless)
    # (16-bit: to the tensor-core multiple of 8 - the count is a mean, and a grouped GEMM's
    # leading dimensions are the aligned feature widths whatever an expert's row count)
    # (blockwise fp8 aligns as per-tensor fp8 does: get_fp8_align_size gives 32 to MXFP8
    # alone, Megatron-LM d98e8a6 fp8_utils.py L356 - 361)
    block = (x["block_scaled"] > 0) & (x["blockwise"] == 0)
    align = np.where(block, BLOCK_SCALED_ROW_ALIGN,
                     np.where(x["fp8"] > 0, FP8_ROW_ALIGN, float(TC_ALIGN)))
    return np.ceil(rows / align) * align


def distinct_fraction(E, k, share) -> np.ndarray:
    """Probability that a token's k distinct experts, drawn uniformly from E, include one of
    the ``share`` x E experts of a given destination: 1 - C(E - a, k) / C(E, k) with
    a = share x E (hypergeometric; notes 4.2)."""
    E = as_array(E, dtype=np.float64)
    a = as_array(share, dtype=np.float64) * E
    k = as_array(k, dtype=np.float64)
    miss = np.ones_like(E * a * k)  # (their broadcast shape)
    for i in range(int(np.max(k, initial=0.0))):
        miss = miss * np.where(i < k, np.maximum(E - a - i, 0.0) / np.maximum(E - i, 1.0), 1.0)
    return 1.0 - miss


def a2a_bytes(x: Mapping, T_l, ep, g, value_bytes) -> tuple[np.ndarray, np.ndarray]:
    """(bytes one GPU sends over NVLink, bytes it sends over its NICs) in one dispatch or
    combine of T_l tokens to ep ranks, g of them in its NVLink domain (notes 4.1, 4.2).

    NCCL all-to-all (moe_token_dispatcher_type alltoall) sends one copy per routed expert,
    T_l k rows, spread evenly: (g - 1) / ep of them to NVLink peers, (ep - g) / ep across
    domains. The flex dispatchers (DeepEP, HybridEP) send one copy per destination domain
    over the NICs and one per destination GPU inside a domain (DeepEP tests/legacy
    test_internode.py num_rdma_token_sent, test_intranode.py recv_x)."""
    k, E = x["topk"], x["E"]
    row = x["em"] * value_bytes  # (a latent MoE moves latent-wide rows)
    domains = np.maximum(ep / np.maximum(g, 1.0), 1.0)
    sent = rows_sent(x, T_l)
    nccl_nvl = sent * row * (g - 1.0) / ep
    nccl_net = sent * row * (ep - g) / ep
    ranks_hit = ep * distinct_fraction(E, k, 1.0 / ep)
    domains_hit = domains * distinct_fraction(E, k, 1.0 / domains)
    flex_net = T_l * row * domains_hit * (domains - 1.0) / domains
    # inside the domain a token goes to each hit GPU once; the (g - 1) / g of those GPUs
    # that are not this one are NVLink traffic (with several domains: the copies received
    # over the NICs forwarded to their GPUs, HybridEP / DeepEP normal kernels)
    flex_nvl = T_l * row * ranks_hit * (g - 1.0) / np.maximum(g, 1.0)
    flex = x["flex"] > 0
    return np.where(flex, flex_nvl, nccl_nvl), np.where(flex, flex_net, nccl_net)


def rows_sent(x: Mapping, T_l) -> np.ndarray:
    """Token copies one GPU sends in a dispatch: T_l k dropless; with a capacity factor and
    padding, every expert's capacity ceil(T_l k cf / E) (token_dispatcher.py preprocess:
    num_out_tokens = capacity x num_experts; notes 4.1)."""
    k, E = x["topk"], np.maximum(x["E"], 1.0)
    padded = E * np.ceil(T_l * k * x["capacity"] / E)
    return np.where(x["capacity"] > 0, padded, T_l * k)


def a2a_s(nvl_bytes, net_bytes, ep, g, x: Mapping) -> np.ndarray:
    """Time of one all-to-all: the two tiers run concurrently, each at a2a_eff of its link
    bandwidth (at most one NIC's worth per GPU: NCCL does not aggregate NICs in all-to-all,
    nccl-tests issue #267), plus one latency of the slowest tier crossed."""
    nvl = x["nvl_Bps"] * x["a2a_eff"]
    net = x["net_Bps"] * np.clip(x["nics"], 1e-9, 1.0) * x["a2a_eff"]
    lat = np.where(ep > g, x["net_lat_s"], x["nvl_lat_s"])
    t = np.maximum(nvl_bytes / nvl, net_bytes / net) + lat
    return np.where(ep > 1, t, 0.0)


def router_s(x: Mapping, T_l) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) time of the router on T_l tokens: the (T_l x h)(h x E) GEMM in 16
    bits, and the scores, top-k and normalisation, memory-bound on T_l x E fp32
    (router.py TopKRouter; notes 3.1)."""
    e, E = x["e"], np.maximum(x["E"], 1.0)
    p16, eff = x["peak16_flops_per_s"], x["gemm_eff"] * x["gemm_sustained"]
    fwd = gemm_s(T_l, E, e, x, p16, eff) + memory_s(ROUTER_BYTES_PER_SCORE * T_l * E, x, 2.0)
    bwd = gemm_s(T_l, e, E, x, p16, eff) + gemm_s(e, E, T_l, x, p16, eff) \
        + memory_s(2.0 * ROUTER_BYTES_PER_SCORE * T_l * E, x, 2.0)
    return fwd, bwd


def routed_experts(x: Mapping, c: Mapping, lay: Mapping, peak) -> dict:
    """Per-micro-batch times, FLOPs and kept activations of one block's routed part (the
    router aside: router_s): token permutation, dispatch and combine all-to-alls, the grouped
    expert GEMMs and their activation function. ``lay`` holds ``Ta``, the tokens entering the
    block (calibrated._tokens); ``peak`` the GEMM peak of the job's format."""
    T_l = lay["Ta"]  # tokens entering the block on this GPU (its sequence-parallel shard)
    # (e: the width of the rows the experts see and the all-to-alls move, h_m)
    ab, sb, e = x["act_bytes"], x["saved_in_bytes"], x["em"]
    ep = as_array(c["ep"], dtype=np.float64)
    etp = as_array(c["etp"], dtype=np.float64)
    g = as_array(c["nv_ep"], dtype=np.float64)
    E, fe = np.maximum(x["E"], 1.0), x["fe"]
    glu = x["swiglu"]
    local = E / ep  # experts on this GPU
    M = tokens_per_expert(x, T_l, ep, etp)  # rows per local expert
    rows = M * local  # token copies processed here
    # permute before the dispatch (T_l rows read, T_l k written), sort by local expert after
    # it, and the mirror image around the combine (token_dispatcher.py dispatch_preprocess /
    # dispatch_postprocess / combine_*; moe_utils.py permute, unpermute; notes 3.2)
    sent = rows_sent(x, T_l)
    perm_bytes = 2.0 * ab * e * (T_l + sent + 2.0 * rows)
    perm_f = memory_s(perm_bytes, x, 4.0)
    perm_b = memory_s(perm_bytes, x, 4.0)
    # grouped expert GEMMs (experts.py TEGroupedMLP): fc1 (h -> (1 + glu) f_e / etp), fc2
    # (f_e / etp -> h) for every local expert at once, at the grouped-GEMM efficiency
    eff = x["grouped_eff"] * x["gemm_sustained"]
    w1, w2 = (1.0 + glu) * fe / etp, fe / etp
    shapes = [(M, w1, e), (M, e, w2)]
    # Transformer Engine's grouped linear issues one cuBLAS GEMM per local expert,
    # round-robin over 4 compute streams (transformer_engine/common/gemm/cublaslt_gemm.cu
    # multi_stream_cublas_gemm; gemm.h num_streams = 4): the GPU runs them side by side (the
    # batch's wave quantization), but the host prepares each expert's GEMM in turn (its
    # input split or quantized, its weight workspace, quantizers and gradient buffers:
    # pytorch/module/grouped_linear.py _GroupedLinear, Python loops over num_gemms), after
    # the dispatch has synchronised the token counts to the host (m_splits as a list), so
    # that host time per expert (expert_us) adds to the GEMMs rather than hiding behind them
    host = local * x["expert_s"]
    ob = x["gemm_operand_bytes"]
    gemm_f = sum(gemm_s(m, n, kk, x, peak, eff, local, ob) + host for m, n, kk in shapes)
    gemm_b = sum(gemm_s(m, kk, n, x, peak, eff, local, ob)
                 + gemm_s(kk, n, m, x, peak, eff, local, ob) + 2.0 * host
                 for m, n, kk in shapes)
    gemm_flops = 2.0 * rows * e * (w1 + w2)
    # SwiGLU / GELU and the probability multiply (fused), plus low-precision casts of the two
    # GEMM inputs
    act_bytes_f = ab * rows * w2 * (2.0 + glu) + rows * 4.0 \
        + x["fp8"] * (ab + x["lp_copy_bytes"]) * rows * (e + w2)
    # GPT-OSS's clamped SwiGLU: the gate and linear halves clamped and concatenated again in
    # three eager kernels before the fused activation (Megatron-Core fused_bias_geglu.py
    # weighted_bias_quick_geglu_impl: chunk, clamp, clamp, cat), 8 passes of w2 per row
    # (backward: each clamp's masked gradient, 3, and the halves' gradients concatenated, 2
    # of the 2 w2 width: 10); and the experts' fc2 biases added one local expert at a time in
    # Python (experts.py TEGroupedMLP._apply_bias: split, t + b p, cat), 6 passes of the
    # h-wide output (backward: the bias and probability gradients, a product and a sum each,
    # and the split's gradient concatenated: 8)
    clamp, bias = x["clamp"] * glu, x["expert_bias"]
    eager_f = ab * rows * (clamp * 8.0 * w2 + bias * 6.0 * e)
    eager_b = ab * rows * (clamp * 10.0 * w2 + bias * 8.0 * e)
    eager_kernels = 3.0 * clamp + bias * (2.0 * local + 1.0)
    act_f = memory_s(act_bytes_f + eager_f, x, 2.0 + eager_kernels)
    act_b = memory_s(2.0 * act_bytes_f + eager_b, x, 3.0 + 2.0 * eager_kernels)
    # dispatch and combine: forward and backward one all-to-all each (token_dispatch /
    # token_combine); with ETP > 1 the received rows are all-gathered over the ETP group and
    # the outputs reduce-scattered (dispatch_postprocess / combine_preprocess; notes 4.1)
    nvl_b, net_b = a2a_bytes(x, T_l, ep, g, ab)
    one = a2a_s(nvl_b, net_b, ep, g, x)
    d_in = as_array(c["nv_tp"], dtype=np.float64) * as_array(c["nv_cp"], np.float64) \
        * as_array(c["nv_dp"], dtype=np.float64)
    etp_domain = np.minimum(etp, np.maximum(d_in, 1.0))
    etp_buffer = etp * sent * e * ab
    etp_comm = collective_s("allgather", etp_buffer, etp, etp_domain, x) \
        + collective_s("reducescatter", etp_buffer, etp, etp_domain, x)
    comm_f = 2.0 * one + etp_comm
    comm_b = 2.0 * one + etp_comm
    memory_f, memory_b = perm_f + act_f, perm_b + act_b
    latent = _latent_projections(x, T_l, peak)
    # kept for the backward (no recompute): router scores, the dispatched rows (fc1 input),
    # fc1 output, fc2 input (activation output), probabilities (notes 6.2)
    # (recompute_moe_act: the activation output, fc2's input, is recomputed from fc1's)
    # (offloading expert_fc1 under per-tensor fp8, fc1 keeps its 16-bit input instead of
    # a quantized copy: experts.py set_save_original_input, "to avoid ... multiple d2h
    # copies"; MXFP8 and NVFP4 keep theirs)
    fc1_b = np.where((x["off_fc1"] > 0) & (x["fp8"] > 0) & (x["block_scaled"] == 0), ab, sb)
    acts = ROUTER_BYTES_PER_SCORE * T_l * E + rows * (e * fc1_b + w1 * ab
                                                      + w2 * sb * (1.0 - x["rc_moe_act"]) + 4.0)
    h = x["e"]  # (the router reads the model-wide tokens)
    out = {"compute_f": gemm_f, "compute_b": gemm_b, "memory_f": memory_f,
           "memory_b": memory_b, "ep_f": comm_f, "ep_b": comm_b,
           "gemm_f": gemm_f, "gemm_b": gemm_b, "permute_f": perm_f, "permute_b": perm_b,
           "act_f": act_f, "act_b": act_b,
           # the router's (T_l x h)(h x E) GEMM: forward, and dgrad + wgrad
           "flops_f": gemm_flops + 2.0 * T_l * E * h,
           "flops_b": 2.0 * gemm_flops + 4.0 * T_l * E * h, "acts": acts,
           # of those, the inputs fine-grained offloading moves to the host (offload_modules:
           # expert_fc1 the dispatched rows, moe_act fc1's output, fused_group_mlp the grouped
           # MLP's inputs: both and fc2's)
           "acts_offload": rows * (x["off_fc1"] * e * fc1_b + x["off_moe_act"] * w1 * ab
                                   + x["off_group_mlp"] * (e * sb + w1 * ab + w2 * sb * (
                                       1.0 - x["rc_moe_act"]))),
           "latent_f": 0.0, "latent_b": 0.0}
    if latent is not None:
        for k in ("compute_f", "compute_b", "memory_f", "memory_b", "flops_f", "flops_b",
                  "acts"):
            out[k] = out[k] + latent[k]
        # (their GEMMs; the casts join the block's other elementwise work)
        out["latent_f"], out["latent_b"] = latent["compute_f"], latent["compute_b"]
    return out


def _latent_projections(x: Mapping, T_l, peak) -> dict | None:
    """A latent MoE's two projections on the T_l tokens entering the block, or None without
    them: fc1_latent_proj h -> L before the dispatch and fc2_latent_proj L -> h after the
    combine (Megatron-Core d98e8a6 moe_layer.py L265 - 300, preprocess L489,
    postprocess L591), Transformer Engine Linears in the job's GEMM format with
    parallel_mode "duplicated" - the whole matrices on every TP rank, on its own
    sequence-parallel shard, no TP collective. Their inputs are cast as a linear's are (2 B
    read, the low-precision copy written; twice in the backward) and kept for the backward:
    fc2's L-wide input its own tensor, fc1's h-wide one (the norm output the router and the
    shared expert read too) only where the stack keeps a low-precision copy of its own (in
    16 bits autograd keeps that one tensor once: calibrated._activation_bytes_per_layer
    counts it). Not modelled: the all-reduce of their weight gradients over the TP group (2
    h L gradients a layer once a step: 17 MB a layer in bf16, ~0.7 GB a step for Nemotron 3
    Super)."""
    if not np.any(as_array(x["latent"]) > 0):
        return None
    has = np.where(as_array(x["latent"]) > 0, 1.0, 0.0)  # (a stacked context's other jobs)
    h, L = x["e"], x["latent"]
    ab, sb, ob = x["act_bytes"], x["saved_in_bytes"], x["gemm_operand_bytes"]
    eff = x["gemm_eff"] * x["gemm_sustained"]
    if np.any(as_array(x["bf16_latent"]) > 0):
        # (bf16_latent: 16-bit GEMMs at the 16-bit peak, inputs neither cast nor kept
        # quantized: calibrated.make_context's B16_PREFIX entries)
        on = as_array(x["bf16_latent"]) > 0
        peak = np.where(on, x["peak16_flops_per_s"], peak)
        ob = np.where(on, x["b16:gemm_operand_bytes"], ob)
        sb = np.where(on, x["b16:saved_in_bytes"], sb)
        x = dict(x, fp8=np.where(on, 0.0, x["fp8"]))
    shapes = [(T_l, L, h), (T_l, h, L)]
    gemm_f = sum(gemm_s(m, n, kk, x, peak, eff, operand_bytes=ob) for m, n, kk in shapes)
    gemm_b = sum(gemm_s(m, kk, n, x, peak, eff, operand_bytes=ob)
                 + gemm_s(kk, n, m, x, peak, eff, operand_bytes=ob) for m, n, kk in shapes)
    cast_bytes = x["fp8"] * (ab + x["lp_copy_bytes"]) * T_l * (h + L)
    cast_kernels = 2.0 * x["fp8"]
    flops = 2.0 * 2.0 * T_l * h * L
    own_copy = np.where(sb < ab, 1.0, 0.0)  # (fc1's input a quantized copy of its own)
    return {"compute_f": has * gemm_f, "compute_b": has * gemm_b,
            "memory_f": has * memory_s(cast_bytes, x, cast_kernels),
            "memory_b": has * memory_s(2.0 * cast_bytes, x, 2.0 * cast_kernels),
            "flops_f": has * flops, "flops_b": has * 2.0 * flops,
            "acts": has * T_l * (own_copy * h + L) * sb}

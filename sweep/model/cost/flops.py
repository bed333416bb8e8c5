"""Model FLOPs of one training iteration (the MFU numerator), shared by every profile.

Convention of PaLM (Chowdhery et al. 2022, appendix B) and Megatron-LM (Narayanan et al.
2021, eq. 3 without the recompute term): forward = 2 FLOPs per multiply-accumulate of every
weight matrix per token (the LM head; not the embedding, a lookup), plus the attention score
and context products; training = 3 x forward (backward = 2 x forward), forward-only jobs 1 x.
Unlike those two, which count the whole score matrix, causal attention counts half of it,
as FlashAttention's benchmarks do (docs/model.md, "Memory and FLOP conventions").

Mixture-of-experts, MLA and multi-token-prediction layers are counted as Megatron-LM and
Megatron-Bridge count them (``megatron/training/training.py`` and Megatron-Bridge
``training/utils/flop_utils.py``, ``transformer_flops``; docs/notes/moe-research.md section
2): a token passes through its top_k routed experts and the shared ones; the router, norms
(but MLA's two LoRA norms) and elementwise work are not counted; an MTP layer is one more
transformer layer (of the last layer's kind) plus its 2h x h projection, its three norms and
one more LM head.
"""

from __future__ import annotations

from ..job import CSA_RATIO, HCA_RATIO, Job

__all__ = ["model_flops_per_iteration", "matmul_params_per_layer", "model_flops_per_token",
           "csa_keys_per_query", "dsa_keys_per_query"]


def matmul_params_per_layer(job: Job, moe: bool = False) -> int:
    """Weights that take part in a GEMM per token in one block (no norms, no biases): a
    dense block, or an MoE block's top_k routed and its shared experts (no router) and a
    latent MoE's two projections (Megatron-Bridge v0.6.0 training/utils/flop_utils.py L526 -
    536: routed experts on moe_latent_size, plus 4 b s h L for the projections). MLA's two
    LoRA norms are counted, as Megatron counts them."""
    # (csa: without its heads' sink logits, which Megatron-Bridge does not count; a DSA
    # indexer's FLOPs _dsa_flops_per_token counts)
    attention = job.attention_params() - (job.n_heads if job.attention == "csa" else 0)
    if not moe:
        return attention + job.ffn_params(job.ffn_hidden)
    return (attention + job.ffn_params(job.shared_ffn_hidden)
            + job.top_k * job.ffn_params(job.moe_ffn_hidden, job.moe_width)
            + 2 * job.hidden * job.moe_latent_size)


def _core_flops_per_token(job: Job) -> float:
    """Forward score and context products per token per layer: 2 x keys x heads x (q/k width
    + v width), the keys a query sees on average: half the sequence when causal (MHA: 4 s H d
    / 2), the whole otherwise; in a sliding-window layer the window, less the first queries'
    shorter histories (W - W (W - 1) / 2s when causal, at most 2W + 1 otherwise; W at most
    s), averaged over the windowed and full layers."""
    s, w = job.seq_len, job.sliding_window
    keys = 0.5 * s if job.causal else float(s)
    if w:
        w = min(w, s)  # (a window past the sequence is no window: the formula peaks at s)
        windowed = min(keys, w - w * (w - 1) / (2.0 * s) if job.causal else 2.0 * w + 1.0)
        share = job.windowed_layer_fraction
        keys = (1.0 - share) * keys + share * windowed
    if job.attention == "mla":
        qk, v = job.qk_nope_head_dim + job.qk_rope_head_dim, job.v_head_dim
    else:
        qk = v = job.head_dim
    return 2.0 * keys * job.n_heads * (qk + v)


def csa_keys_per_query(job: Job, executed: bool = False) -> tuple[float, float, float]:
    """Keys a query of a csa layer attends to on average, as Megatron-Bridge v0.6.0 counts
    them (training/utils/flop_utils.py L930 - 956): (window-only, ratio-4, ratio-128
    layer). A window-only layer the window; a ratio-128 layer also every compressed entry
    before the query, half of s / 128 on average; a ratio-4 layer the indexer's top k of its
    s / 4 entries, k (1 - 4 k / 2 s) on average with k = min(index_topk, s / 4) (a query
    within the first 4 k tokens has fewer). A window past the sequence is the sequence
    (Megatron-Bridge's formula, never run so, would count keys that do not exist);
    ``executed``: the window as the kernels visit it, fewer for the first queries (W - W (W -
    1) / 2s, as _core_flops_per_token), where Megatron-Bridge counts W whole."""
    s = job.seq_len
    w = float(min(job.sliding_window, s))
    if executed:
        w = w - w * (w - 1.0) / (2.0 * s)
    k = min(job.index_topk, s // CSA_RATIO)
    r4 = w + (k * (1.0 - k * CSA_RATIO / (2.0 * s)) if k else 0.0)
    return w, r4, w + (s // HCA_RATIO) / 2.0


def dsa_keys_per_query(job: Job) -> float:
    """Keys a query of a DeepSeek-sparse-attention layer attends to on average: the
    indexer's top k of the tokens up to it, all of them while fewer (Megatron-LM d98e8a6
    dsa_cudnn_kernels.py: effective_topk = min(index_topk, keys), the valid entries
    compacted and counted by topk_length, L283, L982 - 990, L2157): the mean over the
    positions p = 1 .. s of min(k, p), k - k (k - 1) / 2s when s >= k, else (s + 1) / 2 -
    Megatron-Bridge's sparse_causal_context (flop_utils.py @52fc01b)."""
    s, k = job.seq_len, job.index_topk
    return k - k * (k - 1) / (2.0 * s) if s >= k else (s + 1) / 2.0


def _dsa_flops_per_token(job: Job, training: bool) -> float:
    """FLOPs per token of every DSA layer's sparse attention and indexer, the MTP depths'
    included, forward and backward, as Megatron-Bridge counts them since its PR #5324
    (main 52fc01b, 2026-08-05, flop_utils.py "dsa" branch; v0.6.0 counted dense causal MLA):
    absorbed attention 3 x 2 x keys x H x (kv_lora + rope + kv_lora) over the mean chosen
    keys (dsa_keys_per_query); on the layers that compute their top-k (IndexShare:
    Job.indexer_layers, the MTP depths numbered apart) the indexer's projections forward and
    weight gradient (4 x weights; untrained 2 x), its scores 2 x heads x (width + 1) per
    earlier token ((s + 1) / 2), their gradient on the chosen keys alone (4 x, the sparse KL
    loss), and the loss's target logits 2 x keys x H x (kv_lora + rope) - no loss when not
    training or without index_loss."""
    layers = job.n_layers + job.mtp_layers
    computing = job.indexer_layers() + job.indexer_layers(job.mtp_layers)
    s, H, ih, idim = job.seq_len, job.n_heads, job.index_heads, job.index_head_dim
    keys, dense = dsa_keys_per_query(job), (s + 1) / 2.0
    qk, v = job.kv_lora_rank + job.qk_rope_head_dim, job.kv_lora_rank
    projections = job.q_lora_rank * ih * idim + job.hidden * idim + job.hidden * ih
    score = ih * (idim + 1)
    trains = training and job.index_loss
    indexer = (4.0 if trains else 2.0) * projections + 2.0 * dense * score
    if trains:
        indexer += 4.0 * keys * score + 2.0 * keys * H * qk
    return layers * (3.0 if training else 1.0) * 2.0 * keys * H * (qk + v) \
        + computing * indexer


def _csa_flops_per_token(job: Job) -> float:
    """Forward FLOPs per token of every csa layer's sparse attention, compressors and
    indexer, the MTP depths' (window-only) included (Megatron-Bridge v0.6.0 flop_utils.py
    L904 - 968): heads x keys x (head_dim for QK^T and again for PV) multiply-adds; a ratio-4
    layer's compressor h x 2 x 2 head_dim, a ratio-128 one's h x 2 head_dim; the indexer's
    compressor h x 2 x 2 index_head_dim, its queries q_lora x heads x width, head weights
    h x heads and scores heads x width x s / 4 (not halved for causality there)."""
    e, H, D, s = job.hidden, job.n_heads, job.head_dim, job.seq_len
    n4, n128 = job.csa_layers, job.hca_layers
    n0 = job.n_layers - n4 - n128 + job.mtp_layers
    k0, k4, k128 = csa_keys_per_query(job)
    ih, idim = job.index_heads, job.index_head_dim
    sparse = H * D * 2.0 * (n0 * k0 + n4 * k4 + n128 * k128)
    compressors = n4 * e * 2 * D * 2 + n128 * e * D * 2
    indexer = n4 * (e * 2 * idim * 2 + job.q_lora_rank * ih * idim + e * ih
                    + ih * idim * (s // CSA_RATIO))
    return 2.0 * (sparse + compressors + indexer)


def model_flops_per_token(job: Job, training: bool = True) -> float:
    """FLOPs per token of one iteration (3 x forward when training)."""
    moe_layers = job.moe_layers
    dense_layers = job.blocks - moe_layers
    last_is_moe = job.last_layer_is_moe
    mtp = job.mtp_layers
    moe_total = moe_layers + (mtp if last_is_moe else 0)
    dense_total = dense_layers + (0 if last_is_moe else mtp)
    fwd = 2.0 * (dense_total * matmul_params_per_layer(job)
                 + moe_total * matmul_params_per_layer(job, moe=True))
    dsa = 0.0  # (DSA's own, forward and backward: its indexer is not 3 x a forward)
    if job.dsa:
        dsa = _dsa_flops_per_token(job, training)
    elif not job.is_hybrid:
        fwd += _csa_flops_per_token(job) if job.attention == "csa" else \
            (job.attention_layers + mtp) * _core_flops_per_token(job)
    if not job.is_hybrid:
        fwd += 2.0 * mtp * (2 * job.hidden**2 + 3 * job.hidden)  # MTP projection and norms
    else:
        # a hybrid's FFN layers hold no attention, its attention layers stand alone
        # (counted above as blocks); a Mamba-2 layer as Megatron-Bridge counts it
        # (training/utils/flop_utils.py, hybrid models): in_proj 2 h (2 d_in + 2 G N +
        # heads), the scan 7 d_in N, out_proj 2 d_in h - with the mixer's own d_in, where
        # Megatron-Bridge's formula takes d_in = 2 h. An MTP depth adds its mtp_pattern's
        # layers and an LM head, not its projection and norms (Megatron-Bridge v0.6.0
        # flop_utils.py: Megatron-Core get_hybrid_layer_counts adds the MTP pattern's
        # layers per depth; eh_proj is counted in the transformer path alone)
        d_in = job.mamba_inner
        mtp_attention, mtp_mamba = job.mtp_mixers
        attention = job.attention_layers + mtp * mtp_attention
        fwd += attention * _core_flops_per_token(job)
        fwd += 2.0 * (attention - job.blocks - mtp) * job.attention_params()
        fwd += (job.mamba_layers + mtp * mtp_mamba) * (
            2.0 * job.hidden * job.mamba_in_width + 7.0 * d_in * job.mamba_state
            + 2.0 * d_in * job.hidden)
    fwd += 2.0 * job.hidden * job.vocab * (1 + mtp)  # LM head(s)
    return (3.0 if training else 1.0) * fwd + dsa


def model_flops_per_iteration(job: Job, training: bool = True) -> float:
    """FLOPs of one iteration over the global batch (all GPUs together)."""
    return model_flops_per_token(job, training) * float(job.global_batch) * job.seq_len

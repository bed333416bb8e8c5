"""Training workloads: ``jobs/*.yaml`` -> :class:`Job`.

A job is a dense transformer and how it is trained: its dimensions, the sequence length,
the global batch (in sequences) and the precision. Example::

    name: llama3_8b
    source: Meta Llama 3 model card / config.json
    n_layers: 32
    hidden: 4096
    ffn_hidden: 14336
    n_heads: 32
    n_kv_heads: 8
    vocab: 128256
    seq_len: 8192
    global_batch: 512
    mlp: swiglu
    norm: rmsnorm
    dtype: bf16

Limits: every integer field has an upper bound (:data:`INT_MAX`), generously above any real
model, and ``global_batch x seq_len`` is at most :data:`MAX_TOKENS_PER_BATCH`, so that the
integer products of the cost model (micro-batch x sequence x width, in int64) cannot
overflow; float fields are finite.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from .units import brief, finite_float, integral, name_problem

__all__ = ["Job", "parse_job", "override_job", "INT_MAX", "MAX_TOKENS_PER_BATCH"]

_INT_FIELDS = {
    "n_layers": "transformer blocks",
    "hidden": "model (embedding) width e",
    "ffn_hidden": "MLP inner width f",
    "n_heads": "attention (query) heads",
    "n_kv_heads": "key/value heads (GQA/MQA); default n_heads",
    "head_dim": "width of one head; default hidden / n_heads",
    "vocab": "vocabulary size; 0 = no embedding / LM head modelled",
    "seq_len": "tokens per sequence",
    "global_batch": "sequences per iteration",
    # mixture of experts (0 = a dense model)
    "n_experts": "routed experts per MoE layer; 0 = dense",
    "top_k": "routed experts per token",
    "moe_ffn_hidden": "FFN inner width of one routed expert",
    "shared_ffn_hidden": "total FFN inner width of the shared expert(s); 0 = none",
    "first_k_dense": "leading dense (non-MoE) layers",
    "moe_layer_step": "after the dense layers, every moe_layer_step-th layer is MoE (1 = all)",
    "router_groups": "expert groups of group-limited routing; 0 = none",
    "router_group_topk": "groups one token may route to",
    "moe_latent_size": "latent MoE (Nemotron 3 Super): the width tokens are projected down to "
                       "before the dispatch and the routed experts, and back up after the "
                       "combine; 0 = the routed experts work at the model width",
    # multi-head latent attention (DeepSeek-V2/V3); 0 = not MLA
    "q_lora_rank": "MLA query compression rank; 0 = queries not compressed",
    "kv_lora_rank": "MLA key/value compression rank",
    "qk_nope_head_dim": "MLA per-head query/key width without position encoding",
    "qk_rope_head_dim": "MLA per-head query/key width carrying RoPE",
    "v_head_dim": "MLA per-head value width",
    "mtp_layers": "multi-token-prediction layers (DeepSeek-V3); not counted in n_layers",
    # DeepSeek-V4's compressed sparse attention (attention: csa; Megatron-Core
    # experimental_attention_variant dsv4_hybrid): every layer attends to a sliding window
    # of sliding_window tokens, csa_layers add ratio-4 compressed entries of which an
    # indexer picks index_topk, hca_layers add every ratio-128 compressed entry
    "o_lora_rank": "csa: rank of the grouped low-rank output projection (o_lora_rank)",
    "o_groups": "csa: head groups of the output projection, each to o_lora_rank (o_groups)",
    "csa_layers": "csa: layers whose keys add ratio-4 compressed entries chosen by the "
                  "indexer (compress_ratios 4)",
    "hca_layers": "csa: layers whose keys add every ratio-128 compressed entry "
                  "(compress_ratios 128); the other layers attend to the window alone",
    "index_heads": "csa, or MLA with DeepSeek sparse attention (DSA): the indexer's heads "
                   "(index_n_heads)",
    "index_head_dim": "csa, DSA: width of one indexer head (index_head_dim)",
    "index_topk": "csa: compressed entries the indexer picks per query; DSA (attention: mla "
                  "with the indexer: DeepSeek-V3.2, GLM-5): the earlier tokens each query "
                  "attends to (index_topk)",
    "index_topk_freq": "DSA IndexShare (GLM-5.2): consecutive layers sharing one layer's top-k, "
                       "the others skipping their indexer (Megatron-Core "
                       "dsa_indexer_topk_freq); 1 = every layer its own",
    "index_skip_topk_offset": "DSA IndexShare: layers before this one compute their own top-k "
                              "(dsa_indexer_skip_topk_offset; GLM-5.2: 3)",
    "hc_streams": "hyper-connections (DeepSeek-V4 mHC): residual streams of the model "
                  "width a token carries (hc_mult); 0 = a plain residual",
    # per-layer precision of fp8 / MXFP8 / NVFP4 jobs (Megatron-Core first_last_layers_bf16)
    "bf16_first_layers": "fp8 / MXFP8 / NVFP4 jobs: the first layers of the stack run their "
                         "GEMMs in 16 bits (Megatron-Core num_layers_at_start_in_bf16; a "
                         "hybrid's layers are its pattern's symbols)",
    "bf16_last_layers": "fp8 / MXFP8 / NVFP4 jobs: the last layers run their GEMMs in 16 bits "
                        "(num_layers_at_end_in_bf16)",
    # sliding-window attention (GPT-OSS, Gemma, Mistral); 0 = every layer attends to the
    # whole (causal) sequence
    "sliding_window": "tokens a query of a windowed layer attends to (itself included); 0 = "
                      "no windowed layers",
    "full_attention_every": "with sliding_window: every full_attention_every-th layer attends "
                            "to the whole sequence, the others to the window (GPT-OSS: 2, "
                            "Megatron-Core window_attn_skip_freq); 0 = every layer windowed",
    # hybrid Mamba-2 / Transformer models (hybrid_pattern): the Mamba-2 mixer's dimensions
    # (Megatron-Core MambaMixer: mamba_num_heads, mamba_head_dim, mamba_state_dim,
    # mamba_num_groups, d_conv)
    "mamba_heads": "Mamba-2 heads of a Mamba layer (hybrid_pattern)",
    "mamba_head_dim": "width of one Mamba-2 head (d_inner = mamba_heads x mamba_head_dim)",
    "mamba_state": "Mamba-2 state size N (d_state)",
    "mamba_groups": "Mamba-2 groups sharing B and C (ngroups)",
    "mamba_conv": "width of the Mamba-2 causal convolution (d_conv)",
}
#: integer fields that may be 0
_ZERO_OK = {"vocab", "n_experts", "top_k", "moe_ffn_hidden", "shared_ffn_hidden",
            "moe_latent_size", "first_k_dense", "router_groups", "router_group_topk",
            "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
            "v_head_dim", "mtp_layers", "sliding_window", "full_attention_every",
            "o_lora_rank", "o_groups", "csa_layers", "hca_layers", "index_heads",
            "index_head_dim", "index_topk", "index_skip_topk_offset", "hc_streams",
            "bf16_first_layers",
            "bf16_last_layers", "mamba_heads", "mamba_head_dim",
            "mamba_state", "mamba_groups", "mamba_conv"}
#: the fields of an MoE model, and of MLA attention (validated together)
MOE_FIELDS = ("top_k", "moe_ffn_hidden", "shared_ffn_hidden", "moe_latent_size",
              "first_k_dense", "moe_layer_step", "router_groups", "router_group_topk", "router",
              "capacity_factor", "moe_imbalance", "moe_dispatcher")
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
              "v_head_dim")
#: the fields of DeepSeek-V4's compressed sparse attention (attention: csa) alone
CSA_FIELDS = ("o_lora_rank", "o_groups", "csa_layers", "hca_layers", "index_heads",
              "index_head_dim", "index_topk")
#: the indexer's fields, which MLA attention takes too: DeepSeek sparse attention (DSA,
#: DeepSeek-V3.2 and GLM-5; Megatron-Core experimental_attention_variant dsa)
INDEXER_FIELDS = ("index_heads", "index_head_dim", "index_topk")
#: compression ratios of csa's two compressed kinds of layer (Megatron-Bridge v0.6.0
#: flop_utils.py L928 - 935: "Only 0, 4, and 128 are supported")
CSA_RATIO, HCA_RATIO = 4, 128
#: the Mamba-2 mixer's fields (a hybrid_pattern with Mamba layers needs the first three)
MAMBA_FIELDS = ("mamba_heads", "mamba_head_dim", "mamba_state", "mamba_groups", "mamba_conv")
#: symbols of a hybrid layer pattern (Megatron-Core hybrid_override_pattern,
#: megatron/core/ssm/mamba_hybrid_layer_allocation.py Symbols): a Mamba-2 mixer, an
#: attention mixer, an MLP, an MoE layer; every symbol is one layer with its own pre-norm and
#: residual
HYBRID_SYMBOLS = {"M": "Mamba-2", "*": "attention", "-": "MLP", "E": "MoE"}
#: upper bound of each integer field (real models: <= ~200 layers, widths <= ~100k,
#: vocabularies <= ~256k, contexts <= ~10M tokens)
INT_MAX = {
    "n_layers": 2**16, "hidden": 2**20, "ffn_hidden": 2**22, "n_heads": 2**16,
    "n_kv_heads": 2**16, "head_dim": 2**16, "vocab": 2**24, "seq_len": 2**24,
    "global_batch": 2**24, "n_experts": 2**16, "top_k": 2**16, "moe_ffn_hidden": 2**22,
    "shared_ffn_hidden": 2**22, "moe_latent_size": 2**20, "first_k_dense": 2**16 - 1,
    "moe_layer_step": 2**16,
    "router_groups": 2**16, "router_group_topk": 2**16, "q_lora_rank": 2**20,
    "kv_lora_rank": 2**20, "qk_nope_head_dim": 2**16, "qk_rope_head_dim": 2**16,
    "v_head_dim": 2**16, "mtp_layers": 2**8, "sliding_window": 2**24,
    "full_attention_every": 2**16, "o_lora_rank": 2**20, "o_groups": 2**16,
    "csa_layers": 2**16, "hca_layers": 2**16, "index_heads": 2**16, "index_head_dim": 2**16,
    "index_topk": 2**24, "index_topk_freq": 2**16, "index_skip_topk_offset": 2**16,
    "hc_streams": 2**6, "bf16_first_layers": 2**16,
    "bf16_last_layers": 2**16, "mamba_heads": 2**16, "mamba_head_dim": 2**16,
    "mamba_state": 2**16, "mamba_groups": 2**16, "mamba_conv": 2**8,
}
#: global_batch x seq_len, at most (~7e10 tokens per iteration; real: ~1.6e7). With widths
#: <= 2**22 this keeps micro-batch x sequence x width below 2**58, inside int64.
MAX_TOKENS_PER_BATCH = 2**36
_CHOICES = {
    # relu2: squared ReLU (Nemotron-H), two matrices like GELU
    "mlp": ("gelu", "swiglu", "relu2"),
    "norm": ("layernorm", "rmsnorm"),
    "dtype": ("bf16", "fp16", "fp8", "mxfp8", "nvfp4", "fp32"),
    "position": ("learned", "rope", "none"),
    # how the training stack runs it (calibrated profile)
    "attention_kernel": ("flash", "fused", "materialized"),
    # fp32: fp32 main gradients; bf16: 16-bit gradients; mixed: 16-bit gradients plus an fp32
    # accumulation buffer (DeepSpeed BF16Optimizer)
    "grad_dtype": ("fp32", "bf16", "mixed"),
    # MoE router score function; attention: multi-head (MHA / GQA / MQA) or latent (MLA)
    "router": ("softmax", "sigmoid"),
    # fp8 scaling: delayed (scale from the amax history, amax recorded in the cast), current
    # (the tensor's own amax: one more read before the cast), rowwise (torchao's
    # axiswise recipe: a scale per row, every operand quantized from 16 bits along each
    # axis a GEMM reads it, the backward GEMMs' outputs rescaled, 16-bit communication) or
    # blockwise (DeepSeek-V3's recipe, TE Float8BlockScaling: an fp32 scale per 1 x 128
    # block of activations and gradients, per 128 x 128 block of weights; run as MXFP8 on
    # Blackwell)
    "fp8_scaling": ("delayed", "current", "rowwise", "blockwise"),
    # a low-precision job's Mamba-2 out_proj in another format (a quantization recipe's
    # per-module override: Megatron-Bridge's Nemotron 3 Super NVFP4 te_quant.cfg runs it in
    # MXFP8); unset: the job's
    "mamba_out_dtype": ("bf16", "fp8", "mxfp8", "nvfp4"),
    # DeepSeek-V4's compressed sparse attention (csa: Megatron-Core dsv4_hybrid)
    "attention": ("mha", "mla", "csa"),
    # how MoE tokens travel to their experts: alltoall (NCCL all-to-all, one copy per routed
    # expert) or flex (DeepEP / HybridEP: one copy per destination GPU over NVLink and one per
    # destination NVLink domain over the NICs; Megatron-Core moe_token_dispatcher_type=flex)
    "moe_dispatcher": ("alltoall", "flex"),
    # Adam's moments and master weights under Megatron-Core's precision-aware optimizer
    # (optimizer_config.py exp_avg_dtype, exp_avg_sq_dtype, main_params_dtype; Transformer
    # Engine FusedAdam: fp32, fp16, bf16 or fp8 moments, fp32 or fp16 master weights)
    "exp_avg_dtype": ("fp32", "bf16", "fp16", "fp8"),
    "exp_avg_sq_dtype": ("fp32", "bf16", "fp16", "fp8"),
    "main_params_dtype": ("fp32", "fp16"),
}
_BOOL_FIELDS = {
    "causal": "causal (decoder) attention; false = full (encoder / ViT) attention",
    "dropout": "dropout layers present",
    "mlp_dropout": "with dropout, also one on the MLP's hidden activation (timm's ViT Mlp); "
                   "Megatron's GPT has dropout after attention and the MLP only",
    "bias": "linear layers carry biases",
    "tied_embeddings": "LM head shares the embedding matrix",
    "fused_kernels": "norms / activations / residuals fused (TE, apex, torch.compile)",
    "dp_overlap": "data-parallel communication overlapped with compute",
    "pp_overlap": "interleaved pipelines overlap their p2p sends with compute (Megatron-Core "
                  "overlap_p2p_comm)",
    "fused_loss": "fused cross-entropy: 16-bit logits and gradient, no fp32 copy",
    "embedding_slots": "the pipeline split counts the embedding and the LM head as a layer "
                       "each (Megatron-DeepSpeed type:transformer|embedding, Megatron-Core "
                       "account_for_embedding/loss_in_pipeline_split)",
    "training": "false = forward only (inference)",
    "lp_saved_inputs": "fp8 / MXFP8 / NVFP4 jobs keep the inputs of their linear layers for "
                       "the backward pass in the low-precision format, with its scales "
                       "(Transformer Engine); false: in 16 bits (torchao float8 in eager mode)",
    "lp_norm_cast": "fp8 / MXFP8 / NVFP4 jobs: the norm before the QKV and first MLP "
                    "projections writes its output straight in the low-precision format "
                    "(Transformer Engine LayerNormLinear); false: a separate cast kernel",
    "recompute_norms": "the norm outputs are recomputed in the backward instead of kept "
                       "(Megatron-Core recompute_modules layernorm), on top of the "
                       "configuration's recompute policy",
    "recompute_moe_act": "MoE: the experts' activation function output is recomputed "
                         "(Megatron-Core recompute_modules moe_act)",
    "recompute_moe": "MoE: the whole MoE layer (router, dispatch, experts, combine) is "
                     "recomputed from its input (Megatron-Core recompute_modules moe)",
    "recompute_mla_up": "MLA: the query/key/value up-projections are recomputed "
                        "(Megatron-Core recompute_modules mla_up_proj)",
    "tp_async_bwd": "without TP communication overlap, the column-parallel linears' backward "
                    "collectives run behind their dgrad / wgrad GEMMs (Transformer Engine's "
                    "Linear and LayerNormLinear); false: every TP collective waits",
    "lp_params": "fp8 / MXFP8 jobs hold their weights only in the low-precision format, "
                 "without a 16-bit copy (Megatron fp8_param_gather, TE fp8_model_init); the "
                 "fp32 master copy stays in the optimizer",
    "mtp_shared": "the mtp_layers depths share one depth's weights, each still run forward "
                  "and backward (Megatron-Core mtp_use_repeated_layer)",
    "mtp_bf16": "fp8 / MXFP8 / NVFP4 jobs run the MTP depths' GEMMs in 16 bits "
                "(Megatron-Bridge keep_mtp_spec_in_bf16; NVFP4 jobs' depths always)",
    "bf16_attention": "fp8 / MXFP8 / NVFP4 jobs run the attention layers' QKV and output "
                      "projections in 16 bits (a quantization recipe's per-module override: "
                      "Megatron-Bridge's Nemotron 3 Super NVFP4 te_quant.cfg)",
    "bf16_latent": "fp8 / MXFP8 / NVFP4 jobs run a latent MoE's two projections in 16 bits "
                   "(the same recipe)",
    "index_loss": "DSA: the indexer is trained by its KL loss on the chosen keys (GLM-5's "
                  "use_sparse_loss); false: a loss coefficient of 0, the top-k under no_grad",
    "precision_aware_optimizer": "Adam runs in Transformer Engine's FusedAdam with the "
                                 "states' formats of exp_avg_dtype, exp_avg_sq_dtype and "
                                 "main_params_dtype, reading the gradients as held "
                                 "(grad_dtype: Megatron-Core's main_grads_dtype) "
                                 "(Megatron-Core use_precision_aware_optimizer; it needs a "
                                 "distributed optimizer: ZeRO >= 1)",
    "store_param_remainders": "with the precision-aware optimizer, an fp32 master weight of "
                              "a bf16 parameter keeps only its 16 low bits, the bf16 "
                              "parameter holding the high ones (Transformer Engine FusedAdam; "
                              "Megatron-Core's default)",
}
#: Megatron-Core's offloadable module inputs (transformer_config.py offload_modules, less
#: gdp_qkv: no GatedDeltaProduct mixer here), in its order
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm",
                   "expert_fc1", "moe_act", "fused_group_mlp")
_TEXT_FIELDS = {"name": "short id; default the file name", "source": "where the numbers come from",
                "notes": "free text",
                "hybrid_pattern": "a hybrid Mamba-2 / Transformer model's layers in order, one "
                                  "symbol each (Megatron-Core hybrid_override_pattern): M "
                                  "Mamba-2, * attention, - MLP, E MoE; n_layers is its length",
                "offload_modules": "modules whose inputs go to host memory after the forward "
                                   "and come back for the backward (Megatron-Core "
                                   "fine_grained_activation_offloading, offload_modules), "
                                   "joined by +: " + "+".join(OFFLOAD_MODULES),
                "mtp_pattern": "a hybrid model's multi-token-prediction depth, in "
                               "hybrid_pattern's symbols with one MLP or MoE layer "
                               "(Megatron-Core mtp_hybrid_override_pattern: Nemotron 3 "
                               "Super's *E)"}
_FLOAT_FIELDS = {
    "buffers_GiB": "fixed framework buffers (e.g. DeepSpeed ZeRO buckets), GiB",
    "zero3_live_params": "ZeRO-3: most gathered parameters held at once (DeepSpeed "
                         "stage3_max_live_parameters); 0 = two whole layers (FSDP prefetch)",
    "grad_bucket_params": "ZeRO-2/3: unsharded gradients held before their reduce-scatter "
                          "(DeepSpeed reduce_bucket_size); 0 = one whole layer",
    "grad_accum_bytes": "memory traffic per parameter and micro-batch to accumulate gradients "
                        "outside the weight-gradient GEMMs, bytes: 0 = fused into the GEMM "
                        "(Megatron gradient_accumulation_fusion), 6 = autograd adds into "
                        "16-bit gradients, 18 = DeepSpeed BF16Optimizer's fp32 cast and add",
    "offload_act_layers": "activations of this many layers per pipeline stage are kept in "
                          "host memory, copied out and back behind compute (Megatron-Core "
                          "cpu_offloading_num_layers); 0 = none",
    "capacity_factor": "MoE expert capacity as a multiple of the even share of tokens "
                       "(tokens beyond it are dropped, experts padded to it); 0 = dropless",
    "moe_imbalance": "MoE: tokens of the most loaded expert-parallel rank over the even "
                     "share, beyond the statistical spread of random routing; 1 = balanced "
                     "(force-balanced benchmarks; the least allowed)",
    "rope_mscale": "attention scale YaRN folds into the rotary cos / sin (Megatron-Core "
                   "YarnRotaryEmbedding: mscale over mscale_all_dim; GPT-OSS 1.3466); 1 = "
                   "none. Other than 1, Megatron-Core applies RoPE unfused, 0 = 1",
    "swiglu_clamp": "SwiGLU inputs clamped to this magnitude before the activation (GPT-OSS: "
                    "7); 0 = none. Megatron-Core clamps and concatenates them in separate "
                    "kernels before its fused activation",
}


@dataclass(frozen=True)
class Job:
    """One training workload (integer sizes are counts, not bytes)."""

    name: str
    n_layers: int
    hidden: int
    ffn_hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    seq_len: int
    global_batch: int
    mlp: str = "gelu"
    norm: str = "layernorm"
    dtype: str = "bf16"
    position: str = "learned"
    causal: bool = True
    dropout: bool = False
    mlp_dropout: bool = False  # (with dropout) one more on the MLP's hidden activation
    bias: bool = False
    tied_embeddings: bool = False
    # flash (FlashAttention-2 class), fused (cuDNN / FA3) or materialized score matrix
    attention_kernel: str = "flash"
    fused_kernels: bool = True  # elementwise ops fused (TE / apex / torch.compile)
    dp_overlap: bool = True  # gradient / parameter collectives overlapped with compute
    pp_overlap: bool = True  # interleaved pipelines overlap p2p with compute
    fused_loss: bool = False  # fused cross-entropy (no fp32 logits copy)
    grad_dtype: str = "fp32"  # gradients: fp32, bf16, or mixed (bf16 + fp32 accumulation)
    # Adam's states' formats (Megatron-Core precision-aware optimizer; fp32 without it)
    precision_aware_optimizer: bool = False
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"
    main_params_dtype: str = "fp32"
    store_param_remainders: bool = True
    training: bool = True  # false: forward-only inference
    buffers_GiB: float = 0.0  # fixed framework buffers (communication buckets), GiB
    zero3_live_params: float = 0.0  # ZeRO-3 gathered-parameter cap; 0: two whole layers
    grad_bucket_params: float = 0.0  # ZeRO-2/3 unsharded-gradient cap; 0: one whole layer
    grad_accum_bytes: float = 0.0  # per parameter and micro-batch, outside the GEMMs
    embedding_slots: bool = False  # pipeline split counts embedding and LM head as layers
    lp_saved_inputs: bool = True  # low-precision jobs save linear inputs in that format
    lp_params: bool = False  # fp8 / MXFP8 weights without a 16-bit copy
    tp_async_bwd: bool = True  # TE: column-parallel backward collectives behind GEMMs
    lp_norm_cast: bool = True  # norms write the QKV / fc1 inputs quantized (TE)
    fp8_scaling: str = "delayed"  # fp8: delayed, current, rowwise or blockwise scaling
    mamba_out_dtype: str = ""  # a Mamba-2 out_proj's own format; "": the job's
    offload_act_layers: float = 0.0  # layers per stage whose activations live in host memory
    offload_modules: str = ""  # module inputs offloaded (fine-grained), "+"-joined
    # cheap modules recomputed on top of the candidate's policy (Megatron recompute_modules)
    recompute_norms: bool = False
    recompute_moe_act: bool = False
    recompute_moe: bool = False
    recompute_mla_up: bool = False
    # mixture of experts (n_experts = 0: dense)
    n_experts: int = 0
    top_k: int = 0
    moe_ffn_hidden: int = 0  # one routed expert
    shared_ffn_hidden: int = 0  # all shared experts together
    moe_latent_size: int = 0  # routed experts' width (latent MoE); 0 = hidden
    first_k_dense: int = 0
    moe_layer_step: int = 1
    router: str = "softmax"
    router_groups: int = 0
    router_group_topk: int = 0
    capacity_factor: float = 0.0  # 0 = dropless
    moe_imbalance: float = 1.0  # load of the busiest EP rank over the even share
    moe_dispatcher: str = "alltoall"  # alltoall (NCCL) or flex (DeepEP / HybridEP)
    # attention: mha (MHA / GQA / MQA through n_kv_heads) or mla (multi-head latent)
    attention: str = "mha"
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mtp_layers: int = 0
    # compressed sparse attention (attention: csa) and hyper-connections
    o_lora_rank: int = 0
    o_groups: int = 0
    csa_layers: int = 0
    hca_layers: int = 0
    index_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    index_topk_freq: int = 1
    index_skip_topk_offset: int = 0
    index_loss: bool = True
    hc_streams: int = 0
    # per-layer and per-module precision under a low-precision recipe
    bf16_first_layers: int = 0
    bf16_last_layers: int = 0
    bf16_attention: bool = False
    bf16_latent: bool = False
    sliding_window: int = 0  # tokens a query of a windowed layer sees; 0 = no window
    full_attention_every: int = 0  # every n-th layer full attention, the others windowed
    rope_mscale: float = 1.0  # YaRN's attention scale in cos / sin; not 1: unfused RoPE
    swiglu_clamp: float = 0.0  # SwiGLU input clamp (GPT-OSS 7); 0 = none
    # hybrid Mamba-2 / Transformer models: the layer pattern ("" = every layer an attention
    # + FFN block) and the Mamba-2 mixer's dimensions
    hybrid_pattern: str = ""
    mtp_pattern: str = ""  # a hybrid's MTP depth (one FFN layer and its mixers)
    mtp_shared: bool = False  # MTP depths share one depth's weights
    mtp_bf16: bool = False  # MTP depths' GEMMs in 16 bits under a low-precision recipe
    mamba_heads: int = 0
    mamba_head_dim: int = 64
    mamba_state: int = 0
    mamba_groups: int = 1
    mamba_conv: int = 4
    source: str = ""

    @property
    def attention_width(self) -> int:
        """Width of the concatenated query heads (n_heads * head_dim)."""
        return self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of the concatenated key (or value) heads."""
        return self.n_kv_heads * self.head_dim

    @property
    def windowed_layer_fraction(self) -> float:
        """Share of the layers whose attention is the sliding window (every layer but each
        full_attention_every-th: GPT-OSS's even layers of 36, 18; HF layer_types)."""
        if not self.sliding_window:
            return 0.0
        if not self.full_attention_every:
            return 1.0
        return 1.0 - (self.n_layers // self.full_attention_every) / self.n_layers

    @property
    def bf16_end_blocks(self) -> tuple[int, int]:
        """The cost model's blocks among the bf16_first_layers and among the
        bf16_last_layers (of a hybrid, its FFN layers among those symbols of its pattern),
        a block counted once where the two overlap."""
        first = min(self.bf16_first_layers, self.n_layers)
        last = min(self.bf16_last_layers, self.n_layers - first)
        if not self.is_hybrid:
            return first, last
        pattern = self.hybrid_pattern
        def blocks(text):
            return sum(text.count(k) for k in "-E")
        return blocks(pattern[:first]), blocks(pattern[len(pattern) - last:] if last else "")

    @property
    def bf16_block_share(self) -> float:
        """Share of the cost model's blocks in 16 bits (bf16_end_blocks)."""
        return sum(self.bf16_end_blocks) / self.blocks

    @property
    def is_hybrid(self) -> bool:
        """Whether the layers follow a hybrid pattern (Mamba-2, attention, MLP / MoE layers
        each on its own) instead of attention + FFN blocks."""
        return bool(self.hybrid_pattern)

    @property
    def blocks(self) -> int:
        """The cost model's unit count: attention + FFN blocks, or in a hybrid model its FFN
        (MLP or MoE) layers, each costed with its share of the pattern's mixers."""
        if not self.is_hybrid:
            return self.n_layers
        return sum(self.hybrid_pattern.count(k) for k in "-E")

    @property
    def mtp_mixers(self) -> tuple[int, int]:
        """(attention layers, Mamba-2 layers) of one multi-token-prediction depth: its
        mtp_pattern's in a hybrid model, else one attention layer (a block)."""
        if not self.mtp_pattern:
            return 1, 0
        return self.mtp_pattern.count("*"), self.mtp_pattern.count("M")

    @property
    def mamba_layers(self) -> int:
        """Mamba-2 layers of a hybrid pattern."""
        return self.hybrid_pattern.count("M")

    @property
    def attention_layers(self) -> int:
        """Attention layers: one per block, or the pattern's attention layers."""
        return self.hybrid_pattern.count("*") if self.is_hybrid else self.n_layers

    @property
    def mamba_inner(self) -> int:
        """d_inner of a Mamba-2 mixer: heads x head width."""
        return self.mamba_heads * self.mamba_head_dim

    @property
    def mamba_in_width(self) -> int:
        """Output width of a Mamba-2 mixer's in_proj: z and x (d_inner each), B and C (G N
        each) and dt (a value per head) (Megatron-Core mamba_mixer.py)."""
        return 2 * self.mamba_inner + 2 * self.mamba_groups * self.mamba_state + self.mamba_heads

    def mamba_params(self) -> int:
        """Weights of one Mamba-2 mixer layer (Megatron-Core mamba_mixer.py MambaMixer):
        in_proj h -> (z, x, B, C, dt) = 2 d_inner + 2 G N + heads, the depthwise causal
        convolution over x, B, C (weight d_conv wide, and a bias), A_log, D and dt_bias per
        head, the gated RMSNorm over d_inner, out_proj d_inner -> h (with biases, their
        biases); and the layer's pre-norm."""
        e, d_in, w_in = self.hidden, self.mamba_inner, self.mamba_in_width
        conv = (d_in + 2 * self.mamba_groups * self.mamba_state) * (self.mamba_conv + 1)
        pre_norm = (2 if self.norm == "layernorm" else 1) * e
        biases = (w_in + e) if self.bias else 0  # (in_proj's and out_proj's)
        return e * w_in + conv + 3 * self.mamba_heads + d_in + d_in * e + pre_norm + biases

    @property
    def is_moe(self) -> bool:
        """Whether some layers are mixture-of-experts layers."""
        return self.n_experts > 0

    @property
    def dsa(self) -> bool:
        """Whether MLA attention is DeepSeek sparse attention: an indexer picks the
        index_topk earlier tokens each query attends to (DeepSeek-V3.2, GLM-5; Megatron-Core
        experimental_attention_variant dsa)."""
        return self.attention == "mla" and self.index_topk > 0

    def indexer_params(self) -> int:
        """DSA: weights of one layer's indexer (Megatron-LM d98e8a6 experimental_attention_
        variant/dsa.py DSAIndexer L1159 - 1204): linear_wq_b q_lora -> heads x width,
        linear_wk h -> width with its LayerNorm (weight and bias), linear_weights_proj h ->
        heads; 0 for other attention."""
        if not self.dsa:
            return 0
        e, ih, idim = self.hidden, self.index_heads, self.index_head_dim
        return self.q_lora_rank * ih * idim + e * idim + 2 * idim + e * ih

    def indexer_layers(self, layers: int | None = None) -> int:
        """DSA: of ``layers`` layers numbered from 1 (default the model's; an MTP stack
        numbers its own from 1), those that compute their top-k (and hold an indexer); under
        IndexShare layer n reuses another's unless (max(n - max(offset, 1), 0)) % freq == 0
        (Megatron-LM d98e8a6 dsa.py is_dsa_skip_topk_layer L37 - 47; Megatron-Bridge main
        52fc01b flop_utils.py count_indexer_layers). 0 for other attention."""
        if not self.dsa:
            return 0
        n = self.n_layers if layers is None else layers
        offset, freq = max(self.index_skip_topk_offset, 1), self.index_topk_freq
        return sum(max(k - offset, 0) % freq == 0 for k in range(1, n + 1))

    @property
    def indexer_share(self) -> float:
        """DSA: the share of the layers (MTP depths included) that compute their top-k."""
        if not self.dsa:
            return 0.0
        layers = self.n_layers + self.mtp_layers
        return (self.indexer_layers() + self.indexer_layers(self.mtp_layers)) / layers

    @property
    def moe_width(self) -> int:
        """Width of the tokens the routed experts see and the all-to-alls move: the latent
        size of a latent MoE (Megatron-Core moe_layer.py: fc1_latent_proj before the
        dispatch, fc2_latent_proj after the combine; experts.py: the experts' input and
        output are moe_latent_size wide), else the model width."""
        return self.moe_latent_size or self.hidden

    def latent_projection_params(self) -> int:
        """Weights of a latent MoE layer's two projections, hidden -> latent and back
        (Megatron-Core moe_layer.py fc1_latent_proj / fc2_latent_proj, TELinear with the
        model's bias setting); 0 without a latent size."""
        latent = self.moe_latent_size
        if not latent:
            return 0
        return 2 * self.hidden * latent + ((latent + self.hidden) if self.bias else 0)

    @property
    def moe_layers(self) -> int:
        """MoE layers: after the first_k_dense dense ones, the last of every moe_layer_step
        layers (layers k + step - 1, k + 2 step - 1, ...: Llama 4 Maverick's odd layers,
        HF Llama4TextConfig ``moe_layers``)."""
        if not self.is_moe:
            return 0
        return (self.blocks - self.first_k_dense) // self.moe_layer_step

    @property
    def last_layer_is_moe(self) -> bool:
        """Whether the last block is an MoE block (an MTP layer copies its kind)."""
        return self.is_moe and (self.blocks - self.first_k_dense) % self.moe_layer_step == 0

    def attention_params(self) -> int:
        """Weights of one attention block (projections; MLA: with its two LoRA norms).

        MLA (DeepSeek-V2, arXiv 2405.04434 section 2.1; Megatron-Core
        multi_latent_attention.py): queries h -> q_lora (norm) -> H (dn + dr), or h -> H (dn +
        dr) without compression; keys/values h -> kv_lora + dr (the shared RoPE key), kv_lora
        (norm) -> H (dn + dv); output H dv -> h.
        """
        e = self.hidden
        if self.attention == "csa":
            # DeepSeek-V4 (Megatron-Bridge v0.6.0 flop_utils.py L884 - 902; docs/notes/
            # moe-research.md 29): queries h -> q_lora (norm) -> H heads of head_dim; one
            # key-and-value head h -> head_dim (norm); output: o_groups groups of H / g heads
            # each to o_lora, then g o_lora -> h; a sink logit per head. Compressors and
            # indexers: compressor_params
            H, D, q_lora, o_lora = self.n_heads, self.head_dim, self.q_lora_rank, self.o_lora_rank
            return (e * q_lora + q_lora + q_lora * H * D + e * D + D
                    + H * D * o_lora + self.o_groups * o_lora * e + H)
        if self.attention == "mla":
            H, dn, dr, dv = (self.n_heads, self.qk_nope_head_dim, self.qk_rope_head_dim,
                             self.v_head_dim)
            q_lora, kv_lora = self.q_lora_rank, self.kv_lora_rank
            q = (e * q_lora + q_lora + q_lora * H * (dn + dr)) if q_lora else e * H * (dn + dr)
            kv = e * (kv_lora + dr) + kv_lora + kv_lora * H * (dn + dv)
            return q + kv + H * dv * e
        return e * (self.attention_width + 2 * self.kv_width) + self.attention_width * e

    def compressor_params(self) -> int:
        """Attention weights some layers hold and others do not, the model's total: csa's
        compressors and indexers (Megatron-Bridge v0.6.0 flop_utils.py L937 - 964: a ratio-4
        layer's two h -> 2 head_dim compressor linears (two overlapping windows), its
        indexer's two h -> 2 index_head_dim compressor linears, q_lora -> heads x
        index_head_dim queries and h -> heads weights; a ratio-128 layer's two h -> head_dim
        linears); DSA's indexers, in the layers that compute their top-k (a layer reusing
        another's builds none, dsa.py L1580 - 1584); 0 for other attention."""
        if self.dsa:
            return self.indexer_layers() * self.indexer_params()
        if self.attention != "csa":
            return 0
        e, D = self.hidden, self.head_dim
        indexer = (2 * e * 2 * self.index_head_dim
                   + self.q_lora_rank * self.index_heads * self.index_head_dim
                   + e * self.index_heads)
        return self.csa_layers * (2 * e * 2 * D + indexer) + self.hca_layers * 2 * e * D

    def hc_params_per_layer(self) -> int:
        """Hyper-connections: weights of one layer's two mixing modules (Megatron-Core
        d98e8a6 transformer/hyper_connection.py HyperConnectionModule: mapping_proj n h ->
        n^2 + 2 n, its bias, three gating factors; n = hc_streams); 0 without them."""
        n = self.hc_streams
        if not n:
            return 0
        return 2 * (n * self.hidden * (n * n + 2 * n) + n * n + 2 * n + 3)

    def ffn_params(self, width: int, model_width: int = 0) -> int:
        """Weights of an FFN of inner width ``width`` on tokens ``model_width`` wide (default
        the hidden size): 3 matrices with SwiGLU, else 2."""
        return (3 if self.mlp == "swiglu" else 2) * (model_width or self.hidden) * width

    def _attention_biases(self) -> int:
        return (self.attention_width + 2 * self.kv_width + self.hidden) if self.bias else 0

    def _ffn_biases(self, width: int, model_width: int = 0) -> int:
        return ((2 if self.mlp == "swiglu" else 1) * width + (model_width or self.hidden)) \
            if self.bias else 0

    def params_per_layer(self) -> int:
        """Weights of one dense block: attention projections + MLP + norms (+ biases)."""
        norms = (4 if self.norm == "layernorm" else 2) * self.hidden
        return (self.attention_params() + self._attention_biases() + norms
                + self.ffn_params(self.ffn_hidden) + self._ffn_biases(self.ffn_hidden))

    def routed_expert_params(self, experts: int | None = None) -> int:
        """Weights of ``experts`` routed experts of one block (default all of them): their
        FFN matrices (moe_width wide on the token side) and, with biases (GPT-OSS), their
        biases."""
        n = self.n_experts if experts is None else experts
        w = self.moe_width
        return n * (self.ffn_params(self.moe_ffn_hidden, w)
                    + self._ffn_biases(self.moe_ffn_hidden, w))

    def params_per_moe_layer(self, active: bool = False) -> int:
        """Weights of one MoE block: attention, the router (n_experts x hidden), the routed
        experts (all of them, or the top_k a token uses when ``active``), the shared
        expert(s), a latent MoE's two projections and the norms (expert biases, GPT-OSS,
        counted per expert)."""
        e = self.hidden
        norms = (4 if self.norm == "layernorm" else 2) * e
        return (self.attention_params() + self._attention_biases() + norms
                + self.n_experts * e  # the router
                + self.routed_expert_params(self.top_k if active else None)
                + self.ffn_params(self.shared_ffn_hidden) + self.latent_projection_params())

    def params_total(self) -> int:
        """All weights: blocks, embedding (and LM head unless tied) and the final norm
        (multi-token-prediction layers not included, as model cards count them)."""
        emb = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        pos = self.seq_len * self.hidden if self.position == "learned" and self.vocab else 0
        dense = self.blocks - self.moe_layers
        blocks = dense * self.params_per_layer() + self.moe_layers * self.params_per_moe_layer()
        if self.is_hybrid:
            # a block above holds one attention mixer; a hybrid's FFN layers hold none, and
            # its attention and Mamba layers stand alone, each with its pre-norm
            norm = (2 if self.norm == "layernorm" else 1) * self.hidden
            attention = self.attention_params() + self._attention_biases() + norm
            blocks += (self.attention_layers - self.blocks) * attention \
                + self.mamba_layers * self.mamba_params()
        blocks += self.compressor_params() + self.n_layers * self.hc_params_per_layer()
        return blocks + emb + pos + (2 if self.norm == "layernorm" else 1) * self.hidden

    def params_active(self) -> int:
        """Weights one token uses: as params_total, with top_k routed experts per MoE layer."""
        return self.params_total() - self.moe_layers * (
            self.params_per_moe_layer() - self.params_per_moe_layer(active=True))

    def record(self) -> dict[str, Any]:
        """Flat record of every field, for the ``/cases`` table."""
        return {f"job_{k}" if k != "name" else "job": v
                for k, v in dataclasses.asdict(self).items() if k != "source"}


def _fail(source: str, key: str, msg: str) -> SpecError:
    return SpecError(source, key, msg)


def _valid() -> str:
    return ", ".join(list(_TEXT_FIELDS) + list(_INT_FIELDS) + list(_CHOICES) + list(_BOOL_FIELDS)
                     + list(_FLOAT_FIELDS))


def parse_job(raw: Mapping[str, Any], source: str, default_name: str = "") -> Job:
    """Validate a job mapping (one YAML file).

    Raises:
        SpecError: unknown or missing key, bad value, or inconsistent dimensions.
    """
    if not isinstance(raw, Mapping):
        raise _fail(source, "", f"expected a mapping of job parameters, got {type(raw).__name__}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        key = str(key)
        if key in _INT_FIELDS:
            value = integral(value)  # (4.096e3, exponent form, is 4096)
            ok = isinstance(value, int) and not isinstance(value, bool)
            if not ok or value < (0 if key in _ZERO_OK else 1):
                want = "a non-negative integer" if key in _ZERO_OK else "a positive integer"
                raise _fail(source, key, f"expected {want}, got {brief(value)}")
            if value > INT_MAX[key]:
                raise _fail(source, key, f"expected at most {INT_MAX[key]}, got {brief(value)}")
        elif key in _CHOICES:
            # (mamba_out_dtype "": the job's format, as a stored job writes it)
            if value not in _CHOICES[key] and not (key == "mamba_out_dtype" and value == ""):
                raise _fail(source, key, f"expected one of {', '.join(_CHOICES[key])}, "
                                         f"got {brief(value)}")
        elif key in _BOOL_FIELDS:
            if not isinstance(value, bool):
                raise _fail(source, key, f"expected true or false, got {brief(value)}")
        elif key == "offload_modules":
            value = _offload_modules(value, source)
        elif key in _TEXT_FIELDS:
            why = name_problem(value) if key == "name" else None
            if key.endswith("_pattern") and not isinstance(value, str):
                why = f"expected a text of layer symbols, got {brief(value)}"
            if why:
                raise _fail(source, key, why)
            value = str(value)
        elif key in _FLOAT_FIELDS:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise _fail(source, key, f"expected a non-negative number, got {brief(value)}")
            number = finite_float(value)
            if number is None:
                raise _fail(source, key, f"expected a finite number, got {brief(value)}")
            value = number
        else:
            raise _fail(source, key, f"unknown key; valid keys: {_valid()}")
        values[key] = value
    _check_hybrid(values, source)
    for req in ("n_layers", "hidden", "ffn_hidden", "n_heads", "seq_len", "global_batch"):
        if req not in values:
            raise _fail(source, req, "missing")
    values.setdefault("n_kv_heads", values["n_heads"])
    if "head_dim" not in values:
        # derived; an explicit head_dim may differ (Qwen3, Gemma: n_heads x head_dim != hidden)
        if values["hidden"] % values["n_heads"]:
            raise _fail(source, "hidden", f"hidden = {values['hidden']} is not a multiple of "
                                          f"n_heads = {values['n_heads']} (or give head_dim)")
        values["head_dim"] = values["hidden"] // values["n_heads"]
    if values["global_batch"] * values["seq_len"] > MAX_TOKENS_PER_BATCH:
        raise _fail(source, "global_batch", f"global_batch x seq_len = "
                    f"{values['global_batch'] * values['seq_len']} tokens per iteration, more "
                    f"than the limit of {MAX_TOKENS_PER_BATCH}")
    if values["n_heads"] % values["n_kv_heads"]:
        raise _fail(source, "n_kv_heads", f"{values['n_kv_heads']} does not divide "
                                          f"n_heads = {values['n_heads']}")
    _check_moe(values, source)
    _check_mla(values, source)
    _check_optimizer(values, source)
    if values.get("full_attention_every") and not values.get("sliding_window"):
        raise _fail(source, "full_attention_every", "needs sliding_window (the other layers' "
                                                    "window)")
    bf16_ends = values.get("bf16_first_layers", 0) + values.get("bf16_last_layers", 0)
    if bf16_ends > values["n_layers"]:
        raise _fail(source, "bf16_last_layers" if values.get("bf16_last_layers") else
                    "bf16_first_layers", f"bf16_first_layers + bf16_last_layers = {bf16_ends}, "
                    f"more than n_layers = {values['n_layers']}")
    if bf16_ends and values.get("dtype") == "fp8" \
            and values.get("fp8_scaling", "delayed") == "delayed":
        raise _fail(source, "bf16_last_layers" if values.get("bf16_last_layers") else
                    "bf16_first_layers", "needs fp8_scaling other than delayed (Megatron-Core: "
                    "\"Delayed scaling does not support first / last layer in BF16\")")
    if values.get("mamba_out_dtype") and "M" not in values.get("hybrid_pattern", ""):
        raise _fail(source, "mamba_out_dtype", "needs Mamba-2 layers (M in hybrid_pattern)")
    if values.get("bf16_latent") and not values.get("moe_latent_size"):
        raise _fail(source, "bf16_latent", "needs moe_latent_size (the latent projections)")
    if values.get("swiglu_clamp") and values.get("mlp", "gelu") != "swiglu":
        raise _fail(source, "swiglu_clamp", "needs mlp: swiglu")
    _check_offload_modules(values, source)
    if values.get("offload_act_layers", 0.0) > values["n_layers"]:  # (per stage: at most all)
        raise _fail(source, "offload_act_layers", f"{values['offload_act_layers']:g} layers, "
                                                  f"more than n_layers = {values['n_layers']}")
    if values.get("rope_mscale") == 0:
        values["rope_mscale"] = 1.0
    values.setdefault("vocab", 0)
    values["name"] = str(values.get("name", default_name) or default_name)
    values.pop("notes", None)
    return Job(**values)


def _offload_modules(value: Any, source: str) -> str:
    """offload_modules as a YAML list or a "+"-joined text, in Megatron-Core's order."""
    if isinstance(value, (list, tuple)):
        names = [str(v) for v in value]
    elif isinstance(value, str):
        names = value.replace(",", "+").split("+")
    else:
        raise _fail(source, "offload_modules", f"expected a list of module names, got "
                                               f"{brief(value)}")
    names = [n.strip() for n in names if n.strip()]
    unknown = [n for n in names if n not in OFFLOAD_MODULES]
    if unknown:
        raise _fail(source, "offload_modules", f"unknown module {unknown[0]!r}; choices: "
                                               f"{', '.join(OFFLOAD_MODULES)}")
    return "+".join(n for n in OFFLOAD_MODULES if n in names)


def _check_offload_modules(values: dict[str, Any], source: str) -> None:
    """Megatron-Core's rules for fine-grained activation offloading (transformer_config.py
    __post_init__, d98e8a6)."""
    mods = set(filter(None, values.get("offload_modules", "").split("+")))
    if not mods:
        return
    key = "offload_modules"
    if values.get("offload_act_layers"):
        raise _fail(source, key, "cannot be combined with offload_act_layers "
                                 "(fine_grained_activation_offloading with cpu_offloading)")
    if "attn_proj" in mods and "core_attn" not in mods:
        raise _fail(source, key, "attn_proj needs core_attn (its input is core attention's "
                                 "output, which core attention's backward needs)")
    expert = mods & {"expert_fc1", "moe_act", "fused_group_mlp"}
    if "fused_group_mlp" in mods and expert - {"fused_group_mlp"}:
        raise _fail(source, key, "fused_group_mlp offloads the whole grouped MLP: not with "
                                 "expert_fc1 or moe_act")
    if expert and not values.get("n_experts"):
        raise _fail(source, key, f"{min(expert)} needs routed experts (n_experts)")
    if "fused_group_mlp" in mods and values.get("mlp", "gelu") == "gelu":
        raise _fail(source, key, "fused_group_mlp needs a fusable expert activation (swiglu "
                                 "or relu2: Transformer Engine's op fuser)")
    attention_side = mods & {"qkv_linear", "core_attn", "attn_proj"}
    if attention_side and (values.get("index_topk") or values.get("attention") == "csa"):
        raise _fail(source, key, f"{min(attention_side)}: offloading sparse (DSA / csa) "
                                 "attention's tensors is not modelled")
    if expert and values.get("recompute_moe"):
        raise _fail(source, key, f"{min(expert)} cannot be offloaded while "
                                 "recompute_moe recomputes the whole MoE layer")


def _check_optimizer(values: dict[str, Any], source: str) -> None:
    """Adam's states leave fp32 only under the precision-aware optimizer, which runs 16-bit
    and low-precision jobs (Megatron-Core optimizer_config.py __post_init__: "exp_avg_dtype
    can only be fp32 when not using precision-aware optimizer")."""
    if values.get("precision_aware_optimizer"):
        if values.get("dtype") == "fp32":
            raise _fail(source, "precision_aware_optimizer", "needs a 16-bit or "
                        "low-precision dtype (an fp32 job's weights are its master copy)")
        # fp8 weights under delayed scaling go through TE's fp8 Adam kernel, which takes an
        # fp32 master and fp32 moments (transformer_engine/common/multi_tensor/adam.cu);
        # their nominal dtype is bf16, so remainders would make the master int16
        if values.get("dtype") == "fp8" and values.get("lp_params") \
                and values.get("fp8_scaling", "delayed") == "delayed":
            for key in ("exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype"):
                if values.get(key, "fp32") != "fp32":
                    raise _fail(source, key, "must be fp32 with fp8 weights (lp_params) under "
                                             "delayed scaling: TE's fp8 Adam kernel")
            if values.get("store_param_remainders", True):
                raise _fail(source, "store_param_remainders", "must be false with fp8 weights "
                            "(lp_params) under delayed scaling: TE's fp8 Adam kernel takes "
                            "an fp32 master")
        return
    for key in ("exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype"):
        if values.get(key, "fp32") != "fp32":
            raise _fail(source, key, f"{values[key]} needs precision_aware_optimizer: true "
                                     "(without it Adam's states are fp32)")


def _check_moe(values: dict[str, Any], source: str) -> None:
    """An MoE job names its experts, top-k and expert width consistently; a dense job has
    no MoE keys."""
    experts = values.get("n_experts", 0)
    if not experts:
        defaults = {f.name: f.default for f in dataclasses.fields(Job)}
        for key in MOE_FIELDS:
            if key in values and values[key] != defaults[key]:
                raise _fail(source, key, "is an MoE setting; give n_experts too" if
                            "n_experts" not in values else "is an MoE setting, and n_experts "
                            "= 0 makes the job dense (an MoE job has at least one expert)")
        return
    for req in ("top_k", "moe_ffn_hidden"):
        if req not in values:
            raise _fail(source, req, "missing (an MoE job needs it: n_experts is given)")
        if not values[req]:
            raise _fail(source, req, f"expected at least 1 in an MoE job (n_experts = "
                                     f"{experts}), got {brief(values[req])}")
    if values["top_k"] > experts:
        raise _fail(source, "top_k", f"{values['top_k']} routed experts per token, more than "
                                     f"n_experts = {experts}")
    if values.get("moe_imbalance", 1.0) < 1.0:  # (the busiest rank holds at least its share)
        raise _fail(source, "moe_imbalance", f"expected at least 1 (the most loaded EP rank's "
                                             f"tokens over the even share), got "
                                             f"{values['moe_imbalance']}")
    if values.get("first_k_dense", 0) >= values["n_layers"]:
        raise _fail(source, "first_k_dense", f"{values['first_k_dense']} dense layers leave no "
                                             f"MoE layer of n_layers = {values['n_layers']}")
    step = values.get("moe_layer_step", 1)
    if step > values["n_layers"] - values.get("first_k_dense", 0):
        raise _fail(source, "moe_layer_step", f"every {step}th layer after the dense ones "
                                              f"leaves no MoE layer of n_layers = "
                                              f"{values['n_layers']}")
    groups, group_topk = values.get("router_groups", 0), values.get("router_group_topk", 0)
    if groups and experts % groups:
        raise _fail(source, "router_groups", f"{groups} groups do not divide n_experts = "
                                             f"{experts}")
    if group_topk and not groups:
        raise _fail(source, "router_group_topk", "needs router_groups")
    if group_topk > groups:
        raise _fail(source, "router_group_topk", f"{group_topk} is more than router_groups = "
                                                 f"{groups}")
    if groups and values["top_k"] > group_topk * (experts // groups):
        raise _fail(source, "top_k", f"{values['top_k']} is more than the "
                                     f"{group_topk * (experts // groups)} experts of "
                                     f"{group_topk} group{'s' if group_topk > 1 else ''}")


def _check_hybrid(values: dict[str, Any], source: str) -> None:
    """A hybrid pattern is made of HYBRID_SYMBOLS with at least one FFN layer, MLP or MoE
    layers but not both, and its length is n_layers (set from it when not given); Mamba
    layers need the mixer's dimensions, which only they use. Multi-token prediction in a
    hybrid names its depth's layers (mtp_pattern: one FFN layer of the pattern's kind)."""
    pattern = values.get("hybrid_pattern", "")
    defaults = {f.name: f.default for f in dataclasses.fields(Job)}
    given = [k for k in MAMBA_FIELDS if values.get(k, defaults[k]) != defaults[k]]
    for key in ("mtp_shared", "mtp_bf16"):
        if values.get(key) and not values.get("mtp_layers"):
            raise _fail(source, key, "needs mtp_layers (the depths it describes)")
    mtp = values.get("mtp_pattern", "")
    if not pattern:
        if given:
            raise _fail(source, given[0], "is a Mamba-2 setting; give hybrid_pattern too")
        if mtp:
            raise _fail(source, "mtp_pattern", "needs hybrid_pattern (a depth of any other "
                                               "model is one block of its last block's kind)")
        return
    bad = sorted(set(pattern) - set(HYBRID_SYMBOLS))
    if bad:
        raise _fail(source, "hybrid_pattern", f"unknown symbol {bad[0]!r}; expected "
                    + ", ".join(f"{k} ({v})" for k, v in HYBRID_SYMBOLS.items()))
    if "-" not in pattern and "E" not in pattern:
        raise _fail(source, "hybrid_pattern", "has no MLP (-) or MoE (E) layer; the cost model "
                                              "costs a hybrid per FFN layer")
    if "-" in pattern and "E" in pattern:
        raise _fail(source, "hybrid_pattern", "mixes MLP (-) and MoE (E) layers, which is not "
                                              "modelled; use one kind of FFN layer")
    if values.setdefault("n_layers", len(pattern)) != len(pattern):
        raise _fail(source, "n_layers", f"{values['n_layers']}, but hybrid_pattern has "
                                        f"{len(pattern)} layers")
    if ("E" in pattern) != bool(values.get("n_experts", 0)):
        raise _fail(source, "hybrid_pattern", "has MoE layers (E) but n_experts is not given"
                    if "E" in pattern else "has MLP layers (-) but n_experts is given: use E "
                    "for MoE layers")
    for key, why in (("first_k_dense", "the pattern places the MoE layers"),
                     ("moe_layer_step", "the pattern places the MoE layers"),
                     ("sliding_window", "not modelled for hybrid models")):
        default = 1 if key == "moe_layer_step" else 0
        if values.get(key, default) != default:
            raise _fail(source, key, f"cannot be set with hybrid_pattern: {why}")
    _check_mtp_pattern(values, source, pattern, mtp)
    if "M" in pattern + mtp:
        for key in ("mamba_heads", "mamba_state"):
            if not values.get(key):
                raise _fail(source, key, "missing (hybrid_pattern has Mamba layers)")
        for key in ("mamba_head_dim", "mamba_groups", "mamba_conv"):
            if key in values and not values[key]:
                raise _fail(source, key, "expected a positive integer, got 0")
        groups = values.get("mamba_groups", 1)
        if values["mamba_heads"] % groups:
            raise _fail(source, "mamba_groups", f"{groups} groups do not divide mamba_heads "
                                                f"= {values['mamba_heads']}")
    elif given:
        raise _fail(source, given[0], "is a Mamba-2 setting; hybrid_pattern has no Mamba layer "
                                      "(M)")


def _check_mtp_pattern(values: dict[str, Any], source: str, pattern: str, mtp: str) -> None:
    """A hybrid's MTP depths (mtp_layers) each follow mtp_pattern: HYBRID_SYMBOLS with
    exactly one FFN layer, of the main pattern's kind (the cost model costs a depth as one
    block: that FFN layer with the depth's mixers)."""
    if not values.get("mtp_layers"):
        if mtp:
            raise _fail(source, "mtp_pattern", "needs mtp_layers (the depths it describes)")
        return
    if not mtp:
        raise _fail(source, "mtp_layers", "needs mtp_pattern in a hybrid model (the layers of "
                                          "one depth, e.g. *E)")
    bad = sorted(set(mtp) - set(HYBRID_SYMBOLS))
    if bad:
        raise _fail(source, "mtp_pattern", f"unknown symbol {bad[0]!r}; expected "
                    + ", ".join(f"{k} ({v})" for k, v in HYBRID_SYMBOLS.items()))
    ffn = "E" if "E" in pattern else "-"
    if mtp.count("-") + mtp.count("E") != 1 or ffn not in mtp:
        raise _fail(source, "mtp_pattern", f"{mtp!r} must hold exactly one FFN layer, {ffn} "
                                           f"as in hybrid_pattern")


def _check_mla(values: dict[str, Any], source: str) -> None:
    """MLA names its ranks and head widths; multi-head attention has none of them; csa
    (_check_csa) its own."""
    kind = values.get("attention", "mha")
    if kind != "csa":
        for key in CSA_FIELDS:
            if values.get(key) and not (kind == "mla" and key in INDEXER_FIELDS):
                raise _fail(source, key, "is a compressed-sparse-attention setting; give "
                                         "attention: csa" + (
                                             " (or attention: mla for DeepSeek sparse "
                                             "attention)" if key in INDEXER_FIELDS else ""))
    dsa = kind == "mla" and values.get("index_topk")
    for key, off in (("index_topk_freq", 1), ("index_skip_topk_offset", 0), ("index_loss", True)):
        if values.get(key, off) != off and not dsa:
            raise _fail(source, key, "is a DeepSeek sparse attention setting (attention: mla "
                                     "with index_heads, index_head_dim, index_topk)")
    if values.get("hc_streams") == 1:
        raise _fail(source, "hc_streams", "expected 0 (no hyper-connections) or at least 2 "
                                          "residual streams, got 1")
    if values.get("hc_streams") and values.get("hybrid_pattern"):
        raise _fail(source, "hc_streams", "cannot be set with hybrid_pattern: not modelled")
    if kind == "csa":
        _check_csa(values, source)
        return
    if kind == "mha":
        for key in MLA_FIELDS:
            if values.get(key):
                raise _fail(source, key, "is an MLA setting; give attention: mla")
        return
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if not values.get(key):
            raise _fail(source, key, "missing (attention: mla needs it)")
    # DeepSeek sparse attention: the indexer's three fields together, its queries from the
    # compressed query (Megatron-LM dsa.py DSAIndexer linear_wq_b reads q_lora); its
    # sparse kernels are fused ones
    given = [key for key in INDEXER_FIELDS if values.get(key)]
    if given:
        for key in INDEXER_FIELDS:
            if not values.get(key):
                raise _fail(source, key, f"missing (DeepSeek sparse attention, {given[0]} "
                                         f"given, needs index_heads, index_head_dim and "
                                         f"index_topk together)")
        if not values.get("q_lora_rank"):
            raise _fail(source, "q_lora_rank", "missing (the DSA indexer's queries come from "
                                               "the compressed query)")
        if values["qk_rope_head_dim"] > values["index_head_dim"]:
            raise _fail(source, "index_head_dim", f"{values['index_head_dim']} is narrower "
                                                  f"than the RoPE part qk_rope_head_dim = "
                                                  f"{values['qk_rope_head_dim']} it carries")
        # (Megatron-Core's absorbed MLA: no biases, no fp8 / fp4 with its up-projection
        # recompute, absorbed_mla.py L170, L671 - 673; DSA's mask is causal)
        low = values.get("dtype") in ("fp8", "mxfp8", "nvfp4")
        for key, bad, why in (
                ("hybrid_pattern", values.get("hybrid_pattern"), "not modelled"),
                ("sliding_window", values.get("sliding_window"), "its indexer picks the keys"),
                ("attention_kernel", values.get("attention_kernel") == "materialized",
                 "its sparse kernels are fused"),
                ("causal", values.get("causal") is False, "its attention is causal"),
                ("bias", values.get("bias"), "absorbed MLA has no biases"),
                ("recompute_mla_up", values.get("recompute_mla_up") and low,
                 "absorbed MLA refuses it for fp8 / fp4 GEMMs")):
            if bad:
                raise _fail(source, key, f"cannot be set with DeepSeek sparse attention "
                                         f"(index_topk): {why}")


def _check_csa(values: dict[str, Any], source: str) -> None:
    """DeepSeek-V4's compressed sparse attention: queries through q_lora_rank, one key-and-
    value head (n_kv_heads 1) of head_dim with qk_rope_head_dim of it rotated, a sliding
    window on every layer, the grouped output projection, and the indexer where layers
    compress at ratio 4 (Megatron-Bridge v0.6.0 deepseek_v4_bridge.py L408 - 475)."""
    for key in ("q_lora_rank", "qk_rope_head_dim", "sliding_window", "o_lora_rank",
                "o_groups"):
        if not values.get(key):
            raise _fail(source, key, "missing (attention: csa needs it)")
    for key in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
        if values.get(key):
            raise _fail(source, key, "is an MLA setting; attention: csa has one key-and-value "
                                     "head of head_dim")
    every_layer = "every csa layer attends to its window"
    for key, why in (("hybrid_pattern", "not modelled"), ("full_attention_every", every_layer),
                     ("bias", "not modelled"),
                     ("attention_kernel", "its sparse kernels are fused")):
        if key == "attention_kernel" and values.get(key) != "materialized":
            continue
        if values.get(key):
            raise _fail(source, key, f"cannot be set with attention: csa: {why}")
    if values["n_kv_heads"] != 1:
        raise _fail(source, "n_kv_heads", f"expected 1 with attention: csa (one key-and-value "
                                          f"head), got {values['n_kv_heads']}")
    if values["qk_rope_head_dim"] >= values["head_dim"]:
        raise _fail(source, "qk_rope_head_dim", f"{values['qk_rope_head_dim']} is not less "
                                                f"than head_dim = {values['head_dim']}")
    if values["n_heads"] % values["o_groups"]:
        raise _fail(source, "o_groups", f"{values['o_groups']} groups do not divide n_heads = "
                                        f"{values['n_heads']}")
    compressed = values.get("csa_layers", 0) + values.get("hca_layers", 0)
    if compressed > values["n_layers"]:
        raise _fail(source, "hca_layers" if values.get("hca_layers") else "csa_layers",
                    f"csa_layers + hca_layers = {compressed}, more than n_layers = "
                    f"{values['n_layers']}")
    for key in ("index_heads", "index_head_dim", "index_topk"):
        if values.get("csa_layers") and not values.get(key):
            raise _fail(source, key, "missing (csa_layers need the indexer)")
        if values.get(key) and not values.get("csa_layers"):
            raise _fail(source, key, "is an indexer setting; only csa_layers have an indexer")


def override_job(job: Job, overrides: Mapping[str, Any], source: str, where: str = "") -> Job:
    """Return ``job`` with spec overrides (e.g. ``global_batch``, ``seq_len``) applied.

    Derived dimensions follow what they derive from: a ``head_dim`` equal to hidden /
    n_heads is recomputed when ``hidden`` or ``n_heads`` is overridden (and refused if hidden
    is then not a multiple of n_heads), and ``n_kv_heads`` equal to ``n_heads`` (multi-head
    attention) follows an override of ``n_heads``. A head_dim or n_kv_heads that differs
    (Qwen3, Gemma; GQA) is kept unless overridden itself. ``mtp_layers: 0`` drops the
    depths' pattern, sharing and format unless they are overridden too.
    """
    raw = {k: v for k, v in dataclasses.asdict(job).items()}
    for key in overrides:
        if key in ("name", "source"):
            raise _fail(source, f"{where}.{key}" if where else key, "cannot be overridden")
    if ("head_dim" not in overrides and ("hidden" in overrides or "n_heads" in overrides)
            and job.n_heads * job.head_dim == job.hidden):
        del raw["head_dim"]
    if "n_kv_heads" not in overrides and "n_heads" in overrides and job.n_kv_heads == job.n_heads:
        del raw["n_kv_heads"]
    if "n_layers" not in overrides and "hybrid_pattern" in overrides:
        del raw["n_layers"]  # (a hybrid's layer count is its pattern's length)
    if overrides.get("mtp_layers", None) == 0:  # (no depths: no depth pattern or sharing)
        for key in ("mtp_pattern", "mtp_shared", "mtp_bf16"):
            if key not in overrides:
                del raw[key]
    raw.update(overrides)
    try:
        return parse_job(raw, source, job.name)
    except SpecError as exc:
        bad = exc.key
        if bad == "hidden" and "hidden" not in overrides and "n_heads" in overrides:
            bad = "n_heads"  # the override that broke the divisibility
        key = f"{where}.{bad}" if where else bad
        raise _fail(source, key, str(exc).split(": ", 2)[-1]) from None

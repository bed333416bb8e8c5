"""Model FLOPs of one training iteration (the MFU numerator), shared by every profile.

Convention of PaLM (Chowdhery et al. 2022, appendix B) and Megatron-LM (Narayanan et al.
2021, eq. 3 without the recompute term): forward = 2 FLOPs per multiply-accumulate of every
weight matrix per token, plus the attention score and context products; training = 3 x
forward (backward = 2 x forward). Causal attention counts half the score matrix.
"""

from __future__ import annotations

from ..job import Job

__all__ = ["model_flops_per_iteration", "matmul_params_per_layer"]


def matmul_params_per_layer(job: Job) -> int:
    """Weights that take part in a GEMM per token in one block (no norms, no biases)."""
    e, f = job.hidden, job.ffn_hidden
    attn = e * (job.attention_width + 2 * job.kv_width) + job.attention_width * e
    mlp = (3 if job.mlp == "swiglu" else 2) * e * f
    return attn + mlp


def model_flops_per_iteration(job: Job, training: bool = True) -> float:
    """FLOPs of one iteration over the global batch (all GPUs together)."""
    tokens = float(job.global_batch) * job.seq_len
    causal = 0.5 if job.causal else 1.0
    per_token_fwd = 2.0 * matmul_params_per_layer(job) * job.n_layers
    # QK^T and AV: 2 x 2 x seq x (heads x head_dim) per token per layer
    per_token_fwd += 4.0 * job.seq_len * job.attention_width * job.n_layers * causal
    per_token_fwd += 2.0 * job.hidden * job.vocab  # LM head
    return (3.0 if training else 1.0) * per_token_fwd * tokens

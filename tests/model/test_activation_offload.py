"""Fine-grained activation offloading (Megatron-Core fine_grained_activation_offloading,
offload_modules): the bytes each module's input takes off the GPU, by hand; the memory and
the exposed transfer time of a candidate; the refusals Megatron-Core makes; the held-out
rows that ran with it."""

from __future__ import annotations

import numpy as np
import pytest

from sweep.errors import SpecError
from sweep.model.cost import calibrated
from sweep.model.job import parse_job
from tests.conftest import calibrated_context, candidate_block

# 4 layers, h 512, 8 heads of 64 (MHA), SwiGLU 2048, bf16, 1024 tokens a micro-batch
RAW = {"n_layers": 4, "hidden": 512, "ffn_hidden": 2048, "n_heads": 8, "vocab": 4096,
       "seq_len": 1024, "global_batch": 8, "mlp": "swiglu", "position": "rope",
       "norm": "rmsnorm"}
MOE = {"n_experts": 8, "top_k": 2, "moe_ffn_hidden": 512}
T, H = 1024.0, 512.0  # tokens of one micro-batch on a GPU, hidden width


def job(**kw):
    return parse_job({**RAW, **kw}, "test.yaml", "t")


def step(j, **config):
    x = calibrated_context(j)
    return calibrated.evaluate(x, candidate_block(1, **config)), x


@pytest.mark.parametrize("modules, per_layer_bytes", [
    # the input norms' inputs: a 16-bit hidden vector a token each
    ("attn_norm", T * H * 2), ("mlp_norm", T * H * 2),
    # QKV's input, the norm's output (16 bits in a bf16 job)
    ("qkv_linear", T * H * 2),
    # core attention's q, k, v: (8 + 2 x 8) heads of 64
    ("core_attn", T * 3 * H * 2),
    # with the output projection's input, a head-wide vector
    ("core_attn+attn_proj", T * 3 * H * 2 + T * H * 2),
])
def test_bytes_each_module_takes_off_the_gpu(modules, per_layer_bytes):
    """Memory: the listed inputs of every layer of the stage but its last (one pipeline stage,
    one micro-batch in flight), against the same candidate without offloading."""
    base, _ = step(job(), recompute=0)
    off, _ = step(job(offload_modules=modules), recompute=0)
    saved = base["mem_activations_bytes"][0] - off["mem_activations_bytes"][0]
    assert saved == pytest.approx(3 * per_layer_bytes)
    assert off["step_time_s"][0] == base["step_time_s"][0]  # (hidden behind each layer)


def test_expert_inputs_by_hand():
    """expert_fc1: the dispatched rows (T k of them, h wide); moe_act: fc1's output (2 f_e
    wide, SwiGLU); fused_group_mlp: both and fc2's input (f_e wide)."""
    rows = T * 2
    want = {"expert_fc1": rows * H * 2, "moe_act": rows * 2 * 512 * 2,
            "fused_group_mlp": rows * (H + 2 * 512 + 512) * 2}
    base, _ = step(job(**MOE), recompute=0, ep=1)
    for modules, per_layer in want.items():
        off, _ = step(job(**MOE, offload_modules=modules), recompute=0, ep=1)
        saved = base["mem_activations_bytes"][0] - off["mem_activations_bytes"][0]
        assert saved == pytest.approx(3 * per_layer), modules


def test_recomputed_layers_offload_nothing_and_a_slow_link_shows():
    everything = "attn_norm+qkv_linear+core_attn+attn_proj+mlp_norm"  # (qkv: the norm out)
    full_base, _ = step(job(), recompute=2)
    full_off, _ = step(job(offload_modules=everything), recompute=2)
    assert full_off["mem_activations_bytes"][0] == full_base["mem_activations_bytes"][0]
    # the transfer (out after the forward, back before the backward) hides behind a layer's
    # compute unless the host link is slow: then the difference is exposed, per layer but
    # the last
    j = job(offload_modules=everything)
    x = dict(calibrated_context(j), host_Bps=1e6)
    slow = calibrated.evaluate(x, candidate_block(1, recompute=0))
    base = calibrated.evaluate(dict(calibrated_context(job()), host_Bps=1e6),
                               candidate_block(1, recompute=0))
    off_bytes = T * H * 2 * 3 + T * 3 * H * 2 + T * H * 2
    # 8 micro-batches (global batch 8, micro-batch 1), 3 layers each, less the compute
    transfer = 8 * 3 * (2 * off_bytes / 1e6)
    assert base["t_offload_s"][0] == 0.0
    assert transfer * 0.99 < slow["t_offload_s"][0] < transfer
    assert slow["step_time_s"][0] - base["step_time_s"][0] == pytest.approx(
        slow["t_offload_s"][0])


@pytest.mark.parametrize("fields, message", [
    ({"offload_modules": "attn_proj"}, "attn_proj needs core_attn"),
    ({"offload_modules": "softmax"}, "unknown module 'softmax'"),
    ({"offload_modules": "expert_fc1"}, "needs routed experts"),
    ({**MOE, "offload_modules": "fused_group_mlp+moe_act"}, "not with expert_fc1 or moe_act"),
    ({**MOE, "offload_modules": "moe_act", "recompute_moe": True}, "recompute_moe"),
    ({"offload_modules": "core_attn", "offload_act_layers": 1}, "offload_act_layers"),
    ({"offload_modules": 3}, "expected a list"),
])
def test_refusals(fields, message):
    with pytest.raises(SpecError) as err:
        job(**fields)
    assert err.value.key == "offload_modules" and message in str(err.value)


def test_a_yaml_list_and_the_label_spelling_agree():
    listed = job(offload_modules=["attn_proj", "core_attn"])
    joined = job(offload_modules="core_attn+attn_proj")
    assert listed == joined and listed.offload_modules == "core_attn+attn_proj"
    assert job().offload_modules == ""
    assert np.isclose(calibrated_context(listed)["off_proj"], 1.0)


def test_the_held_out_rows_that_offload_say_so():
    """Nemotron 3 Ultra in Megatron-Bridge 26.08 offloads its fused grouped MLP's inputs."""
    from pathlib import Path

    from sweep.analysis.express import express_all
    from sweep.analysis.measured import read_runs

    path = Path(__file__).resolve().parents[2] / "docs" / "heldout" / \
        "megatron-bridge-26.04-26.08.csv"
    cases, _ = express_all(read_runs(path))
    offloading = {c.row["id"]: c.job.offload_modules for c in cases if c.job.offload_modules}
    assert offloading == {"ho_2608_017": "fused_group_mlp", "ho_2608_018": "fused_group_mlp"}


def test_latent_attention_offloads_its_up_projected_heads_not_the_latents():
    """MLA: core attention's inputs are the up-projected q, k, v, 4 heads x (2 x 48 + 32)
    wide; the latents (the up-projections' inputs) stay. With recompute_mla_up those heads
    are not kept, so nothing is offloaded."""
    mla = {"n_heads": 4, "attention": "mla", "q_lora_rank": 64, "kv_lora_rank": 32,
           "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32}
    base, _ = step(job(**mla), recompute=0)
    off, _ = step(job(**mla, offload_modules="core_attn"), recompute=0)
    saved = base["mem_activations_bytes"][0] - off["mem_activations_bytes"][0]
    assert saved == pytest.approx(3 * T * 4 * (2 * 48 + 32) * 2)
    base, _ = step(job(**mla, recompute_mla_up=True), recompute=0)
    off, _ = step(job(**mla, recompute_mla_up=True, offload_modules="core_attn"), recompute=0)
    assert off["mem_activations_bytes"][0] == base["mem_activations_bytes"][0]

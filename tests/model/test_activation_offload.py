"""Fine-grained activation offloading (Megatron-Core fine_grained_activation_offloading,
offload_modules): what each module takes off the GPU, by hand (every tensor autograd saves
inside it; norms only where they are separate modules); the memory over pipeline stages and
recompute policies; the exposed reload time; the candidates and refusals Megatron-Core
imposes; the held-out rows that ran with it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sweep.errors import SpecError
from sweep.model.candidates import enumerate_calibrated
from sweep.model.cost import calibrated
from sweep.model.job import parse_job
from tests.conftest import calibrated_context, candidate_block

# 4 layers, h 512, 8 heads of 64 (MHA), SwiGLU 2048, bf16, 1024 tokens a micro-batch
RAW = {"n_layers": 4, "hidden": 512, "ffn_hidden": 2048, "n_heads": 8, "vocab": 4096,
       "seq_len": 1024, "global_batch": 8, "mlp": "swiglu", "position": "rope",
       "norm": "rmsnorm"}
MOE = {"n_experts": 8, "top_k": 2, "moe_ffn_hidden": 512}
MLA = {"n_heads": 4, "attention": "mla", "q_lora_rank": 64, "kv_lora_rank": 32,
       "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32}
HYBRID = {"mamba_heads": 16, "mamba_head_dim": 64, "mamba_state": 64, "mamba_groups": 1}
T, H = 1024.0, 512.0  # tokens of one micro-batch on a GPU, hidden width
STATS = 8 * 1024 * 4.0  # the fused attention's fp32 softmax statistics: 8 heads x 1024
QKV = T * 3 * H * 2  # core attention's q, k, v (8 + 2 x 8 heads of 64 would be GQA)
EVERYTHING = "attn_norm+qkv_linear+core_attn+attn_proj+mlp_norm"


def job(**kw):
    return parse_job({**RAW, **kw}, "test.yaml", "t")


def step(j, hardware="H100-SXM", host_Bps=None, **config):
    x = calibrated_context(j, hardware)
    if host_Bps is not None:
        x = dict(x, host_Bps=host_Bps)
    return calibrated.evaluate(x, candidate_block(1, **config))


def saved(base, off, hardware="H100-SXM", **config):
    """Activation bytes the offload takes off the GPU (one candidate of ``config``)."""
    return step(base, hardware, **config)["mem_activations_bytes"][0] \
        - step(off, hardware, **config)["mem_activations_bytes"][0]


@pytest.mark.parametrize("modules, per_layer_bytes", [
    # the input norms are fused into QKV / fc1 here (TE LayerNormLinear): no modules
    ("attn_norm", 0.0), ("mlp_norm", 0.0),
    # QKV's fused norm: its input and output, 16-bit hidden vectors
    ("qkv_linear", 2 * T * H * 2),
    # core attention's q, k, v and softmax statistics (its output stays: attn_proj's input)
    ("core_attn", QKV + STATS),
    ("core_attn+attn_proj", QKV + STATS + T * H * 2),
])
def test_bytes_each_module_takes_off_the_gpu(modules, per_layer_bytes):
    """One pipeline stage, one micro-batch in flight: every layer but the last, against the
    same candidate without offloading; the copies hide behind the layers."""
    assert saved(job(), job(offload_modules=modules), recompute=0) == pytest.approx(
        3 * per_layer_bytes)
    assert step(job(offload_modules=modules), recompute=0)["step_time_s"][0] == \
        step(job(), recompute=0)["step_time_s"][0]


def test_moe_blocks_by_hand():
    """expert_fc1: the dispatched rows (T k, h wide); moe_act: fc1's output (2 f_e, SwiGLU);
    fused_group_mlp: both and fc2's input; mlp_norm: the MoE layer's own pre-norm."""
    rows = T * 2
    want = {"expert_fc1": rows * H * 2, "moe_act": rows * 2 * 512 * 2,
            "fused_group_mlp": rows * (H + 2 * 512 + 512) * 2, "mlp_norm": T * H * 2}
    for modules, per_layer in want.items():
        got = saved(job(**MOE), job(**MOE, offload_modules=modules), recompute=0, ep=1)
        assert got == pytest.approx(3 * per_layer), modules
    # recompute_moe_act: fc2's input is not kept, so not offloaded
    got = saved(job(**MOE, recompute_moe_act=True),
                job(**MOE, recompute_moe_act=True, offload_modules="fused_group_mlp"),
                recompute=0, ep=1)
    assert got == pytest.approx(3 * rows * (H + 2 * 512) * 2)


def test_low_precision_widths():
    """MXFP8: QKV's and the output projection's inputs and the experts' rows at the saved
    quantized width; per-tensor fp8 offloading expert_fc1 keeps and moves its 16-bit input
    (experts.py set_save_original_input)."""
    sb = calibrated_context(job(dtype="mxfp8"), "B200")["saved_in_bytes"]
    assert sb < 2.0
    assert saved(job(dtype="mxfp8"), job(dtype="mxfp8", offload_modules="core_attn+attn_proj"),
                 "B200", recompute=0) == pytest.approx(3 * (QKV + STATS + T * H * sb))
    assert saved(job(dtype="mxfp8", **MOE), job(dtype="mxfp8", **MOE,
                                                  offload_modules="expert_fc1"),
                 "B200", recompute=0, ep=1) == pytest.approx(3 * T * 2 * H * sb)
    slow = step(job(dtype="fp8", **MOE, offload_modules="expert_fc1"), host_Bps=1e6,
                recompute=0, ep=1)
    assert slow["t_offload_s"][0] == pytest.approx(8 * 3 * T * 2 * H * 2 / 1e6, rel=0.01)


def test_latent_attention():
    """MLA: a separate input norm (attn_norm: its input); qkv_linear wraps the down- and
    up-projections (the norm output and the latents, 64 + 32 + 16 wide); core attention's
    inputs are the up-projected heads, 4 x (2 x 48 + 32) wide. recompute_mla_up: those heads
    are not kept, nothing of core attention's offloaded but its statistics."""
    assert saved(job(**MLA), job(**MLA, offload_modules="attn_norm"),
                 recompute=0) == pytest.approx(3 * T * H * 2)
    assert saved(job(**MLA), job(**MLA, offload_modules="qkv_linear"),
                 recompute=0) == pytest.approx(3 * T * (H + 64 + 32 + 16) * 2)
    stats = 4 * 1024 * 4.0
    assert saved(job(**MLA), job(**MLA, offload_modules="core_attn"),
                 recompute=0) == pytest.approx(3 * (T * 4 * (2 * 48 + 32) * 2 + stats))
    up = {**MLA, "recompute_mla_up": True}
    assert saved(job(**up), job(**up, offload_modules="core_attn"),
                 recompute=0) == pytest.approx(3 * stats)


def test_recompute_policies():
    """Full recompute keeps each layer's input only: nothing offloaded (MoE blocks too);
    selective recompute checkpoints core attention, so core_attn offloads nothing (attn_proj
    still does); first-k recompute: the layers not recomputed, but the last."""
    assert saved(job(), job(offload_modules=EVERYTHING), recompute=2) == 0.0
    for modules in ("expert_fc1", "moe_act", "fused_group_mlp", "core_attn+expert_fc1"):
        assert saved(job(**MOE), job(**MOE, offload_modules=modules), recompute=2, ep=1) == 0.0
    assert saved(job(), job(offload_modules="core_attn"), recompute=1) == 0.0
    assert saved(job(), job(offload_modules="core_attn+attn_proj"),
                 recompute=1) == pytest.approx(3 * T * H * 2)
    for k, left in ((0, 3), (1, 2), (2, 1), (4, 0)):
        got = saved(job(), job(offload_modules="core_attn"), recompute=3, recompute_layers=k)
        assert got == pytest.approx(left * (QKV + STATS)), k
    none = step(job(offload_modules="core_attn"), host_Bps=1e3, recompute=3,
                recompute_layers=4)
    assert none["t_offload_s"][0] == 0.0


def test_pipeline_stages_keep_one_group_an_iteration_the_last_one_a_micro_batch():
    """A first stage offloads every micro-batch's layers but one group; the last stage
    keeps its last layer of each micro-batch in flight (should_bulk_offload)."""
    x = calibrated_context(job())
    xo = calibrated_context(job(offload_modules="core_attn"))
    c = candidate_block(1, pp=2, recompute=0)
    c["dp"] = np.asarray([1])
    base, off = calibrated.evaluate(x, c), calibrated.evaluate(xo, c)
    # 2 layers a stage, 2 micro-batches in flight on the first: 2 x 2 - 1 groups offloaded,
    # the last stage's 1 micro-batch: 2 - 1; the first stage is the larger
    assert base["mem_activations_bytes"][0] - off["mem_activations_bytes"][0] == \
        pytest.approx(3 * (QKV + STATS))


def test_the_reload_is_exposed_where_it_outlasts_the_backward():
    """Copies out never block compute; each block's copy back (q, k, v, statistics and the
    output's copy) is waited for before its backward: exposed what outlasts the backward,
    per micro-batch and block but the one kept."""
    copy = QKV + STATS + T * H * 2
    a = step(job(offload_modules="core_attn"), host_Bps=1e6, recompute=0)
    b = step(job(offload_modules="core_attn"), host_Bps=2e6, recompute=0)
    per = 8 * 3  # micro-batches x blocks but the kept one
    bwd_a = copy / 1e6 - a["t_offload_s"][0] / per
    bwd_b = copy / 2e6 - b["t_offload_s"][0] / per
    assert bwd_a == pytest.approx(bwd_b) and bwd_a > 0.0
    layer = (a["step_time_s"][0] - a["t_offload_s"][0]) / (8 * 4)
    assert bwd_a < layer  # (the backward alone, not the forward and backward)


def test_hybrid_offloads_attention_layers_not_mamba_mixers():
    """A hybrid's attention layers fuse their norm; its Mamba-2 mixers are not offloaded."""
    def got(pattern, modules):
        return saved(job(hybrid_pattern=pattern, n_layers=len(pattern), **HYBRID),
                     job(hybrid_pattern=pattern, n_layers=len(pattern), **HYBRID,
                         offload_modules=modules), recompute=0)
    for modules, unit in (("core_attn", QKV + STATS), ("attn_norm", 0.0)):
        assert got("M*-M*-", modules) == pytest.approx(unit)
        assert got("MM*-MM*-", modules) == pytest.approx(unit)
        assert got("M-M-*-*-", modules) == pytest.approx(1.5 * unit)


def test_candidates_megatron_allows():
    """fused_group_mlp runs Transformer Engine's op fuser: expert TP 1 only; fine-grained
    offloading excludes whole-activation offload (cpu_offloading)."""
    j = job(**MOE, offload_modules="fused_group_mlp")
    space = enumerate_calibrated(j, 8, 8)
    cols = space.columns(0, len(space))
    assert set(cols["etp"].tolist()) == {1}
    assert len(set(enumerate_calibrated(job(**MOE), 8, 8).columns(0, 10 ** 6)["etp"])) > 1
    space = enumerate_calibrated(job(offload_modules="core_attn"), 8, 8, host_memory=True)
    assert not (space.columns(0, len(space))["offload"] & 2).any()


@pytest.mark.parametrize("fields, message", [
    ({"offload_modules": "attn_proj"}, "attn_proj needs core_attn"),
    ({"offload_modules": "softmax"}, "unknown module 'softmax'"),
    ({"offload_modules": "expert_fc1"}, "needs routed experts"),
    ({**MOE, "offload_modules": "fused_group_mlp+moe_act"}, "not with expert_fc1 or moe_act"),
    ({**MOE, "mlp": "gelu", "offload_modules": "fused_group_mlp"}, "fusable expert activation"),
    ({**MOE, "offload_modules": "moe_act", "recompute_moe": True}, "recompute_moe"),
    ({"offload_modules": "core_attn", "offload_act_layers": 1}, "offload_act_layers"),
    ({**MLA, "index_heads": 2, "index_head_dim": 32, "index_topk": 128,
      "offload_modules": "core_attn"}, "sparse (DSA / csa)"),
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
    # a spec's YAML list is labelled as the job reads it back (sweep show -> sweep predict)
    from sweep.engine.catalog import label_value

    assert label_value(["core_attn", "attn_proj"]) == "core_attn+attn_proj"
    assert job(offload_modules=label_value(["attn_proj", "core_attn"])) == joined


def test_the_held_out_rows_that_offload_say_so():
    """Nemotron 3 Ultra in Megatron-Bridge 26.08 offloads its fused grouped MLP's inputs;
    without the fine_grained_activation_offloading flag a row offloads nothing."""
    from sweep.analysis.express import express_all
    from sweep.analysis.measured import read_runs

    path = Path(__file__).resolve().parents[2] / "docs" / "heldout" / \
        "megatron-bridge-26.04-26.08.csv"
    runs = read_runs(path)
    cases, _ = express_all(runs)
    offloading = {c.row["id"]: c.job.offload_modules for c in cases if c.job.offload_modules}
    assert offloading == {"ho_2608_017": "fused_group_mlp", "ho_2608_018": "fused_group_mlp"}
    for r in runs:
        for k, v in r.items():
            if isinstance(v, str):
                r[k] = v.replace("fine_grained_activation_offloading=True",
                                 "fine_grained_activation_offloading=False")
    cases, _ = express_all(runs)
    assert not any(c.job.offload_modules for c in cases)

"""Multi-token prediction in hybrid models (mtp_pattern, mtp_shared; Nemotron 3 Super's two
*E depths sharing one layer): a depth of attention + FFN is the dense model's MTP depth;
a depth with a Mamba layer more is never faster or smaller; shared depths keep one depth's
weights; the model FLOPs by hand; the op table adds up; the refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sweep.engine.catalog import load_hardware, load_job
from sweep.errors import SpecError
from sweep.model.cost import calibrated
from sweep.model.cost.flops import model_flops_per_token
from sweep.model.job import parse_job
from tests.conftest import candidate_block
from tests.model.test_hybrid import BASE, MAMBA, job, step


def test_an_attention_and_mlp_depth_is_the_dense_models_mtp_depth():
    hybrid = job("*-*-*-*-", mtp_layers=1, mtp_pattern="*-")
    dense = job(n_layers=4, mtp_layers=1)
    for config in ({"tp": 1}, {"tp": 2, "sp": 1}, {"tp": 1, "pp": 2, "mbs": 2}):
        a, b = step(hybrid, n=4, **config), step(dense, n=4, **config)
        for key in ("step_time_s", "mem_bytes", "hardware_flops"):
            assert a[key][0] == pytest.approx(b[key][0], rel=1e-12), (key, config)
        # the model FLOPs of a hybrid's depth leave out its [h; emb] projection and norms,
        # as Megatron-Bridge counts hybrids (flop_utils.py): 3 x 2 x (2 h^2 + 3 h) a token,
        # over the 4 GPUs
        tokens = 8 * 512 / 4
        e = BASE["hidden"]
        assert float(b["model_flops"][0] - a["model_flops"][0]) == pytest.approx(
            tokens * 3 * 2 * (2 * e * e + 3 * e))


def test_a_depth_with_a_mamba_layer_more_is_never_faster_or_smaller():
    fewer = job("M-*-M-", mtp_layers=1, mtp_pattern="*-")
    more = job("M-*-M-", mtp_layers=1, mtp_pattern="M*-")
    for config in ({"tp": 1}, {"tp": 2, "sp": 1}, {"tp": 2, "sp": 1, "recompute": 2}):
        a, b = step(fewer, n=2, **config), step(more, n=2, **config)
        assert b["step_time_s"][0] > a["step_time_s"][0]
        assert b["mem_bytes"][0] > a["mem_bytes"][0]
        assert b["hardware_flops"][0] > a["hardware_flops"][0]


def test_mtp_flops_of_a_hybrid_depth_by_hand():
    # one *E depth more: an attention layer (projections and scores), an MoE layer (top-k
    # experts and the shared one) and an LM head, 3 x forward
    moe = {"n_experts": 8, "top_k": 2, "moe_ffn_hidden": 128, "shared_ffn_hidden": 256}
    without = job("M*EME", **moe)
    with_mtp = job("M*EME", mtp_layers=1, mtp_pattern="*E", **moe)
    e, v, s = BASE["hidden"], BASE["vocab"], BASE["seq_len"]
    attention = e * (4 * 64 + 2 * 2 * 64) + 4 * 64 * e
    scores = 2 * (s / 2) * 4 * (64 + 64)  # causal: half the keys; q.k and p.v
    experts = 2 * 2 * e * 128 + 2 * e * 256  # relu2: two matrices
    want = 3 * (2 * attention + scores + 2 * experts + 2 * e * v)
    assert model_flops_per_token(with_mtp) - model_flops_per_token(without) == \
        pytest.approx(want)


def test_shared_depths_keep_one_depths_weights_and_run_every_depth():
    moe = {"n_experts": 8, "top_k": 2, "moe_ffn_hidden": 128}
    own = job("M*EME", mtp_layers=2, mtp_pattern="*E", **moe)
    shared = job("M*EME", mtp_layers=2, mtp_pattern="*E", mtp_shared=True, **moe)
    one = job("M*EME", mtp_layers=1, mtp_pattern="*E", **moe)
    a, b, c = (step(j, n=2, ep=2) for j in (own, shared, one))
    assert b["mem_weights_bytes"][0] == pytest.approx(c["mem_weights_bytes"][0], rel=1e-12)
    assert b["mem_weights_bytes"][0] < a["mem_weights_bytes"][0]
    assert b["hardware_flops"][0] == pytest.approx(a["hardware_flops"][0], rel=1e-12)
    assert b["hardware_flops"][0] > c["hardware_flops"][0]


def test_the_op_table_of_nemotron_3_super_adds_up_with_its_mtp_depths():
    j = load_job("nemotron_3_super")
    assert (j.mtp_layers, j.mtp_pattern, j.mtp_shared, j.mtp_mixers) == (2, "*E", True, (1, 0))
    hw = load_hardware("GB200-NVL72")
    x = calibrated.make_context(j, hw, hw.calibration)
    c = candidate_block(1, tp=2, sp=1, ep=64, mbs=1)
    c["dp"] = np.array([32])
    rows = {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(x, c)}
    assert rows["multi-token prediction"] > rows["LM head and loss"] > 0
    assert rows["MoE latent projections"] > 0
    total = float(calibrated.evaluate(x, c)["step_time_s"][0])
    assert sum(rows.values()) == pytest.approx(total, rel=1e-9)


@pytest.mark.parametrize("raw, key", [
    ({"hybrid_pattern": "M-*-", "mtp_layers": 1}, "mtp_layers"),  # no depth pattern
    ({"n_layers": 2, "mtp_layers": 1, "mtp_pattern": "*-"}, "mtp_pattern"),  # not hybrid
    ({"hybrid_pattern": "M-*-", "mtp_pattern": "*-"}, "mtp_pattern"),  # no depths
    ({"hybrid_pattern": "M-*-", "mtp_layers": 1, "mtp_pattern": "*--"}, "mtp_pattern"),
    ({"hybrid_pattern": "M-*-", "mtp_layers": 1, "mtp_pattern": "*E"}, "mtp_pattern"),
    ({"hybrid_pattern": "M-*-", "mtp_layers": 1, "mtp_pattern": "*x-"}, "mtp_pattern"),
    ({"hybrid_pattern": "M-*-", "mtp_shared": True}, "mtp_shared"),
    ({"hybrid_pattern": "M-*-", "mtp_layers": 1, "mtp_pattern": None}, "mtp_pattern"),
    ({"hybrid_pattern": "M-*-", "mtp_bf16": True}, "mtp_bf16"),
])
def test_inconsistent_mtp_depths_are_refused_naming_the_key(raw, key):
    raw = dict(BASE, **raw)
    if "M" in raw.get("hybrid_pattern", ""):
        raw = {**MAMBA, **raw}
    with pytest.raises(SpecError) as err:
        parse_job(raw, "bad.yaml", "bad")
    assert err.value.key == key and "bad.yaml" in str(err.value)


def _parts(j, n=2, **config):
    """(results, per-block terms, micro-batches) of one candidate of job ``j``."""
    c = candidate_block(1, **config)
    c["dp"] = np.array([n // (c["tp"][0] * c["pp"][0])])
    hw = load_hardware("H100-SXM")
    x = calibrated.make_context(j, hw, hw.calibration)
    out, parts = calibrated._step(x, c)
    lay = {k: np.asarray(v, dtype=float).ravel()[0] for k, v in parts["lay"].items()
           if not isinstance(v, list)}
    lay["mtp_s"] = float(np.asarray(parts["mtp"]).ravel()[0])
    return out, lay, float(parts["m"][0])


def test_an_attention_and_mlp_depth_of_a_mamba_model_costs_a_dense_block():
    """The depth of a Mamba hybrid, *-, costs what a block of the dense model with the same
    dimensions costs: its time, its executed FLOPs and its activations, plus the depth's
    projection and LM head (one stage, one micro-batch in flight)."""
    with_mtp, plain = job("M*-M*-", mtp_layers=1, mtp_pattern="*-"), job("M*-M*-")
    dense = job(n_layers=2)
    a, lay, m = _parts(with_mtp)
    b, _, _ = _parts(plain)
    _, block, _ = _parts(dense)
    extra = lay["eh_f"] + lay["eh_b"] + lay["head_f"] + lay["head_b"]
    assert lay["mtp_s"] == pytest.approx(block["fwd"] + block["bwd"] + extra, rel=1e-12)
    # the step: that a micro-batch, and the depth's weights' optimizer step and gradients
    others = sum(float(a[k][0] - b[k][0]) for k in ("t_optimizer_s", "t_dp_comm_s"))
    assert float(a["step_time_s"][0] - b["step_time_s"][0]) == pytest.approx(
        m * lay["mtp_s"] + others, rel=1e-9)
    # activations: the dense block's, and the depth's fp32 logits kept while the loss runs
    # (the job's vocab over 1 TP rank, one sequence of 512 tokens a micro-batch)
    logits = 512 * BASE["vocab"] * 4.0
    assert float(a["mem_activations_bytes"][0] - b["mem_activations_bytes"][0]) == \
        pytest.approx(float(block["act_layer"]) + logits, rel=1e-9)
    # executed FLOPs: the block's forward and backward, the [h; emb] projection and one more
    # LM head, each 3 x forward, over the 2 GPUs
    e, v = BASE["hidden"], BASE["vocab"]
    head = 3 * 2.0 * 512 * e * (v + 2 * e)
    want = m * (block["flops_f"] + block["flops_b"] + head) / 1.0
    assert float(a["hardware_flops"][0] - b["hardware_flops"][0]) == pytest.approx(
        float(want), rel=1e-9)


def test_model_flops_of_a_depth_with_a_mamba_layer_by_hand():
    e, d_in, gn, n, heads = 256, 512, 32, 16, 8
    mamba_fwd = 2 * e * (2 * d_in + 2 * gn + heads) + 7 * d_in * n + 2 * d_in * e
    a = job("M*-M*-", mtp_layers=2, mtp_pattern="M*-")
    b = job("M*-M*-", mtp_layers=2, mtp_pattern="*-")
    assert model_flops_per_token(a) - model_flops_per_token(b) == pytest.approx(
        3.0 * 2 * mamba_fwd)


def test_a_depth_beside_another_hybrids_depth_is_unchanged():
    """sweep validate and the calibration stack every row's context: Nemotron 3 Super's *E
    depth costs the same beside a hybrid whose depth holds a Mamba layer (which sends every
    depth through the hybrid path), under every recompute policy - full recompute
    checkpoints a depth's two layer inputs either way."""
    b200 = load_hardware("B200")
    sup = calibrated.make_context(load_job("nemotron_3_super"), b200, b200.calibration)
    other = calibrated.make_context(
        parse_job({**BASE, **MAMBA, "hybrid_pattern": "M*-M*-", "mtp_layers": 1,
                   "mtp_pattern": "M*-"}, "t.yaml", "t"), b200, b200.calibration)
    for policy in (0, 1, 2):
        c = candidate_block(2, tp=2, sp=1, mbs=1, ep=8)
        c["dp"] = np.array([32, 32])
        c["recompute"] = np.array([policy, policy])
        both = calibrated.evaluate(calibrated.stack_contexts([sup, other]), c)
        alone = calibrated.evaluate(sup, {k: v[:1] for k, v in c.items()})
        for key in ("step_time_s", "mem_bytes", "mem_activations_bytes", "hardware_flops"):
            assert both[key][0] == pytest.approx(alone[key][0], rel=1e-12), (policy, key)


def test_an_override_without_depths_drops_their_pattern():
    from sweep.model.job import override_job

    sup = load_job("nemotron_3_super")
    none = override_job(sup, {"mtp_layers": 0}, "spec.yaml", "jobs[0]")
    assert (none.mtp_layers, none.mtp_pattern, none.mtp_shared) == (0, "", False)
    with pytest.raises(SpecError) as err:  # (a pattern kept by hand still needs depths)
        override_job(sup, {"mtp_layers": 0, "mtp_pattern": "*E"}, "spec.yaml", "jobs[0]")
    assert err.value.key == "jobs[0].mtp_pattern"


def test_nemotron_3_5_lightning_is_nano_with_two_shared_depths():
    # Megatron-Bridge's Lightning performance recipes: Nano's model, MTP 2 x *E, repeated
    nano, light = load_job("nemotron_3_nano"), load_job("nemotron_3_5_lightning")
    fields = ("hybrid_pattern", "hidden", "n_heads", "n_kv_heads", "mamba_heads", "n_experts",
              "top_k", "moe_ffn_hidden", "shared_ffn_hidden", "vocab")
    assert all(getattr(nano, k) == getattr(light, k) for k in fields)
    assert (light.mtp_layers, light.mtp_pattern, light.mtp_shared) == (2, "*E", True)
    assert light.params_total() == nano.params_total()  # (model cards leave MTP out)


def test_depths_in_16_bits_cost_their_16_bit_block():
    """mtp_bf16 (Megatron-Bridge's keep_mtp_spec_in_bf16), and NVFP4 always (Megatron-Core
    ignores FP4 in MTP layers): the depth is the block of the same job in bf16, its routed
    experts too; the main blocks keep the job's format."""
    hw = load_hardware("B200")
    light = load_job("nemotron_3_5_lightning")
    c = candidate_block(1, ep=8, mbs=1)
    c["dp"] = np.array([8])

    def parts(j):
        _, p = calibrated._step(calibrated.make_context(j, hw, hw.calibration), c)
        return {k: float(np.asarray(v).ravel()[0]) for k, v in p["lay"].items()
                if not isinstance(v, list)}

    mx = parts(dataclasses.replace(light, dtype="mxfp8"))
    bf = parts(dataclasses.replace(light, dtype="bf16"))
    fp4 = parts(dataclasses.replace(light, dtype="nvfp4", mtp_bf16=False))
    own = parts(dataclasses.replace(light, dtype="mxfp8", mtp_bf16=False))
    for key in ("moe:fwd", "moe:bwd", "moe:routed_gemm_f"):
        assert mx["mtp:" + key] == pytest.approx(bf["mtp:" + key], rel=1e-12), key
        assert fp4["mtp:" + key] == pytest.approx(bf["mtp:" + key], rel=1e-12), key
        assert own["mtp:" + key] < mx["mtp:" + key], key  # (MXFP8 GEMMs are faster)
        assert mx[key] == pytest.approx(own[key], rel=1e-12), key  # main blocks: MXFP8

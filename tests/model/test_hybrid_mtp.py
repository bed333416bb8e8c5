"""Multi-token prediction in hybrid models (mtp_pattern, mtp_shared; Nemotron 3 Super's two
*E depths sharing one layer): a depth of attention + FFN is the dense model's MTP depth;
a depth with a Mamba layer more is never faster or smaller; shared depths keep one depth's
weights; the model FLOPs by hand; the op table adds up; the refusals."""

from __future__ import annotations

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
])
def test_inconsistent_mtp_depths_are_refused_naming_the_key(raw, key):
    raw = dict(BASE, **raw)
    if "M" in raw.get("hybrid_pattern", ""):
        raw = {**MAMBA, **raw}
    with pytest.raises(SpecError) as err:
        parse_job(raw, "bad.yaml", "bad")
    assert err.value.key == key and "bad.yaml" in str(err.value)

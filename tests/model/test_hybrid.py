"""Hybrid Mamba-2 / Transformer models (hybrid_pattern): the job's layer counts and weights,
a Mamba-2 mixer's FLOPs by hand, the block decomposition (an attention + FFN block costed
through the hybrid path is unchanged; a pattern of attention and MLP layers in equal numbers
is the dense model), properties (a Mamba layer more is never faster or smaller), the
candidate space and the refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sweep.engine.catalog import load_hardware, load_job
from sweep.errors import SpecError
from sweep.model.candidates import enumerate_calibrated
from sweep.model.cost import calibrated, evaluate_columns, unmodelled
from sweep.model.cost.flops import model_flops_per_token
from sweep.model.job import parse_job
from tests.conftest import candidate_block

BASE = {"hidden": 256, "ffn_hidden": 1024, "n_heads": 4, "n_kv_heads": 2, "seq_len": 512,
        "global_batch": 8, "vocab": 1024, "mlp": "relu2", "norm": "rmsnorm",
        "position": "none"}
MAMBA = {"mamba_heads": 8, "mamba_head_dim": 64, "mamba_state": 16, "mamba_groups": 2}


def job(pattern: str | None = None, **kw):
    raw = dict(BASE, **kw)
    if pattern is not None:
        raw["hybrid_pattern"] = pattern
        if "M" in pattern:
            raw = {**MAMBA, **raw}
    return parse_job(raw, "test.yaml", "t")


def step(j, hw="H100-SXM", n=1, **config):
    c = candidate_block(1, **config)
    c["dp"] = np.asarray([n // (c["tp"][0] * c["pp"][0])])
    return evaluate_columns("calibrated", j, load_hardware(hw), "1d", n, c)


# ------------------------------------------------------------------------------ the job

def test_pattern_counts_and_weights():
    j = job("M-M*-M-", n_layers=7)
    assert (j.n_layers, j.blocks, j.mamba_layers, j.attention_layers) == (7, 3, 3, 1)
    e, d_in, gn, heads = 256, 8 * 64, 2 * 16, 8
    mamba = (e * (2 * d_in + 2 * gn + heads) + (d_in + 2 * gn) * 5 + 3 * heads + d_in
             + d_in * e + e)  # in_proj, conv weight and bias, A_log D dt_bias, norms, out_proj
    assert j.mamba_params() == mamba
    attention = e * (4 * 64 + 2 * 2 * 64) + 4 * 64 * e + e
    mlp = 2 * e * 1024 + e
    assert j.params_total() == 3 * mamba + attention + 3 * mlp + 2 * 1024 * e + e


def test_shipped_hybrids_have_their_published_sizes():
    # Nemotron-H 56B (arXiv 2504.03624: 56B); Nemotron 3 Nano 30B-A3B (model card: 31.6B
    # total, about 3.6B active with the embeddings)
    h56 = load_job("nemotron_h_56b")
    assert (h56.n_layers, h56.mamba_layers, h56.attention_layers, h56.blocks) == (118, 54, 10, 54)
    assert h56.params_total() / 1e9 == pytest.approx(56.3, abs=0.1)
    nano = load_job("nemotron_3_nano")
    assert (nano.n_layers, nano.mamba_layers, nano.attention_layers, nano.moe_layers) == \
        (52, 23, 6, 23)
    assert nano.params_total() / 1e9 == pytest.approx(31.6, abs=0.1)
    assert nano.params_active() / 1e9 == pytest.approx(3.58, abs=0.05)


@pytest.mark.parametrize("raw, key", [
    ({"hybrid_pattern": "M-x"}, "hybrid_pattern"),
    ({"hybrid_pattern": "M*M*"}, "hybrid_pattern"),  # no FFN layer
    ({"hybrid_pattern": "M-E", "n_experts": 4, "top_k": 1, "moe_ffn_hidden": 64},
     "hybrid_pattern"),  # MLP and MoE layers mixed
    ({"hybrid_pattern": "ME*E"}, "hybrid_pattern"),  # MoE layers without experts
    ({"hybrid_pattern": "M-*-", "n_layers": 5}, "n_layers"),
    ({"hybrid_pattern": "M-*-", "mamba_state": 16}, "mamba_heads"),
    ({"hybrid_pattern": "M-*-", "mamba_heads": 6, "mamba_state": 16, "mamba_groups": 4},
     "mamba_groups"),
    ({"hybrid_pattern": "*-*-", "mamba_heads": 8}, "mamba_heads"),  # no Mamba layer
    ({"mamba_state": 16, "n_layers": 2}, "mamba_state"),  # no pattern at all
    ({"hybrid_pattern": "M-*-", "mamba_heads": 8, "mamba_state": 16, "sliding_window": 64},
     "sliding_window"),
])
def test_inconsistent_hybrids_are_refused_naming_the_key(raw, key):
    with pytest.raises(SpecError) as err:
        parse_job(dict(BASE, **raw), "bad.yaml", "bad")
    assert err.value.key == key and "bad.yaml" in str(err.value)


# ------------------------------------------------------------------------------ by hand

def test_mamba_layer_flops_by_hand():
    # one Mamba-2 layer's forward a token (Megatron-Bridge flop_utils.py, with the mixer's
    # own d_inner): in_proj 2 h (2 d_in + 2 G N + heads), scan 7 d_in N, out_proj 2 d_in h
    e, d_in, gn, n, heads = 256, 512, 32, 16, 8
    mamba_fwd = 2 * e * (2 * d_in + 2 * gn + heads) + 7 * d_in * n + 2 * d_in * e
    with_mamba, without = job("M-*-"), job("-*-")
    assert model_flops_per_token(with_mamba) - model_flops_per_token(without) == \
        pytest.approx(3.0 * mamba_fwd)
    # the executed FLOPs (hfu): the in_proj / out_proj GEMMs and the scan, forward and
    # backward (2x the GEMMs', SSD_BWD_FACTOR x the scan's), on 512 tokens
    a, b = step(with_mamba), step(without)
    gemms = 2 * e * (2 * d_in + 2 * gn + heads) + 2 * d_in * e
    want = 512 * 8 * (3 * gemms + (1 + calibrated.SSD_BWD_FACTOR) * 7 * d_in * n)
    assert float(a["hardware_flops"][0] - b["hardware_flops"][0]) == pytest.approx(want)


def test_attention_and_ffn_layers_in_equal_numbers_are_the_dense_model():
    hybrid, dense = job("*-*-*-*-"), job(n_layers=4)
    for config in ({"tp": 1}, {"tp": 2, "sp": 1}, {"tp": 1, "pp": 2, "mbs": 2}):
        a, b = step(hybrid, n=4, **config), step(dense, n=4, **config)
        for key in ("step_time_s", "mem_bytes", "hardware_flops", "model_flops"):
            assert a[key][0] == b[key][0], key


def test_a_block_through_the_hybrid_path_is_unchanged(monkeypatch):
    # the hybrid path with one attention layer and no Mamba layer a block is the block
    x = calibrated.make_context(load_job("llama3_8b"), load_hardware("H100-SXM"),
                                load_hardware("H100-SXM").calibration)
    c = candidate_block(3, tp=np.array([1, 2, 4]), sp=np.array([0, 1, 1]),
                        tp_overlap=np.array([0, 0, 1]), mbs=np.array([1, 2, 1]))
    c["recompute"] = np.array([0, 1, 2])
    plain = calibrated._layer(x, c, calibrated._layout(x, c))
    monkeypatch.setattr(calibrated, "_hybrid", lambda x: True)
    forced = calibrated._layer(x, c, calibrated._layout(x, c))
    for key, value in plain.items():
        if key.endswith("_each"):
            for i, v in enumerate(value):
                np.testing.assert_allclose(forced[key][i], v, rtol=1e-12)
        else:
            np.testing.assert_allclose(forced[key], value, rtol=1e-12, err_msg=key)


# ------------------------------------------------------------------------------ properties

def test_a_mamba_layer_more_is_never_faster_or_smaller():
    fewer, more = job("M-*-M-"), job("M-*-MM-")
    for config in ({"tp": 1}, {"tp": 2, "sp": 1}, {"tp": 2, "sp": 1, "recompute": 2}):
        a, b = step(fewer, n=2, **config), step(more, n=2, **config)
        assert b["step_time_s"][0] > a["step_time_s"][0]
        assert b["mem_bytes"][0] > a["mem_bytes"][0]


def test_the_op_table_names_the_mamba_ops_and_adds_up():
    j = load_job("nemotron_3_nano")
    x = calibrated.make_context(j, load_hardware("B200"), load_hardware("B200").calibration)
    c = candidate_block(1, ep=8, mbs=1)
    c["dp"] = np.array([8])
    rows = calibrated.op_table(x, c)
    names = [r["name"] for r in rows]
    for name in ("Mamba in_proj", "Mamba out_proj", "Mamba convolution and SSD scan",
                 "MoE expert GEMMs (grouped)", "attention core"):
        assert name in names
    total = sum(float(r["time_s"][0]) for r in rows)
    assert total == pytest.approx(float(calibrated.evaluate(x, c)["step_time_s"][0]))


# ------------------------------------------------------------------------------ search

def test_candidates_follow_megatrons_hybrid_rules():
    # TP splits the Mamba heads and groups; stages split the pattern's layers evenly,
    # without interleaving (Megatron-Core hybrid_layer_allocation); no torchtitan per-op
    # recompute
    j = job("M-*-M-", mamba_groups=2, global_batch=64)
    base = enumerate_calibrated(j, 16, 8).base
    assert set(np.unique(base["tp"]).tolist()) <= {1, 2}  # 2 groups; 4 heads of attention
    assert set(np.unique(base["pp"]).tolist()) == {1, 2}  # 6 layers: not 4, 8 or 16
    assert set(np.unique(base["vpp"]).tolist()) == {1}
    assert 4 not in set(np.unique(base["recompute"]).tolist())
    assert unmodelled(j, "nersc2024") is not None and unmodelled(j) is None


def test_a_shipped_hybrid_takes_another_pattern_by_override():
    from sweep.model.job import override_job
    j = override_job(load_job("nemotron_h_56b"), {"hybrid_pattern": "M-M-*-"}, "spec.yaml")
    assert (j.n_layers, j.blocks, j.mamba_layers) == (6, 3, 2)
    with pytest.raises(SpecError, match="n_layers: 7, but hybrid_pattern has 6 layers"):
        override_job(load_job("nemotron_h_56b"), {"hybrid_pattern": "M-M-*-", "n_layers": 7},
                     "spec.yaml")


def test_recompute_moe_keeps_none_of_the_moe_layers_tensors():
    # Megatron's recompute_modules 'moe' re-runs the MoE layer, shared expert included, from
    # its input: none of its routed or shared tensors kept, their forward run again
    nano = load_job("nemotron_3_nano")
    c = candidate_block(1, ep=8, mbs=1)
    c["dp"] = np.array([8])
    b200 = load_hardware("B200")
    plain = calibrated.evaluate(calibrated.make_context(nano, b200, b200.calibration), c)
    again = dataclasses.replace(nano, recompute_moe=True)
    rc = calibrated.evaluate(calibrated.make_context(again, b200, b200.calibration), c)
    x = calibrated.make_context(nano, b200, b200.calibration)
    lay, routed = calibrated.layer_terms(x, c)
    shared = {k[len("shared:"):]: v for k, v in lay.items() if k.startswith("shared:")}
    def kept(f):  # one block's tensors with a shared expert of width f, 8192 tokens
        return float(calibrated._activation_bytes_per_layer(dict(x, f=f), 8192.0, 8192.0, 1.0,
                                                            False, 1.0, 0))

    per_block = float(routed["acts"][0]) + kept(x["fs"]) - kept(0.0)
    assert shared["act_layer"][0] > 0
    assert float(plain["mem_activations_bytes"][0] - rc["mem_activations_bytes"][0]) == \
        pytest.approx(23 * per_block, rel=1e-9)
    assert rc["step_time_s"][0] > plain["step_time_s"][0]


def test_a_block_beside_a_hybrid_row_is_unchanged():
    # sweep validate stacks every row's context: a hybrid row among them must not move the
    # others (per-op and full recompute keep per-block tensors of their own)
    h100 = load_hardware("H100-SXM")
    dense = calibrated.make_context(load_job("llama3_8b"), h100, h100.calibration)
    hybrid = calibrated.make_context(load_job("nemotron_h_56b"), h100, h100.calibration)
    for policy in (0, 1, 2, 4):
        c = candidate_block(2, tp=8, sp=1, mbs=1)
        c["recompute"] = np.array([policy, policy])
        both = calibrated.evaluate(calibrated.stack_contexts([dense, hybrid]), c)
        alone = calibrated.evaluate(dense, {k: v[:1] for k, v in c.items()})
        for key in ("step_time_s", "mem_bytes", "mem_activations_bytes", "hardware_flops"):
            assert both[key][0] == alone[key][0], (policy, key)


def test_mamba_context_parallel_all_to_alls_by_hand():
    # one Mamba-2 layer (no attention) on cp = 2 ranks of one NVLink domain: z, x, B, C, dt
    # to head shards and the scan output back (Megatron-Core mamba_context_parallel.py),
    # half of each tensor over NVLink at a2a_eff, six latencies, a read and a write of the
    # tensors to undo / redo the load-balanced chunks; the same in the backward
    j = job("M-", global_batch=2)
    h100 = load_hardware("H100-SXM")
    x = calibrated.make_context(j, h100, h100.calibration)
    c = candidate_block(1, cp=2, mbs=1)
    rows = {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(x, c)}
    T = 512 / 2  # tokens of a rank
    groups_sent = max(2 / 1, 2) * 16  # 2 groups of state 16, at least cp of them
    into = T * 2 * (2 * 512 + 2 * groups_sent + 8)
    back = T * 2 * 512
    a2a = (into + back) / 2 / (x["nvl_Bps"] * x["a2a_eff"]) + 6 * x["nvl_lat_s"]
    passes = 2 * (into + back) / (x["hbm_Bps"] * x["hbm_eff"]) + 6 * x["kernel_s"]
    micro_batches = 2  # global batch 2 on dp = 1, mbs = 1
    assert rows["CP communication (exposed)"] == pytest.approx(
        micro_batches * 2 * (a2a + passes), rel=1e-9)


def test_context_parallelism_of_a_hybrid_follows_its_heads_and_groups():
    from sweep.model.candidates import mamba_cp_ok
    j = job("M-*-M-", mamba_heads=8, mamba_groups=2)
    assert mamba_cp_ok(j, 1, 2) and mamba_cp_ok(j, 1, 4) and mamba_cp_ok(j, 2, 4)
    assert not mamba_cp_ok(j, 1, 16)  # 8 heads
    assert not mamba_cp_ok(job("M-*-M-", mamba_heads=12, mamba_groups=3), 1, 2)  # 3 groups
    space = enumerate_calibrated(job("M-*-M-", mamba_groups=2, seq_len=4096), 16, 8).base
    assert set(np.unique(space["cp"]).tolist()) == {1, 2, 4, 8}


def test_context_parallel_mamba_keeps_b_and_c_repeated_to_cp_groups():
    # after the all-to-alls a rank keeps z x B C dt of its heads over the whole sequence, B
    # and C repeated up to cp groups when it holds fewer (mamba_context_parallel.py): with one
    # group, cp = 4 keeps more than a quarter of cp = 1's Mamba tensors
    j = job("M-", mamba_groups=1, global_batch=4)
    h100 = load_hardware("H100-SXM")
    x = calibrated.make_context(j, h100, h100.calibration)

    def acts(cp):
        T = 512 / cp
        return float(calibrated._activation_bytes_per_layer(x, T, T, 1.0, False, float(cp), 0))

    n = 16  # the state size
    repeat = 512 / 4 * 2 * 2 * (4 - 1) * n  # B and C: 4 groups instead of 1, 2 bytes
    assert acts(4) - acts(1) / 4 == pytest.approx(repeat, rel=1e-12)

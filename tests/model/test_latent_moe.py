"""Latent mixture of experts (moe_latent_size; Nemotron 3 Super's LatentMoE): the routed
experts and the all-to-alls work on tokens projected down to the latent size, by hand; the
projections' GEMMs, weights and FLOPs; properties (a latent as wide as the model is the plain
MoE layer plus its two projections; a narrower latent never moves more bytes or keeps more
expert weights); the shipped job's published size and the refusals."""

from __future__ import annotations

import dataclasses
from itertools import pairwise

import numpy as np
import pytest

from sweep.engine.catalog import load_job
from sweep.errors import SpecError
from sweep.model.cost import calibrated, moe
from sweep.model.cost.flops import model_flops_per_token
from sweep.model.job import parse_job
from tests.model.test_moe_cost import TINY, TOY, cand, ctx, layout

LATENT = dataclasses.replace(TINY, name="latent", moe_latent_size=256)


def test_routed_experts_and_all_to_all_work_at_the_latent_width():
    x = ctx(LATENT, kernel_us=0.0)
    c = cand(dp=4, ep=4)
    r = moe.routed_experts(x, c, layout(x, c), 100e12)
    rows = moe.tokens_per_expert(x, 1024.0, 4.0, 1.0) * 2  # 2 local experts
    # fc1 256 -> 2 x 512, fc2 512 -> 256 per routed row; the router still reads the
    # 1024-wide token (1024 x 8); the projections 1024 -> 256 and 256 -> 1024 per token
    experts = 2 * rows * 256 * (1024 + 512)
    router = 2 * 1024 * 8 * 1024
    projections = 2 * 2 * 1024 * 1024 * 256
    assert r["flops_f"] == pytest.approx(experts + router + projections)
    assert r["flops_b"] == pytest.approx(2 * (experts + router + projections))
    # the dispatch moves 256-wide bf16 rows: 3/4 of the T k copies leave the GPU
    nvl, net = moe.a2a_bytes(x, 1024.0, 4.0, 4.0, 2.0)
    assert (nvl, net) == (pytest.approx(1024 * 2 * 256 * 2 * 3 / 4), 0.0)
    # permutation: read T, write T k, sort the received rows twice, all 256 wide
    perm = 2 * 2 * 256 * (1024 + 2048 + 2 * rows)
    assert r["permute_f"] == pytest.approx(perm / (1000e9 * 0.5))
    # the projections' GEMMs, at the dense GEMM rate, are their own op
    gemm = sum(calibrated.gemm_s(m, n, k, x, 100e12, 0.5) for m, n, k in
               ((1024.0, 256.0, 1024.0), (1024.0, 1024.0, 256.0)))
    assert r["latent_f"] == pytest.approx(gemm)


def test_weights_and_model_flops_of_a_latent_moe_layer():
    plain, lat = TINY, LATENT
    # experts: 8 x 3 matrices of 256 x 512 instead of 1024 x 512; the projections 2 x 1024 x 256
    assert lat.routed_expert_params() == 8 * 3 * 256 * 512
    assert lat.params_per_moe_layer() - plain.params_per_moe_layer() == \
        8 * 3 * (256 - 1024) * 512 + 2 * 1024 * 256
    # model FLOPs a token (Megatron-Bridge flop_utils: routed experts on the latent width,
    # plus 4 h L for the projections), training = 3 x forward, over the two layers
    diff = model_flops_per_token(plain) - model_flops_per_token(lat)
    assert diff == pytest.approx(3 * 2 * 2 * (2 * 3 * (1024 - 256) * 512 - 2 * 1024 * 256))
    x = ctx(lat)
    assert x["p_latent"] == 2 * 1024 * 256 and x["em"] == 256.0


def test_a_latent_as_wide_as_the_model_is_the_plain_layer_plus_its_projections():
    same = dataclasses.replace(TINY, name="same", moe_latent_size=1024)
    xa, xb = ctx(TINY), ctx(same)
    c = cand(dp=8, ep=4, nv_dp=4)
    a = moe.routed_experts(xa, c, layout(xa, c), 100e12)
    b = moe.routed_experts(xb, c, layout(xb, c), 100e12)
    proj = moe._latent_projections(xb, layout(xb, c)["Ta"], 100e12)
    for k in ("gemm_f", "gemm_b", "permute_f", "act_f", "ep_f", "ep_b"):
        assert b[k] == pytest.approx(a[k], rel=1e-12), k
    for k in ("compute_f", "compute_b", "flops_f", "flops_b", "acts"):
        assert b[k] == pytest.approx(a[k] + proj[k], rel=1e-12), k
    ea, eb = calibrated.evaluate(xa, c), calibrated.evaluate(xb, c)
    assert eb["step_time_s"][0] > ea["step_time_s"][0]
    # the projections' weights sit on every TP rank, beside the router (bf16, two blocks)
    assert eb["mem_weights_bytes"][0] == pytest.approx(
        ea["mem_weights_bytes"][0] + 2 * 2 * (2 * 1024 * 1024), rel=1e-12)


def test_a_narrower_latent_never_moves_more_or_keeps_more_expert_weights():
    c = cand(dp=8, ep=8, nv_dp=2)
    runs = [calibrated.evaluate(ctx(dataclasses.replace(TINY, moe_latent_size=L)), c)
            for L in (1024, 512, 256, 128)]
    ep = [r["t_ep_comm_s"][0] for r in runs]
    assert all(b < a for a, b in pairwise(ep))
    weights = [r["mem_weights_bytes"][0] for r in runs]
    assert all(b < a for a, b in pairwise(weights))


def test_the_op_table_names_the_latent_projections_and_adds_up():
    x = ctx(LATENT)
    c = cand(dp=8, ep=4, nv_dp=2, sp=1)
    rows = calibrated.op_table(x, c)
    step = calibrated.evaluate(x, c)["step_time_s"][0]
    assert sum(r["time_s"][0] for r in rows) == pytest.approx(step, rel=1e-9)
    assert "MoE latent projections" in {r["name"] for r in rows if r["time_s"][0] > 0}
    assert "MoE latent projections" not in {r["name"] for r in calibrated.op_table(ctx(), c)}


@pytest.mark.parametrize("name, layers, total_B, active_B", [
    # the model card: 120B total, 12B active; 40 Mamba-2, 40 latent-MoE, 8 attention layers
    ("nemotron_3_super", (88, 40, 40, 8), 120.7, 12.8),
    # 550B total, 55B active (Megatron-Bridge's Ultra README); 48 Mamba-2, 48 latent-MoE,
    # 12 attention layers
    ("nemotron_3_ultra", (108, 48, 48, 12), 549.3, 56.1),
])
def test_the_latent_moe_jobs_have_their_published_sizes(name, layers, total_B, active_B):
    job = load_job(name)
    assert (job.n_layers, job.mamba_layers, job.moe_layers, job.attention_layers) == layers
    assert job.params_total() / 1e9 == pytest.approx(total_B, abs=0.1)
    assert job.params_active() / 1e9 == pytest.approx(active_B, abs=0.1)


@pytest.mark.parametrize("raw", [
    {"moe_latent_size": 256},  # a dense job
    {"moe_latent_size": -1, "n_experts": 8, "top_k": 2, "moe_ffn_hidden": 64},
])
def test_a_latent_size_without_experts_or_below_zero_is_refused(raw):
    base = {"n_layers": 2, "hidden": 256, "ffn_hidden": 1024, "n_heads": 4, "seq_len": 512,
            "global_batch": 8}
    with pytest.raises(SpecError) as err:
        parse_job(dict(base, **raw), "bad.yaml", "bad")
    assert err.value.key == "moe_latent_size" and "bad.yaml" in str(err.value)


def test_a_plain_moe_row_is_unchanged_beside_a_latent_one():
    """Stacked contexts (validate): a job without a latent size evaluates as it does alone."""
    x = ctx(TINY)
    c = cand(dp=8, ep=4, nv_dp=2)
    alone = calibrated.evaluate(x, c)["step_time_s"][0]
    stacked = {k: np.asarray([v, ctx(LATENT)[k]]) if isinstance(v, float) else v
               for k, v in x.items()}
    c2 = cand(2, dp=8, ep=4, nv_dp=2)
    both = calibrated.evaluate(stacked, c2)["step_time_s"]
    assert both[0] == alone and both[1] == calibrated.evaluate(ctx(LATENT), c)["step_time_s"][0]


def test_the_projections_keep_their_inputs_by_hand():
    """fc2's latent-wide input is kept; fc1's model-wide one only where the stack keeps a
    low-precision copy of its own (in 16 bits it is the norm output the shared block keeps)."""
    bf16 = moe._latent_projections(ctx(LATENT), 1024.0, 100e12)
    assert bf16["acts"] == pytest.approx(1024 * 256 * 2.0)
    mx = dataclasses.replace(LATENT, dtype="mxfp8")
    x = ctx(mx, hw=dataclasses.replace(TOY, matrix_flops_per_s={
        **TOY.matrix_flops_per_s, "fp4": 400e12}))
    sb = x["saved_in_bytes"]
    assert sb == pytest.approx(1.0 + 1.0 / 32.0)  # one byte and an E8M0 scale per 32
    assert moe._latent_projections(x, 1024.0, 100e12)["acts"] == \
        pytest.approx(1024 * (1024 + 256) * sb)


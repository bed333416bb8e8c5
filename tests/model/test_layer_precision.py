"""Per-layer and per-module precision under a low-precision recipe (bf16_first_layers,
bf16_last_layers: Megatron-Core first_last_layers_bf16; bf16_attention, bf16_latent: a
quantization recipe's 16-bit modules): the share of blocks in 16 bits by hand; every block in
16 bits is the 16-bit job's block; a share mixes the two; the attention and latent
projections at the 16-bit rate; no effect on a 16-bit job; the refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sweep.engine.catalog import load_hardware, load_job
from sweep.errors import SpecError
from sweep.model.candidates import enumerate_calibrated
from sweep.model.cost import calibrated, moe
from sweep.model.job import parse_job
from tests.conftest import candidate_block
from tests.model.test_moe_cost import TINY

H100 = load_hardware("H100-SXM")
FP8 = dataclasses.replace(TINY, name="fp8", dtype="fp8", n_layers=4, global_batch=16)


def ctx(job):
    return calibrated.make_context(job, H100, H100.calibration)


def terms(job, **config):
    x = ctx(job)
    c = candidate_block(1, mbs=1, **config)
    return calibrated._layer_terms(x, c), calibrated._routed_terms(x, c)


def test_share_of_blocks_in_16_bits_by_hand():
    assert dataclasses.replace(FP8, bf16_last_layers=1).bf16_block_share == 0.25
    assert dataclasses.replace(FP8, bf16_first_layers=1, bf16_last_layers=2).bf16_block_share \
        == 0.75
    # Nemotron 3 Super's NVFP4 recipe: the last 14 of its 88 layers hold 7 of its 40 MoE
    # layers (EMEM*EMEMEMEME)
    super_ = dataclasses.replace(load_job("nemotron_3_super"), bf16_last_layers=14)
    assert super_.bf16_block_share == 7 / 40
    # first and last overlapping count once
    assert dataclasses.replace(super_, bf16_first_layers=80).bf16_block_share == 1.0


def test_every_block_in_16_bits_is_the_16_bit_jobs_block():
    all16 = dataclasses.replace(FP8, bf16_last_layers=4)
    b16 = dataclasses.replace(FP8, dtype="bf16")
    (la, ra), (lb, rb) = terms(all16), terms(b16)
    la = calibrated._blend(la, 1.0)  # (every block of the stage in 16 bits)
    for key in ("fwd", "bwd", "act_layer", "act_none", "memory_f", "compute_b"):
        assert la[key] == pytest.approx(lb[key], rel=1e-12), key
        assert la["shared:" + key] == pytest.approx(lb["shared:" + key], rel=1e-12), key
    for key in ("compute_f", "compute_b", "memory_f", "acts"):
        assert ra[calibrated.B16_PREFIX + key] == pytest.approx(rb[key], rel=1e-12), key
    c = candidate_block(1, mbs=1, dp=1)
    a, b = calibrated.evaluate(ctx(all16), c), calibrated.evaluate(ctx(b16), c)
    assert a["step_time_s"][0] == pytest.approx(b["step_time_s"][0], rel=1e-12)


def test_a_share_mixes_the_two_formats():
    half = dataclasses.replace(FP8, bf16_first_layers=1, bf16_last_layers=1)
    (lh, _), (lf, _) = terms(half), terms(FP8)
    (lb, _) = terms(dataclasses.replace(FP8, dtype="bf16"))
    assert calibrated._blend(lh, 0.5)["fwd"] == pytest.approx(0.5 * (lf["fwd"] + lb["fwd"]),
                                                              rel=1e-12)
    step = {name: float(calibrated.evaluate(ctx(j), candidate_block(1, mbs=1, dp=1))[
        "step_time_s"][0]) for name, j in (("fp8", FP8), ("half", half),
                                           ("bf16", dataclasses.replace(FP8, dtype="bf16")))}
    # (between the two, whichever is faster: on this small block the casts cost fp8 more
    # than its GEMMs save)
    assert min(step["fp8"], step["bf16"]) < step["half"] < max(step["fp8"], step["bf16"])


def test_the_16_bit_layers_sit_on_the_first_and_last_stages():
    # Megatron-Core puts the first and last layers on the edge stages: at pp 2 with the last
    # two of four layers in 16 bits, the last stage is the 16-bit job's and the first the
    # fp8 job's
    dense = dataclasses.replace(FP8, n_experts=0, top_k=0, moe_ffn_hidden=0, ffn_hidden=2048)
    mixed = dataclasses.replace(dense, bf16_last_layers=2)
    c = candidate_block(1, mbs=1, pp=2, dp=1)
    parts = {name: calibrated._step(ctx(j), c)[1] for name, j in (
        ("mixed", mixed), ("fp8", dense), ("bf16", dataclasses.replace(dense, dtype="bf16")))}
    assert parts["mixed"]["last"] == pytest.approx(parts["bf16"]["last"], rel=1e-12)
    assert parts["mixed"]["first"] == pytest.approx(parts["fp8"]["first"], rel=1e-12)
    # the model FLOPs' executed counterpart counts every block once in its own format
    flops = {name: float(calibrated.evaluate(ctx(j), c)["hardware_flops"][0])
             for name, j in (("mixed", mixed), ("fp8", dense))}
    assert flops["mixed"] == pytest.approx(flops["fp8"], rel=1e-12)


def test_attention_and_latent_projections_at_the_16_bit_rate():
    attn = dataclasses.replace(FP8, bf16_attention=True)
    (la, _), (lf, _), (lb, _) = terms(attn), terms(FP8), terms(dataclasses.replace(
        FP8, dtype="bf16"))
    for i, want in ((0, lb), (1, lb), (2, lf), (3, lf)):
        assert la["gemm_f_each"][i] == pytest.approx(want["gemm_f_each"][i], rel=1e-12), i
        assert la["gemm_b_each"][i] == pytest.approx(want["gemm_b_each"][i], rel=1e-12), i
    # their inputs are neither cast (the norm writes 16 bits for QKV, no cast for the
    # output projection) nor kept quantized: 16-bit copies of the QKV and output-projection
    # inputs, 1024 tokens x (1024 + 1024) wide
    x = ctx(FP8)
    T, sb = 1024.0, x["saved_in_bytes"]
    assert la["shared:act_none"] - lf["shared:act_none"] == pytest.approx(
        (2.0 - sb) * T * (1024 + 1024))
    assert la["shared:memory_f"] < lf["shared:memory_f"]
    lat = dataclasses.replace(FP8, moe_latent_size=256)
    x8, x16 = ctx(dataclasses.replace(lat, bf16_latent=True)), ctx(dataclasses.replace(
        lat, dtype="bf16"))
    p8 = moe._latent_projections(x8, 512.0, calibrated._gemm_rate(x8)[0])
    p16 = moe._latent_projections(x16, 512.0, calibrated._gemm_rate(x16)[0])
    for key in ("compute_f", "compute_b", "memory_f", "acts"):
        assert p8[key] == pytest.approx(p16[key], rel=1e-12), key


def test_a_16_bit_job_is_unchanged():
    b16 = dataclasses.replace(FP8, dtype="bf16")
    both = dataclasses.replace(b16, bf16_last_layers=2, bf16_attention=True)
    c = candidate_block(1, mbs=1, dp=1)
    a, b = calibrated.evaluate(ctx(b16), c), calibrated.evaluate(ctx(both), c)
    for key in ("step_time_s", "mem_bytes"):
        assert a[key][0] == b[key][0]


def test_the_16_bit_layers_weights_are_16_bit_and_fit_their_stages():
    # no low-precision copy for them, and with fp8_param_gather their weights stay 16-bit
    all16 = dataclasses.replace(FP8, bf16_last_layers=4, fp8_scaling="current")
    b16 = dataclasses.replace(FP8, dtype="bf16")
    c = candidate_block(1, mbs=1, dp=1)
    for lp_params in (False, True):
        a = calibrated.evaluate(ctx(dataclasses.replace(all16, lp_params=lp_params)), c)
        assert a["mem_weights_bytes"][0] == pytest.approx(
            calibrated.evaluate(ctx(b16), c)["mem_weights_bytes"][0], rel=1e-12)
    # Megatron-Core: at most n_layers // pp 16-bit layers at either end
    three = dataclasses.replace(all16, bf16_last_layers=3)
    space = enumerate_calibrated(three, 4, 8)
    assert set(np.unique(space.columns(0, len(space))["pp"]).tolist()) == {1}
    assert {2, 4} <= set(np.unique(enumerate_calibrated(dataclasses.replace(
        three, dtype="nvfp4"), 4, 8).base["pp"]).tolist())  # (an fp8 rule)


def test_rows_beside_a_row_with_16_bit_layers_are_unchanged():
    # sweep validate stacks every row's context: an MTP job with 16-bit layers beside a
    # hybrid (whose MTP depth is a block of its own) costs what it costs alone
    gb = load_hardware("GB200-NVL72")
    v3 = dataclasses.replace(load_job("deepseek_v3"), dtype="mxfp8", bf16_last_layers=3)
    rows = [calibrated.make_context(j, gb, gb.calibration)
            for j in (v3, dataclasses.replace(load_job("nemotron_3_super"), dtype="nvfp4"))]
    c = candidate_block(2, mbs=1, ep=8, tp=2, sp=1, pp=4)
    c["dp"] = np.array([8, 8])
    both = calibrated.evaluate(calibrated.stack_contexts(rows), c)
    for i, x in enumerate(rows):
        alone = calibrated.evaluate(x, {k: v[i:i + 1] for k, v in c.items()})
        for key in ("step_time_s", "mem_bytes", "hardware_flops"):
            assert both[key][i] == pytest.approx(alone[key][0], rel=1e-12), (i, key)


@pytest.mark.parametrize("raw, key", [
    ({"bf16_first_layers": 3, "bf16_last_layers": 2}, "bf16_last_layers"),
    ({"bf16_last_layers": 1, "dtype": "fp8"}, "bf16_last_layers"),  # (delayed scaling)
    ({"bf16_first_layers": 5}, "bf16_first_layers"),
    ({"bf16_latent": True}, "bf16_latent"),
])
def test_inconsistent_precision_settings_are_refused(raw, key):
    base = {"n_layers": 4, "hidden": 256, "ffn_hidden": 512, "n_heads": 4, "seq_len": 512,
            "global_batch": 8, "dtype": "mxfp8"}
    with pytest.raises(SpecError, match=f"test.yaml: {key}: "):
        parse_job({**base, **raw}, "test.yaml", "t")


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_the_op_table_adds_up_with_16_bit_layers(pp):
    gb = load_hardware("GB200-NVL72")
    j = dataclasses.replace(load_job("nemotron_3_super"), dtype="nvfp4", bf16_last_layers=14,
                            bf16_attention=True, bf16_latent=True, global_batch=512)
    x = calibrated.make_context(j, gb, gb.calibration)
    c = candidate_block(1, tp=2, sp=1, ep=32, mbs=1, pp=pp)
    c["dp"] = np.array([64 // (2 * pp)])
    rows = {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(x, c)}
    total = float(calibrated.evaluate(x, c)["step_time_s"][0])
    assert sum(rows.values()) == pytest.approx(total, rel=1e-9)


def test_a_mamba_out_proj_in_a_format_of_its_own():
    # Megatron-Bridge's Nemotron 3 Super NVFP4 recipe runs the Mamba-2 out_proj in MXFP8
    gb = load_hardware("GB200-NVL72")
    base = dataclasses.replace(load_job("nemotron_3_super"), dtype="nvfp4")
    mixed = dataclasses.replace(base, mamba_out_dtype="mxfp8")

    def mixer(job):
        x = calibrated.make_context(job, gb, gb.calibration)
        peak, eff = calibrated._gemm_rate(x)
        return x, calibrated._mamba_mixer(x, 4096.0, 2.0, peak, eff)

    (_, fp4), (_, mx), (_, both) = mixer(base), mixer(dataclasses.replace(
        base, dtype="mxfp8")), mixer(mixed)
    assert both["gemm_f"][0] == pytest.approx(fp4["gemm_f"][0], rel=1e-12)  # in_proj
    assert both["gemm_f"][1] == pytest.approx(mx["gemm_f"][1], rel=1e-12)  # out_proj
    assert both["gemm_b"][1] == pytest.approx(mx["gemm_b"][1], rel=1e-12)
    assert both["gemm_f"][1] > fp4["gemm_f"][1]
    # a 16-bit block's out_proj is 16-bit
    x16 = calibrated._b16_context(calibrated.make_context(
        dataclasses.replace(mixed, bf16_last_layers=14), gb, gb.calibration))
    b16 = calibrated._mamba_mixer(x16, 4096.0, 2.0, *calibrated._gemm_rate(x16))
    (_, plain16) = mixer(dataclasses.replace(base, dtype="bf16"))
    assert b16["gemm_f"][1] == pytest.approx(plain16["gemm_f"][1], rel=1e-12)
    # a format the hardware lacks is refused naming the key
    h100 = load_hardware("H100-SXM")
    fp8 = dataclasses.replace(load_job("nemotron_h_56b"), dtype="fp8", mamba_out_dtype="mxfp8")
    assert calibrated.unsupported_job_precision(fp8, h100).startswith("mamba_out_dtype: mxfp8")
    with pytest.raises(SpecError, match="test.yaml: mamba_out_dtype: needs Mamba-2 layers"):
        parse_job({"n_layers": 4, "hidden": 256, "ffn_hidden": 512, "n_heads": 4,
                   "seq_len": 512, "global_batch": 8, "dtype": "nvfp4",
                   "mamba_out_dtype": "mxfp8"}, "test.yaml", "t")


def test_16_bit_blocks_by_global_index_on_the_ranks_holding_them():
    gb = load_hardware("GB200-NVL72")

    def on(job, pp, v, layers, slot=0.0):
        x = calibrated.make_context(job, gb, gb.calibration)
        g, *_ = calibrated._b16_blocks(x, np.float64(pp), np.float64(v), float(job.blocks),
                                      np.float64(layers), slot, job.is_moe)
        return [tuple(float(a) for a in g(np.float64(r))) for r in range(pp)]

    llama = dataclasses.replace(load_job("llama3_70b"), dtype="fp8", fp8_scaling="current")
    # the first 20 of 80 layers: one stage's at pp 4, one chunk of 5 on each rank at vpp 4
    first = dataclasses.replace(llama, bf16_first_layers=20)
    assert on(first, 4, 1, 20) == [(20, 0), (0, 0), (0, 0), (0, 0)]
    assert on(first, 4, 4, 20) == [(5, 0), (5, 0), (5, 0), (5, 0)]
    # NVFP4 may keep more than a stage: the last 30 spill onto the third rank
    last = dataclasses.replace(llama, dtype="nvfp4", bf16_last_layers=30)
    assert on(last, 4, 1, 20) == [(0, 0), (0, 0), (10, 0), (20, 0)]
    # embedding slots: 82 items of 21 a stage, the last rank's 18 blocks and 2 of the third's
    slots = dataclasses.replace(llama, bf16_last_layers=20)
    assert on(slots, 4, 1, 21, slot=1.0) == [(0, 0), (0, 0), (2, 0), (18, 0)]
    # DeepSeek-V3's first three (dense) blocks: its first stage's dense blocks all 16-bit,
    # its MoE blocks none
    v3 = dataclasses.replace(load_job("deepseek_v3"), dtype="mxfp8", bf16_first_layers=3)
    n16, moe16 = on(v3, 8, 1, 8)[0]
    assert (n16, moe16) == (3, 0)
    assert calibrated._b16_shares(n16, moe16, 8.0, 5.0) == (1.0, 0.0)
    # interleaved chunks leaving a whole chunk empty at the end (61 layers, pp 8 x vpp 4,
    # chunks of 2): the last blocks counted from the end stay on the last rank
    short = dataclasses.replace(llama, n_layers=61, bf16_last_layers=1)
    assert on(short, 8, 4, 8)[-1] == (1, 0)
    # a middle rank holding both a first and a last chunk is the busiest
    both = dataclasses.replace(llama, bf16_first_layers=6, bf16_last_layers=6)
    assert on(both, 5, 8, 16) == [(2, 0), (2, 0), (4, 0), (2, 0), (2, 0)]


def test_the_busiest_middle_rank_sets_the_middle_stage():
    # 80 layers at pp 5 x vpp 8 (chunks of 2), the first and last 6 in 16 bits: the third
    # rank holds 4 of them, the other middle ranks 2; the middle stage is that rank's
    dense = dataclasses.replace(FP8, n_experts=0, top_k=0, moe_ffn_hidden=0, ffn_hidden=2048,
                                n_layers=80, global_batch=40, fp8_scaling="current")
    job = dataclasses.replace(dense, bf16_first_layers=6, bf16_last_layers=6)
    x = ctx(job)
    c = candidate_block(1, mbs=1, pp=5, vpp=8, dp=1)
    lay = calibrated._layer_terms(x, c)
    mid = calibrated._step(x, c)[1]["mid"]
    view = calibrated._blend(lay, 4.0 / 16.0)
    assert mid == pytest.approx(16.0 * (view["fwd"] + view["bwd"]), rel=1e-12)

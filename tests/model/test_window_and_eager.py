"""Sliding-window attention and the eager elementwise passes of GPT-OSS's stack (calibrated
profile): hand-computed model FLOPs, window costs and extra bytes of a tiny model; properties
(a window as long as the sequence is full attention, a shorter window is never slower, a
half-windowed model costs the mean of the two); the job fields' validation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sweep.engine.catalog import load_job
from sweep.errors import SpecError
from sweep.model.cost import calibrated, moe
from sweep.model.cost.flops import model_flops_per_token
from sweep.model.cost.kernels import FLASH_KV_BLOCK
from sweep.model.job import parse_job
from tests.model.test_moe_cost import DENSE, TINY, TOY, cand, ctx, layout

FULL = dataclasses.replace(DENSE, seq_len=4096)


def _layer(job, **c):
    x = ctx(job)
    block = cand(**c)
    return calibrated._layer(x, block, layout(x, block))


def _one(v) -> float:
    return float(np.ravel(v)[0])


def _attention_s(job, **c):
    lay = _layer(job, **c)
    return _one(lay["attn_f"]), _one(lay["attn_b"])


# ------------------------------------------------------------------------------ by hand

def test_model_flops_of_a_windowed_model_by_hand():
    # 2 layers, every 2nd full: one windowed (128 keys, less the first queries' shorter
    # histories) and one full causal layer (half the 4096 keys)
    job = dataclasses.replace(FULL, sliding_window=128, full_attention_every=2)
    keys = 0.5 * 2048 + 0.5 * (128 - 128 * 127 / (2 * 4096))
    core = 2 * keys * 8 * (128 + 128)
    want = model_flops_per_token(FULL) + 3 * 2 * (core - 2 * 2048 * 8 * 256)
    assert model_flops_per_token(job) == pytest.approx(want)
    # every layer windowed: the window alone
    every = dataclasses.replace(FULL, sliding_window=128)
    assert every.windowed_layer_fraction == 1.0
    assert job.windowed_layer_fraction == 0.5


def test_a_windowed_layer_visits_the_window_and_one_key_tile():
    # all layers windowed: the fused kernel's FLOPs over (window + one tile) keys of every
    # query, against half the sequence for full causal attention
    job = dataclasses.replace(FULL, sliding_window=256, attention_kernel="fused")
    full = dataclasses.replace(FULL, attention_kernel="fused")
    x, xf = ctx(job), ctx(full)
    lay, layf = _layer(job), _layer(full)
    ratio = (256 + FLASH_KV_BLOCK) / 4096 / 0.5
    # attention time = FLOPs x factor / rate + one kernel's fixed cost (0 here)
    assert x["kernel_s"] == 0.0 and xf["kernel_s"] == 0.0
    assert _one(lay["attn_f"]) == pytest.approx(ratio * _one(layf["attn_f"]))
    assert _one(lay["attn_b"]) == pytest.approx(ratio * _one(layf["attn_b"]))


def test_unfused_yarn_rope_adds_its_passes_by_hand():
    # Megatron-Core's unfused RoPE: 12 passes forward instead of the fused kernel's 2, 10
    # backward instead of 4, over the query and key heads (8 + 8 heads of 128, 4096 tokens)
    yarn = dataclasses.replace(FULL, position="rope", rope_mscale=1.3466)
    plain = dataclasses.replace(FULL, position="rope")
    a, b = _layer(yarn), _layer(plain)
    q_bytes = 2.0 * 4096 * (8 + 8) * 128
    bw = 1000e9 * 0.5
    assert _one(a["memory_f"] - b["memory_f"]) == pytest.approx((12 - 2) * q_bytes / bw)
    assert _one(a["memory_b"] - b["memory_b"]) == pytest.approx((10 - 4) * q_bytes / bw)


def test_clamped_swiglu_and_expert_biases_add_their_passes_by_hand():
    # 8 experts top-2 on one EP rank: rows = 1024 tokens x 2; the clamp: 8 passes of the
    # 512-wide half forward, 10 backward, 3 more kernels forward, 6 backward; the biases: 6
    # and 8 passes of the 1024-wide output, one kernel pair per local expert and a cat
    clamp = dataclasses.replace(TINY, swiglu_clamp=7.0)
    bias = dataclasses.replace(TINY, bias=True)
    base = dataclasses.replace(TINY)
    x0, xc, xb = ctx(base, kernel_us=1.0), ctx(clamp, kernel_us=1.0), ctx(bias, kernel_us=1.0)
    c = cand()
    r0, rc, rb = (moe.routed_experts(x, c, layout(x, c), 100e12) for x in (x0, xc, xb))
    rows = moe.tokens_per_expert(x0, 1024.0, 1.0, 1.0) * 8
    bw = 1000e9 * 0.5
    assert _one(rc["act_f"] - r0["act_f"]) == pytest.approx(
        2 * rows * 8 * 512 / bw + 3 * 1e-6)
    assert _one(rc["act_b"] - r0["act_b"]) == pytest.approx(
        2 * rows * 10 * 512 / bw + 6 * 1e-6)
    kernels = 2 * 8 + 1
    assert _one(rb["act_f"] - r0["act_f"]) == pytest.approx(
        2 * rows * 6 * 1024 / bw + kernels * 1e-6)
    assert _one(rb["act_b"] - r0["act_b"]) == pytest.approx(
        2 * rows * 8 * 1024 / bw + 2 * kernels * 1e-6)


# ------------------------------------------------------------------------------ properties

@pytest.mark.parametrize("window", [4096, 8192, 100_000])
def test_a_window_as_long_as_the_sequence_is_full_attention(window):
    """Also past the sequence: the causal average's parabola peaks at the sequence length,
    and a window of 100,000 on 4,096 tokens gave negative model FLOPs (an outside review)."""
    long = dataclasses.replace(FULL, sliding_window=window, full_attention_every=2)
    assert _attention_s(long) == _attention_s(FULL)
    assert model_flops_per_token(long) == pytest.approx(model_flops_per_token(FULL),
                                                        rel=1e-3)


@pytest.mark.parametrize("kernel", ["flash", "fused"])
def test_a_shorter_window_is_never_slower(kernel):
    job = dataclasses.replace(FULL, attention_kernel=kernel)
    times = [_attention_s(dataclasses.replace(job, sliding_window=w))
             for w in (4096, 2048, 1024, 512, 128, 1)]
    for longer, shorter in zip(times, times[1:]):
        assert shorter[0] <= longer[0] and shorter[1] <= longer[1]
    assert times[-1][0] < times[0][0]


def test_half_windowed_layers_cost_the_mean_of_all_and_none():
    # (the fixed per-kernel cost aside, attention time is linear in the keys visited)
    full = _attention_s(FULL)
    every = _attention_s(dataclasses.replace(FULL, sliding_window=128))
    half = _attention_s(dataclasses.replace(FULL, sliding_window=128, full_attention_every=2))
    assert half[0] == pytest.approx((full[0] + every[0]) / 2)
    assert half[1] == pytest.approx((full[1] + every[1]) / 2)


def test_gpt_oss_is_expressed_with_its_window_clamp_and_yarn_scale():
    job = load_job("gpt_oss_120b")
    assert (job.sliding_window, job.full_attention_every) == (128, 2)
    assert job.windowed_layer_fraction == 0.5  # 18 of 36 layers
    x = calibrated.make_context(job, TOY, {})
    assert (x["rope_unfused"], x["clamp"], x["expert_bias"]) == (1.0, 1.0, 1.0)


# ------------------------------------------------------------------------------ validation

BASE = {"n_layers": 2, "hidden": 64, "ffn_hidden": 128, "n_heads": 4, "seq_len": 256,
        "global_batch": 8}


@pytest.mark.parametrize("extra,key", [
    ({"full_attention_every": 2}, "full_attention_every"),
    ({"swiglu_clamp": 7.0}, "swiglu_clamp"),
    ({"sliding_window": -1}, "sliding_window"),
    ({"rope_mscale": -1.0}, "rope_mscale")])
def test_inconsistent_window_and_clamp_fields_are_refused(extra, key):
    with pytest.raises(SpecError, match=key):
        parse_job({**BASE, **extra}, "job.yaml")


def test_a_zero_yarn_scale_means_none():
    assert parse_job({**BASE, "rope_mscale": 0}, "job.yaml").rope_mscale == 1.0

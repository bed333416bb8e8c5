"""Adam's states under Megatron-Core's precision-aware optimizer (Transformer Engine's
FusedAdam): the bytes a parameter holds and the bytes its step moves, by hand for each
format; the memory and step time they give a candidate; the refusals (the Megatron-Bridge
rows that ran with it: tests/analysis/test_measured.py)."""

from __future__ import annotations

import pytest

from sweep.errors import SpecError
from sweep.model.cost.calibrated import optimizer_bytes
from sweep.model.job import parse_job
from tests.conftest import calibrated_step

RAW = {"n_layers": 4, "hidden": 512, "ffn_hidden": 2048, "n_heads": 8, "vocab": 4096,
       "seq_len": 1024, "global_batch": 64, "mlp": "swiglu", "position": "rope"}
PAO = {"precision_aware_optimizer": True}
BF16_MOMENTS = {**PAO, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}


def job(**kw):
    return parse_job({**RAW, **kw}, "test.yaml", "t")


@pytest.mark.parametrize("fields, want", [
    # without it: fp32 master, m, v (12); ZeRO-3's fp32 shards are the master (8); the step
    # reads g, m, v, w (16), writes m, v, w (12) and the 16-bit copy (2)
    ({}, (12, 8, 30)),
    # bf16 job: TE keeps the master as 16-bit remainders (2 + 4 + 4); step: fp32 gradient 4,
    # remainder and bf16 parameter each read and written 8, moments 16
    (PAO, (10, 8, 28)),
    (dict(PAO, store_param_remainders=False), (12, 8, 30)),  # master 4 r/w + param write 2
    # DeepSeek-V3's recipe: bf16 moments (read and written by the kernel, fuse_unscale) and
    # bf16 main gradients: 2 + 2 + 2; step 2 + 8 + 4 + 4
    (dict(BF16_MOMENTS, main_grads_dtype="bf16"), (6, 4, 18)),
    # one bf16 moment alone is unscaled to fp32 and copied back: 2 + 4 + 8 + 4 + 2 = 20
    (dict(PAO, exp_avg_dtype="bf16"), (8, 6, 4 + 8 + 20 + 8)),
    # fp16 / fp8 moments also read their absolute maximum: 2s + 20
    (dict(PAO, exp_avg_dtype="fp16", exp_avg_sq_dtype="fp16"), (6, 4, 4 + 8 + 24 + 24)),
    (dict(PAO, exp_avg_dtype="fp8", exp_avg_sq_dtype="fp8"), (4, 2, 4 + 8 + 22 + 22)),
    # fp16 master: scaled as a state (2 + 4 + 8 + 4 + 4 + 2 = 24) and the parameter written
    (dict(PAO, main_params_dtype="fp16"), (10, 8, 4 + 26 + 16)),
    # an fp8 recipe other than delayed: Megatron-Core keeps an fp32 master, TE reads it
    # with its fp32 gradient: no remainders whatever the flag
    (dict(BF16_MOMENTS, dtype="mxfp8", main_grads_dtype="bf16"), (8, 4, 4 + 10 + 8)),
    (dict(BF16_MOMENTS, dtype="fp8", fp8_scaling="current"), (8, 4, 4 + 10 + 8)),
    # delayed fp8 leaves the master to TE: remainders of the bf16 weights, none of fp8 ones
    (dict(PAO, dtype="fp8"), (10, 8, 28)),
    (dict(PAO, dtype="fp8", lp_params=True), (12, 8, 30)),
    (dict(PAO, dtype="fp16"), (12, 8, 30)),  # remainders need bf16 parameters
])
def test_bytes_a_parameter_holds_and_its_step_moves(fields, want):
    assert optimizer_bytes(job(**fields)) == tuple(float(w) for w in want)


def test_a_lower_precision_state_never_costs_more():
    formats = ("fp32", "bf16", "fp16", "fp8")
    for m in formats:
        for v in formats:
            held, held_z3, _ = optimizer_bytes(job(**PAO, exp_avg_dtype=m, exp_avg_sq_dtype=v))
            assert held <= 12 and held_z3 <= 8


@pytest.mark.parametrize("zero, ratio", [(0, 6 / 12), (1, 6 / 12), (3, 4 / 8)])
def test_the_states_memory_and_step_of_a_candidate(zero, ratio):
    """Optimizer memory scales by the held bytes (ZeRO-3: the moments alone); the step is
    shorter; nothing else moves."""
    dp = 8
    base = calibrated_step(job(), n=dp, zero=zero, shard_group=dp)
    low = calibrated_step(job(**BF16_MOMENTS, main_grads_dtype="bf16"), n=dp, zero=zero,
                          shard_group=dp)
    assert low["mem_optimizer_bytes"][0] == pytest.approx(ratio * base["mem_optimizer_bytes"][0])
    assert low["mem_weights_bytes"][0] == base["mem_weights_bytes"][0]
    assert low["mem_activations_bytes"][0] == base["mem_activations_bytes"][0]
    assert low["t_optimizer_s"][0] < base["t_optimizer_s"][0]
    assert low["step_time_s"][0] == pytest.approx(
        base["step_time_s"][0] - base["t_optimizer_s"][0] + low["t_optimizer_s"][0], rel=1e-12)


@pytest.mark.parametrize("fields, key", [
    ({"exp_avg_dtype": "bf16"}, "exp_avg_dtype"),
    ({"main_grads_dtype": "bf16"}, "main_grads_dtype"),
    ({"main_params_dtype": "fp16"}, "main_params_dtype"),
    ({**PAO, "dtype": "fp32"}, "precision_aware_optimizer"),
    ({**PAO, "exp_avg_dtype": "int8"}, "exp_avg_dtype"),
])
def test_inconsistent_optimizer_fields_are_refused(fields, key):
    with pytest.raises(SpecError) as err:
        job(**fields)
    assert err.value.key == key


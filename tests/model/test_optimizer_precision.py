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
    # (16-bit gradients' widening into the fp32 main gradient is not counted: 30 as well)
    ({"grad_dtype": "bf16"}, (12, 8, 30)),
    # bf16 job: TE keeps the master as 16-bit remainders (2 + 4 + 4); step: the fp32
    # gradient 4, remainder and bf16 parameter each read and written 8, moments 16
    (PAO, (10, 8, 28)),
    (dict(PAO, grad_dtype="bf16"), (10, 8, 26)),  # TE reads the 16-bit buffer as it is
    (dict(PAO, store_param_remainders=False), (12, 8, 30)),  # master 4 r/w + param write 2
    # DeepSeek-V3's recipe: bf16 moments (read and written by the kernel, fuse_unscale) and
    # bf16 gradients: 2 + 2 + 2; step 2 + 8 + 4 + 4
    (dict(BF16_MOMENTS, grad_dtype="bf16"), (6, 4, 18)),
    # one bf16 moment alone: widened (2 + 4), the kernel (8), narrowed to a temporary
    # (4 + 2) and copied (2 + 2): 24
    (dict(PAO, exp_avg_dtype="bf16"), (8, 6, 4 + 8 + 24 + 8)),
    # fp16: widened (6), scaled (8), the kernel (8), aminmax (4), divided (8), narrowed (6)
    (dict(PAO, exp_avg_dtype="fp16", exp_avg_sq_dtype="fp16"), (6, 4, 4 + 8 + 40 + 40)),
    # fp8: dequantized (5), the kernel (8), aminmax (4), quantized (5)
    (dict(PAO, exp_avg_dtype="fp8", exp_avg_sq_dtype="fp8"), (4, 2, 4 + 8 + 22 + 22)),
    # which moment is which matters: bf16 first moment scaled (24), fp16 second (40)
    (dict(PAO, exp_avg_dtype="bf16", exp_avg_sq_dtype="fp16"), (6, 4, 4 + 8 + 24 + 40)),
    # fp16 master: scaled as a state (40) and the parameter written (2)
    (dict(PAO, main_params_dtype="fp16"), (10, 8, 4 + 42 + 16)),
    # an fp8 recipe other than delayed: Megatron-Core keeps an fp32 master and hands TE an
    # fp32 copy of the gradients (read 4): no remainders whatever the flag
    (dict(BF16_MOMENTS, dtype="mxfp8", grad_dtype="bf16"), (8, 4, 4 + 10 + 8)),
    (dict(BF16_MOMENTS, dtype="fp8", fp8_scaling="current"), (8, 4, 4 + 10 + 8)),
    # delayed fp8 leaves the master to TE: remainders of the bf16 weights
    (dict(PAO, dtype="fp8"), (10, 8, 28)),
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
    low = calibrated_step(job(**BF16_MOMENTS), n=dp, zero=zero, shard_group=dp)
    assert low["mem_optimizer_bytes"][0] == pytest.approx(ratio * base["mem_optimizer_bytes"][0])
    assert low["mem_weights_bytes"][0] == base["mem_weights_bytes"][0]
    assert low["mem_activations_bytes"][0] == base["mem_activations_bytes"][0]
    assert low["t_optimizer_s"][0] < base["t_optimizer_s"][0]
    assert low["step_time_s"][0] == pytest.approx(
        base["step_time_s"][0] - base["t_optimizer_s"][0] + low["t_optimizer_s"][0], rel=1e-12)


@pytest.mark.parametrize("fields, key", [
    ({"exp_avg_dtype": "bf16"}, "exp_avg_dtype"),
    ({"exp_avg_sq_dtype": "fp8"}, "exp_avg_sq_dtype"),
    ({**PAO, "exp_avg_dtype": "bf16", "dtype": "fp8", "lp_params": True}, "exp_avg_dtype"),
    ({**PAO, "dtype": "fp8", "lp_params": True}, "store_param_remainders"),
    ({"main_params_dtype": "fp16"}, "main_params_dtype"),
    ({**PAO, "dtype": "fp32"}, "precision_aware_optimizer"),
    ({**PAO, "exp_avg_dtype": "int8"}, "exp_avg_dtype"),
])
def test_inconsistent_optimizer_fields_are_refused(fields, key):
    with pytest.raises(SpecError) as err:
        job(**fields)
    assert err.value.key == key



def test_fp8_weights_under_delayed_scaling_take_fp32_states():
    fp8 = job(**PAO, dtype="fp8", lp_params=True, store_param_remainders=False)
    assert optimizer_bytes(fp8) == (12.0, 8.0, 30.0)


def test_zero_3_holds_the_moments_and_experts_follow():
    """ZeRO-3 against ZeRO-1 in absolute bytes (the moments alone against master and
    moments), the routed experts' states scaled alike, and the states' offload streaming
    half the bytes."""
    dp = 8
    bf = job(**BF16_MOMENTS)
    z1 = calibrated_step(bf, n=dp, zero=1, shard_group=dp)["mem_optimizer_bytes"][0]
    z3 = calibrated_step(bf, n=dp, zero=3, shard_group=dp)["mem_optimizer_bytes"][0]
    assert z3 == pytest.approx(4.0 / 6.0 * z1)
    moe = {"n_experts": 8, "top_k": 2, "moe_ffn_hidden": 512}
    for zero in (1, 3):
        base = calibrated_step(job(**moe), n=dp, zero=zero, shard_group=dp, ep=8)
        low = calibrated_step(job(**moe, **BF16_MOMENTS), n=dp, zero=zero, shard_group=dp, ep=8)
        assert low["mem_optimizer_bytes"][0] == pytest.approx(
            base["mem_optimizer_bytes"][0] * (6 / 12 if zero == 1 else 4 / 8))
    off = {}
    for name, j in (("fp32", job()), ("bf16", bf)):
        on = calibrated_step(j, n=dp, zero=1, shard_group=dp, offload=4)["t_offload_s"][0]
        off[name] = on
    assert off["bf16"] == pytest.approx(off["fp32"] * 6 / 12)


def test_the_option_needs_a_distributed_optimizer():
    """Megatron-Core refuses it without the distributed optimizer: no ZeRO 0 candidate where
    the data-parallel group has more than one GPU (one GPU: ZeRO 0 is all there is)."""
    from sweep.model.candidates import enumerate_calibrated

    for fields, n in ((PAO, 8), ({}, 8), (PAO, 1)):
        space = enumerate_calibrated(job(**fields), n, 8)
        cols = space.columns(0, len(space))
        grouped = cols["dp"] * cols["cp"] > 1
        zeros = set(cols["zero"][grouped].tolist()) if n > 1 else set(cols["zero"].tolist())
        assert (0 in zeros) == (not fields or n == 1), (fields, n)

"""The calibrated profile: hand-computed cases per feature, and properties.

The toy machine has round numbers (100 TFLOP/s bf16, 1 TB/s HBM, 100 GB/s NVLink, 10 GB/s
per NIC, 100 SMs, 128 x 128 GEMM tiles) and the calibration is fixed (GEMM, attention and HBM
efficiency 0.5, no kernel overhead, ideal links, no reserve), so every expected value below
is a few lines of arithmetic.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from sweep.engine.catalog import load_hardware, load_job
from sweep.model.candidates import (
    enumerate_calibrated,
    enumerate_space,
    last_stage_layers,
    stage_layers,
)
from sweep.model.cost import calibrated, evaluate_columns, kernels, op_table
from sweep.model.cost.kernels import collective_s, flash_attention_s, gemm_s, p2p_s
from sweep.model.hardware import parse_hardware
from sweep.model.job import Job
from sweep.model.schema import Reason, Recompute
from tests.conftest import candidate_block

PARAMS = {"gemm_eff": 0.5, "attn_eff": 0.5, "hbm_eff": 0.5, "kernel_us": 0.0, "nvl_eff": 1.0,
          "net_eff": 1.0, "fp8_eff": 1.0, "reserve_GiB": 0.0, "allocator_cache": 0.0}
TOY = dataclasses.replace(parse_hardware({
    "name": "toy", "matrix_tflops": {"bf16": 100, "fp8": 200},
    "vector_tflops": {"bf16": 10, "fp32": 5}, "hbm_GBps": 1000, "hbm_GB": 80,
    "nvlink_GBps": 100, "nvlink_latency_us": 1, "nvlink_domain": 8, "scaleout_GBps": 10,
    "scaleout_latency_us": 5, "nics_per_gpu": 1, "sm_count": 100, "gemm_tile": [128, 128],
}, "toy"), generation="toy", calibration=PARAMS)  # (no generation's typical values)
# two GELU / LayerNorm layers of width 1024, no vocabulary, 8 sequences of 1024 tokens;
# every TP collective waits for its data (the asynchronous backward ones: their own test)
TINY = Job(name="tiny", n_layers=2, hidden=1024, ffn_hidden=4096, n_heads=8, n_kv_heads=8,
           head_dim=128, vocab=0, seq_len=1024, global_batch=8, tp_async_bwd=False)
TE = 1024 * 1024  # tokens x hidden of one sequence


def ctx(job=TINY, hw=TOY, **params):
    return calibrated.make_context(job, hw, {**PARAMS, **params})


def cand(n=1, **kw):
    """Column block of n identical candidates (degrees 1, groups inside one domain)."""
    return candidate_block(n, **kw)


def run(job=TINY, hw=TOY, params=None, **kw):
    out = calibrated.evaluate(ctx(job, hw, **(params or {})), cand(**kw))
    return {k: float(np.asarray(v).ravel()[0]) for k, v in out.items()}


# ------------------------------------------------------------------------------ kernels

def test_gemm_one_full_wave_is_flops_over_efficient_peak():
    x = ctx()
    # 10 x 10 tiles of 128 fill the 100 SMs once; k = 1280 is a multiple of the k-tile
    t = gemm_s(1280, 1280, 1280, x, 100e12, 0.5)
    assert t == pytest.approx(2 * 1280**3 / 50e12, rel=1e-12)


def test_gemm_wave_quantization_takes_the_best_tile():
    x = ctx()
    # 11 x 11 tiles = 121 on 100 SMs: 2 waves at 60.5%; half tiles 242 -> 80.7%;
    # quarter tiles 484 on 5 waves -> 96.8%, the best
    t = gemm_s(1408, 1408, 1280, x, 100e12, 0.5)
    assert t == pytest.approx(2 * 1408**2 * 1280 / (50e12 * 484 / 500), rel=1e-12)


def test_gemm_k_padding_and_misalignment():
    x = ctx()
    # k = 96 is padded to 128: 75% of the math is useful
    t = gemm_s(1280, 1280, 96, x, 100e12, 0.5)
    assert t == pytest.approx(2 * 1280**2 * 96 / (50e12 * 0.75), rel=1e-12)
    # n = 1001 is not a multiple of 8: no tensor cores, the vector peak (10 TFLOP/s)
    slow = gemm_s(1280, 1001, 1280, x, 100e12, 0.5)
    fast = gemm_s(1280, 1000, 1280, x, 100e12, 0.5)
    assert slow > 9 * fast


def test_misaligned_16bit_gemms_fall_back_to_the_fp32_fma_peak():
    # PyTorch accumulates 16-bit GEMMs in fp32: off the tensor cores they run on the fp32
    # units (A100: 19.5 TFLOP/s, not its 78 TFLOP/s half2 or 39 TFLOP/s bf16 vector peak)
    hw = load_hardware("A100-80GB")
    for dtype in ("bf16", "fp16"):
        x = calibrated.make_context(dataclasses.replace(load_job("llama3_8b"), dtype=dtype),
                                    hw, hw.calibration)
        assert x["vpeak_flops_per_s"] == pytest.approx(19.5e12)
        # a head dimension of 108 (QK^T's k) is not a multiple of 8
        batched = gemm_s(2048, 2048, 108, x, x["peak16_flops_per_s"], 1.0, batch=64)
        flops = 2 * 2048 * 2048 * 108 * 64
        assert batched >= flops / 19.5e12


def test_gemm_memory_bound_shape_is_the_operand_traffic():
    x = ctx()
    # (1 x 8192)(8192 x 8192): 128 MiB of weights read at 0.5 TB/s
    t = gemm_s(1, 8192, 8192, x, 100e12, 0.5)
    assert t == pytest.approx(2 * (8192 + 8192**2 + 8192) / 0.5e12, rel=1e-12)


def test_a_low_precision_gemm_reads_its_quantized_operands():
    """The roofline of an fp8 / MXFP8 / NVFP4 GEMM reads its two quantized inputs (values
    and block scales) and writes its 16-bit output: the memory-bound (1 x 8192)(8192 x 8192)
    reads 64 MiB of fp8 weights, not 128 MiB. (Every operand was priced at 2 bytes.)"""
    for dtype, per_element in (("bf16", 2.0), ("fp8", 1.0), ("mxfp8", 1.0 + 1 / 32),
                               ("nvfp4", 0.5 + 1 / 16)):
        hw = dataclasses.replace(TOY, matrix_flops_per_s={**TOY.matrix_flops_per_s,
                                                          "fp4": 400e12})
        x = ctx(dataclasses.replace(TINY, dtype=dtype), hw)
        assert x["gemm_operand_bytes"] == per_element
        # (a peak high enough that the math, 1 row of a 128-row tile, takes no time)
        t = gemm_s(1, 8192, 8192, x, 1e17, 0.5, operand_bytes=x["gemm_operand_bytes"])
        assert t == pytest.approx((per_element * (8192 + 8192**2) + 2 * 8192) / 0.5e12,
                                  rel=1e-9), dtype
    # in a layer: memory-bound fp8 GEMMs (one token a micro-batch, slow memory) are faster
    one_token = dataclasses.replace(TINY, seq_len=1, global_batch=1, dtype="fp8")
    x = ctx(one_token, hbm_eff=0.001)
    fp8_lay = calibrated._layer(x, cand(), calibrated._layout(x, cand()))
    x16 = dict(x, gemm_operand_bytes=2.0)
    as16 = calibrated._layer(x16, cand(), calibrated._layout(x16, cand()))
    for part in ("gemm_f_each", "gemm_b_each"):
        assert all(float(np.ravel(a)[0]) < float(np.ravel(b)[0])
                   for a, b in zip(fp8_lay[part], as16[part])), part


def test_flash_attention_forward_and_backward():
    x = ctx()
    # 8 heads x 10 query blocks = 80 thread blocks on 100 SMs; causal halves the FLOPs
    fwd = flash_attention_s(1, 8, 1280, 1280, 128, x, 0.5, False)
    flops = 4 * 8 * 1280**2 * 128 * 0.5
    assert fwd == pytest.approx(flops / (100e12 * 0.5 * 0.8), rel=1e-12)
    bwd = flash_attention_s(1, 8, 1280, 1280, 128, x, 0.5, True)
    assert bwd == pytest.approx(2.5 * fwd, rel=1e-12)
    # head dim 80 is padded to 96 in the kernel: it takes as long as 96
    d80 = flash_attention_s(1, 8, 1280, 1280, 80, x, 0.5, False)
    d96 = flash_attention_s(1, 8, 1280, 1280, 96, x, 0.5, False)
    assert d80 == pytest.approx(d96, rel=1e-12) and d96 == pytest.approx(0.75 * fwd, rel=1e-12)


def test_softmax_exponentials_by_hand():
    """Attention pays for the SFU exponentials it does not hide (kernels.softmax_exp_factor):
    at head dim 128 on its generation's reference ratio nothing changes; Blackwell Ultra's
    doubled exponentials give cuDNN's measured GB300 / GB200 speed-ups, forward 1.18 and
    backward 1.08 (1574 -> 1856 and 1332 -> 1435 TFLOP/s, bf16 causal, d = 128, s = 8192);
    a 64-wide head pays more per FLOP."""
    g = kernels.EXP_EXPOSED
    b200 = dataclasses.replace(TOY, generation="blackwell", exp_per_s=100e12 / 512)
    ultra = dataclasses.replace(b200, exp_per_s=100e12 / 256)
    x, xu = ctx(hw=b200), ctx(hw=ultra)
    assert x["flops_per_exp"] == x["flops_per_exp_ref"] == 512.0  # 8192 FLOPs / 16 exp2
    assert xu["flops_per_exp"] == 256.0 and xu["flops_per_exp_ref"] == 512.0

    def fa(x, d, backward):
        return flash_attention_s(1, 8, 1280, 1280, d, x, 0.5, backward) - x["kernel_s"]

    flops = 4 * 8 * 1280**2 * 128 * 0.5
    assert fa(x, 128, False) == pytest.approx(flops / (100e12 * 0.5 * 0.8), rel=1e-12)
    # forward: one exponential per 4 d = 512 FLOPs, 512 FLOPs per exponential: r = 1 -> 1/2
    assert fa(x, 128, False) / fa(xu, 128, False) == pytest.approx((1 + g) / (1 + g / 2),
                                                                  rel=1e-12)
    assert fa(x, 128, False) / fa(xu, 128, False) == pytest.approx(1856 / 1574, abs=0.002)
    # backward: 2.5 x the FLOPs, the same exponentials: r = 0.4 -> 0.2
    assert fa(x, 128, True) / fa(xu, 128, True) == pytest.approx(
        (1 + 0.4 * g) / (1 + 0.2 * g), rel=1e-12)
    assert fa(x, 128, True) / fa(xu, 128, True) == pytest.approx(1435 / 1332, abs=0.005)
    # d = 64: half the FLOPs per exponential, r = 2 forward
    per_flop_64 = fa(x, 64, False) / (flops / 2)
    assert per_flop_64 / (fa(x, 128, False) / flops) == pytest.approx((1 + 2 * g) / (1 + g),
                                                                      rel=1e-12)
    # a head padded in the kernel pays the exponentials of its padded width: 80 as 96
    assert fa(x, 80, False) == pytest.approx(fa(x, 96, False), rel=1e-12)
    assert fa(x, 80, True) == pytest.approx(fa(x, 96, True), rel=1e-12)
    # the catalog: GB300 and GB200 differ in their exponentials only, here
    gb200, gb300 = (ctx(hw=load_hardware(n)) for n in ("GB200-NVL72", "GB300-NVL72"))
    assert gb200["sm_count"] == gb300["sm_count"] == 152
    assert fa(gb200, 128, False) / fa(gb300, 128, False) == pytest.approx(1.179, abs=1e-3)


def test_a_swept_tensor_peak_keeps_the_exponential_rate():
    """A spec that doubles the tensor peak (a grid's matrix_tflops) doubles the FLOPs per
    exponential: the special-function units are not the tensor cores."""
    from sweep.model.hardware import apply_overrides

    b200 = load_hardware("B200")
    fast = apply_overrides(b200, {"matrix_tflops": 4500}, "s.yaml")
    assert fast.exp_per_s == b200.exp_per_s == pytest.approx(2250e12 / 512)
    assert ctx(hw=fast)["flops_per_exp"] == pytest.approx(1024.0)
    assert ctx(hw=b200)["flops_per_exp"] == pytest.approx(512.0)


def test_more_exponential_throughput_is_never_slower():
    for d in (32, 64, 96, 128, 192, 256):
        times = [flash_attention_s(2, 16, 4096, 4096, d, ctx(hw=dataclasses.replace(
            TOY, generation="hopper", exp_per_s=100e12 / fpe)), 0.5, bwd)
            for bwd in (False, True) for fpe in (1024.0, 512.0, 256.0, 128.0, 64.0)]
        for a, b in itertools.pairwise(times[:5]):
            assert b <= a
        for a, b in itertools.pairwise(times[5:]):
            assert b <= a


def test_ring_collectives_inside_and_across_domains():
    x = ctx()
    inside = collective_s("allreduce", 8e8, 8, 8, x)
    assert inside == pytest.approx(2 * 7 / 8 * 8e8 / 100e9 + 2 * 7 * 1e-6, rel=1e-12)
    # 16 GPUs, 8 per domain: the domain's 8 NICs (80 GB/s) bound the ring below NVLink
    across = collective_s("allreduce", 8e8, 16, 8, x)
    assert across == pytest.approx(2 * 15 / 16 * 8e8 / 80e9 + 2 * 15 * 5e-6, rel=1e-12)
    gather = collective_s("allgather", 8e8, 8, 8, x)
    assert gather == pytest.approx(inside / 2, rel=1e-12)
    assert collective_s("allreduce", 8e8, 1, 1, x) == 0.0
    assert p2p_s(1e8, False, x) == pytest.approx(5e-6 + 1e8 / 10e9, rel=1e-12)


def test_collectives_below_the_half_bandwidth_size_run_at_half_the_bus_bandwidth():
    # TOY with 8 MB per rank inside the domain (a ring of 8: half bandwidth at 64 MB) and
    # 1 MB across (a ring of 16: 16 MB)
    hw = dataclasses.replace(TOY, nvlink_half_bandwidth_per_rank_bytes=8e6,
                             scaleout_half_bandwidth_per_rank_bytes=1e6)
    x = ctx(hw=hw)
    lat = 2 * 7 * 1e-6
    # 8e8 B > 64 MB: 64 MB more on the wire, busbw = 100 GB/s x 800 / 864
    big = collective_s("allreduce", 8e8, 8, 8, x)
    assert big == pytest.approx(2 * 7 / 8 * (8e8 + 64e6) / 100e9 + lat, rel=1e-12)
    # 3.2e7 B < 64 MB: twice its bytes, half the bus bandwidth
    small = collective_s("allreduce", 3.2e7, 8, 8, x)
    assert small == pytest.approx(2 * 7 / 8 * 6.4e7 / 100e9 + lat, rel=1e-12)
    # across domains the scale-out half size applies
    across = collective_s("allreduce", 8e8, 16, 8, x)
    assert across == pytest.approx(2 * 15 / 16 * (8e8 + 16e6) / 80e9 + 2 * 15 * 5e-6,
                                   rel=1e-12)
    # without a half size (the default) nothing changes
    assert collective_s("allreduce", 8e8, 8, 8, ctx()) == pytest.approx(
        2 * 7 / 8 * 8e8 / 100e9 + lat, rel=1e-12)


def test_collective_time_never_falls_with_more_bytes_or_a_larger_half_size():
    sizes = np.geomspace(1e3, 1e11, 400)
    for half in (0.0, 1e6, 64e6, 256e6):
        x = ctx(hw=dataclasses.replace(TOY, nvlink_half_bandwidth_per_rank_bytes=half,
                                       scaleout_half_bandwidth_per_rank_bytes=half / 4))
        for kind in ("allreduce", "allgather", "broadcast"):
            for group, per_domain in ((8, 8), (64, 8)):
                t = collective_s(kind, sizes, group, per_domain, x)
                assert np.all(np.diff(t) >= 0)
    t = [collective_s("allreduce", 1e8, 8, 8, ctx(hw=dataclasses.replace(
        TOY, nvlink_half_bandwidth_per_rank_bytes=h))) for h in (0.0, 1e7, 1e8, 1e9)]
    assert np.all(np.diff(t) >= 0)


# ------------------------------------------------------------------------------ memory

P_LAYER = 4 * 1024**2 + 2 * 1024 * 4096 + 4 * 1024  # attention + MLP + two LayerNorms
ACT_LAYER = 32 * TE + 8 * 1024 * 4  # K22-style 32 s b h bytes + FlashAttention's row stats


def test_memory_of_plain_data_parallel_training():
    r = run()
    P = 2 * P_LAYER
    assert r["mem_weights_bytes"] == 2 * P
    assert r["mem_grads_bytes"] == 4 * P  # fp32 main gradients
    assert r["mem_optimizer_bytes"] == 12 * P  # fp32 master + Adam m, v
    # both layers' activations kept, plus one layer's gradients in flight
    assert r["mem_activations_bytes"] == 3 * ACT_LAYER
    assert r["mem_bytes"] == 18 * P + 3 * ACT_LAYER


def test_zero_stages_shard_what_they_should():
    P = 2 * P_LAYER
    z = {k: run(dp=8, zero=k) for k in range(4)}
    assert z[0]["mem_optimizer_bytes"] == 12 * P
    assert z[1]["mem_optimizer_bytes"] == 12 * P / 8 and z[1]["mem_grads_bytes"] == 4 * P
    assert z[2]["mem_grads_bytes"] == 4 * P / 8 + 4 * P_LAYER  # shard + one layer's bucket
    # FSDP: fp32 sharded master weights, two layers gathered (prefetch), Adam states
    assert z[3]["mem_weights_bytes"] == 4 * P / 8 + 2 * 2 * P_LAYER
    assert z[3]["mem_optimizer_bytes"] == 8 * P / 8
    totals = [z[k]["mem_bytes"] for k in range(4)]
    assert totals == sorted(totals, reverse=True)


def test_recompute_policies_keep_less_and_cost_more():
    none, sel, full = (run(recompute=r) for r in (Recompute.NONE, Recompute.SELECTIVE,
                                                  Recompute.FULL))
    # flash attention keeps no score matrix, so selective recompute saves nothing on memory
    assert sel["mem_activations_bytes"] == none["mem_activations_bytes"]
    # full: each layer keeps its input (2 bytes x s x h); backward needs one layer's full
    # activations (in place of its input) and their gradients
    assert full["mem_activations_bytes"] == 2 * 2 * TE + 2 * ACT_LAYER - 2 * TE
    assert none["step_time_s"] < sel["step_time_s"] < full["step_time_s"]
    deep = dataclasses.replace(TINY, n_layers=8)
    none, full = run(deep), run(deep, recompute=Recompute.FULL)
    first = run(deep, recompute=Recompute.FIRST_K, recompute_layers=4)
    assert first["mem_activations_bytes"] == 4 * 2 * TE + 4 * ACT_LAYER + 2 * ACT_LAYER - 2 * TE
    assert full["mem_bytes"] < first["mem_bytes"] < none["mem_bytes"]
    assert none["step_time_s"] < first["step_time_s"] < full["step_time_s"]


def test_selective_recompute_counts_the_flops_it_times():
    """Selective recompute re-runs FlashAttention's whole forward (score and context
    products: 4 H s^2 d per layer and sequence) but only the materialized path's score GEMM
    and softmax (half): the executed FLOPs (HFU) count what the time charges (full attention
    here, so no causal share)."""
    full_attention = dataclasses.replace(TINY, causal=False)
    forward = 4 * 8 * 1024 * 1024 * 128 * 2 * 8  # per layer and sequence, 2 layers, 8 sequences
    for kernel, share in (("flash", 1.0), ("materialized", 0.5)):
        job = dataclasses.replace(full_attention, attention_kernel=kernel)
        none, sel = run(job), run(job, recompute=Recompute.SELECTIVE)
        assert sel["hardware_flops"] - none["hardware_flops"] == share * forward


def test_materialized_attention_selective_recompute_drops_the_scores():
    job = dataclasses.replace(TINY, attention_kernel="materialized")
    none, sel = run(job), run(job, recompute=Recompute.SELECTIVE)
    scores = 8 * 1024 * 1024 * 2  # heads x s x s, 16-bit softmax output kept per layer
    assert none["mem_activations_bytes"] - sel["mem_activations_bytes"] == 2 * scores


def test_activations_of_a_gpt_layer_are_korthikantis_table_2():
    """K22 table 2 (tensor and sequence parallel, per layer, 16-bit, dropout after attention
    and after the MLP): 34 s b h / t bytes with the score matrix recomputed, 34 s b h / t + 5
    a s^2 b / t without; the model counts FlashAttention's softmax statistics besides, so
    the materialized score matrix is checked here. A dropout on the MLP's hidden activation
    (timm's ViT: mlp_dropout) adds its 1-byte mask, 4 s b h / t."""
    job = dataclasses.replace(load_job("gpt3"), attention_kernel="materialized")
    s, h, a, t = job.seq_len, job.hidden, job.n_heads, 8
    sbh_t = s * h / t

    def per_layer(job, recompute):
        return calibrated._activation_bytes_per_layer(ctx(job), s, s / t, t, True, 1,
                                                      recompute)

    assert per_layer(job, Recompute.SELECTIVE) == 34 * sbh_t
    assert per_layer(job, Recompute.NONE) == 34 * sbh_t + 5 * a * s * s / t
    vit_like = dataclasses.replace(job, mlp_dropout=True)
    assert per_layer(vit_like, Recompute.SELECTIVE) == 38 * sbh_t


def test_per_op_recompute_saves_every_other_gemm_output():
    job = dataclasses.replace(TINY, mlp="swiglu")
    op = run(job, recompute=Recompute.OP_SAC)
    none = run(job)
    # kept: layer input, q and v, attention output, gate and down outputs (+ row stats)
    kept = 2 * TE * (1 + 2 + 1 + 4 + 1) + 8 * 1024 * 4
    assert op["mem_activations_bytes"] == 2 * kept + (none["mem_activations_bytes"]
                                                      - 2 * (none["mem_activations_bytes"]
                                                             / 3))
    assert none["step_time_s"] < op["step_time_s"]


def test_fused_loss_halves_the_logits():
    job = dataclasses.replace(TINY, vocab=32768)
    plain = run(job)
    fused = run(dataclasses.replace(job, fused_loss=True))
    logits = 1024 * 32768  # tokens x vocabulary of one micro-batch
    assert plain["mem_activations_bytes"] - fused["mem_activations_bytes"] == (8 - 4) * logits


def test_pipeline_stages_hold_the_embedding_first_and_the_logits_last():
    """Megatron-Core puts the LM head on the last pipeline stage: in 1F1B the first stage
    keeps p micro-batches' activations and no logits, the last stage one micro-batch's and
    the logits; a candidate is judged by the larger (the first stage was charged the last's
    logits too: 8.4 GB too many for Llama 3 8B at PP 4 on one micro-batch of 8192 tokens)."""
    logits = 1024 * 32768 * 8  # tokens x vocabulary x (fp32 softmax + its gradient)
    for vocab, first, last in ((4096, 2 * 2 * ACT_LAYER, 0.0),
                               (32768, 0.0, 2 * ACT_LAYER + logits)):
        job = dataclasses.replace(TINY, n_layers=4, vocab=vocab)
        one_stage = run(job, recompute=Recompute.NONE)
        assert one_stage["mem_activations_bytes"] == 4 * ACT_LAYER + ACT_LAYER + 1024 * vocab * 8
        two = run(job, pp=2)  # 8 micro-batches, two layers a stage
        assert two["mem_activations_bytes"] == max(first, last) + ACT_LAYER  # (+ backward's)


def test_a_dense_job_with_an_mtp_depth_is_priced_on_its_last_stage():
    """A dense job may have multi-token-prediction depths too (a KeyError for the MoE terms
    before, in pipelines): the depth's block sits on the last stage, so a two-stage pipeline
    is judged by that stage, which holds one more block and the depth's logits."""
    job = dataclasses.replace(TINY, n_layers=4, vocab=32768)
    plain, mtp = run(job, pp=2), run(dataclasses.replace(job, mtp_layers=1), pp=2)
    assert mtp["mem_bytes"] > plain["mem_bytes"]
    assert mtp["step_time_s"] > plain["step_time_s"]


def test_vocabulary_is_padded_for_tensor_parallel_shards():
    assert calibrated.padded_vocab(50257, 1) == 50304  # 393 x 128
    assert calibrated.padded_vocab(50257, 8) == 51200  # multiple of 128 x 8
    assert calibrated.padded_vocab(0, 8) == 0


def test_inference_has_no_backward_gradients_or_optimizer():
    train, infer = run(), run(dataclasses.replace(TINY, training=False))
    assert infer["mem_grads_bytes"] == infer["mem_optimizer_bytes"] == 0
    assert infer["mem_activations_bytes"] == ACT_LAYER  # one layer at a time
    assert infer["t_optimizer_s"] == 0 and infer["step_time_s"] < train["step_time_s"] / 2


def test_a_forward_only_jobs_model_flops_are_one_forward():
    """MFU's numerator for a forward-only job is one forward pass, a third of training's
    (2 FLOPs per weight and token, no backward): so MFU stays below HFU (it read 3x)."""
    from sweep.model.cost.flops import model_flops_per_token

    job = dataclasses.replace(load_job("llama3_8b"), global_batch=64, training=False)
    hw = load_hardware("H100-SXM")
    space = enumerate_space("calibrated", job, 8, "1d", 8)
    out = evaluate_columns("calibrated", job, hw, "1d", 8, space.columns(0, space.size))
    forward = model_flops_per_token(dataclasses.replace(job, training=True)) / 3.0
    assert model_flops_per_token(job, training=False) == forward
    np.testing.assert_allclose(out["model_flops"], forward * 64 * job.seq_len / 8, rtol=1e-12)
    fits = out["feasible"]
    assert fits.any() and np.all(out["mfu"][fits] <= out["hfu"][fits])


def test_offload_moves_optimizer_state_to_the_host_tier():
    hw = dataclasses.replace(TOY, host_memory_bytes=1e12, host_link_bytes_per_s=50e9)
    on, off = run(hw=hw, offload=4), run(hw=hw)
    P = 2 * P_LAYER
    assert on["mem_optimizer_bytes"] == 0 and off["mem_optimizer_bytes"] == 12 * P
    assert on["t_offload_s"] == pytest.approx(2 * 12 * P / 50e9, rel=1e-12)
    small = dataclasses.replace(hw, host_memory_bytes=1e6)
    assert run(hw=small, offload=4)["reason"] == Reason.OFFLOAD_CAPACITY


# ------------------------------------------------------------------------------ time

def test_tensor_parallel_all_reduces_per_layer():
    one, two = run(), run(tp=2)
    # 2 all-reduces forward, 2 backward, of the (s, h) activation: 2 bytes x TE
    ar = 2 * 1 / 2 * 2 * TE / 100e9 + 2 * 1 * 1e-6
    assert two["t_tp_comm_s"] == pytest.approx(8 * 2 * 4 * ar, rel=1e-9)  # 8 mb, 2 layers
    assert one["t_tp_comm_s"] == 0
    sp = run(tp=2, sp=1)  # sequence parallelism re-gathers once more in backward
    assert sp["t_tp_comm_s"] == pytest.approx(8 * 2 * 5 * ar, rel=1e-9)
    overlapped = run(tp=2, sp=1, tp_overlap=1)
    assert overlapped["t_tp_comm_s"] < sp["t_tp_comm_s"] * 0.5


def test_te_backward_collectives_hide_behind_the_column_parallel_gemms():
    """Transformer Engine's column-parallel linears (QKV, fc1) launch their backward
    collectives asynchronously: with SP the input re-gathers behind the dgrad GEMMs and the
    dgrad reduce-scatters behind the wgrad GEMMs (each half of the two linears' backward), so
    of the backward's three all-reduce volumes only the row-parallel gradients' gathers (one)
    wait, plus what outlasts those GEMMs; without SP the dgrad all-reduces (two volumes)
    behind the wgrad GEMMs."""
    job = dataclasses.replace(TINY, tp_async_bwd=True)
    ar = 2 * 1 / 2 * 2 * TE / 100e9 + 2 * 1 * 1e-6
    T, e, f = 1024, 1024, 4096
    x = ctx(job)
    # dgrad (= wgrad) of QKV (3e / 2 wide) and fc1 (f / 2 wide) on one of 2 TP ranks
    half = sum(float(gemm_s(T, n, e, x, 100e12, 0.5)) for n in (3 * e / 2, f / 2))
    sp_bwd = ar + max(ar - half, 0.0) + max(ar - half, 0.0)
    plain_bwd = max(2 * ar - half, 0.0)
    for sp, bwd in ((1, sp_bwd), (0, plain_bwd)):
        r = run(job, tp=2, sp=sp)
        assert r["t_tp_comm_s"] == pytest.approx(8 * 2 * (2 * ar + bwd), rel=1e-9)
        assert r["t_tp_comm_s"] < run(tp=2, sp=sp)["t_tp_comm_s"]
    # userbuffers overlap replaces it
    assert run(job, tp=2, sp=1, tp_overlap=1)["t_tp_comm_s"] == \
        run(tp=2, sp=1, tp_overlap=1)["t_tp_comm_s"]


def test_pipeline_bubble_is_p_minus_1_over_v_m():
    job = dataclasses.replace(TINY, n_layers=8, global_batch=32)
    fast = dataclasses.replace(TOY, nvlink_bytes_per_s=1e18, nvlink_latency_s=0.0)
    for v in (1, 2):
        r = run(job, fast, pp=4, vpp=v)
        m = 32
        steady = r["step_time_s"] - r["t_bubble_s"] - r["t_pp_comm_s"] - r["t_dp_comm_s"] \
            - r["t_optimizer_s"]
        assert r["t_bubble_s"] / steady == pytest.approx(3 / (v * m), rel=1e-9)


def test_context_parallel_splits_activations_and_adds_the_ring():
    one, two = run(), run(cp=2)
    assert two["mem_activations_bytes"] < 0.55 * one["mem_activations_bytes"]
    assert two["t_cp_comm_s"] > 0 and one["t_cp_comm_s"] == 0


def test_gqa_and_swiglu_change_the_weights():
    gqa = dataclasses.replace(TINY, n_kv_heads=2)
    assert run(gqa)["mem_weights_bytes"] == 2 * 2 * (P_LAYER - 2 * 1024 * 768)
    swiglu = dataclasses.replace(TINY, mlp="swiglu")
    assert run(swiglu)["mem_weights_bytes"] == 2 * 2 * (P_LAYER + 1024 * 4096)


def test_causal_attention_costs_half_the_full_attention():
    x_causal, x_full = ctx(), ctx(dataclasses.replace(TINY, causal=False))
    c = cand()
    a = calibrated.op_table(x_causal, c)
    b = calibrated.op_table(x_full, c)
    core = {r["name"]: float(r["time_s"][0]) for r in a}["attention core"]
    core_full = {r["name"]: float(r["time_s"][0]) for r in b}["attention core"]
    assert core_full == pytest.approx(2 * core, rel=1e-9)


def _norm_row(job, hw=TOY, **params):
    """Seconds of the "norms, activations, residuals" row (2 layers x 8 micro-batches)."""
    return {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(
        ctx(job, hw, **params), cand())}["norms, activations, residuals"]


def _norm_row_c(job, **columns):
    """The same row and the recompute row, for a candidate with the given columns."""
    rows = {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(
        ctx(job), cand(**columns))}
    return rows["norms, activations, residuals"] + rows["activation recompute"]


@pytest.mark.parametrize("generation, scaling, bytes_per_token, launches", [
    # TINY at TP 1 (no SP), per token of a layer and micro-batch: QKV 3072 wide, attention
    # output 1024, fc1 / fc2 4096 (GELU), e = 1024. Delayed scaling: the norms write their
    # outputs in fp8 (1 B instead of 2: -1 B x 2e), the attention-output and fc2 inputs are
    # cast_transposed (read 2, write 1: 3 B x 5120); backward, the column-parallel outputs'
    # gradients (3 B x 7168) and the row-parallel ones' (3 B x 2e). Kernels: 2 casts
    # forward, 4 backward
    ("toy", "delayed", -2048 + 3 * 5120 + 3 * 7168 + 3 * 2048, 2 + 4),
    # current scaling: the norm writes 16 bits, a cast reads them (3 B x 2e); every other
    # cast reads its tensor once more for the amax (5 B); 4 kernels a cast (zero the amax,
    # the amax, the scale, the cast), 3 after a norm (its amax is fused)
    ("toy", "current", 3 * 2048 + 5 * 5120 + 5 * 7168 + 5 * 2048, 2 * (3 + 4) + 4 * 4),
    # Hopper's TN-only fp8 GEMMs need a 1-B transposed copy: the norms' fp8 outputs are
    # transposed (read 1, write 1), every cast_transpose writes 1 B more; one transpose
    # kernel after each norm
    ("hopper", "delayed", 2048 * (-1 + 2) + 4 * 5120 + 4 * 7168 + 4 * 2048, 2 * 2 + 4),
    ("hopper", "current", 2048 * 4 + 6 * 5120 + 6 * 7168 + 6 * 2048, 2 * (3 + 4) + 4 * 4),
])
def test_per_tensor_fp8_casts_as_transformer_engine_runs_them(generation, scaling,
                                                              bytes_per_token, launches):
    """Cast bytes and kernels of TE's per-tensor fp8 (calibrated._per_tensor_casts), by
    hand: the fp8 job's elementwise row less the bf16 one's, 2 layers x 8 micro-batches of
    1024 tokens, at 1000 GB/s x 0.5 and 1 us a kernel."""
    hw = dataclasses.replace(TOY, generation=generation)
    fp8 = dataclasses.replace(TINY, dtype="fp8", fp8_scaling=scaling)
    extra_s = _norm_row(fp8, hw, kernel_us=1.0) - _norm_row(TINY, hw, kernel_us=1.0)
    per_layer = bytes_per_token * 1024 / (1000e9 * 0.5) + launches * 1e-6
    assert extra_s == pytest.approx(2 * 8 * per_layer, rel=1e-9)
    # torchao's casts (norms not feeding TE's quantizers), by torchao's roofline: each GEMM
    # input (2048 + 5120 wide) and output gradient (3072 + 4096 + 2048) cast once into both
    # fp8 layouts (read 2, write 1 + 1, whatever the GPU), the amax read fused into its
    # producer when compiled (TINY: fused kernels), 2 B more when not; no cast kernels
    ao = dataclasses.replace(fp8, lp_norm_cast=False)
    for fused, elem in ((True, 4), (False, 6)):
        ao_f, bf16 = (dataclasses.replace(j, fused_kernels=fused) for j in (ao, TINY))
        assert _norm_row(ao_f, hw, kernel_us=1.0) - _norm_row(bf16, hw, kernel_us=1.0) \
            == pytest.approx(2 * 8 * elem * (7168 + 9216) * 1024 / (1000e9 * 0.5), rel=1e-9)


def test_te_fp8_with_sequence_parallelism_gathers_fp8_and_reduces_amaxes():
    """TP 2 with SP: TE all-gathers the fp8 copies (1 B) of the norm outputs and of the
    row-parallel gradients; current scaling adds 4 blocking one-float all-reduces of an
    amax per layer and micro-batch."""
    def tp_row(job):
        return {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(
            ctx(job), cand(tp=2, sp=1))}["TP communication (exposed)"]

    x = ctx()
    T, e = 1024, 1024
    ag1 = collective_s("allgather", T * e * 1.0, 2, 2, x)
    rs2 = collective_s("reducescatter", T * e * 2.0, 2, 2, x)
    delayed = dataclasses.replace(TINY, dtype="fp8")
    # forward 2 (all-gather + reduce-scatter), backward 2 reduce-scatters and 4 all-gathers
    # (the row-parallel gradients and the saved norm outputs again)
    assert tp_row(delayed) == pytest.approx(2 * 8 * float(6 * ag1 + 4 * rs2), rel=1e-9)
    current = dataclasses.replace(delayed, fp8_scaling="current")
    amax_s = collective_s("allreduce", 4.0, 2, 2, x)
    assert tp_row(current) - tp_row(delayed) == pytest.approx(2 * 8 * 4 * float(amax_s),
                                                              rel=1e-9)
    # fewer bytes than bf16's all-reduce-sized gathers
    assert tp_row(delayed) < tp_row(TINY)


def test_torchao_rowwise_casts_twice_rescales_and_communicates_in_16_bits():
    """torchao's rowwise recipe against its tensorwise one (both torchao: lp_norm_cast off):
    every GEMM input (forward) and output gradient (backward) cast with a 16-bit transposed
    copy more (+2 B an element: torchao's roofline), and the backward GEMMs' outputs
    rescaled (read and write 2 B an element of the input gradients and of the weight
    gradients); its TP all-gathers stay 16-bit where tensorwise casts first (torchtitan
    enable_float8_tensorwise_tp). A job that leaves lp_norm_cast on is priced the same:
    rowwise is torchao's alone."""
    torchao = dataclasses.replace(TINY, dtype="fp8", lp_norm_cast=False,
                                  fp8_scaling="current")
    rowwise = dataclasses.replace(torchao, fp8_scaling="rowwise")
    T = 1024
    inputs = T * (2 * 1024 + 1024 + 4096)  # QKV and fc1 inputs (e), attention out, fc2
    grads = T * (3072 + 4096 + 2 * 1024)  # QKV and fc1 outputs, attention out and fc2 (e)
    weights = 3 * 1024 * 4096  # QKV 3072 x 1024, out 1024 x 1024, fc1 and fc2 1024 x 4096
    extra = 2 * (inputs + grads) + 4 * (inputs + weights)
    assert _norm_row(rowwise) - _norm_row(torchao) == pytest.approx(
        2 * 8 * extra / (1000e9 * 0.5), rel=1e-9)
    assert _norm_row(dataclasses.replace(rowwise, lp_norm_cast=True)) == pytest.approx(
        _norm_row(rowwise), rel=1e-12)
    # (a full recompute re-runs the forward's casts of the inputs, not the backward's)
    full = {"recompute": int(Recompute.FULL)}
    assert (_norm_row_c(rowwise, **full) - _norm_row_c(torchao, **full)) == pytest.approx(
        2 * 8 * (extra + 2 * inputs) / (1000e9 * 0.5), rel=1e-9)

    def tp_row(job):
        return {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(
            ctx(job), cand(tp=2, sp=1))}["TP communication (exposed)"]

    assert tp_row(rowwise) == pytest.approx(tp_row(TINY), rel=1e-12)
    assert tp_row(torchao) == pytest.approx(tp_row(dataclasses.replace(
        torchao, lp_norm_cast=True)) - 2 * 8 * 4 * float(collective_s(
            "allreduce", 4.0, 2, 2, ctx())), rel=1e-9)  # (TE's amax all-reduces only)


def test_te_fp8_casts_with_sequence_parallelism_on_hopper_by_hand():
    """A Llama-3-70B-shaped block (e 8192, QKV 10240, attention out 8192, fc1 2 x 28672,
    fc2 28672) at TP 4 with SP on Hopper (1-B transposed copies), per token of a layer and
    micro-batch, in units of e bytes. Delayed: the norms write fp8 on the shard (-1 B x 2e
    / 4), attention-out and fc2 inputs cast_transposed (4 B x 9216 / e = 4.5); backward
    the column-parallel gradients (4 B x 16896 / e = 8.25), the row-parallel ones cast on
    the shard and transposed after the fp8 gather (2 x (3 / 4 + 2) = 5.5), the saved norm
    outputs gathered again and transposed (2 x 2 = 4): 4.0 + 17.75. Current: the norms'
    outputs cast on the shard (2 x 3 / 4 = 1.5), every other cast 2 B more (6.75;
    12.375 + 2 x (5 / 4 + 2) + 4): 8.25 + 22.875. Kernels: delayed 2 + 8, current 14 +
    20 (docs/notes/parameter-ranges.md, stop 44: "~22" and "~31" T e bytes)."""
    big = Job(name="big", n_layers=1, hidden=8192, ffn_hidden=28672, n_heads=64,
              n_kv_heads=8, head_dim=128, vocab=0, seq_len=1024, global_batch=8,
              mlp="swiglu", norm="rmsnorm")
    hw = dataclasses.replace(TOY, generation="hopper")

    def row(job):
        return {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(
            ctx(job, hw, kernel_us=1.0), cand(tp=4, sp=1))}["norms, activations, residuals"]

    T, e = 1024, 8192
    for scaling, units, launches in (("delayed", 4.0 + 17.75, 2 + 8),
                                     ("current", 8.25 + 22.875, 14 + 20)):
        fp8 = dataclasses.replace(big, dtype="fp8", fp8_scaling=scaling)
        per_mb = units * T * e / (1000e9 * 0.5) + launches * 1e-6
        assert row(fp8) - row(big) == pytest.approx(8 * per_mb, rel=1e-9), scaling


def test_a_routed_only_block_gathers_its_one_fp8_input():
    """A block whose MLP is all routed experts quantizes only its QKV input before the SP
    all-gather (its experts cast after the dispatch): one gather of two in fp8 forward, two
    of four backward; and its casts count the one norm-fed input."""
    moe_job = dataclasses.replace(TINY, dtype="fp8", n_experts=8, top_k=2,
                                  moe_ffn_hidden=512, mlp="swiglu", norm="rmsnorm")
    x = ctx(moe_job)
    lay = calibrated._layout(x, cand(tp=2, sp=1))
    for f, n in ((0.0, 1.0), (4096.0, 2.0)):
        pt = calibrated._per_tensor_casts({**x, "f": np.float64(f)}, lay, 2.0,
                                          x["lp_copy_bytes"], np.array(False), 3072.0, 1024.0,
                                          2 * f)
        assert float(pt["fp8_inputs"]) == n
    tp = {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(
        x, cand(tp=2, sp=1, ep=1))}["TP communication (exposed)"]
    T, e = 1024, 1024
    ag1 = float(collective_s("allgather", T * e * 1.0, 2, 2, x))
    ag2 = float(collective_s("allgather", T * e * 2.0, 2, 2, x))
    rs2 = float(collective_s("reducescatter", T * e * 2.0, 2, 2, x))
    assert tp == pytest.approx(2 * 8 * (4 * rs2 + 3 * ag1 + 3 * ag2), rel=1e-9)
    # current scaling: one amax all-reduce forward (the QKV input) and one backward (the
    # attention output's gradient)
    cur = {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(
        ctx(dataclasses.replace(moe_job, fp8_scaling="current")),
        cand(tp=2, sp=1, ep=1))}["TP communication (exposed)"]
    amax_s = float(collective_s("allreduce", 4.0, 2, 2, x))
    assert cur - tp == pytest.approx(2 * 8 * 2 * amax_s, rel=1e-9)


def test_hopper_keeps_a_transposed_fp8_copy_blackwell_does_not():
    hopper = dataclasses.replace(TOY, generation="hopper")
    assert calibrated.low_precision("fp8", hopper)[0] == 2 * calibrated.low_precision(
        "fp8", TOY)[0]
    assert calibrated.low_precision("fp8", load_hardware("B200"))[0] == 1.0


def test_gemms_run_at_the_gpus_sustained_rate_attention_does_not():
    # TOY (generation "toy": no typical value) sustains its full peak; at 0.8 of it every
    # compute-bound GEMM takes 1 / 0.8 as long and the FlashAttention core is unchanged
    assert ctx()["gemm_sustained"] == 1.0
    slow = dataclasses.replace(TOY, matrix_sustained_fraction=0.8)
    a = {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(ctx(), cand())}
    b = {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(ctx(hw=slow), cand())}
    for name in ("QKV projection", "attention output projection", "MLP up (and gate)",
                 "MLP down"):
        assert b[name] == pytest.approx(a[name] / 0.8, rel=1e-12), name
    assert b["attention core"] == a["attention core"]
    # a hardware file without its own measurement takes its generation's (H100 SXM MAMF)
    hopper = dataclasses.replace(TOY, generation="hopper")
    assert ctx(hw=hopper)["gemm_sustained"] == calibrated.SUSTAINED_FRACTION["hopper"]
    assert ctx(hw=load_hardware("GB300-NVL72"))["gemm_sustained"] == 0.849


def test_fp8_halves_compute_bound_gemms_and_keeps_an_fp8_weight_copy():
    x16 = ctx()
    fp8 = dataclasses.replace(TINY, dtype="fp8")
    x8 = ctx(fp8)
    t16 = gemm_s(1280, 1280, 1280, x16, x16["peak16_flops_per_s"], 0.5)
    t8 = gemm_s(1280, 1280, 1280, x8, x8["peak8_flops_per_s"] * x8["fp8_eff"], 0.5)
    assert t8 == pytest.approx(t16 / 2, rel=1e-12)
    assert run(fp8)["mem_weights_bytes"] == 3 * 2 * P_LAYER
    # the embedding and the LM head stay 16-bit (Transformer Engine's fp8 is the blocks')
    vocab = dataclasses.replace(fp8, vocab=32768, tied_embeddings=False)
    assert run(vocab)["mem_weights_bytes"] == 3 * 2 * P_LAYER + 2 * (2 * 32768 * 1024)


BLACKWELL_TOY = dataclasses.replace(TOY, matrix_flops_per_s={"bf16": 100e12, "fp8": 200e12,
                                                             "fp4": 400e12})


@pytest.mark.parametrize("dtype, peak, copy_bytes", [
    ("fp8", 200e12, 1.0),                     # per-tensor scale: one copy, 1 B
    ("mxfp8", 200e12, 2 * (1 + 1 / 32)),      # row- and column-wise, an E8M0 per 32
    ("nvfp4", 400e12, 2 * (0.5 + 1 / 16)),    # row- and column-wise, an E4M3 per 16
])
def test_block_scaled_formats_by_hand(dtype, peak, copy_bytes):
    """Peaks of each format, the bytes of its cast copies (weights and GEMM inputs)."""
    job = dataclasses.replace(TINY, dtype=dtype)
    x = ctx(job, BLACKWELL_TOY)
    assert x["peak8_flops_per_s"] == peak and x["lp_copy_bytes"] == pytest.approx(copy_bytes)
    assert run(job, BLACKWELL_TOY)["mem_weights_bytes"] == pytest.approx(
        (2 + copy_bytes) * 2 * P_LAYER)
    # the casts per token of a layer: the norms write the copies (copy - 2 B x 2e), the
    # attention-output and fc2 inputs are read and quantized (2 + copy B x 5120); backward
    # the gradients entering the four GEMMs, both usages in one pass (2 + copy B x (3072 +
    # 4096 + 2048)); per-tensor fp8 (delayed, TE) 40,960 B (see the test above); 8
    # micro-batches of 1024 tokens, 2 layers, at 1000 GB/s x hbm_eff 0.5. The same GEMM
    # peak as fp8 for MXFP8, so the whole difference is the extra cast bytes
    fp8 = run(dataclasses.replace(TINY, dtype="fp8"), BLACKWELL_TOY)
    lowp = run(job, BLACKWELL_TOY)
    per_token = (copy_bytes - 2) * 2048 + (2 + copy_bytes) * (5120 + 9216)
    if dtype == "fp8":
        per_token = 40960
    extra_s = (per_token - 40960) * 1024 * 8 * 2 / (1000e9 * 0.5)
    if dtype != "nvfp4":
        assert lowp["step_time_s"] - fp8["step_time_s"] == pytest.approx(extra_s, rel=1e-9)
        assert lowp["t_compute_s"] == pytest.approx(fp8["t_compute_s"], rel=1e-12)
    assert lowp["t_memory_s"] - fp8["t_memory_s"] == pytest.approx(extra_s, rel=1e-9)


def test_fp8_blockwise_by_hand():
    """DeepSeek-V3's fp8 recipe (TE Float8BlockScaling). Without block-scaled tensor cores
    (Hopper): fp8 GEMMs at BLOCKWISE_HOPPER_GEMM of per-tensor fp8's rate, both usages of
    every input quantized from 16 bits with an fp32 scale per 128 elements (copies 2 x (1 +
    1/32) B), the norms writing 16 bits that are then cast (TE fuses no blockwise norm);
    with them (Blackwell), exactly MXFP8."""
    blockwise = dataclasses.replace(TINY, dtype="fp8", fp8_scaling="blockwise")
    fp8 = dataclasses.replace(TINY, dtype="fp8")
    copy_bytes = 2 * (1 + 1 / 32)
    x = ctx(blockwise)
    assert x["peak8_flops_per_s"] == 200e12 and x["lp_copy_bytes"] == pytest.approx(copy_bytes)
    assert x["gemm_operand_bytes"] == pytest.approx(1 + 1 / 32)
    # the weights: 16 bits and both usages, an fp32 scale per 128 x 128 block
    assert run(blockwise)["mem_weights_bytes"] == pytest.approx(
        (2 + 2 * (1 + 4 / 128**2)) * 2 * P_LAYER)

    def gemm_rows(job):
        rows = {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(ctx(job), cand())}
        return [rows[k] for k in ("QKV projection", "attention output projection",
                                  "MLP up (and gate)", "MLP down")]

    # TINY's GEMMs are compute-bound at kernel_us 0: each 1 / 0.81 of per-tensor fp8's
    for slow, fast in zip(gemm_rows(blockwise), gemm_rows(fp8)):
        assert slow == pytest.approx(fast / calibrated.BLOCKWISE_HOPPER_GEMM, rel=1e-9)
    # casts per token of a layer: the four GEMM inputs (2e norm outputs, 5120 of attention
    # output and fc2 input) read at 2 B and quantized, and backward the four gradients
    # (3072 + 4096 + 2048), against per-tensor fp8's 40,960 B (test above); 8 micro-batches
    # of 1024 tokens, 2 layers, 1000 GB/s x 0.5
    per_token = (2 + copy_bytes) * (2048 + 5120 + 9216)
    extra_s = (per_token - 40960) * 1024 * 8 * 2 / (1000e9 * 0.5)
    assert run(blockwise)["t_memory_s"] - run(fp8)["t_memory_s"] == pytest.approx(extra_s,
                                                                                  rel=1e-9)
    # kept for the weight gradients: one row-wise copy with its scales
    assert calibrated.saved_input_bytes(blockwise) == pytest.approx(1 + 1 / 32)
    # Blackwell: the recipe runs as MXFP8 (TE), every output the same
    mx = run(dataclasses.replace(TINY, dtype="mxfp8"), BLACKWELL_TOY)
    assert run(blockwise, BLACKWELL_TOY) == mx


@pytest.mark.parametrize("norm_cast", [True, False])  # TE's casts, or torchao's
def test_a_block_scaled_format_never_beats_its_unscaled_peak(norm_cast):
    """Same peak, more cast traffic: MXFP8 is never faster than per-tensor fp8, and no
    low-precision run is faster than its GEMM FLOPs at the format's peak allow."""
    job = dataclasses.replace(load_job("llama3_8b"), lp_norm_cast=norm_cast)
    hw = load_hardware("B200")
    space = enumerate_space("calibrated", job, 64, "1d", hw.nvlink_domain)
    c = space.columns(0, min(space.size, 20000))
    steps = {}
    for dt in ("bf16", "fp8", "mxfp8", "nvfp4"):
        out = evaluate_columns("calibrated", dataclasses.replace(job, dtype=dt), hw, "1d", 64,
                               c)
        steps[dt] = out["step_time_s"]
        peak = calibrated.low_precision(dt, hw)[1] or hw.matrix_peak("bf16")
        assert (out["step_time_s"] >= out["hardware_flops"] / peak).all()
    # (communication-bound candidates tie: equal up to rounding)
    assert (steps["mxfp8"] >= steps["fp8"] * (1 - 1e-12)).all()
    assert (steps["fp8"] <= steps["bf16"] * (1 + 1e-12)).all()
    assert (steps["nvfp4"] <= steps["mxfp8"] * (1 + 1e-12)).all()


def test_fp8_blockwise_on_hopper_is_never_faster_than_per_tensor_fp8():
    """Slower GEMMs, at least as many cast bytes, 16-bit gathers: on an H100, blockwise fp8
    never beats delayed per-tensor fp8 on any candidate of a sweep."""
    job = load_job("llama3_8b")
    hw = load_hardware("H100-SXM")
    space = enumerate_space("calibrated", job, 64, "1d", hw.nvlink_domain)
    c = space.columns(0, min(space.size, 20000))
    steps = {s: evaluate_columns("calibrated", dataclasses.replace(job, dtype="fp8",
                                                                   fp8_scaling=s),
                                 hw, "1d", 64, c)["step_time_s"]
             for s in ("delayed", "blockwise")}
    assert (steps["blockwise"] >= steps["delayed"] * (1 - 1e-12)).all()
    assert (steps["blockwise"] > steps["delayed"]).any()


def test_block_scaled_formats_need_blackwell_tensor_cores(tmp_path, capsys):
    from sweep.analysis.predict import predict
    from sweep.cli import main
    from sweep.errors import SweepError

    with pytest.raises(ValueError, match="nvfp4 needs block-scaled tensor cores"):
        ctx(dataclasses.replace(TINY, dtype="nvfp4"))
    # fp8 on a GPU without fp8 tensor cores is refused too (it was costed at 2x bf16)
    with pytest.raises(SweepError, match="fp8 needs fp8 tensor cores; hardware 'A100-80GB'"):
        predict("calibrated", dataclasses.replace(load_job("llama3_8b"), dtype="fp8"),
                load_hardware("A100-80GB"), "1d", 8, {"tp": 8})
    with pytest.raises(SweepError, match="hardware 'H100-SXM' has none"):
        predict("calibrated", dataclasses.replace(load_job("llama3_8b"), dtype="mxfp8"),
                load_hardware("H100-SXM"), "1d", 8, {"tp": 8})
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\njobs: [{name: llama3_8b, dtype: nvfp4}]\ngpus: 8\n"
                    "hardware: {base: [B200, H100-SXM]}\n")
    assert main(["plan", str(spec)]) == 2
    assert "job llama3_8b[dtype=nvfp4]: dtype: nvfp4 needs block-scaled tensor cores" in \
        capsys.readouterr().err
    # bf16 on a Volta GPU is refused too (it was costed at V100's fp16 peak); fp16 runs
    with pytest.raises(SweepError, match="bf16 needs bf16 tensor cores .* 'V100' is a Volta"):
        predict("calibrated", load_job("llama3_8b"), load_hardware("V100"), "1d", 8, {"tp": 8})
    assert predict("calibrated", dataclasses.replace(load_job("llama3_8b"), dtype="fp16"),
                   load_hardware("V100"), "1d", 8, {"tp": 8}).row["tp"] == 8
    spec.write_text("name: s\njobs: [llama3_8b]\ngpus: 8\nhardware: {base: [V100]}\n")
    assert main(["plan", str(spec)]) == 2
    assert "bf16 needs bf16 tensor cores" in capsys.readouterr().err


@pytest.mark.parametrize("accum_bytes,slots", [(0.0, False), (18.0, True)])
def test_op_table_adds_up_to_the_step_time(accum_bytes, slots):
    job, hw = load_job("llama3_8b"), load_hardware("H100-SXM")
    job = dataclasses.replace(job, grad_accum_bytes=accum_bytes, embedding_slots=slots)
    space = enumerate_calibrated(job, 64, 8)
    cols = space.columns(0, space.size)
    pick = np.random.default_rng(0).choice(space.size, 200, replace=False)
    sub = {k: v[pick] for k, v in cols.items()}
    rows = op_table("calibrated", job, hw, "1d", sub)
    total = sum(np.asarray(r["time_s"]) for r in rows)
    step = evaluate_columns("calibrated", job, hw, "1d", 64, sub)["step_time_s"]
    np.testing.assert_allclose(total, step, rtol=1e-12)


# ------------------------------------------------------------------------------ properties

def _sample(job_name="llama3_8b", hw_name="H100-SXM", n=64, k=3000, seed=1, strategy="1d"):
    job, hw = load_job(job_name), load_hardware(hw_name)
    space = enumerate_calibrated(job, n, hw.nvlink_domain, strategy=strategy)
    pick = np.sort(np.random.default_rng(seed).choice(space.size, k, replace=False))
    cols = space.columns(0, space.size)
    return job, hw, n, {k: v[pick] for k, v in cols.items()}


def _eval(job, hw, n, c, strategy="1d"):
    return evaluate_columns("calibrated", job, hw, strategy, n, c)


def test_more_recompute_never_raises_memory_or_lowers_time():
    job, hw, n, c = _sample()
    base = dict(c, recompute=np.zeros_like(c["recompute"]),
                recompute_layers=np.zeros_like(c["recompute"]))
    none = _eval(job, hw, n, base)
    half = np.maximum(-(-job.n_layers // c["pp"]) // 2, 1)
    for policy in (Recompute.SELECTIVE, Recompute.OP_SAC, Recompute.FULL, Recompute.FIRST_K):
        r = _eval(job, hw, n, dict(base, recompute=np.full_like(c["recompute"], policy),
                                   recompute_layers=half))
        assert np.all(r["mem_bytes"] <= none["mem_bytes"]), policy
        assert np.all(r["step_time_s"] >= none["step_time_s"]), policy


def test_zero3_never_raises_memory_without_pipelining():
    job, hw, n, c = _sample()
    keep = (c["pp"] == 1) & (c["dp"] > 1)
    c = {k: v[keep] for k, v in c.items()}
    c["shard_group"] = np.zeros_like(c["zero"])
    z3 = _eval(job, hw, n, dict(c, zero=np.full_like(c["zero"], 3)))
    for stage in (0, 1, 2):
        other = _eval(job, hw, n, dict(c, zero=np.full_like(c["zero"], stage)))
        assert np.all(z3["mem_bytes"] <= other["mem_bytes"])


@pytest.mark.parametrize("strategy", ["1d", "2d"])
def test_more_bandwidth_is_never_slower(strategy):
    job, hw, n, c = _sample("llama3_70b", "H100-SXM", 256, strategy=strategy)
    before = _eval(job, hw, n, c, strategy)["step_time_s"]
    for field in ("hbm_bytes_per_s", "nvlink_bytes_per_s", "scaleout_bytes_per_s"):
        faster = dataclasses.replace(hw, **{field: 2 * getattr(hw, field)})
        after = _eval(job, faster, n, c, strategy)["step_time_s"]
        assert np.all(after <= before * (1 + 1e-12)), field


def test_fp8_never_slows_compute_bound_gemms():
    job, hw = load_job("llama3_70b"), load_hardware("H100-SXM")
    x16 = calibrated.make_context(job, hw, hw.calibration)
    x8 = calibrated.make_context(dataclasses.replace(job, dtype="fp8"), hw, hw.calibration)
    m = np.array([1024, 4096, 8192, 16384])[:, None]
    n = np.array([1024, 3584, 8192, 28672])[None, :]
    t16 = gemm_s(m, n, 8192, x16, x16["peak16_flops_per_s"], x16["gemm_eff"])
    t8 = gemm_s(m, n, 8192, x8, x8["peak8_flops_per_s"] * x8["fp8_eff"], x8["gemm_eff"])
    assert np.all(t8 <= t16)


@pytest.mark.parametrize("strategy", ["1d", "2d"])
def test_a_block_equals_its_rows_evaluated_one_by_one(strategy):
    job, hw, n, c = _sample(k=400, strategy=strategy)
    block = _eval(job, hw, n, c, strategy)
    for i in range(0, 400, 37):
        row = _eval(job, hw, n, {k: v[i:i + 1] for k, v in c.items()}, strategy)
        for k in ("step_time_s", "mem_bytes", "t_tp_comm_s", "t_dp_comm_s", "reason"):
            assert row[k][0] == block[k][i], k


def test_per_candidate_contexts_equal_the_shared_context():
    """The vectorised validation path (one context per row) and the sweep path (one shared
    context, per-layer deduplication) are the same model."""
    job, hw, n, c = _sample(k=500)
    x = calibrated.make_context(job, hw, hw.calibration)
    shared = calibrated.evaluate(x, c)
    stacked = calibrated.evaluate({k: np.full(500, v, dtype=float) for k, v in x.items()}, c)
    for k, v in shared.items():
        np.testing.assert_array_equal(np.broadcast_to(v, (500,)), stacked[k], err_msg=k)


def test_search_space_rules():
    job = load_job("llama3_70b")  # 64 heads, 8 KV heads, 80 layers, batch 512
    space = enumerate_calibrated(job, 256, 8)
    c = space.columns(0, space.size)
    index = np.sort(c["index"])  # (a sort: numpy 2.4's hash-based np.unique takes 6 s here)
    assert np.all(index[1:] > index[:-1]) and len(index) == space.size
    assert np.all(c["dp"] * c["tp"] * c["cp"] * c["pp"] == 256)
    assert np.all((64 % c["tp"] == 0) & ((8 % c["tp"] == 0) | (c["tp"] % 8 == 0)))
    assert np.all((512 // c["dp"]) % c["mbs"] == 0)
    inter = c["vpp"] > 1
    assert np.all((80 // c["pp"][inter]) % c["vpp"][inter] == 0)
    assert np.all(((512 // c["dp"][inter]) // c["mbs"][inter]) % c["pp"][inter] == 0)
    assert np.all(c["tp_overlap"] <= c["sp"]) and np.all(c["sp"][c["tp"] == 1] == 0)
    assert np.all((c["shard_group"] == 0) | (c["zero"] == 3))
    # ZeRO shards over data x context parallel ranks: also with dp = 1 and cp > 1
    assert (c["zero"][(c["dp"] == 1) & (c["cp"] > 1)] == 3).any()
    assert not c["zero"][c["dp"] * c["cp"] == 1].any()
    assert not c["offload"].any()
    assert set(np.unique(c["recompute"]).tolist()) == {0, 1, 2, 3, 4}
    with_host = enumerate_calibrated(job, 256, 8, host_memory=True)
    assert with_host.size == 8 * space.size
    # uneven stages are allowed, but every stage holds a layer: 80 layers over 32 stages
    # would be 3 each and none left for the last ones
    pps = set(np.unique(c["pp"]).tolist())
    assert {16, 32, 64} & pps == {16}
    assert [last_stage_layers(job, pp) for pp in (6, 12, 24, 32)] == [10, 3, -12, -13]
    # with embedding slots 82 items: 12 stages of 7 leave 5 for the last (and its head)
    assert last_stage_layers(dataclasses.replace(job, embedding_slots=True), 12) == 4
    # (first, middle, last) by hand: 80 layers over 6 stages hold 14 x 5 and 10; with the
    # slots 82 items of 14 a stage, the first holds 13 (and the embedding), the last
    # 82 - 5 x 14 - 1 = 11 (and the head)
    assert stage_layers(80, 6, False) == (14, 14, 10)
    assert stage_layers(80, 6, True) == (13, 14, 11)
    assert stage_layers(80, 1, True) == (80, 80, 80)  # (one stage: no slots)


# ------------------------------------------------------------------------------ 2D, CP

def test_broadcast_is_one_buffer_per_link():
    x = ctx()
    assert collective_s("broadcast", 8e8, 8, 8, x) == pytest.approx(8e8 / 100e9 + 7e-6,
                                                                     rel=1e-12)


def test_summa_gemm_panels_and_exposed_broadcasts():
    x = ctx()
    c = cand(tp=2, tp2=2, nb=2)
    comp_f, comp_b, exp_f, exp_b = (float(np.ravel(v)[0]) for v in calibrated._summa_gemm(
        1280.0, 2560.0, 2560.0, x, c, 100e12, 0.5, 2.0, 2.0, 2.0))
    # per panel: a (1280 x 1280)(1280 x 1280) GEMM; 10 x 10 tiles fill the 100 SMs
    panel = 2 * 1280**3 / 50e12
    assert comp_f == pytest.approx(2 * panel, rel=1e-12)
    # per panel: A (1280 x 1280) along the row, B (1280 x 1280) along the column, 2 GPUs each
    tau = 2 * (1280 * 1280 * 2 / 100e9 + 1e-6)
    assert exp_f == pytest.approx(tau + max(2 * tau - 2 * panel, 0), rel=1e-12)
    assert comp_b == pytest.approx(2 * comp_f, rel=1e-12)
    assert exp_b == pytest.approx(2 * tau + max(4 * tau - comp_b, 0), rel=1e-12)


def test_2d_shards_weights_over_the_grid_and_tokens_over_tp2():
    x2 = calibrated.make_context(TINY, TOY, PARAMS, "2d")
    one = calibrated.evaluate(x2, cand(tp=2, tp2=1, nb=2))
    four = calibrated.evaluate(x2, cand(tp=2, tp2=2, nb=2))
    # (the norms' weights stay replicated: 0.1 % of the layer)
    assert four["mem_weights_bytes"][0] == pytest.approx(one["mem_weights_bytes"][0] / 2,
                                                          rel=1e-3)
    assert four["mem_activations_bytes"][0] < 0.55 * one["mem_activations_bytes"][0]
    assert four["t_cp_comm_s"][0] > 0 and one["t_cp_comm_s"][0] == 0  # K/V over tp2


def test_context_parallel_all_gather_of_keys_and_values():
    ring, gather = run(cp=2), run(cp=2, cp_comm=1)
    kv = 2 * 1 * 8 * 128 * 1024 * 2  # K and V of one sequence, 8 heads of 128, 2 bytes
    ag = 1 / 2 * kv / 100e9 + 1e-6
    # per layer: all-gather forward; all-gather and reduce-scatter of dK, dV backward
    assert gather["t_cp_comm_s"] == pytest.approx(8 * 2 * 3 * ag, rel=1e-9)
    assert gather["mem_activations_bytes"] == ring["mem_activations_bytes"] + kv


def test_a_one_by_one_summa_grid_has_one_panel_and_more_would_never_be_faster():
    # more panels only split a 1 x 1 grid's GEMMs into more launches (calibrated kernel costs)
    job, hw = load_job("llama3_8b"), load_hardware("H100-SXM")
    x = calibrated.make_context(job, hw, hw.calibration, strategy="2d")
    panels = [1, 2, 4, 8]
    out = calibrated.evaluate(x, cand(len(panels), tp2=1, pp=4, nb=panels, dp=2, mbs=1))
    step = np.asarray(out["step_time_s"])
    assert np.all(np.diff(step) >= 0) and step[-1] > step[0]
    space = enumerate_calibrated(job, 8, 8, strategy="2d")
    c = space.columns(0, space.size)
    grid1 = (c["tp"] == 1) & (c["tp2"] == 1)
    assert grid1.any() and np.all(c["nb"][grid1] == 1)


def test_2d_search_space_rules():
    job = load_job("llama3_70b")
    space = enumerate_calibrated(job, 256, 8, strategy="2d")
    c = space.columns(0, space.size)
    assert np.all(c["dp"] * c["tp"] * c["tp2"] * c["pp"] == 256) and np.all(c["cp"] == 1)
    assert np.all(c["sp"] == 0) and np.all(c["cp_comm"] == 0)
    assert np.all((8192 % c["tp2"] == 0) & (c["nb"] >= np.maximum(c["tp"], c["tp2"])))
    assert (c["tp2"] > 1).any()


def test_rmsnorm_has_half_the_norm_weights_and_eager_norms_cost_more():
    rms = dataclasses.replace(TINY, norm="rmsnorm")
    assert run(rms)["mem_weights_bytes"] == 2 * 2 * (P_LAYER - 2 * 1024)
    eager = dataclasses.replace(rms, fused_kernels=False)
    x_f, x_e = ctx(rms), ctx(eager)
    rows_f = {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(x_f, cand())}
    rows_e = {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(x_e, cand())}
    key = "norms, activations, residuals"
    assert rows_e[key] > 1.5 * rows_f[key]


def test_embedding_and_lm_head_sit_on_the_first_and_last_stage():
    job = dataclasses.replace(TINY, vocab=32768, n_layers=4, global_batch=16)
    x = ctx(job)
    lay = calibrated._layer_terms(x, cand())
    head = float(np.ravel(lay["head_f"] + lay["head_b"])[0])
    emb = float(np.ravel(lay["emb_f"] + lay["emb_b"])[0])
    # at least the LM head's forward GEMM (1024 tokens x 32768 x 1024) at 50 TFLOP/s
    assert head > 2 * 1024 * 32768 * 1024 / 50e12
    single = run(job)
    plain = run(dataclasses.replace(job, vocab=0))
    # the untied embedding and head add 2 x 32768 x 1024 parameters to the Adam step:
    # 30 bytes each at 0.5 TB/s
    adam = single["t_optimizer_s"] - plain["t_optimizer_s"]
    assert adam == pytest.approx(30 * 2 * 32768 * 1024 / 0.5e12, rel=1e-9)
    assert single["step_time_s"] - plain["step_time_s"] == pytest.approx(
        16 * (head + emb) + adam, rel=1e-9)
    # two stages: the slower of (embedding + 2 layers, 2 layers + head) bounds the pipeline
    rows = {r["name"]: float(r["time_s"][0])
            for r in calibrated.op_table(x, cand(pp=2))}
    assert rows["embedding"] == 0 and rows["LM head and loss"] == pytest.approx(16 * head)


def test_hybrid_shard_shards_within_groups_and_replicates_across():
    P = 2 * P_LAYER
    full, hybrid = run(dp=8, zero=3), run(dp=8, zero=3, shard_group=4)
    # FSDP hybrid shard over groups of 4: fp32 master weights and Adam states / 4, not / 8
    assert hybrid["mem_weights_bytes"] == 4 * P / 4 + 2 * 2 * P_LAYER
    assert hybrid["mem_optimizer_bytes"] == 8 * P / 4
    assert full["mem_optimizer_bytes"] == 8 * P / 8
    # the gradient shards are then all-reduced across the 2 replicas: more DP traffic than
    # the per-layer reduce-scatter alone, and none of it free
    assert hybrid["t_dp_comm_s"] > 0 and full["t_dp_comm_s"] > 0


def test_deepspeed_caps_gathered_weights_and_gradient_buckets():
    P = 2 * P_LAYER
    fsdp = run(dp=8, zero=3)
    capped_job = dataclasses.replace(TINY, zero3_live_params=1000.0, grad_bucket_params=500.0)
    ds = run(job=capped_job, dp=8, zero=3)
    # at most 1000 parameters gathered (not two layers) and 500 unsharded gradients (not one
    # layer): everything else as FSDP
    assert ds["mem_weights_bytes"] == 4 * P / 8 + 2 * 1000
    assert ds["mem_grads_bytes"] == 4 * P / 8 + 4 * 500
    assert fsdp["mem_bytes"] - ds["mem_bytes"] == 2 * (2 * P_LAYER - 1000) + 4 * (P_LAYER - 500)
    # a cap above a layer changes nothing, and the step time never depends on it
    roomy = run(job=dataclasses.replace(TINY, zero3_live_params=1e12, grad_bucket_params=1e12),
                dp=8, zero=3)
    assert roomy["mem_bytes"] == fsdp["mem_bytes"]
    assert ds["step_time_s"] == fsdp["step_time_s"]


def test_unfused_gradient_accumulation_is_a_pass_per_micro_batch():
    fused = run(mbs=1)
    deepspeed_bf16 = run(job=dataclasses.replace(TINY, grad_accum_bytes=18.0), mbs=1)
    # 8 micro-batches, each ending with 18 B per parameter of the 2 layers at
    # 0.5 x 1000 GB/s (kernel_us = 0)
    assert deepspeed_bf16["step_time_s"] - fused["step_time_s"] == pytest.approx(
        8 * 18 * 2 * P_LAYER / 500e9, rel=1e-9)
    # it is per micro-batch: 4 micro-batches of 2 sequences pay half of it
    fused2 = run(mbs=2)
    ds2 = run(job=dataclasses.replace(TINY, grad_accum_bytes=18.0), mbs=2)
    assert ds2["step_time_s"] - fused2["step_time_s"] == pytest.approx(
        4 * 18 * 2 * P_LAYER / 500e9, rel=1e-9)
    # inference accumulates nothing
    infer = dataclasses.replace(TINY, training=False)
    assert run(job=dataclasses.replace(infer, grad_accum_bytes=18.0))["step_time_s"] == \
        run(job=infer)["step_time_s"]


def test_an_uneven_pipeline_split_leaves_the_remainder_on_the_last_stage():
    def no_opt(job, **kw):
        r = run(job=job, **kw)
        return r["step_time_s"] - r["t_optimizer_s"]

    three, four = (dataclasses.replace(TINY, n_layers=n) for n in (3, 4))
    # one layer's forward + backward per micro-batch, from single-stage runs (8 micro-batches)
    layer = (no_opt(dataclasses.replace(TINY, n_layers=2)) -
             no_opt(dataclasses.replace(TINY, n_layers=1))) / 8
    # 3 layers over 2 stages: 2 + 1; 4 layers: 2 + 2. The steady state is the same (2 layers
    # bound it) and the bubble, one mean stage, is half a layer shorter
    assert no_opt(three, pp=2) - no_opt(four, pp=2) == pytest.approx(-0.5 * layer, rel=1e-9)
    # the first stage holds (and keeps the activations of) 2 layers in both
    assert run(job=three, pp=2)["mem_weights_bytes"] == run(job=four, pp=2)["mem_weights_bytes"]


def test_embedding_slots_take_a_layer_off_the_first_and_last_stages():
    job = dataclasses.replace(TINY, n_layers=7, vocab=32000)
    slots = dataclasses.replace(job, embedding_slots=True)
    # 7 layers over 3 stages: 3 + 3 + 1 (and the LM head); with the embedding and the head
    # counted as one layer each, 9 items: embedding + 2, 3, 2 + head
    plain, slotted = run(job=job, pp=3), run(job=slots, pp=3)
    # the first stage, the larger (a 32000 x 1024 embedding outweighs a layer), holds one
    # layer's 16-bit weights fewer
    assert plain["mem_weights_bytes"] - slotted["mem_weights_bytes"] == 2 * P_LAYER
    # ... and the LM head, 2.6 layers' worth here, now shares the last stage with 2 layers,
    # not 1: that stage bounds the pipeline, 4.6 layers' worth instead of 3.6
    assert slotted["step_time_s"] > plain["step_time_s"]
    # without pipeline stages, or without a vocabulary, slots change nothing
    assert run(job=slots)["step_time_s"] == run(job=job)["step_time_s"]
    nov = dataclasses.replace(TINY, n_layers=4)
    assert run(job=dataclasses.replace(nov, embedding_slots=True), pp=2)["step_time_s"] == \
        run(job=nov, pp=2)["step_time_s"]


def test_interleaved_p2p_overlap_leaves_the_fill_and_drain_exposed():
    job = dataclasses.replace(TINY, n_layers=4)
    # one stage-boundary activation, 1024 tokens x 1024 x 2 B over NVLink (100 GB/s, 1 us)
    one = 1e-6 + 1024 * 1024 * 2 / 100e9
    serial = dataclasses.replace(job, pp_overlap=False)
    # 8 micro-batches x 2 virtual stages x (forward + backward) transfers, all exposed
    assert run(job=serial, pp=2, vpp=2)["t_pp_comm_s"] == pytest.approx(32 * one, rel=1e-9)
    # overlapped with the next chunk's compute: the fill and drain, (p - 1) each way, remain
    assert run(job=job, pp=2, vpp=2)["t_pp_comm_s"] == pytest.approx(2 * one, rel=1e-9)
    # 1F1B without interleaving overlaps nothing
    assert run(job=job, pp=2)["t_pp_comm_s"] == run(job=serial, pp=2)["t_pp_comm_s"] == \
        pytest.approx(16 * one, rel=1e-9)


# ------------------------------------------------------------------------------ issue 15

#: linear-layer inputs of one TINY layer: the norm outputs feeding QKV and the MLP up
#: projection, the output projection's input, the MLP down projection's input (T x widths)
LINEAR_INPUTS = 1024 * (2 * 1024 + 1024 + 4096)


@pytest.mark.parametrize("dtype, saved_bytes", [("fp8", 1.0), ("mxfp8", 1 + 1 / 32),
                                                ("nvfp4", 0.5 + 1 / 16)])
def test_low_precision_jobs_keep_linear_inputs_in_their_format(dtype, saved_bytes):
    """Transformer Engine saves the quantized input of each linear layer for its
    weight-gradient GEMM: 2 B -> the format's bytes (with scales) per element, in the two
    stored layers and the working layer; the 16-bit GEMM outputs and norm inputs stay."""
    job = dataclasses.replace(TINY, dtype=dtype)
    lowp = run(job, BLACKWELL_TOY)
    assert lowp["mem_activations_bytes"] == pytest.approx(
        3 * (ACT_LAYER - (2 - saved_bytes) * LINEAR_INPUTS), rel=1e-12)
    kept16 = run(dataclasses.replace(job, lp_saved_inputs=False), BLACKWELL_TOY)
    assert kept16["mem_activations_bytes"] == 3 * ACT_LAYER


def test_offloaded_layers_move_their_activations_to_the_host_behind_compute():
    """offload_act_layers (Megatron cpu_offloading_num_layers): all but the last layer's
    activations may go; the copy out and back is hidden unless it outlasts the layer."""
    fast = dataclasses.replace(TOY, host_memory_bytes=1e12, host_link_bytes_per_s=1e15)
    base = run(hw=fast)
    one = run(dataclasses.replace(TINY, offload_act_layers=1), fast)
    many = run(dataclasses.replace(TINY, offload_act_layers=5), fast)
    assert one["mem_activations_bytes"] == 2 * ACT_LAYER  # 3 layers' worth -> 2
    assert many["mem_activations_bytes"] == one["mem_activations_bytes"]  # the last stays
    assert one["t_offload_s"] == 0 and one["step_time_s"] == base["step_time_s"]
    slow = dataclasses.replace(fast, host_link_bytes_per_s=1e9)
    lay = calibrated._layer_terms(ctx(), cand())
    exposed = 2 * ACT_LAYER / 1e9 - float(lay["fwd"][0] + lay["bwd"][0])
    assert run(dataclasses.replace(TINY, offload_act_layers=1), slow)["t_offload_s"] == \
        pytest.approx(8 * exposed, rel=1e-9)  # 8 micro-batches x 1 layer
    tiny_host = dataclasses.replace(fast, host_memory_bytes=1e3)
    assert run(dataclasses.replace(TINY, offload_act_layers=1), tiny_host)["reason"] == \
        Reason.OFFLOAD_CAPACITY


def test_fused_attention_kernels_run_at_their_own_efficiency():
    """attention_kernel fused (cuDNN / FlashAttention-3) at fused_attn_eff, flash
    (FlashAttention-2 class) at attn_eff; materialized at neither."""
    fused = dataclasses.replace(TINY, attention_kernel="fused")
    x2 = ctx(attn_eff=0.25, fused_attn_eff=0.5)
    x3 = ctx(fused, attn_eff=0.25, fused_attn_eff=0.5)
    fa2 = flash_attention_s(1, 8, 1280, 1280, 128, x2, 0.5, False)
    fa3 = flash_attention_s(1, 8, 1280, 1280, 128, x3, 0.5, False)
    assert fa2 == pytest.approx(2 * fa3, rel=1e-12)
    # a generation without a fused_attn_eff of its own uses attn_eff for both
    x_old = calibrated.make_context(fused, TOY, {k: v for k, v in PARAMS.items()})
    assert x_old["fused_attn_eff"] == x_old["attn_eff"] == 0.5


def test_more_memory_never_makes_a_feasible_config_infeasible():
    job, hw = load_job("llama3_70b"), load_hardware("H100-SXM")
    space = enumerate_space("calibrated", job, 64, "1d", hw.nvlink_domain)
    c = space.columns(0, min(space.size, 20000))
    feasible = {}
    for gb in (40, 80, 141):
        big = dataclasses.replace(hw, hbm_capacity_bytes=gb * 2.0**30)
        out = evaluate_columns("calibrated", job, big, "1d", 64, c)
        feasible[gb] = out["reason"] == Reason.OK
    assert feasible[40].sum() < feasible[80].sum() < feasible[141].sum()
    assert not (feasible[40] & ~feasible[80]).any() and not (feasible[80] & ~feasible[141]).any()


def test_predict_answers_the_fastest_that_fits_else_the_smallest():
    """sweep predict fills a partial configuration with the fastest matching candidate that
    fits in memory; when none fits (Llama 3.1 405B on 8 H100) with the one needing the least
    memory - what comes closest to running - not the fastest of those that cannot run."""
    from sweep.analysis.predict import predict

    job, hw = load_job("llama3_405b"), load_hardware("H100-SXM")
    p = predict("calibrated", job, hw, "1d", 8, {"tp": 8})
    space = enumerate_space("calibrated", job, 8, "1d", hw.nvlink_domain)
    cols = space.columns(0, space.size)
    mine = cols["tp"] == 8
    metrics = evaluate_columns("calibrated", job, hw, "1d", 8,
                               {k: v[mine] for k, v in cols.items()})
    assert not metrics["feasible"].any() and not p.row["feasible"]
    assert p.row["mem_bytes"] == metrics["mem_bytes"].min()
    assert p.matches == int(mine.sum())
    fits = predict("calibrated", load_job("llama3_8b"), hw, "1d", 8, {"tp": 8})
    assert fits.row["feasible"]

"""The calibrated profile's mixture-of-experts layers (issue 16): hand-computed routing,
dispatch and expert GEMMs of a tiny model; properties (EP never raises per-GPU expert memory,
a larger NVLink domain never slows the all-to-all, one top-1 expert is the dense MLP); the
expert-parallel candidate space."""

from __future__ import annotations

import dataclasses
from math import comb

import numpy as np
import pytest

from sweep.engine.catalog import load_hardware, load_job
from sweep.model.candidates import enumerate_calibrated, expert_ranks_per_domain
from sweep.model.cost import calibrated, evaluate_columns, moe
from sweep.model.hardware import parse_hardware
from sweep.model.job import Job
from sweep.model.schema import Recompute
from tests.conftest import candidate_block

PARAMS = {"gemm_eff": 0.5, "attn_eff": 0.5, "hbm_eff": 0.5, "kernel_us": 0.0, "nvl_eff": 1.0,
          "net_eff": 1.0, "fp8_eff": 1.0, "reserve_GiB": 0.0, "allocator_cache": 0.0,
          "grouped_gemm_eff": 0.5, "expert_us": 0.0, "a2a_eff": 0.5}
TOY = dataclasses.replace(parse_hardware({
    "name": "toy", "matrix_tflops": {"bf16": 100, "fp8": 200},
    "vector_tflops": {"bf16": 10, "fp32": 5}, "hbm_GBps": 1000, "hbm_GB": 80,
    "nvlink_GBps": 100, "nvlink_latency_us": 1e-6, "nvlink_domain": 8, "scaleout_GBps": 10,
    "scaleout_latency_us": 1e-6, "nics_per_gpu": 1, "sm_count": 100, "gemm_tile": [128, 128],
}, "toy"), generation="toy", calibration=PARAMS)  # (no generation's typical values)
DENSE = Job(name="dense", n_layers=2, hidden=1024, ffn_hidden=512, n_heads=8, n_kv_heads=8,
            head_dim=128, vocab=0, seq_len=1024, global_batch=8, mlp="swiglu",
            norm="rmsnorm")
# 8 experts of width 512, top-2, every layer MoE
TINY = dataclasses.replace(DENSE, name="tiny_moe", n_experts=8, top_k=2, moe_ffn_hidden=512,
                           ffn_hidden=4096)


def ctx(job=TINY, hw=TOY, **params):
    return calibrated.make_context(job, hw, {**PARAMS, **params})


def cand(n=1, **kw):
    """Column block of n identical candidates (degrees 1, groups inside one domain)."""
    return candidate_block(n, **kw)


def layout(x, c):
    return calibrated._layout(x, c)


# ------------------------------------------------------------------------------ by hand

def test_tokens_per_expert_even_share_spread_and_capacity():
    x = ctx()
    # one EP rank: all 1024 x 2 token copies spread over 8 experts, no spread term
    assert moe.tokens_per_expert(x, 1024.0, 1.0, 1.0) == pytest.approx(256.0)
    # 4 EP ranks: the busiest receives the mean + sqrt(2 ln 4 (3/4) / 2048) of it
    spread = 1.0 + np.sqrt(2.0 * np.log(4.0) * 0.75 / 2048.0)
    want = np.ceil(4 * 2048 / 8 * spread / 8) * 8  # padded to the tensor-core multiple
    assert moe.tokens_per_expert(x, 1024.0, 4.0, 1.0) == pytest.approx(want)
    # a capacity factor pads every expert to ceil(T k cf / E) rows per source rank
    x_cap = ctx(dataclasses.replace(TINY, capacity_factor=1.25))
    padded = 4 * np.ceil(1000 * 2 * 1.25 / 8)  # 4 x 313 = 1252, to the multiple of 8: 1256
    assert moe.tokens_per_expert(x_cap, 1000.0, 4.0, 1.0) == np.ceil(padded / 8) * 8 == 1256


def test_distinct_fraction_is_the_hypergeometric_miss():
    # 8 experts, top-2, a destination holding 2 of them: 1 - C(6, 2) / C(8, 2)
    assert moe.distinct_fraction(8.0, 2.0, 0.25) == pytest.approx(1 - comb(6, 2) / comb(8, 2))
    assert moe.distinct_fraction(256.0, 8.0, 1.0) == pytest.approx(1.0)
    assert moe.distinct_fraction(256.0, 0.0, 0.5) == pytest.approx(0.0)


def test_all_to_all_volumes_by_hand():
    x = ctx()
    row = 1024 * 2  # one token's hidden state in bf16
    # NCCL all-to-all over 4 ranks in one domain: 3/4 of the T k copies leave the GPU
    nvl, net = moe.a2a_bytes(x, 1024.0, 4.0, 4.0, 2.0)
    assert (nvl, net) == (pytest.approx(1024 * 2 * row * 3 / 4), pytest.approx(0.0))
    # two domains of 2: 1/4 over NVLink, 2/4 over the NICs
    nvl, net = moe.a2a_bytes(x, 1024.0, 4.0, 2.0, 2.0)
    assert (nvl, net) == (pytest.approx(1024 * 2 * row / 4), pytest.approx(1024 * 2 * row / 2))
    # the flex dispatcher sends a token once per GPU it hits: 4 (1 - C(6,2)/C(8,2)) GPUs
    xf = ctx(dataclasses.replace(TINY, moe_dispatcher="flex"))
    hit = 4 * (1 - comb(6, 2) / comb(8, 2))
    nvl, net = moe.a2a_bytes(xf, 1024.0, 4.0, 4.0, 2.0)
    assert nvl == pytest.approx(1024 * row * hit * 3 / 4) and net == pytest.approx(0.0)
    # time: the slower tier at a2a_eff of its link (NVLink 100 GB/s, NIC 10 GB/s)
    t = moe.a2a_s(1e9, 1e8, 4.0, 2.0, x)
    assert t == pytest.approx(max(1e9 / 50e9, 1e8 / 5e9))
    assert moe.a2a_s(1e9, 0.0, 1.0, 1.0, x) == 0.0  # no expert parallelism: no all-to-all


def test_routed_flops_and_permute_bytes_by_hand():
    x = ctx(kernel_us=0.0)
    c = cand(dp=4, ep=4)
    r = moe.routed_experts(x, c, layout(x, c), 100e12)
    rows = moe.tokens_per_expert(x, 1024.0, 4.0, 1.0) * 2  # 2 local experts
    # fc1 1024 -> 2 x 512 (gate, up), fc2 512 -> 1024, two FLOPs per multiply-add; and the
    # router's 1024 x 8 projection of the 1024 tokens
    experts, router = 2 * rows * 1024 * (1024 + 512), 2 * 1024 * 8 * 1024
    assert r["flops_f"] == pytest.approx(experts + router)
    assert r["flops_b"] == pytest.approx(2 * (experts + router))
    # permute and unpermute: read T, write T k, sort the received rows twice; bf16
    perm = 2 * 2 * 1024 * (1024 + 2048 + 2 * rows)
    assert r["permute_f"] == pytest.approx(perm / (1000e9 * 0.5))


def test_router_is_a_gemm_over_the_experts_and_a_pass_over_the_scores():
    x = ctx()
    f, b = moe.router_s(x, 1024.0)
    gemm = 2 * 1024 * 8 * 1024 / (100e12 * 0.5)  # N = 8 experts: one tile of 128 padded
    assert f > gemm and f == pytest.approx(
        calibrated.gemm_s(1024.0, 8.0, 1024.0, x, 100e12, 0.5)
        + moe.ROUTER_BYTES_PER_SCORE * 1024 * 8 / 500e9)
    assert b > f


# ------------------------------------------------------------------------------ properties

def test_one_top_1_expert_is_the_dense_mlp():
    """n_experts = 1, top_k = 1: the routed GEMMs are the dense MLP's GEMMs (at the same
    efficiency), and the expert weights the MLP's weights; the MoE block adds only its
    router and permutation."""
    one = dataclasses.replace(DENSE, name="one", n_experts=1, top_k=1, moe_ffn_hidden=512)
    xd, xm = ctx(DENSE), ctx(one, grouped_gemm_eff=PARAMS["gemm_eff"])
    c = cand()
    dense = calibrated._layer(xd, c, layout(xd, c))
    r = moe.routed_experts(xm, c, layout(xm, c), 100e12)
    assert r["gemm_f"] == pytest.approx(dense["gemm_f_each"][2] + dense["gemm_f_each"][3])
    assert r["gemm_b"] == pytest.approx(dense["gemm_b_each"][2] + dense["gemm_b_each"][3])
    assert xm["p_experts"] == one.routed_expert_params() == 3 * 1024 * 512
    a, b = calibrated.evaluate(xd, c), calibrated.evaluate(xm, c)
    assert b["step_time_s"] > a["step_time_s"]  # router and permutation on top
    assert b["t_ep_comm_s"] == 0.0
    # the same weights but the two routers (1024 x 1 each, bf16)
    assert b["mem_weights_bytes"] == pytest.approx(a["mem_weights_bytes"] + 2 * 1024 * 2)


def test_expert_parallelism_never_raises_per_gpu_expert_memory():
    x = ctx()
    mems = [calibrated.evaluate(x, cand(dp=8, ep=ep, zero=1))["mem_weights_bytes"][0]
            for ep in (1, 2, 4, 8)]
    assert all(b < a for a, b in zip(mems, mems[1:]))
    opt = [calibrated.evaluate(x, cand(dp=8, ep=ep, zero=1))["mem_optimizer_bytes"][0]
           for ep in (1, 2, 4, 8)]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(opt, opt[1:]))


def test_a_larger_nvlink_domain_never_slows_the_all_to_all():
    x = ctx()
    for flex in ("alltoall", "flex"):
        xf = ctx(dataclasses.replace(TINY, moe_dispatcher=flex))
        times = [moe.a2a_s(*moe.a2a_bytes(xf, 4096.0, 8.0, g, 2.0), 8.0, g, xf)
                 for g in (1.0, 2.0, 4.0, 8.0)]
        assert all(b <= a for a, b in zip(times, times[1:])), flex
    # and whole candidates: EP 8 over domains of 1, 2, 4, 8 GPUs
    steps = [calibrated.evaluate(x, cand(dp=8, ep=8, nv_dp=d))["t_ep_comm_s"][0]
             for d in (1, 2, 4, 8)]
    assert all(b <= a for a, b in zip(steps, steps[1:])) and steps[-1] < steps[0]


def test_more_link_bandwidth_is_never_slower_for_moe():
    slow = calibrated.evaluate(ctx(), cand(dp=8, ep=8, nv_dp=2))["step_time_s"][0]
    fast_hw = dataclasses.replace(TOY, nvlink_bytes_per_s=2 * TOY.nvlink_bytes_per_s,
                                  scaleout_bytes_per_s=2 * TOY.scaleout_bytes_per_s)
    fast = calibrated.evaluate(ctx(hw=fast_hw), cand(dp=8, ep=8, nv_dp=2))["step_time_s"][0]
    assert fast < slow


def test_a2a_overlap_hides_communication_behind_the_other_micro_batch():
    x = ctx()
    plain = calibrated.evaluate(x, cand(dp=8, ep=8, nv_dp=2))
    hidden = calibrated.evaluate(x, cand(dp=8, ep=8, nv_dp=2, a2a_overlap=1))
    assert hidden["t_ep_comm_s"][0] < plain["t_ep_comm_s"][0]
    assert hidden["step_time_s"][0] < plain["step_time_s"][0]


@pytest.mark.parametrize("accum_bytes", [0.0, 8.0])
def test_op_table_rows_sum_to_the_step_and_name_the_moe_ops(accum_bytes):
    job = dataclasses.replace(TINY, first_k_dense=1, n_layers=3, grad_accum_bytes=accum_bytes)
    x = ctx(job)
    c = cand(dp=8, ep=4, nv_dp=2, recompute=Recompute.SELECTIVE)
    rows = calibrated.op_table(x, c)
    step = calibrated.evaluate(x, c)["step_time_s"][0]
    assert sum(r["time_s"][0] for r in rows) == pytest.approx(step, rel=1e-9)
    names = {r["name"] for r in rows if r["time_s"][0] > 0}
    assert {"MoE router", "MoE expert GEMMs (grouped)", "MoE token permute / unpermute",
            "EP all-to-all and ETP collectives (exposed)"} <= names


def test_a_block_equals_its_rows_evaluated_one_by_one():
    job, hw = load_job("qwen3_30b_a3b"), load_hardware("B200")
    space = enumerate_calibrated(job, 16, hw.nvlink_domain)
    cols = space.columns(0, 4096)
    block = evaluate_columns("calibrated", job, hw, "1d", 16, cols)
    for i in (0, 1, 777, 2048, 4095):
        one = evaluate_columns("calibrated", job, hw, "1d", 16,
                               {k: v[i:i + 1] for k, v in cols.items()})
        for k in ("step_time_s", "mem_bytes", "t_ep_comm_s"):
            assert one[k][0] == pytest.approx(block[k][i], rel=1e-12), (i, k)


# ------------------------------------------------------------------------------ the space

def test_expert_space_folds_ep_and_etp_into_the_stage():
    job = load_job("qwen3_30b_a3b")
    space = enumerate_calibrated(job, 16, 8)
    cols = space.columns(0, space.size)
    mesh = cols["tp"] * cols["cp"] * cols["dp"]
    assert np.all(mesh % (cols["ep"] * cols["etp"]) == 0)
    assert np.all(job.n_experts % cols["ep"] == 0)
    assert np.all(job.moe_ffn_hidden % cols["etp"] == 0)
    assert set(np.unique(cols["ep"])) == {1, 2, 4, 8, 16}
    # the all-to-all overlap only where Megatron-Core allows it
    ov = cols["a2a_overlap"] == 1
    assert ov.any() and np.all(cols["ep"][ov] > 1)
    assert np.all((cols["pp"][ov] == 1) | (cols["vpp"][ov] > 1))
    assert not np.isin(cols["recompute"][ov], (Recompute.FULL, Recompute.FIRST_K)).any()
    # tensor parallelism with MoE always with sequence parallelism
    assert np.all(cols["sp"][cols["tp"] > 1] == 1)
    # EP ranks per NVLink domain follow the placement
    assert np.array_equal(cols["nv_ep"], expert_ranks_per_domain(cols))
    assert np.all(cols["nv_ep"] <= cols["ep"])


def test_dense_jobs_keep_their_space():
    job = load_job("llama3_8b")
    cols = enumerate_calibrated(job, 16, 8).columns(0, 10_000)
    assert np.all(cols["ep"] == 1) and np.all(cols["etp"] == 1) and np.all(cols["nv_ep"] == 1)


def test_summa_is_refused_for_moe_and_mla_as_an_empty_space():
    assert enumerate_calibrated(load_job("qwen3_30b_a3b"), 16, 8, strategy="2d").size == 0
    assert enumerate_calibrated(load_job("deepseek_v3"), 64, 8, strategy="2d").size == 0


def test_a_run_fills_its_nvlink_domains_in_equal_parts():
    # 256 GPUs on NVL72 racks: four domains of 64
    cols = enumerate_calibrated(load_job("qwen3_30b_a3b"), 256, 72).columns(0, 200_000)
    inside = cols["nv_tp"] * cols["nv_cp"] * cols["nv_dp"] * cols["nv_pp"]
    assert inside.max() <= 64 and 64 in set(inside.tolist())


def test_each_local_expert_costs_its_host_preparation_per_grouped_call():
    # 4 local experts (8 / ep 2), fc1 and fc2: forward 2 calls, backward 4 (dgrad, wgrad)
    c = cand(dp=2, ep=2)
    base = moe.routed_experts(ctx(), c, layout(ctx(), c), 100e12)
    x = ctx(expert_us=10.0)
    slow = moe.routed_experts(x, c, layout(x, c), 100e12)
    assert slow["gemm_f"] - base["gemm_f"] == pytest.approx(2 * 4 * 10e-6)
    assert slow["gemm_b"] - base["gemm_b"] == pytest.approx(4 * 4 * 10e-6)


def test_the_busiest_middle_stage_of_a_sparse_moe_pattern():
    """MoE on every 4th of 36 layers over 8 stages of 5 (the last of 1): the fourth stage
    holds 2 MoE blocks, every other stage 1, and the step is bound by it (8 micro-batches of
    it at least)."""
    x = ctx(dataclasses.replace(TINY, n_layers=36, moe_layer_step=4, ffn_hidden=256))
    c = cand(pp=8)
    lay = calibrated._layer_terms(x, c)
    both = calibrated._with_moe(x, c, lay, calibrated._routed_terms(x, c))
    dense_block = lay["fwd"][0] + lay["bwd"][0]
    moe_block = both["moe:fwd"][0] + both["moe:bwd"][0]
    out = calibrated.evaluate(x, c)
    steady = out["step_time_s"][0] - sum(out[k][0] for k in (
        "t_bubble_s", "t_pp_comm_s", "t_dp_comm_s", "t_optimizer_s"))
    assert moe_block > dense_block
    assert steady == pytest.approx(8 * (3 * dense_block + 2 * moe_block), rel=1e-9)


def test_nccl_all_to_all_uses_at_most_one_nic_per_gpu():
    # a GPU with two NICs still sends its all-to-all through one (nccl-tests #267)
    x = ctx()
    two = dict(x, nics=2.0)
    assert moe.a2a_s(0.0, 1e8, 8.0, 1.0, two) == pytest.approx(moe.a2a_s(0.0, 1e8, 8.0, 1.0, x))
    half = dict(x, nics=0.5)  # a NIC shared by two GPUs: half of it each
    assert moe.a2a_s(0.0, 1e8, 8.0, 1.0, half) == pytest.approx(1e8 / (0.5 * 10e9 * 0.5))


def test_capacity_padding_is_sent_too():
    # 1000 tokens, top-2, 8 experts, capacity factor 1.25: 8 x ceil(312.5) = 2504 rows
    padded = ctx(dataclasses.replace(TINY, capacity_factor=1.25))
    assert moe.rows_sent(padded, 1000.0) == 8 * 313
    assert moe.rows_sent(ctx(), 1000.0) == 2000  # dropless: T k
    nvl, _ = moe.a2a_bytes(padded, 1000.0, 4.0, 4.0, 2.0)
    assert nvl == pytest.approx(8 * 313 * 1024 * 2 * 3 / 4)


def test_zero3_gathers_the_experts():
    """ZeRO-3 keeps each GPU's fp32 shard of its experts (over the expert data-parallel group)
    and gathers two blocks' experts in 16 bits. From ep = 4 to ep = 2 (8 GPUs, 2 MoE blocks,
    X = one block's expert weights): the shards stay 2 X / 8 x 4 B, the gathered copy grows from
    2 (X / 4) to 2 (X / 2) x 2 B, by X bytes; without the gather nothing would change."""
    x = ctx()
    X = x["p_experts"]
    z3 = {ep: calibrated.evaluate(x, cand(dp=8, ep=ep, zero=3))["mem_weights_bytes"][0]
          for ep in (2, 4)}
    assert z3[2] - z3[4] == pytest.approx(X)



def test_an_all_moe_job_has_no_dense_ffn_to_gather():
    """With every block MoE the dense FFN width is unused: ZeRO-2's gradient bucket, ZeRO-3's
    gathered blocks and FSDP's per-block gathers and reduce-scatters are an MoE block's
    (they were a dense block's of ffn_hidden)."""
    for zero in (0, 1, 2, 3):
        c = cand(dp=8, zero=zero, ep=2)
        runs = [calibrated.evaluate(ctx(dataclasses.replace(TINY, ffn_hidden=f)), c)
                for f in (512, 4096, 60000)]
        for k in ("mem_bytes", "mem_weights_bytes", "mem_grads_bytes", "t_dp_comm_s",
                  "step_time_s"):
            assert runs[0][k] == runs[1][k] == runs[2][k], (zero, k)

@pytest.mark.parametrize("extra", [{}, {"mtp_layers": 1, "vocab": 32000},
                                   {"recompute_moe_act": True, "recompute_norms": True}],
                         ids=["plain", "mtp", "recompute-modules"])
def test_full_recompute_is_first_k_of_every_block(extra):
    """Full recompute re-runs each block's forward, an MoE block's router, dispatch, experts
    and combine included (Megatron-Core checkpoints whole layers): the same step time and
    executed FLOPs as first-k recompute of every block (the recompute modules are not
    charged again on a block re-run in full). An MTP depth is checkpointed under full
    recompute and left alone by first-k (Megatron-Core multi_token_prediction.py: "block"
    is "not supported for MTP yet. Skipping recompute"): first-k of every block is faster
    by the depth's forward, one a micro-batch. (Full recompute charged only the attention
    and shared-expert side; first-k's time left out the modules of the blocks it re-ran.)"""
    job = dataclasses.replace(TINY, n_layers=4, **extra)
    x = ctx(job)
    base = {"dp": 8, "ep": 8, "nv_dp": 2}
    c_full = cand(recompute=Recompute.FULL, **base)
    full = calibrated.evaluate(x, c_full)
    every = calibrated.evaluate(x, cand(recompute=Recompute.FIRST_K, recompute_layers=4,
                                        **base))
    _, parts = calibrated._step(x, c_full)
    depth = job.mtp_layers * parts["m"][0]  # (one MoE block a depth, every micro-batch)
    lay = parts["lay"]
    want = {"step_time_s": depth * lay["moe:fwd"][0],
            "hardware_flops": depth * lay["moe:flops_f"][0]}
    for k in ("step_time_s", "hardware_flops"):
        assert full[k][0] - every[k][0] == pytest.approx(want[k], rel=1e-9, abs=1e-12), k


def test_full_recompute_reruns_the_whole_moe_block():
    """Full recompute adds one forward of every whole MoE block to the step (by hand)."""
    job = dataclasses.replace(TINY, n_layers=4)
    x = ctx(job)
    base = {"dp": 8, "ep": 8, "nv_dp": 2}
    full = calibrated.evaluate(x, cand(recompute=Recompute.FULL, **base))
    none = calibrated.evaluate(x, cand(**base))
    # one more forward of every block: the block's own forward time, routed part included
    lay = calibrated._with_moe(x, cand(recompute=Recompute.FULL, **base),
                               *calibrated._layer_terms_dedup(x, cand(recompute=Recompute.FULL,
                                                                       **base)))
    fwd = lay[calibrated.MOE_PREFIX + "fwd"][0]
    m = 8 / 8  # micro-batches: global batch 8 over dp 8 at mbs 1
    assert full["step_time_s"][0] - none["step_time_s"][0] == pytest.approx(
        m * 4 * fwd, rel=1e-9)


@pytest.mark.parametrize("pp", [1, 2, 3, 4])
def test_executed_flops_are_the_model_over_the_gpus_whatever_the_stages(pp):
    """Hardware FLOPs per GPU are the whole model's executed FLOPs over the GPUs, averaged
    over the pipeline stages (as the model FLOPs are): the same total on 1 - 4 stages, 3
    of them uneven (a middle stage's blocks times pp overcounted them), and first-k
    recompute of k blocks a stage adds k forwards on each stage."""
    job = dataclasses.replace(TINY, n_layers=7, vocab=32000)  # (stages of 7, 4+3, 3+3+1, 2+2+2+1)
    x = ctx(job)
    totals = {}
    for k in (0, 1):
        c = cand(dp=8, ep=8, nv_dp=2, pp=pp, recompute=Recompute.FIRST_K if k else 0,
                 recompute_layers=k)
        totals[k] = calibrated.evaluate(x, c)["hardware_flops"][0] * 8 * pp
    one = cand(dp=8, ep=8, nv_dp=2)
    want = calibrated.evaluate(x, one)["hardware_flops"][0] * 8
    assert totals[0] == pytest.approx(want, rel=1e-12)
    lay = calibrated._with_moe(x, one, *calibrated._layer_terms_dedup(x, one))
    forward = lay[calibrated.MOE_PREFIX + "flops_f"][0] * 8  # one block, 8 GPUs, 1 micro-batch
    assert totals[1] - totals[0] == pytest.approx(pp * forward, rel=1e-9)


def test_an_mtp_depth_holds_a_block_its_projection_and_its_logits():
    """Multi-token prediction on the stage with the LM head (DeepSeek-V3 section 2.2;
    Megatron-Core's MTP layer: enorm, hnorm, eh_proj, a transformer block, final norm):
    against one more decoder block there, a depth adds the projection [h; emb] 2h -> h and
    three norms (weights, gradients, optimizer state) and its logits' saved softmax, live
    while the main loss's gradient is formed. One stage, so that stage is the one reported.
    (An outside tester found MTP priced in time and not in memory.)"""
    from sweep.analysis.predict import predict

    hw = load_hardware("GB200-NVL72")
    base = load_job("qwen3_30b_a3b")  # every block MoE, bf16, no fused loss
    config = {"tp": 1, "cp": 1, "pp": 1, "ep": 8, "etp": 1, "mbs": 1, "zero": 1,
              "recompute": 0, "a2a_overlap": 0}

    def mem(**change):
        row = predict("calibrated", dataclasses.replace(base, **change), hw, "1d", 64,
                      config).row
        return {k: float(row[k]) for k in ("mem_weights_bytes", "mem_grads_bytes",
                                           "mem_optimizer_bytes", "mem_activations_bytes")}

    plain, depth, block = mem(), mem(mtp_layers=1), mem(n_layers=base.n_layers + 1)
    h = base.hidden
    extra_params = 2 * h * h + 3 * h  # eh_proj and enorm, hnorm, final norm
    assert depth["mem_weights_bytes"] - block["mem_weights_bytes"] == \
        pytest.approx(2.0 * extra_params, rel=1e-9)  # bf16 weights
    grad_bytes = {"fp32": 4.0, "bf16": 2.0, "mixed": 6.0}[base.grad_dtype]  # (ZeRO-1: whole)
    assert depth["mem_grads_bytes"] - block["mem_grads_bytes"] == \
        pytest.approx(grad_bytes * extra_params, rel=1e-9)
    assert depth["mem_weights_bytes"] > plain["mem_weights_bytes"]
    assert depth["mem_optimizer_bytes"] > block["mem_optimizer_bytes"] > \
        plain["mem_optimizer_bytes"]
    # the depth's logits (4096 tokens x the padded vocabulary x fp32) beside one more
    # block's activations
    logits = base.seq_len * calibrated.padded_vocab(base.vocab, 1) * 4.0
    assert depth["mem_activations_bytes"] - block["mem_activations_bytes"] == \
        pytest.approx(logits, rel=1e-9)


def test_zero3_under_pp_keeps_the_experts_gradients_unsharded():
    """FSDP under pipeline parallelism accumulates every gradient unsharded over the
    micro-batches and reduce-scatters once (torch.distributed.pipelining
    backward_maybe_with_nosync; docs/model.md, memory conventions): a routed expert's as the
    other weights'. Its gradient memory is then ZeRO-1's, and without PP it is ZeRO-2's.
    (The experts' gradients were sharded over the expert data-parallel group under PP.)"""
    x = ctx(dataclasses.replace(TINY, n_layers=4))
    grads = {(z, pp): calibrated.evaluate(x, cand(dp=8, ep=2, pp=pp, zero=z))
             ["mem_grads_bytes"][0] for z in (1, 2, 3) for pp in (1, 2)}
    assert grads[3, 2] == pytest.approx(grads[1, 2], rel=1e-12)
    assert grads[3, 1] < grads[1, 1]
    assert grads[2, 2] < grads[3, 2]

"""Iteration totals of the nersc2024 profile: bubble, DP overlap, p2p, memory (section 6-7),
checked by hand on synthetic per-layer costs, plus properties over real candidate spaces."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sweep.model.candidates import enumerate_nersc
from sweep.model.cost import evaluate, evaluate_columns
from sweep.model.cost import nersc2024 as N
from sweep.model.job import Job

JOB = Job(name="toy", n_layers=8, hidden=1024, ffn_hidden=4096, n_heads=16, n_kv_heads=16,
          head_dim=64, vocab=0, seq_len=2048, global_batch=64)


def cand(**kw):
    base = dict(dp=1, tp=1, tp2=1, cp=1, pp=1, mbs=1, nb=1, nv_tp=1, nv_tp2=1, nv_cp=1,
                nv_dp=1, nv_pp=1, index=0)
    base.update(kw)
    return {k: np.array([v]) for k, v in base.items()}


def layer(**kw):
    base = dict(t_fwd_s=1e-3, t_bwd_s=2e-3, compute_s=2.5e-3, memory_s=0.0, tp_comm_s=0.5e-3,
                cp_comm_s=0.0, flops=1e12, weight_bytes=1e8, act_bytes=3e8, p2p_bytes=4e6)
    base.update(kw)
    return {k: np.array([v]) for k, v in base.items()}


def test_bubble_and_stage(nersc_hw):
    """pp = 4, dp = 2: 2 layers per stage, 32 micro-batches of 1.
    stage = (1 + 2) ms x 32 x 2 + p2p; bubble = (pp - 1) x stage / 32."""
    hw = nersc_hw("A100", 4)
    c = cand(pp=4, dp=2, nv_pp=1, nv_dp=1)
    out = N.totals(JOB, "1d", c, layer(weight_bytes=0.0), hw)
    p2p = 2 * 32 * (5e-6 + 4e6 / 17.5e9)  # fwd + bwd per micro-batch, all scale-out
    stage = 3e-3 * 64 + p2p
    assert out["t_pp_comm_s"][0] == pytest.approx(p2p, rel=1e-14)
    assert out["t_bubble_s"][0] == pytest.approx(3 * stage / 32, rel=1e-14)
    assert out["t_dp_comm_s"][0] == 0.0  # no weights to sync
    assert out["step_time_s"][0] == pytest.approx(stage + 3 * stage / 32, rel=1e-14)


def test_pipeline_hops_between_domains_cost_nothing(nersc_hw):
    """pp = 8 with 2 stages per domain: 7 links, int(8 / 2 - 1) = 3 leave the domain; the
    published code weights the fast time by 4/7 and charges 0 for the slow hops."""
    hw = nersc_hw("A100", 4)
    c = cand(pp=8, nv_pp=2, dp=8)
    out = N.pipeline_p2p_s(np.array([4e6]), c, np.array([8]), hw)
    fast = 2.5e-6 + 4e6 / 210e9
    assert out[0] == pytest.approx(2 * 8 * 4 / 7 * fast, rel=1e-14)
    fixed = N.pipeline_p2p_s(np.array([4e6]), c, np.array([8]), hw,
                             N.NerscDefects(pp_slow_links_free=False))
    slow = 5e-6 + 4e6 / 17.5e9
    assert fixed[0] == pytest.approx(2 * 8 * (4 / 7 * fast + 3 / 7 * slow), rel=1e-14)


def test_data_parallel_overlap(nersc_hw):
    """dp = 4 inside one domain; each per-layer AG/RS beyond the first is exposed only by its
    excess over one layer's compute of one micro-batch."""
    hw = nersc_hw("A100", 4)
    c = cand(dp=4, nv_dp=4)
    w = 1e9
    coll = 3 * 2.5e-6 + 3 / 4 * w / 210e9  # ring inside the domain
    t_fwd, t_bwd = 1e-3, 2e-3
    out = N.data_parallel_s(np.array([w]), np.array([t_fwd]), np.array([t_bwd]), c,
                            np.array([8]), hw, "1d")
    expected = coll + 7 * max(coll - t_fwd, 0) + coll + 7 * max(coll - t_bwd, 0)
    assert out[0] == pytest.approx(expected, rel=1e-14)


def test_memory_terms(nersc_hw):
    """W + G + 6 W / dp + A x min(pp, micro-batches); 2d-seqp shards the optimizer by cp too."""
    hw = nersc_hw("A100", 4)
    out = N.totals(JOB, "1d", cand(pp=2, dp=4), layer(), hw)
    w = 1e8 * 4  # 4 layers per stage
    assert out["mem_weights_bytes"][0] == w and out["mem_grads_bytes"][0] == w
    assert out["mem_optimizer_bytes"][0] == pytest.approx(6 * w / 4)
    assert out["mem_activations_bytes"][0] == pytest.approx(3e8 * 4 * 2)  # 16 mb, pp 2 in flight
    seqp = N.totals(JOB, "2d-seqp", cand(pp=2, dp=4, cp=2), layer(), hw)
    assert seqp["mem_optimizer_bytes"][0] == pytest.approx(6 * w / 8)


@pytest.mark.parametrize("strategy", ["1d", "2d", "2d-seqp"])
def test_block_equals_rows_one_by_one(strategy, nersc_hw, job):
    """Evaluating a block gives exactly what evaluating each row alone gives."""
    hw = nersc_hw("H200", 8)
    model = job("gpt3_1T")
    space = enumerate_nersc(model, 1024, strategy, 8)
    rng = np.random.default_rng(1)
    pick = np.sort(rng.choice(space.size, 40, replace=False))
    cols = space.columns(0, space.size)
    block = {k: v[pick] for k, v in cols.items()}
    together = evaluate("nersc2024", model, hw, strategy, 1024, block)
    for i in range(len(pick)):
        alone = evaluate("nersc2024", model, hw, strategy, 1024,
                         {k: v[i:i + 1] for k, v in block.items()})
        assert alone[0] == together[i]


@pytest.mark.parametrize("strategy", ["1d", "2d", "2d-seqp"])
@pytest.mark.parametrize("field, factor", [("hbm_bytes_per_s", 2.0), ("nvlink_bytes_per_s", 2.0),
                                           ("scaleout_bytes_per_s", 4.0),
                                           ("nics_per_gpu", 2.0)])
def test_more_bandwidth_is_never_slower(strategy, field, factor, nersc_hw, job):
    hw = nersc_hw("B200", 8)
    faster = dataclasses.replace(hw, **{field: getattr(hw, field) * factor})
    model = job("vit_era5")
    space = enumerate_nersc(model, 512, strategy, 8)
    cols = space.columns(0, min(space.size, 20000))
    slow = evaluate_columns("nersc2024", model, hw, strategy, 512, cols)
    fast = evaluate_columns("nersc2024", model, faster, strategy, 512, cols)
    assert (fast["step_time_s"] <= slow["step_time_s"] * (1 + 1e-12)).all()
    assert (fast["mem_bytes"] == slow["mem_bytes"]).all()


def test_capacity_decides_feasibility(nersc_hw, job):
    hw = nersc_hw("A100", 8)
    model = job("gpt3_1T")
    space = enumerate_nersc(model, 512, "1d", 8)
    cols = space.columns(0, space.size)
    out = evaluate_columns("nersc2024", model, hw, "1d", 512, cols)
    assert (out["feasible"] == (out["mem_bytes"] <= hw.hbm_capacity_bytes)).all()
    assert 0 < out["feasible"].sum() < len(out["feasible"])
    assert (out["reason"][~out["feasible"]] == 1).all()


def test_every_metric_column_of_its_dtype(nersc_hw, job):
    """evaluate_columns gives every METRIC column, (n,) of its RESULT dtype: the ones the
    profile leaves out are zeros (they come from one float64 block, so every such metric
    must be float64)."""
    from sweep.model.cost import _FLOAT_METRICS
    from sweep.model.schema import METRIC_FIELDS, RESULT_DTYPE

    assert all(RESULT_DTYPE[name] == np.float64 for name in _FLOAT_METRICS)
    model = job("gpt3_1T")
    space = enumerate_nersc(model, 512, "1d", 8)
    cols = evaluate_columns("nersc2024", model, nersc_hw("A100", 8), "1d", 512,
                            space.columns(0, space.size))
    for name, _, _, _ in METRIC_FIELDS:
        assert cols[name].shape == (space.size,), name
        assert cols[name].dtype == RESULT_DTYPE[name], name
    assert (cols["t_ep_comm_s"] == 0).all() and (cols["t_offload_s"] == 0).all()

"""DeepSeek-V4's compressed sparse attention (attention: csa) and hyper-connections
(hc_streams): the weights, the keys a query sees, the model FLOPs as Megatron-Bridge counts
them and the layer's GEMMs and attention core, by hand; properties (more keys or more
streams are never faster or smaller; a csa row beside a dense one leaves it unchanged); the
candidate space (TP 1, CP 1); the shipped models' published sizes and the refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sweep.engine.catalog import load_hardware, load_job
from sweep.errors import SpecError
from sweep.model.candidates import enumerate_calibrated
from sweep.model.cost import calibrated, csa, unmodelled
from sweep.model.cost.flops import csa_keys_per_query, model_flops_per_token
from sweep.model.cost.kernels import flash_attention_s, gemm_s
from sweep.model.job import parse_job
from sweep.model.schema import Recompute
from tests.conftest import calibrated_context, calibrated_step, candidate_block

RAW = {"n_layers": 4, "hidden": 256, "ffn_hidden": 512, "n_heads": 4, "n_kv_heads": 1,
       "head_dim": 128, "vocab": 1024, "seq_len": 512, "global_batch": 8, "mlp": "swiglu",
       "norm": "rmsnorm", "position": "rope", "attention": "csa", "q_lora_rank": 64,
       "qk_rope_head_dim": 32, "o_lora_rank": 64, "o_groups": 2, "sliding_window": 16,
       "csa_layers": 2, "hca_layers": 1, "index_heads": 2, "index_head_dim": 32,
       "index_topk": 8}


def job(**kw):
    return parse_job({**RAW, **kw}, "test.yaml", "t")


ctx, step = calibrated_context, calibrated_step


# ------------------------------------------------------------------------------ by hand

def test_weights_of_a_csa_layer_by_hand():
    j = job()
    e, H, D, ql, ol, g = 256, 4, 128, 64, 64, 2
    # q_a and its norm, q_b, the key-and-value head and its norm, o_a (grouped), o_b, sinks
    assert j.attention_params() == (e * ql + ql + ql * H * D + e * D + D + H * D * ol
                                    + g * ol * e + H)
    # ratio-4 layers: two compressor linears h -> 2 D, the indexer's two h -> 2 x 32, its
    # queries q_lora -> 2 x 32 and head weights h -> 2; the ratio-128 layer two h -> D
    indexer = 2 * e * 2 * 32 + ql * 2 * 32 + e * 2
    assert j.compressor_params() == 2 * (2 * e * 2 * D + indexer) + 2 * e * D
    mlp, norms = 3 * e * 512, 2 * e
    assert j.params_total() == 4 * (j.attention_params() + mlp + norms) \
        + j.compressor_params() + 2 * 1024 * e + e


def test_keys_a_query_sees_by_hand():
    # window 16; ratio 4: top 8 of 512 / 4 entries, 8 (1 - 4 x 8 / 1024) on average; ratio
    # 128: half of 512 / 128 entries
    assert csa_keys_per_query(job()) == (16.0, 16.0 + 8 * (1 - 32 / 1024), 16.0 + 2.0)
    # a top k past the entries there are is every entry
    assert csa_keys_per_query(job(index_topk=1000))[1] == 16.0 + 128 * (1 - 512 / 1024)
    # as executed, the window has fewer keys for the first 16 queries: 16 - 16 x 15 / 1024
    w = 16 - 16 * 15 / 1024
    assert csa_keys_per_query(job(), executed=True) == (w, w + 7.75, w + 2.0)
    x = ctx(job())
    assert x["csa_keys"] == pytest.approx((w + 2 * (w + 7.75) + w + 2.0) / 4)
    assert x["mtp_csa_keys"] == pytest.approx(w)
    # a window past the sequence is the sequence
    assert csa_keys_per_query(job(sliding_window=4096))[0] == 512.0
    assert (x["kv_lora"], x["mla"], x["win_frac"]) == (0.0, 0.0, 0.0)


def test_model_flops_as_megatron_bridge_counts_them():
    # Megatron-Bridge v0.6.0 flop_utils.py L878 - 968: projections (norms counted, sinks
    # not), sparse attention heads x keys x 2 D, compressors, the indexer; 3 x forward
    j = job()
    e, H, D, ql, s, V = 256, 4, 128, 64, 512, 1024
    proj = ql * (e + H * D + 1) + e * D + D + H * D * 64 + 2 * 64 * e
    sparse = H * D * 2 * (1 * 16 + 2 * (16 + 7.75) + 1 * 18)
    compressors = 2 * e * 2 * D * 2 + 1 * e * D * 2
    indexer = 2 * (e * 2 * 32 * 2 + ql * 2 * 32 + e * 2 + 2 * 32 * (s // 4))
    fwd = 2 * 4 * (proj + 3 * e * 512) + 2 * (sparse + compressors + indexer) + 2 * e * V
    assert model_flops_per_token(j) == pytest.approx(3 * fwd, rel=1e-12)
    # an MTP depth adds a window-only layer, its 2 h x h projection and norms, a head
    m = job(mtp_layers=1)
    depth = 2 * (proj + 3 * e * 512) + 2 * H * D * 2 * 16 + 2 * (2 * e * e + 3 * e) + 2 * e * V
    assert model_flops_per_token(m) - model_flops_per_token(j) == pytest.approx(3 * depth)


def test_the_layers_gemms_and_attention_core_by_hand():
    j = job()
    x = ctx(j)
    T, e, H, D = 512.0, 256.0, 4.0, 128.0
    peak, eff = x["peak16_flops_per_s"], x["gemm_eff"] * x["gemm_sustained"]
    ob = x["gemm_operand_bytes"]

    def g(shapes, share=1.0):
        return share * sum(gemm_s(M, N, K, x, peak, eff, operand_bytes=ob)
                           for M, N, K in shapes)

    p = csa.projections(x, T, peak, eff)
    into = g([(T, 64, e), (T, H * D, 64), (T, D, e)]) \
        + g([(T, 2 * D, e)] * 2 + [(T, 64, e)] * 2 + [(T, 64, 64), (T, 2, e)], 0.5) \
        + g([(T, D, e)] * 2, 0.25)
    assert p["in_f"] == pytest.approx(into, rel=1e-12)
    out = gemm_s(T, 64, H * D / 2, x, peak, eff, batch=2, operand_bytes=2.0) \
        + g([(T, e, 2 * 64)])
    assert p["out_f"] == pytest.approx(out, rel=1e-12)
    assert p["up_f"] == pytest.approx(g([(T, H * D, 64)]), rel=1e-12)
    # H heads against the average keys, D wide; the indexer's causal scores on half the
    # layers: 512 queries x 64 entries x 32, for 2 heads
    core = csa.core(x, 1.0, eff)
    keys = x["csa_keys"]
    index = 0.5 * gemm_s(512.0, 64.0, 32.0, x, peak, eff, batch=2.0)
    # 4 heads share a key's 2-byte row: 8 FLOPs a byte forward, against the dense kernel's
    # rate (0.5624 of the peak) over the HBM's
    slow = 1406 / 2500 * peak / (8.0 * x["hbm_Bps"] * x["hbm_eff"])
    assert csa.sparse_slowdown(x)[0] == pytest.approx(slow) and slow > 1
    fused = dict(x, fused_attn=1.0)  # (the fused kernels' efficiency, as every sparse one)
    assert core["f"] == pytest.approx(slow * flash_attention_s(1.0, H, 512.0, keys, D, fused,
                                                               1.0, False) + index, rel=1e-12)
    assert core["flops"] == pytest.approx(4 * H * 512 * keys * D + 0.5 * 2 * 2 * 512 * 64 * 32)


def test_hyper_connections_traffic_and_activations_by_hand():
    plain, hc = job(), job(hc_streams=4)
    xp, xh = ctx(plain), ctx(hc)
    c = candidate_block(1, mbs=1)
    lp, lh = calibrated._layer(xp, c, calibrated._layout(xp, c)), \
        calibrated._layer(xh, c, calibrated._layout(xh, c))
    # fused: each of two modules 4 n + 2 passes of a 256-wide 16-bit activation instead of
    # a plain residual's 3; three kernels each
    T, e = 512.0, 256.0
    extra = 2 * (4 * 4 + 2 - 3) * T * e * 2 / (xp["hbm_Bps"] * xp["hbm_eff"]) \
        + 6 * xp["kernel_s"]
    assert float(lh["memory_f"][0] - lp["memory_f"][0]) == pytest.approx(extra, rel=1e-9)
    # kept: the n streams and the sublayer output per module; a checkpoint is n streams
    for policy, want in ((Recompute.NONE, 2 * 5 * T * e * 2), (Recompute.FULL, 3 * T * e * 2)):
        a = calibrated._activation_bytes_per_layer(xp, T, T, 1.0, False, 1.0, policy)
        b = calibrated._activation_bytes_per_layer(xh, T, T, 1.0, False, 1.0, policy)
        assert float(b - a) == pytest.approx(want)
    # the streams cross pipeline stages; the MTP projection reads the embedding and n streams
    assert step(hc, n=2, pp=2)["step_time_s"][0] > step(plain, n=2, pp=2)["step_time_s"][0]


# ------------------------------------------------------------------------------ properties

@pytest.mark.parametrize("start, change", [
    ({}, {"index_topk": 64}), ({}, {"hca_layers": 2}), ({}, {"sliding_window": 64}),
    ({}, {"hc_streams": 4}), ({"hc_streams": 2}, {"hc_streams": 4}),
    # (8 heads and more: a 2-wide head-weight GEMM is off the tensor cores' alignment)
    ({"index_heads": 8}, {"index_heads": 16})])
def test_more_keys_or_streams_are_never_faster_or_smaller(start, change):
    base, more = job(**start), job(**{**start, **change})
    for config in ({"mbs": 1}, {"mbs": 2, "recompute": Recompute.FULL}):
        a, b = step(base, n=1, **config), step(more, n=1, **config)
        assert b["step_time_s"][0] > a["step_time_s"][0]
        assert b["mem_bytes"][0] >= a["mem_bytes"][0]


def test_a_block_beside_a_csa_row_is_unchanged():
    h100 = load_hardware("H100-SXM")
    dense = calibrated.make_context(load_job("llama3_8b"), h100, h100.calibration)
    other = calibrated.make_context(job(hc_streams=4, mtp_layers=1), h100, h100.calibration)
    for policy in (0, 1, 2):
        c = candidate_block(2, mbs=1)
        c["recompute"] = np.array([policy, policy])
        c["dp"] = np.array([8, 8])
        both = calibrated.evaluate(calibrated.stack_contexts([dense, other]), c)
        for i, x in enumerate((dense, other)):
            alone = calibrated.evaluate(x, {k: v[i:i + 1] for k, v in c.items()})
            for key in ("step_time_s", "mem_bytes", "hardware_flops"):
                assert both[key][i] == alone[key][0], (policy, i, key)


def test_candidates_run_at_tp_1_and_cp_1_without_per_op_recompute():
    flash = load_job("deepseek_v4_flash")
    space = enumerate_calibrated(flash, 64, 72)
    cols = space.columns(0, len(space))
    assert len(space) > 0
    assert set(np.unique(cols["tp"]).tolist()) == {1}
    assert set(np.unique(cols["cp"]).tolist()) == {1}
    assert Recompute.OP_SAC not in set(np.unique(cols["recompute"]).tolist())
    assert "compressed sparse attention (csa) is not modelled" in unmodelled(job(), "nersc2024")


def test_the_op_table_of_deepseek_v4_flash_adds_up():
    j = dataclasses.replace(load_job("deepseek_v4_flash"), dtype="mxfp8")
    hw = load_hardware("GB200-NVL72")
    x = calibrated.make_context(j, hw, hw.calibration)
    c = candidate_block(1, ep=64, mbs=1)
    c["dp"] = np.array([128])
    rows = {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(x, c)}
    assert min(rows["attention core"], rows["attention output projection"],
               rows["QKV projection"], rows["multi-token prediction"]) > 0
    total = float(calibrated.evaluate(x, c)["step_time_s"][0])
    assert sum(rows.values()) == pytest.approx(total, rel=1e-9)


# ------------------------------------------------------------------------------ the jobs

@pytest.mark.parametrize("name, total, active", [
    ("deepseek_v4_flash", 284e9, 13e9), ("deepseek_v4_pro", 1.6e12, 49e9)])
def test_shipped_models_have_their_published_sizes(name, total, active):
    # DeepSeek-V4 model cards: Flash 284B / 13B activated, Pro 1.6T / 49B (the active
    # count without the input embedding)
    j = load_job(name)
    assert j.params_total() == pytest.approx(total, rel=0.02)
    assert j.params_active() - j.vocab * j.hidden == pytest.approx(active, rel=0.03)


@pytest.mark.parametrize("change, key", [
    ({"n_kv_heads": 2}, "n_kv_heads"),
    ({"q_lora_rank": 0}, "q_lora_rank"),
    ({"o_groups": 3}, "o_groups"),
    ({"csa_layers": 4}, "hca_layers"),
    ({"csa_layers": 0}, "index_heads"),
    ({"index_topk": 0}, "index_topk"),
    ({"kv_lora_rank": 8}, "kv_lora_rank"),
    ({"qk_rope_head_dim": 128}, "qk_rope_head_dim"),
    ({"full_attention_every": 2}, "full_attention_every"),
    ({"bias": True}, "bias"),
    ({"attention_kernel": "materialized"}, "attention_kernel"),
    ({"attention": "mha"}, "o_lora_rank"),
    ({"hc_streams": 1}, "hc_streams"),
])
def test_inconsistent_csa_jobs_are_refused_naming_the_key(change, key):
    with pytest.raises(SpecError, match=f"test.yaml: {key}: "):
        job(**change)


def test_hyper_connections_are_refused_in_a_hybrid():
    with pytest.raises(SpecError, match="test.yaml: hc_streams: cannot be set with "
                                        "hybrid_pattern"):
        parse_job({"hybrid_pattern": "*-", "hidden": 256, "ffn_hidden": 512, "n_heads": 4,
                   "seq_len": 512, "global_batch": 8, "hc_streams": 4}, "test.yaml", "t")


def test_sparse_kernels_against_cudnns_benchmarks_on_gb200():
    # cuDNN on GB200, bf16, s = 4096 (NVIDIA/cudnn-frontend benchmark/dsa and
    # sdpa_benchmark_training): dense causal 1406 / 1057 TFLOPS forward / backward; sparse at
    # Flash's shape 829 / 605, at Pro's 1346 / 786. The model's rates (a dense kernel's over
    # its slowdown) stay within -5 % and +35 % of them, Flash slower than Pro
    hw = load_hardware("GB200-NVL72")
    rates = {}
    for name, want in (("deepseek_v4_flash", (829, 605)), ("deepseek_v4_pro", (1346, 786))):
        slow = csa.sparse_slowdown(calibrated.make_context(load_job(name), hw, hw.calibration))
        rates[name] = (1406 / slow[0], 1057 / slow[1])
        for got, measured in zip(rates[name], want):
            assert 0.95 * measured <= got <= 1.35 * measured, (name, got, measured)
    assert rates["deepseek_v4_flash"][0] < rates["deepseek_v4_pro"][0]
    # more HBM bandwidth never slows it; a 16-bit peak twice as high never halves its time
    fast = dataclasses.replace(hw, hbm_bytes_per_s=2 * hw.hbm_bytes_per_s)
    x = calibrated.make_context(load_job("deepseek_v4_flash"), fast, hw.calibration)
    assert csa.sparse_slowdown(x)[0] < 1406 / rates["deepseek_v4_flash"][0]


def test_recompute_mla_up_reruns_q_b_and_keeps_no_queries():
    plain, rc = job(), job(recompute_mla_up=True)
    a, b = step(plain, mbs=1), step(rc, mbs=1)
    # the queries after q_b (H D, 16 bits) are not kept: 512 tokens x 4 x 128 x 2 bytes in
    # each of 4 layers, and in the one layer's gradients live while its backward runs
    assert float(a["mem_activations_bytes"][0] - b["mem_activations_bytes"][0]) == \
        pytest.approx(5 * 512 * 4 * 128 * 2)
    x = ctx(rc)
    peak, eff = x["peak16_flops_per_s"], x["gemm_eff"] * x["gemm_sustained"]
    q_b = gemm_s(512.0, 512.0, 64.0, x, peak, eff, operand_bytes=x["gemm_operand_bytes"])
    assert float(b["step_time_s"][0] - a["step_time_s"][0]) == pytest.approx(
        8 * 4 * q_b, rel=1e-6)  # (8 micro-batches, 4 layers)


def test_the_mtp_depth_of_a_csa_job_attends_to_its_window_alone():
    # Megatron-Bridge appends compress ratio 0 for the MTP layer: no compressor or indexer,
    # the window's keys; the depth costs less than a main layer with compressed entries
    j = job(mtp_layers=1, csa_layers=3, hca_layers=1)
    x = ctx(j)
    c = candidate_block(1, mbs=1)
    lay = calibrated._layer_terms(x, c)
    depth = {k[len(calibrated.MTP_PREFIX):]: v for k, v in lay.items()
             if k.startswith(calibrated.MTP_PREFIX)}
    assert depth and float(depth["attn_f"][0]) < float(lay["attn_f"][0])
    window = calibrated._layer(dict(x, csa_frac=0.0, hca_frac=0.0, csa_keys=x["mtp_csa_keys"]),
                               c, calibrated._layout(x, c))
    assert float(depth["fwd"][0]) == pytest.approx(float(window["fwd"][0]), rel=1e-12)

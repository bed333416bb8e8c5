"""DeepSeek sparse attention (MLA with an indexer: DeepSeek-V3.2, GLM-5): the indexer's
weights, the keys a query attends to, the model FLOPs as Megatron-Bridge counts them, the
layer's indexer GEMMs, sparse kernels and context-parallel all-gather by hand; properties (a
larger top k or indexer is never faster; a DSA row beside a dense one leaves it unchanged;
at 128K tokens DSA beats the same model's dense MLA); the candidate space (CP all-gathers);
the shipped models' sizes and the refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sweep.analysis.predict import predict
from sweep.engine.catalog import load_hardware, load_job
from sweep.errors import SpecError, SweepError
from sweep.model.candidates import enumerate_calibrated
from sweep.model.cost import calibrated, dsa
from sweep.model.cost.flops import dsa_keys_per_query, model_flops_per_token
from sweep.model.cost.kernels import collective_s, gemm_s
from sweep.model.job import parse_job
from sweep.model.schema import Recompute
from tests.conftest import calibrated_context, calibrated_step, candidate_block

RAW = {"n_layers": 4, "hidden": 256, "ffn_hidden": 512, "n_heads": 4, "n_kv_heads": 4,
       "head_dim": 48, "vocab": 1024, "seq_len": 512, "global_batch": 8, "mlp": "swiglu",
       "norm": "rmsnorm", "position": "rope", "attention": "mla", "q_lora_rank": 64,
       "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
       "index_heads": 2, "index_head_dim": 32, "index_topk": 128}
NO_INDEXER = {"index_heads": 0, "index_head_dim": 0, "index_topk": 0}


def job(**kw):
    return parse_job({**RAW, **kw}, "test.yaml", "t")


ctx, step = calibrated_context, calibrated_step


# ------------------------------------------------------------------------------ by hand

def test_the_indexers_weights_by_hand():
    j, mla = job(), job(**NO_INDEXER)
    # linear_wq_b q_lora -> 2 x 32, linear_wk h -> 32 and its LayerNorm, weights h -> 2
    assert j.dsa and not mla.dsa
    assert j.indexer_params() == 64 * 2 * 32 + 256 * 32 + 2 * 32 + 256 * 2
    assert j.attention_params() == mla.attention_params()
    assert j.params_total() - mla.params_total() == j.compressor_params() \
        == 4 * j.indexer_params()


def test_keys_a_query_attends_to_by_hand():
    # min(128, p) over p = 1 .. 512: 128 x 129 / 2 + 384 x 128, over 512 queries
    assert dsa_keys_per_query(job()) == pytest.approx((128 * 129 / 2 + 384 * 128) / 512)
    # a top k past the sequence: every earlier token, (s + 1) / 2 on average
    assert dsa_keys_per_query(job(index_topk=4096)) == 256.5
    # the stored top-k list: min(k, s) padded to 512 entries
    assert dsa.topk_width(128, 512) == 512.0 and dsa.topk_width(2048, 131072) == 2048.0
    assert dsa.topk_width(600, 131072) == 1024.0


def test_model_flops_as_megatron_bridge_counts_dsa():
    # Megatron-Bridge main 52fc01b (PR #5324) flop_utils.py "dsa": the dense MLA count less
    # its causal core, plus per layer: absorbed attention over the chosen keys (QK 32 + 16,
    # PV 32), the indexer's projections forward and weight gradient, its scores over every
    # earlier token forward ((s + 1) / 2) and over the chosen keys backward, the loss's
    # target logits
    j, mla = job(), job(**NO_INDEXER)
    keys, dense = (128 * 129 / 2 + 384 * 128) / 512, 513 / 2
    core_mla = 2 * 256 * 4 * (48 + 32)  # (the dense causal core: s / 2 keys, QK 48, V 32)
    per_layer = 6 * keys * 4 * (48 + 32) + 4 * (64 * 64 + 256 * 32 + 256 * 2) \
        + 2 * dense * 2 * 33 + 4 * keys * 2 * 33 + 2 * keys * 4 * 48
    assert model_flops_per_token(j) == pytest.approx(
        model_flops_per_token(mla) + 4 * (per_layer - 3 * core_mla), rel=1e-12)
    # forward only: attention and projections once, scores forward, no loss
    fwd_layer = 2 * keys * 4 * (48 + 32) + 2 * (64 * 64 + 256 * 32 + 256 * 2) \
        + 2 * dense * 2 * 33
    assert model_flops_per_token(j, training=False) == pytest.approx(
        model_flops_per_token(mla, training=False) + 4 * (fwd_layer - core_mla), rel=1e-12)


def test_the_indexer_gemms_and_sparse_kernels_by_hand():
    j = job()
    x = ctx(j)
    T, e = 512.0, 256.0
    peak, eff = x["peak16_flops_per_s"], x["gemm_eff"] * x["gemm_sustained"]
    ob = x["gemm_operand_bytes"]
    shapes = [(T, 64.0, 64.0), (T, 32.0, e), (T, 2.0, e)]
    f, b, flops = dsa.projections(x, T, peak, eff)
    assert f == pytest.approx(sum(gemm_s(M, N, K, x, peak, eff, operand_bytes=ob)
                                  for M, N, K in shapes), rel=1e-12)
    # backward: the weight gradients alone (the inputs are detached)
    assert b == pytest.approx(sum(gemm_s(K, N, M, x, peak, eff, operand_bytes=ob)
                                  for M, N, K in shapes), rel=1e-12)
    assert flops == 2 * T * (64 * 64 + 32 * e + 2 * e)
    # 4 heads padded to 64; QK 32 + 16 wide, PV 32, over the mean keys: the longer of the
    # FLOPs at a dense kernel's fraction of the peak (backward a sparse one's) and the key
    # rows (48 x 2 bytes) gathered 1.01 times forward, 3.97 times backward, at the HBM's
    # nominal rate
    keys = x["dsa_keys"]
    frac_f, frac_b = 1406 / 2500, 786 / 2500
    reads_f, reads_b = 9.784e-3 * 8e12 / (32768 * 2048 * 1152), 38.307e-3 * 8e12 / (
        32768 * 2048 * 1152)
    per_head = 2 * 512 * keys * (48 + 32)
    rows = 512 * keys * 48 * 2 / x["hbm_Bps"]
    core = dsa.core(x, 1.0, 4.0, 512.0, eff)
    attn_f = max(64 * per_head / (peak * frac_f), reads_f * rows) + x["kernel_s"]
    target = max(64 * 2 * 512 * keys * 48 / (peak * frac_f), reads_f * rows) + x["kernel_s"]
    # the scores summed over the heads on chip (no per-head output: the one fp32 matrix is
    # elementwise traffic); the indexer backward over the whole padded list (512 entries)
    # at 64 heads (cuDNN pads them), writing no [queries x keys] matrix
    scores = gemm_s(512.0, 256.0, 32.0, x, peak, eff, batch=2.0, out_bytes=0.0)
    index_b = 3 * gemm_s(512.0, 512.0, 32.0, x, peak, eff, batch=64.0, out_bytes=0.0)
    assert core["attn_f"] == pytest.approx(attn_f, rel=1e-12)
    assert core["f"] == pytest.approx(attn_f + target + scores + index_b, rel=1e-12)
    assert core["b"] == pytest.approx(max(2.5 * 64 * per_head / (peak * frac_b),
                                          reads_b * rows) + x["kernel_s"], rel=1e-12)
    assert core["flops"] == pytest.approx(4 * per_head + 2 * 512 * 2 * 32 * 256
                                          + 6 * 512 * 2 * 32 * keys + 2 * 4 * 512 * keys * 48)
    # a forward-only job computes no loss: no target logits, no indexer backward
    fwd_only = dsa.core(dict(x, training=0.0), 1.0, 4.0, 512.0, eff)
    assert fwd_only["f"] == pytest.approx(attn_f + scores, rel=1e-12)


def test_context_parallelism_all_gathers_the_latent_and_indexer_keys():
    j = job()
    x = ctx(j)
    c = candidate_block(1, cp=2, mbs=1, cp_comm=1)
    lay = calibrated._layer(x, c, calibrated._layout(x, c))
    # one latent row (32 + 16) and one indexer key (32) a token, 16 bits, the whole sequence
    assert float(lay["kv_gathered"][0]) == 512 * (32 + 16 + 32) * 2
    # the queries are split: about half the indexer scores and sparse attention per rank
    # (plus each kernel's fixed launch time)
    x = ctx(job(seq_len=16384))
    one, two = (calibrated._layer(x, c, calibrated._layout(x, c)) for c in (
        candidate_block(1, mbs=1), candidate_block(1, cp=2, mbs=1, cp_comm=1)))
    assert 0.45 < float(two["attn_f"][0]) / float(one["attn_f"][0]) < 0.6


def _layer(j, hw="H100-SXM", **config):
    x = ctx(j, hw)
    c = candidate_block(1, **config)
    return x, calibrated._layer(x, c, calibrated._layout(x, c))


def test_activations_absorbed_mla_keeps_by_hand():
    # absorbed MLA keeps no per-head keys or values: the queries after q_b (H x 48), the
    # absorbed ones (H x 48 of 32 + 16), the compressed query (64), the latent key (32 + 16)
    # and the latent output (H x 32); the core attention's own: the gathered key row and
    # indexer key (2 x 256 tokens x (48 + 32)), the top-k lists (512 entries x 4 bytes) and
    # the indexer's query and weight gradients (2 x 32 + 2) a local token
    x, xm = ctx(job()), ctx(job(**NO_INDEXER))
    T, ab = 256.0, 2.0
    qkv = T * (4 * (48 + 32 + 16) + 64 + 4 * 32) * ab + T * (32 + 16) * ab
    qkv_mla = T * 4 * (2 * 48 + 32) * ab + T * (64 + 32 + 16) * ab
    core = 2 * T * (32 + 16 + 32) * ab + T * (512 * 4 + (2 * 32 + 2) * ab)

    def kept(xx, policy):
        return float(calibrated._activation_bytes_per_layer(xx, T, T, 1.0, False, 2.0, policy))
    assert kept(x, Recompute.NONE) - kept(xm, Recompute.NONE) == pytest.approx(
        qkv - qkv_mla + core)
    # selective recompute re-runs the core attention: its own tensors are not kept
    assert kept(x, Recompute.SELECTIVE) == pytest.approx(kept(x, Recompute.NONE) - core)
    # recompute_mla_up drops both query tensors
    assert kept(x, Recompute.NONE) - kept(ctx(job(recompute_mla_up=True)), Recompute.NONE) \
        == pytest.approx(T * 4 * (48 + 32 + 16) * ab)


def test_the_backward_reads_no_scores_and_cp_reduce_scatters_alone():
    # the fp32 scores and top-k lists are forward traffic: the elementwise backward is MLA's
    (x, dsa_lay), (_, mla_lay) = (_layer(j, cp=2, mbs=1, cp_comm=1)
                                  for j in (job(), job(**NO_INDEXER)))
    assert float(dsa_lay["memory_b"][0]) == float(mla_lay["memory_b"][0])
    assert float(dsa_lay["memory_f"][0]) > float(mla_lay["memory_f"][0])
    # the gathered keys are kept: forward one all-gather, backward one reduce-scatter
    kv = 512 * (32 + 16 + 32) * 2.0
    assert float(dsa_lay["cp_f"][0]) == pytest.approx(float(collective_s(
        "allgather", kv, 2.0, 2.0, x)))
    assert float(dsa_lay["cp_b"][0]) == pytest.approx(float(collective_s(
        "reducescatter", kv, 2.0, 2.0, x)))


def test_tensor_parallelism_gathers_the_indexers_inputs_and_reduces_its_target():
    # under TP 2 (sequence parallel) the indexer all-gathers the attention input and the
    # compressed query of the 512 tokens, and the loss target (512 x 512 fp32) is all-reduced
    (x, dsa_lay), (_, mla_lay) = (_layer(j, tp=2, sp=1, mbs=1)
                                  for j in (job(), job(**NO_INDEXER)))
    extra = collective_s("allgather", 512 * (256 + 64) * 2.0, 2.0, 2.0, x) \
        + collective_s("allreduce", 512 * 512 * 4.0, 2.0, 2.0, x)
    assert float(dsa_lay["tp_f"][0] - mla_lay["tp_f"][0]) == pytest.approx(float(extra))
    # and the candidates at TP > 1 are all sequence parallel
    space = enumerate_calibrated(job(), 4, 8)
    cols = space.columns(0, len(space))
    assert (cols["sp"][cols["tp"] > 1] == 1).all()


def test_absorption_einsums_run_in_16_bits_and_recompute_reruns_the_key_part():
    j = job(dtype="fp8")
    x = ctx(j)
    T = 512.0
    peak, eff = calibrated._gemm_rate(x)
    fwd, _, _, up = calibrated._mla_projections(x, T, T, 1.0, peak, eff)
    ob, p16 = x["gemm_operand_bytes"], x["peak16_flops_per_s"]
    plain = [gemm_s(T, 64.0, 256.0, x, peak, eff, operand_bytes=ob),
             gemm_s(T, 4 * 48.0, 64.0, x, peak, eff, operand_bytes=ob),
             gemm_s(T, 48.0, 256.0, x, peak, eff, operand_bytes=ob)]
    absorb = gemm_s(T, 4 * (32.0 + 32.0), 32.0, x, p16, eff, operand_bytes=2.0)
    assert float(fwd) == pytest.approx(float(sum(plain) + absorb), rel=1e-12)
    # recompute_mla_up: q_b and the key absorption (4 x 32 of the 4 x 64), not the value's
    assert float(up) == pytest.approx(float(plain[1] + gemm_s(
        T, 4 * 32.0, 32.0, x, p16, eff, operand_bytes=2.0)), rel=1e-12)


def test_index_share_counts_glm52s_computing_layers():
    # GLM-5.2 (index_topk_freq 4, offset 3): layers 1, 2, 3 and every 4th from 7 compute
    # their top-k, 21 of 78; the MTP layer, numbered apart, computes its own
    glm52 = dataclasses.replace(load_job("glm5"), index_topk_freq=4, index_skip_topk_offset=3)
    assert glm52.indexer_layers() == 21 and glm52.indexer_layers(1) == 1
    assert glm52.indexer_share == pytest.approx(22 / 79)
    assert glm52.compressor_params() == 21 * glm52.indexer_params()
    assert load_job("glm5").indexer_layers() == 78
    # Megatron-Bridge counts the indexer's FLOPs on the computing layers alone
    glm5 = load_job("glm5")
    per_layer = model_flops_per_token(glm5) - model_flops_per_token(glm52)
    assert per_layer > 0
    drop = model_flops_per_token(glm5, training=False) - model_flops_per_token(
        glm52, training=False)
    s, ih, idim = 131072, 32, 128
    forward_indexer = 2 * (2048 * ih * idim + 6144 * idim + 6144 * ih) \
        + 2 * (s + 1) / 2 * ih * (idim + 1)
    assert drop == pytest.approx((79 - 22) * forward_indexer, rel=1e-12)


def test_index_share_and_a_disabled_loss_cost_less_by_hand():
    shared, plain = job(index_topk_freq=2), job()
    xs, xp = ctx(shared), ctx(plain)
    eff = xp["gemm_eff"] * xp["gemm_sustained"]
    # layers 1 and 3 of 4 compute their top-k (offset 0 counts from layer 1)
    assert shared.indexer_layers() == 2 and xs["idx_share"] == 0.5
    a, b = dsa.core(xp, 1.0, 4.0, 512.0, eff), dsa.core(xs, 1.0, 4.0, 512.0, eff)
    # a computing layer runs the indexer, the loss and the sparse forward once more (for
    # the loss's LSE); a layer reusing a top-k runs neither
    attn = a["attn_f"]
    assert b["f"] == pytest.approx(attn + 0.5 * (a["f"] - attn + attn), rel=1e-12)
    f = dsa.projections(xp, 512.0, xp["peak16_flops_per_s"], eff)[0]
    assert dsa.projections(xs, 512.0, xp["peak16_flops_per_s"], eff)[0] == \
        pytest.approx(0.5 * f, rel=1e-12)
    # without the loss: no target, no indexer backward, no projection gradients, nothing
    # of the loss kept
    off = ctx(job(index_loss=False))
    c = dsa.core(off, 1.0, 4.0, 512.0, eff)
    scores = gemm_s(512.0, 256.0, 32.0, xp, xp["peak16_flops_per_s"], eff, batch=2.0,
                    out_bytes=0.0)
    assert c["f"] == pytest.approx(attn + scores, rel=1e-12)
    assert dsa.projections(off, 512.0, xp["peak16_flops_per_s"], eff)[1] == 0.0
    # every layer keeps its own top-k list (IndexShare's too); the indexer's gradients only
    # on the computing layers, and only with the loss
    T, grads = 256.0, 256.0 * (2 * 32 + 2 * 32 + 2) * 2.0
    kept = [dsa.saved_bytes(xx, T, T, 1.0, 2.0)["core"] for xx in (xp, xs, off)]
    assert kept[0] - kept[1] == pytest.approx(0.5 * grads)
    assert kept[0] - kept[2] == pytest.approx(grads)
    # an untrained indexer's key is gathered under no_grad: no gradient reduce-scattered
    lay = calibrated._layer(off, candidate_block(1, cp=2, mbs=1, cp_comm=1), calibrated._layout(
        off, candidate_block(1, cp=2, mbs=1, cp_comm=1)))
    assert float(lay["cp_b"][0]) == pytest.approx(float(collective_s(
        "reducescatter", 512 * (32 + 16) * 2.0, 2.0, 2.0, off)))
    for config in ({"mbs": 1}, {"mbs": 1, "cp": 2, "cp_comm": 1}):
        on, no, sh = (step(j, n=2, **config) for j in (plain, job(index_loss=False), shared))
        assert no["step_time_s"][0] < on["step_time_s"][0]
        assert no["mem_bytes"][0] < on["mem_bytes"][0]
        assert sh["mem_bytes"][0] < on["mem_bytes"][0]


def test_gpus_before_hopper_and_fp32_are_refused():
    hw = load_hardware("A100-80GB")
    with pytest.raises(SweepError, match="fused kernels need Hopper or newer"):
        predict("calibrated", job(), hw, "1d", 1, {})
    with pytest.raises(SweepError, match="fused kernels are 16-bit"):
        predict("calibrated", job(dtype="fp32"), load_hardware("H100-SXM"), "1d", 1, {})
    assert calibrated.unsupported_job_precision(job(), load_hardware("H100-SXM")) is None


def test_candidates_all_gather_under_context_parallelism_without_per_op_recompute():
    space = enumerate_calibrated(job(), 4, 8)
    cols = space.columns(0, len(space))
    split = cols["cp"] > 1
    assert split.any() and (cols["cp_comm"][split] == 1).all()
    assert Recompute.OP_SAC not in set(np.unique(cols["recompute"]).tolist())
    other = enumerate_calibrated(job(**NO_INDEXER), 4, 8)
    plain = other.columns(0, len(other))
    assert (plain["cp_comm"][plain["cp"] > 1] == 0).any()
    hw = load_hardware("H100-SXM")
    with pytest.raises(SweepError, match="all-gathers its keys"):
        predict("calibrated", job(), hw, "1d", 4, {"cp": 2, "cp_comm": 0})


# ------------------------------------------------------------------------------ properties

# (8 indexer heads and more: a 2-wide head-weight GEMM is off the tensor cores' alignment)
@pytest.mark.parametrize("change", [{"index_topk": 256}, {"index_heads": 16},
                                    {"index_head_dim": 64}])
def test_a_larger_top_k_or_indexer_is_never_faster_or_smaller(change):
    base, more = job(index_heads=8), job(**{"index_heads": 8, **change})
    for config in ({"mbs": 1}, {"mbs": 2, "recompute": 2}, {"cp": 2, "cp_comm": 1}):
        a, b = step(base, n=2, **config), step(more, n=2, **config)
        assert b["step_time_s"][0] > a["step_time_s"][0], (change, config)
        assert b["mem_bytes"][0] >= a["mem_bytes"][0], (change, config)


def test_a_block_beside_a_dsa_row_is_unchanged():
    h100 = load_hardware("H100-SXM")
    dense = calibrated.make_context(load_job("deepseek_v3"), h100, h100.calibration)
    other = calibrated.make_context(load_job("deepseek_v32"), h100, h100.calibration)
    c = candidate_block(2, mbs=1, cp=2, cp_comm=1, ep=8)
    c["dp"] = np.array([4, 4])
    both = calibrated.evaluate(calibrated.stack_contexts([dense, other]), c)
    for i, x in enumerate((dense, other)):
        alone = calibrated.evaluate(x, {k: v[i:i + 1] for k, v in c.items()})
        for key in ("step_time_s", "mem_bytes", "hardware_flops"):
            assert both[key][i] == alone[key][0], (i, key)


def test_at_128k_tokens_dsa_beats_dense_mla_and_not_at_4k():
    glm = load_job("glm5")
    sparse = glm
    dense = dataclasses.replace(glm, **NO_INDEXER)
    config = {"mbs": 1, "cp": 32, "cp_comm": 1, "pp": 4, "ep": 32, "recompute": 2}
    long = [float(step(j, "GB200-NVL72", 128, **config)["step_time_s"][0])
            for j in (sparse, dense)]
    assert long[0] < 0.5 * long[1]
    # at 4K the indexer costs more than the keys it saves (2048 of 2048 on average)
    short = [float(step(dataclasses.replace(j, seq_len=4096), "GB200-NVL72", 128,
                        **{**config, "cp": 1})["step_time_s"][0]) for j in (sparse, dense)]
    assert short[0] > short[1]


def test_the_op_table_of_glm5_adds_up():
    hw = load_hardware("GB200-NVL72")
    x = calibrated.make_context(load_job("glm5"), hw, hw.calibration)
    c = candidate_block(1, cp=32, cp_comm=1, pp=6, ep=32, mbs=1, recompute=2)
    rows = {r["name"]: float(r["time_s"][0]) for r in calibrated.op_table(x, c)}
    assert min(rows["attention core"], rows["CP communication (exposed)"],
               rows["multi-token prediction"], rows["DSA indexer: scores, top-k, loss"]) > 0
    total = float(calibrated.evaluate(x, c)["step_time_s"][0])
    assert sum(rows.values()) == pytest.approx(total, rel=1e-9)


# ------------------------------------------------------------------------------ benchmarks

def test_sparse_kernels_against_cudnn_and_flashmla_benchmarks():
    # cuDNN's DSA benchmark at GLM-5's shape (64 heads, QK 576, PV 512, every query gathering
    # 2048 keys) on GB200, bound by the row gathers: fitted at s = 32K (9.784 ms forward,
    # 38.307 ms backward); at s = 4096 (1.138 / 4.423 ms) the model is 8 % slow
    def kernels(name, hw, heads, s, **change):
        h = load_hardware(hw)
        h = dataclasses.replace(h, **change) if change else h
        x = dict(calibrated.make_context(load_job(name), h, h.calibration), kernel_s=0.0)
        return dsa.sparse_kernels_s(x, float(s), 2048.0, heads)
    fwd, bwd, _ = kernels("glm5", "GB200-NVL72", 64.0, 32768)
    assert float(fwd) == pytest.approx(9.784e-3, rel=1e-9)
    assert float(bwd) == pytest.approx(38.307e-3, rel=1e-9)
    fwd, bwd, _ = kernels("glm5", "GB200-NVL72", 64.0, 4096)
    assert 1.138e-3 < fwd < 1.1 * 1.138e-3 and 4.423e-3 < bwd < 1.1 * 4.423e-3
    # not fitted: GB300 (1.076 / 4.406 ms at 4K), cuDNN's backward on H200 (7.992 ms at 4K),
    # FlashMLA's forward at DeepSeek-V3.2's 128 heads on H800 (up to 640 TFLOPS; the H100
    # SXM's peak and HBM): within 20 %
    fwd, bwd, _ = kernels("glm5", "GB300-NVL72", 64.0, 4096)
    assert fwd == pytest.approx(1.076e-3, rel=0.2) and bwd == pytest.approx(4.406e-3, rel=0.2)
    assert kernels("glm5", "H200", 64.0, 4096)[1] == pytest.approx(7.992e-3, rel=0.2)
    flops = 2 * 4096 * 2048 * (576 + 512)
    fwd_h800 = kernels("deepseek_v32", "H100-SXM", 128.0, 4096)[0]
    assert 128 * flops / fwd_h800 == pytest.approx(640e12, rel=0.2)
    # more HBM bandwidth: the gather-bound 64-head kernels faster, the 128-head forward not
    base = kernels("glm5", "GB200-NVL72", 64.0, 4096)
    fast = kernels("glm5", "GB200-NVL72", 64.0, 4096, hbm_bytes_per_s=16e12)
    assert fast[0] < base[0] and fast[1] < base[1]
    v32 = kernels("deepseek_v32", "GB200-NVL72", 128.0, 4096)
    assert kernels("deepseek_v32", "GB200-NVL72", 128.0, 4096,
                   hbm_bytes_per_s=16e12)[0] == v32[0]


def test_index_share_stages_hold_whole_sharing_groups():
    # GLM-5.2 (78 layers, groups of 4 after layers 1 - 3): the smallest possible busiest
    # stage, by brute force over contiguous partitions of the sharing groups, is the
    # closed form's at every pp
    glm52 = dataclasses.replace(load_job("glm5"), index_topk_freq=4, index_skip_topk_offset=3)
    starts = [n for n in range(1, 79) if glm52.indexer_layers(n) > glm52.indexer_layers(n - 1)]
    groups = [b - a for a, b in zip(starts, starts[1:] + [79])]

    def fits(capacity, pp):
        stages, load = 1, 0
        for g in groups:
            if load + g > capacity:
                stages, load = stages + 1, 0
            load += g
        return stages <= pp
    for pp in range(2, 14):
        best = min(c for c in range(max(groups), 79) if fits(c, pp))
        assert dsa.busiest_stage_layers(78, 4, pp) == best, pp
    # the model's stage: at pp 6 the busiest holds 16 layers, not 13: a longer step than
    # the even split's (the same job without IndexShare's stage rule: index_topk_freq 1
    # costs its indexers on every layer, so compare against the 13-layer stage directly)
    x = calibrated_context(glm52, "GB200-NVL72")
    c = candidate_block(1, pp=6, ep=32, mbs=1)
    c["dp"] = np.array([32])
    out = calibrated.evaluate(x, c)
    even = calibrated.evaluate(dict(x, idx_group=1.0), c)
    assert out["step_time_s"][0] > even["step_time_s"][0]


# ------------------------------------------------------------------------------ the jobs

def test_shipped_models_have_their_published_sizes():
    # GLM-5.2's export: 743,377,000,704 parameters (Megatron-Bridge glm5-2 card); DeepSeek-
    # V3.2 is DeepSeek-V3 plus an indexer in each of its 61 layers
    assert load_job("glm5").params_total() == pytest.approx(743_377_000_704, rel=0.002)
    v3, v32 = load_job("deepseek_v3"), load_job("deepseek_v32")
    assert v32.params_total() - v3.params_total() == 61 * v32.indexer_params()
    assert v32.indexer_params() == 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64


@pytest.mark.parametrize("change, key", [
    ({"index_heads": 0}, "index_heads"),
    ({"index_topk": 0}, "index_topk"),
    ({"q_lora_rank": 0}, "q_lora_rank"),
    ({"index_head_dim": 8}, "index_head_dim"),
    ({"sliding_window": 64}, "sliding_window"),
    ({"attention_kernel": "materialized"}, "attention_kernel"),
    ({"attention": "mha", "q_lora_rank": 0, "kv_lora_rank": 0, "qk_nope_head_dim": 0,
      "qk_rope_head_dim": 0, "v_head_dim": 0}, "index_heads"),
    ({"o_groups": 2}, "o_groups"),
    ({"causal": False}, "causal"),
    ({"bias": True}, "bias"),
    ({"dtype": "fp8", "recompute_mla_up": True}, "recompute_mla_up"),
    ({"index_topk_freq": 0}, "index_topk_freq"),
    ({**NO_INDEXER, "index_topk_freq": 4}, "index_topk_freq"),
    ({**NO_INDEXER, "index_loss": False}, "index_loss"),
    ({**NO_INDEXER, "index_skip_topk_offset": 3}, "index_skip_topk_offset"),
])
def test_inconsistent_dsa_jobs_are_refused_naming_the_key(change, key):
    with pytest.raises(SpecError, match=f"test.yaml: {key}: "):
        job(**change)

"""The measured-data contract (sweep.analysis.measured): labels as other teams write them, both
shipped layouts, and the rows it refuses with their reasons."""

from __future__ import annotations

import csv
import json
from collections import Counter

import pytest

from sweep.analysis.express import express, express_all
from sweep.analysis.measured import (
    DEFAULT_DATA,
    MOE,
    PRECISIONS,
    SHIPPED,
    Refusal,
    Run,
    data_paths,
    flops_of,
    framework_of,
    match_gpu,
    parse_run,
    precision_of,
    read_data,
    read_runs,
    sharding_of,
)
from sweep.cli import main
from sweep.engine.catalog import load_job
from sweep.errors import SweepError
from sweep.model.candidates import last_stage_layers
from sweep.model.cost.calibrated import optimizer_bytes
from sweep.model.schema import Recompute


@pytest.fixture(scope="module")
def dense():
    return {r["id"]: r for r in read_runs(DEFAULT_DATA)}


@pytest.fixture(scope="module")
def moe():
    return {r["id"]: r for r in read_runs(SHIPPED[1])}


def _write(path, rows):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return read_runs(path)


def test_product_names_and_free_text_labels_are_accepted(tmp_path, dense):
    base = dense["nemo2407_LLAMA3-70B_64"]  # NeMo, H100, fp8, tokens/s
    rows = [
        dict(base, id="eos", gpu="H100-SXM5-80GB (DGX H100, Eos)",
             framework="NeMo 25.11 / Megatron-Bridge"),
        dict(base, id="b200", gpu="B200-180GB", precision="BF16"),
        dict(base, id="nvl72", gpu="GB200 NVL72", precision="FP8-CS", tokens_per_s_per_gpu="",
             tflops_per_gpu="1500", tflops_definition="model FLOPs (MFU)"),
        dict(base, id="gb300", gpu="DGX-GB300", framework="Megatron-Bridge (Megatron-Core)",
             precision="fp16 mixed"),
        dict(base, id="b300", gpu="B300", precision="FP8-CS (inferred)"),
    ]
    cases, refused = express_all(_write(tmp_path / "theirs.csv", rows))
    assert not refused
    got = {c.row["id"]: (c.hw.name, c.job.dtype) for c in cases}
    assert got == {"eos": ("H100-SXM", "fp8"), "b200": ("B200", "bf16"),
                   "nvl72": ("GB200-NVL72", "fp8"), "gb300": ("GB300-NVL72", "fp16"),
                   "b300": ("B300", "fp8")}
    nvl72 = next(c for c in cases if c.row["id"] == "nvl72")
    assert nvl72.metric == "tflops_per_gpu" and nvl72.flops > 0  # model FLOPs, its formula


def test_labels_map_to_enumerated_values():
    assert match_gpu("H100-SXM5-80GB (DGX H100, Eos)") == "H100-SXM"
    assert match_gpu("H100-SXM 96GB HBM2e (500W)") == "H100-96GB-500W"
    assert match_gpu("A100-SXM4-40GB") == "A100-40GB" and match_gpu("H200-SXM-141GB") == "H200"
    assert match_gpu("GB200") == "GB200-NVL72" and match_gpu("DGX-GB300") == "GB300-NVL72"
    assert match_gpu("nersc-B200") == "nersc-B200"  # a catalog name is itself
    assert "ambiguous: A100-40GB or A100-80GB" in str(match_gpu("A100"))
    assert "no V100 with 16 GB" in str(match_gpu("V100-SXM2-16GB"))
    assert isinstance(match_gpu("B200", "1 node, 8x B200 (power limited)"), Refusal)
    assert [precision_of(p) for p in ("FP8-CS", "FP8-MX", "fp16 mixed", "BF16", "NVFP4",
                                      "float8 tensorwise", "fp8 (TE delayed scaling) + bf16",
                                      "FP8 blockwise 128x128", "fp16/bf16 mixed")] == [
        "fp8-current", "mxfp8", "fp16", "bf16", "nvfp4", "fp8-tensorwise", "fp8-delayed",
        "fp8-blockwise", "fp16"]
    assert flops_of("model FLOPs (MFU)") == "model" and flops_of("eq3") == "hardware-eq3"
    assert flops_of("Megatron-Bridge model FLOPs: causal attention (seq/2)") == "model-causal"
    assert framework_of("NeMo 25.11 / Megatron-Bridge") == "nemo"
    assert framework_of("TorchTitan + TorchAO") == "torchtitan"
    assert sharding_of("", "0", 8) == (1, 0, False)  # Megatron-Bridge FSDP 0: unstated
    assert sharding_of("", "64", 8) == (3, 64, True)
    assert sharding_of("", "FSDP2 (8)", 8) == (3, 8, True)


def test_torchao_float8_recipes_are_read_as_their_scaling(dense):
    """torchtitan's float8 rows: tensorwise is dynamic per-tensor (current) scaling, rowwise
    its own recipe; neither fuses the cast into the norm (a torchao stack)."""
    tensorwise = express(dense["tt25_async_8B_float8tensorwise_vanillaTP"]).job
    rowwise = express(dense["tt25_async_8B_float8rowwise_vanillaTP"]).job
    assert (tensorwise.fp8_scaling, rowwise.fp8_scaling) == ("current", "rowwise")
    assert not tensorwise.lp_norm_cast and not rowwise.lp_norm_cast


def test_bad_labels_are_refused_with_the_nearest_accepted_values(tmp_path, dense):
    base = dense["nemo2407_LLAMA3-70B_64"]
    bad = {"gpu": ("H10O-SXM", "H100-SXM"), "framework": ("Megatron-Brige", "Megatron-Bridge"),
           "precision": ("bf-16", "bf16"), "zero_fsdp": ("zero-three", "zero-3")}
    rows = [dict(base, id=f"bad_{k}", **{k: v}) for k, (v, _) in bad.items()]
    rows.append(dict(base, id="bad_flops", tokens_per_s_per_gpu="", tflops_per_gpu="700",
                     tflops_definition="modle"))
    rows.append(dict(base, id="bad_model", model="Lama3-70B", n_layers="", hidden="",
                     ffn_hidden="", n_heads=""))
    _, refused = express_all(_write(tmp_path / "typos.csv", rows))
    why = {u["id"]: u["reason"] for u in refused}
    assert set(why) == {r["id"] for r in rows}
    for k, (value, near) in bad.items():
        assert repr(value) in why[f"bad_{k}"] and f"nearest: {near}" in why[f"bad_{k}"], k
    assert "'modle' is not recognised (nearest: model" in why["bad_flops"]
    assert "'Lama3-70B' is not in jobs/ (nearest: llama3_70b" in why["bad_model"]


def test_both_shipped_files_load_through_one_contract():
    rows = read_data(SHIPPED)
    runs = [parse_run(r) for r in rows]
    assert len(rows) == 271 + 268
    assert all(isinstance(r, (Run, Refusal)) for r in runs)
    dense_runs = [r for r, row in zip(runs, rows) if row["data_file"] == DEFAULT_DATA.name]
    # all but the two without a global batch (express_all borrows a sibling's)
    assert [str(r) for r in dense_runs if isinstance(r, Refusal)] == \
        ["global_batch_seqs unknown"] * 2
    # the MoE/Blackwell layout reads into the same columns: step_time_s is iter_time_s
    sm = next(r for r, row in zip(runs, rows) if row["id"] == "sm_001")
    assert sm.values["iter_time_s"] == "0.843" and sm.model.name == "llama3_70b"
    assert data_paths("all") == list(SHIPPED)
    assert data_paths("measured_moe_blackwell") == [SHIPPED[1]]


def test_every_moe_file_row_is_expressed_or_refused_for_what_is_not_modelled(moe):
    cases, refused = express_all(list(moe.values()))
    dense_ids = {i for i, r in moe.items() if r["is_moe"] == "0"}
    assert set(moe) == {c.row["id"] for c in cases} | {u["id"] for u in refused}
    assert len(cases) == 124 + 133
    assert sum(c.row["id"] in dense_ids for c in cases) == 124
    kinds = Counter(u["kind"] for u in refused if u["id"] in dense_ids)
    assert kinds == {"power-limited GPU not in the hardware catalog": 4}
    # MoE rows: refused only for what the row leaves out or gets wrong (the hybrid Mamba-2
    # models, Nemotron-H and Nemotron 3 Nano, are expressed)
    assert Counter(u["kind"] for u in refused if u["id"] not in dense_ids) == {
        "seq_len unknown": 3, "global_batch_seqs unknown": 2, "layout inconsistent": 2}
    assert {c.row["id"] for c in cases if c.job.is_hybrid} == \
        {"mb_196", "mb_197", "mb_198", "mb_199"} | {f"dg_{i:03d}" for i in range(22, 29)}
    assert all(c.job.is_moe for c in cases if c.row["id"] not in dense_ids)
    # a precision is costed as its own dtype, never silently as bf16
    for c in cases:
        assert c.job.dtype == PRECISIONS[precision_of(c.row["precision"])], c.row["id"]
    assert {c.hw.name for c in cases} == {"H100-SXM", "B200", "B300", "GB200-NVL72",
                                          "GB300-NVL72"}
    assert Counter(c.job.dtype for c in cases if not c.job.is_moe)["mxfp8"] == 21
    assert Counter(c.job.dtype for c in cases)["nvfp4"] == 8


def test_moe_rows_are_expressed_with_their_experts(moe):
    dsv3 = express(moe["mb_179"])  # DeepSeek-V3, 256 GB200, EP64 PP4 VP4, MXFP8
    assert dsv3.job.is_moe and dsv3.job.attention == "mla" and dsv3.job.mtp_layers == 1
    assert dsv3.job.dtype == "mxfp8" and dsv3.job.moe_dispatcher == "flex"  # hybridep
    opt = dsv3.options[0]
    assert (opt["ep"], opt["etp"], opt["pp"], opt["vpp"], opt["nv_ep"]) == (64, 1, 4, 4, 64)
    assert express(moe["mb_178"]).job.recompute_mla_up  # recompute_modules=['mla_up_proj']
    assert express(moe["mb_238"]).job.mtp_layers == 0  # "w/o MTP"
    simumax = express(moe["sm_007"])  # 4 layers, first dense; capacity factor 1, padded
    assert (simumax.job.n_layers, simumax.job.first_k_dense, simumax.job.capacity_factor,
            simumax.job.mtp_layers, simumax.job.moe_dispatcher) == (4, 1, 1.0, 0, "alltoall")
    assert express(moe["mb_233"]).options[0]["a2a_overlap"] == 1  # moe_a2a_overlap=True
    grok = express(moe["dg_014"])  # dgxc NeMo: ETP stated 4
    assert grok.job.name == "dg_014" and grok.options[0]["etp"] == 4
    assert "ep = 64, etp = 1 do not fold" in str(express(moe["mb_273"]))
    assert str(express(dict(moe["mb_179"], ep=""))) == \
        "an MoE row needs its expert-parallel degree (column ep)"


def test_megatron_bridge_rows_ran_with_the_precision_aware_optimizer(moe):
    """Its perf scripts turn it on for bf16 runs; its DeepSeek-V3 recipe keeps bf16 moments
    at every precision (MXFP8: Megatron-Core's fp32 master and an fp32 copy of the
    gradients: 4 + 10 + 8 bytes a step)."""
    dsv3 = express(moe["mb_179"]).job  # DeepSeek-V3, MXFP8
    assert optimizer_bytes(dsv3) == (8.0, 4.0, 22.0)
    gpt_oss = express(moe["mb_183"]).job  # GPT-OSS-120B, BF16
    assert gpt_oss.precision_aware_optimizer and gpt_oss.exp_avg_dtype == "fp32"
    assert optimizer_bytes(gpt_oss)[0] == 10.0
    assert not express(moe["mb_227"]).job.precision_aware_optimizer  # Qwen3-30B-A3B, MXFP8
    assert not express(moe["sm_007"]).job.precision_aware_optimizer  # SimuMax (Megatron-LM)


def test_a_source_that_measured_its_machine_is_expressed_on_it(moe):
    """SimuMax's rows run on its B200 node at the best GEMM rate its own microbenchmark found
    there (0.655 of peak); another source's B200 rows keep the catalog's figure (0.776), and
    the row says so."""
    simumax, bridge = express(moe["sm_001"]), express(moe["mb_252"])
    assert simumax.hw.name == bridge.hw.name == "B200"
    assert simumax.hw.matrix_sustained_fraction == 0.655
    assert bridge.hw.matrix_sustained_fraction == 0.776
    assert any("0.655 of peak" in a for a in simumax.assumptions)
    assert not any("0.655" in a for a in bridge.assumptions)


def test_a_source_whose_launcher_leaves_dp_overlap_off_is_expressed_without_it(moe):
    """SimuMax's Megatron-LM launchers pass neither --overlap-grad-reduce nor
    --overlap-param-gather (both off by default): its rows reduce and gather exposed, and say
    so; Megatron-Bridge's rows keep their stack's overlap."""
    simumax, bridge = express(moe["sm_001"]), express(moe["mb_252"])
    assert simumax.job.dp_overlap is False
    assert bridge.job.dp_overlap is True
    assert any("--overlap-grad-reduce" in a for a in simumax.assumptions)
    assert not any("--overlap-grad-reduce" in a for a in bridge.assumptions)


def test_rows_are_read_as_their_perf_scripts_ran_them(moe):
    """What the source's own script ran where the row's columns do not say it (an outside
    audit of the MoE tail): a flex backend that Megatron-Bridge's perf script never applied
    at that tag (Qwen3-235B on H100 at v0.3.1: alltoall; on GB300: flex), FP8_CS configs
    under an "FP8" label (current scaling), NeMo 25.09's DeepSeek-V3 run_script (H100:
    DeepEP, the all-to-all overlap, no data-parallel overlap, MLA up-projection recompute; its
    'mlp' recomputes only the three dense layers' MLPs) and NeMo 25.04's dgxc-benchmarking
    DeepSeek-V3 (token drop, MTP, selective recompute, no TP overlap, fp32 gradients)."""
    h100, gb300 = express(moe["mb_195"]), express(moe["mb_192"])
    assert h100.job.moe_dispatcher == "alltoall" and gb300.job.moe_dispatcher == "flex"
    assert h100.job.fp8_scaling == "current"
    assert any("did not apply the flex backend" in a for a in h100.assumptions)
    v3 = express(moe["mb_290"])
    assert v3.job.moe_dispatcher == "flex" and v3.job.dp_overlap is False
    assert v3.job.recompute_mla_up and set(v3.options["a2a_overlap"]) == {1}
    assert set(v3.options["recompute"]) == {Recompute.NONE}
    assert any("dense layers' MLPs only" in a for a in v3.assumptions)
    assert set(h100.options["tp_overlap"]) == {0}  # (its H100 config turns it off)
    dg = express(moe["dg_003"])
    assert dg.job.capacity_factor == 1.0 and dg.job.mtp_layers == 1
    assert dg.job.grad_dtype == "fp32" and set(dg.options["tp_overlap"]) == {0}
    assert set(dg.options["recompute"]) == {Recompute.SELECTIVE}  # (GB200: core_attn)
    dg_h100 = express(moe["dg_001"])  # (H100: dgxc's launch.sh names mla_up_proj)
    assert set(dg_h100.options["recompute"]) == {Recompute.NONE}
    # TE before 2.5 has no fused attention for MLA's 192 / 128 heads on Blackwell: the
    # GB200 rows materialize the score matrix, the H100 ones run cuDNN's fused kernel
    assert dg.job.attention_kernel == "materialized" and dg.job.attention == "mla"
    assert dg_h100.job.attention_kernel == "fused"
    assert any("MLA attention materialized" in a for a in dg.assumptions)
    assert dg_h100.job.recompute_mla_up
    # its pipeline split, 64 / pp - 1, 64 / pp, 64 / pp - 2 layers (pretrain_deepseek_v3.py
    # L73 - 77): for 61 layers, the embedding and the loss counted as a layer each
    # (dg_001 pp 8: 7, 8 x 6, 6; dg_003 pp 4: 15, 16 x 2, 14)
    assert dg_h100.job.embedding_slots and dg.job.embedding_slots
    assert last_stage_layers(dg_h100.job, 8) == 6 and last_stage_layers(dg.job, 4) == 14
    assert any("stages of 7, 8 and 6 layers" in a for a in dg_h100.assumptions)
    pp16 = express(moe["dg_002"])
    assert pp16.job.embedding_slots and last_stage_layers(pp16.job, 16) == 2  # (3, 4 x 14, 2)
    # a layer count the script's split does not fit keeps the even split, saying so
    cut = express(dict(moe["dg_001"], notes=moe["dg_001"]["notes"].replace("layers=61",
                                                                            "layers=58")))
    assert cut.job.n_layers == 58 and not cut.job.embedding_slots
    assert any("do not fit this row: the even split costed" in a for a in cut.assumptions)
    # only the source's own rows: another source's row of that release is read as it is
    other = express(dict(moe["mb_290"], source="my cluster"))
    assert other.job.moe_dispatcher == "alltoall" and other.job.dp_overlap
    # a stated recompute is kept: the release's script fills only what a row leaves empty
    stated = dict(moe["mb_290"], recompute="full")
    assert set(express(stated).options["recompute"]) == {Recompute.FULL}
    # Megatron-Bridge's FP8-CS Llama runs with Megatron FSDP on Grace systems offload
    # activations (25.09 / 25.11 configs: GB200 70B 40 layers, GB300 70B 20, GB200 405B
    # 95): those rows were predicted 17 - 81 % over capacity though they ran
    for rid, layers in (("mb_268", 40), ("mb_245", 40), ("mb_236", 20), ("mb_270", 95)):
        case = express(moe[rid])
        assert case.job.offload_act_layers == layers, rid
        assert set(case.options["recompute"]) == {Recompute.NONE}, rid
    assert express(moe["mb_269"]).job.offload_act_layers == 0  # (its FP8-MX config: none)


def test_unmodelled_precisions_and_models_are_refused_with_their_reasons(moe):
    assert express(moe["mb_167"]).job.dtype == "mxfp8"
    assert express(moe["mb_165"]).job.dtype == "nvfp4"
    # fp8 with DeepSeek-V3's block scales: fp8 GEMMs, blockwise casts
    blockwise = express(dict(moe["mb_171"], precision="FP8 blockwise 128x128 w / 1x128 act"))
    assert (blockwise.job.dtype, blockwise.job.fp8_scaling) == ("fp8", "blockwise")
    assert express(moe["mb_291"]).job.fp8_scaling == "blockwise"
    hybrid = express(moe["dg_022"]).job  # Nemotron-H 56B: 54 Mamba-2 layers
    assert (hybrid.mamba_layers, hybrid.blocks, hybrid.mlp) == (54, 54, "relu2")
    # a latent MoE with hybrid MTP depths (Nemotron 3 Super, a Nano row's layout on 64 GPUs);
    # its depths go with "w/o MTP"
    row = dict(moe["mb_197"], model="Nemotron-3-Super-120B-A12B", n_gpus="64", tp="2",
               ep="64", global_batch_seqs="512", micro_batch="1")
    sup = express(row).job
    assert (sup.moe_latent_size, sup.mtp_layers, sup.mtp_pattern, sup.mtp_shared) == \
        (1024, 2, "*E", True)
    dropped = express(dict(row, notes=row["notes"] + " | w/o MTP")).job
    assert (dropped.mtp_layers, dropped.mtp_pattern, dropped.mtp_shared) == (0, "", False)
    on_a100 = dict(moe["mb_171"], gpu="A100-SXM4-80GB", system="", precision="FP8-CS")
    assert "fp8 needs fp8 tensor cores; hardware 'A100-80GB' has no fp8 peak" in \
        str(express(on_a100))
    # an MoE row must name a model with experts (its dimensions alone do not say them)
    assert str(express(dict(moe["mb_171"], is_moe="1", ep="8"))) == MOE


def test_named_models_resolve_through_jobs(moe):
    c = express(moe["mb_171"])  # Llama3-70B, 64 H100
    job = load_job("llama3_70b")
    assert (c.job.n_layers, c.job.hidden, c.job.ffn_hidden, c.job.n_kv_heads, c.job.vocab) == \
        (job.n_layers, job.hidden, job.ffn_hidden, job.n_kv_heads, job.vocab)
    assert c.job.mlp == "swiglu" and c.job.seq_len == 8192 and c.job.global_batch == 256
    assert express(moe["dg_045"]).job.n_layers == 126  # Llama3.1-405B -> llama3_405b
    assert express(moe["dg_031"]).job.hidden == 18432  # Nemotron4-340B (jobs/ added)
    truncated = express(moe["sm_001"])  # SimuMax: Llama3-70B with 12 layers (notes)
    assert truncated.job.n_layers == 12
    assert "truncated model: 12 of 80 layers (notes)" in truncated.assumptions
    # an NVL72 run fills 64 of a rack's 72 GPUs per NVLink domain
    assert express(moe["mb_270"]).hw.nvlink_domain == 64
    assert express(moe["mb_243"]).hw.nvlink_domain == 8  # 8 GPUs: all in one domain


def test_validate_all_prints_files_and_refusals_by_reason(capsys):
    assert main(["validate", "--data", "all", "--no-loso", "--summary"]) == 0
    out = capsys.readouterr().out
    assert "measured_training_runs.csv: 271 of 271 rows expressed" in out
    assert "measured_moe_blackwell.csv: 257 of 268 rows expressed" in out
    assert "rows not expressed, by reason" in out
    assert "hybrid Mamba" not in out
    assert main(["validate", "--data", "measured_moe_blackwell", "--no-loso", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["files"] == {"measured_moe_blackwell.csv": {"rows": 268, "expressed": 257}}
    assert MOE not in rep["refused"] and "B200 bf16" in rep["per_hardware_precision"]
    assert rep["per_model_kind"]["MoE"]["n"] == 133


def test_a_file_without_dimensions_or_model_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "thin.csv").write_text("id,source,framework,gpu,n_gpus,precision,seq_len,"
                                       "global_batch_seqs,iter_time_s\nx,y,NeMo,H100,8,bf16,"
                                       "4096,8,1.0\n")
    assert main(["validate", "--data", str(tmp_path / "thin.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "missing column(s): n_layers, hidden, ffn_hidden, n_heads (or model)" in err


def test_calibration_records_every_file_it_was_fitted_on(tmp_path):
    from sweep.analysis.calibration import FitResult, write_calibration

    params = {"hopper": {"gemm_eff": 0.6}, "memory": {"reserve_GiB": 2.0}}
    write_calibration(tmp_path / "c.yaml", FitResult(params, {}, {}), list(SHIPPED))
    text = (tmp_path / "c.yaml").read_text()
    assert "data: measured_training_runs.csv + measured_moe_blackwell.csv" in text


def test_allocated_memory_is_compared_as_allocated(moe):
    """SimuMax publishes torch's peak *allocated* memory (its .md): the comparison leaves out
    the CUDA context / NCCL reserve and the allocator's cached blocks, and a row may say
    which it publishes in a mem_definition column."""
    from sweep.analysis.calibration import Evaluator
    from sweep.analysis.express import express
    from sweep.analysis.measured import memory_definition

    row = moe["sm_001"]
    assert memory_definition(row) == "allocated"
    assert memory_definition({**row, "mem_definition": "reserved"}) == "reserved"
    with pytest.raises(SweepError, match="mem_definition 'peak'"):
        memory_definition({**row, "mem_definition": "peak"})
    allocated = express(row)
    reserved = express({**row, "mem_definition": "reserved"})
    out = Evaluator([allocated, reserved]).run()
    reserve = allocated.hw.calibration["reserve_GiB"] * 2**30
    assert out["mem_bytes"][0] == out["mem_bytes"][1]
    assert out["mem_reported_bytes"][0] == pytest.approx(out["mem_bytes"][0] - reserve)
    assert out["mem_reported_bytes"][1] > out["mem_bytes"][1]  # plus the allocator's cache


def test_a_misspelt_column_is_refused_and_a_non_finite_metric_is_not_given(tmp_path, dense):
    """A column name read as absent (recompte) is an error naming the nearest documented
    one, not a silently different row; nan or inf in a metric counts as not given."""
    base = dense["nemo2407_LLAMA3-70B_64"]
    with pytest.raises(SweepError, match="unknown column 'recompte' \\(nearest: recompute"):
        _write(tmp_path / "typo.csv", [{("recompte" if k == "recompute" else k): v
                                        for k, v in base.items()}])
    rows = [dict(base, id=f"nonfinite_{x}", tokens_per_s_per_gpu=x, tflops_per_gpu="",
                 iter_time_s="", samples_per_s="", mfu="") for x in ("nan", "inf")]
    cases, refused = express_all(_write(tmp_path / "nan.csv", rows))
    assert not cases and {u["id"] for u in refused} == {r["id"] for r in rows}


def test_a_measured_value_that_is_no_number_is_refused_naming_it(tmp_path, dense):
    """'137,5', 'fast' or -5 in a metric, or a negative memory, is an error in the row (an
    outside review: refused as "no time-based metric", or a -3 GiB peak compared); 0, a
    published table's rounding, stays a cell not given, and the next metric is used."""
    base = dense["nar21_t1_1"]
    rows = [dict(base, id=f"bad_{i}", tflops_per_gpu=x) for i, x in
            enumerate(("137,5", "fast", "-5", "-inf"))]
    rows.append(dict(base, id="bad_mem", mem_per_gpu_GB="-3"))
    cases, refused = express_all(_write(tmp_path / "bad.csv", rows))
    assert not cases
    reasons = {u["id"]: u["reason"] for u in refused}
    assert reasons["bad_0"] == "tflops_per_gpu '137,5' is not a number of 0 or more"
    assert reasons["bad_2"] == "tflops_per_gpu '-5' is not a number of 0 or more"
    assert reasons["bad_mem"] == "mem_per_gpu_GB '-3' is not a number of 0 or more"
    rounded = dict(base, id="rounded", samples_per_s="0")
    (case,), _ = express_all(_write(tmp_path / "ok.csv", [rounded]))
    assert case.metric == "tflops_per_gpu"


def test_an_id_given_twice_is_refused_naming_both_lines(tmp_path, dense):
    """Rows are keyed by id (errors, assumptions, the fit's weights): a second row with the
    same id was listed twice without a word (an outside tester's finding)."""
    first, second = list(dense.values())[:2]
    path = tmp_path / "mine.csv"
    _write(path, [first, dict(second, id=first["id"])])
    with pytest.raises(SweepError, match=rf"mine.csv line 3: id '{first['id']}' is already "
                                         rf"the id of .*mine.csv line 2"):
        read_data([path])
    # the same id in another file the run reads with it
    other = tmp_path / "other.csv"
    _write(other, [dict(second, id="fresh"), first])
    with pytest.raises(SweepError, match=r"other.csv line 3: id .* of .*mine.csv line 2"):
        read_data([_single(tmp_path, first), other])
    assert len(read_data(list(SHIPPED))) == 539


def _single(tmp_path, row):
    path = tmp_path / "mine.csv"
    _write(path, [row])
    return path


def test_a_deepseek_v4_row_is_expressed_with_its_attention_and_flags(tmp_path, moe):
    # (the plumbing of a row naming DeepSeek-V4: a shipped GB200 DeepSeek-V3 row's columns
    # with Megatron-Bridge v0.6.0's Flash recipe layout; its measured number is not V4's
    # and nothing here compares with it)
    base = next(r for r in moe.values() if r["model"] == "DeepSeek-V3" and r["gpu"] == "GB200"
                and r["source"].startswith("Megatron-Bridge"))
    row = dict(base, id="v4_plumbing", model="DeepSeek-V4-Flash", n_gpus="128", tp="1",
               pp="1", vp="1", cp="1", ep="64", etp="1", global_batch_seqs="2048",
               micro_batch="1", precision="MXFP8", recompute="recompute_modules=['mla_up_proj']",
               other_flags="moe_flex_dispatcher_backend=hybridep")
    cases, refused = express_all(_write(tmp_path / "v4.csv", [row]))
    assert refused == [] and len(cases) == 1
    job = cases[0].job
    assert (job.n_layers, job.attention, job.csa_layers, job.hca_layers, job.hc_streams) == \
        (43, "csa", 21, 20, 4)
    assert job.recompute_mla_up and job.moe_dispatcher == "flex" and job.mtp_layers == 1
    assert job.dtype == "mxfp8"


def test_a_truncated_deepseek_v4_row_keeps_its_shares_of_compressed_layers(tmp_path, moe):
    # (plumbing, as above: a row naming the model with n_layers of its own keeps the model's
    # shares of ratio-4 and ratio-128 layers; without a ratio-4 layer, no indexer)
    base = next(r for r in moe.values() if r["model"] == "DeepSeek-V3" and r["gpu"] == "GB200"
                and r["source"].startswith("Megatron-Bridge"))
    rows = [dict(base, id=f"v4_{n}", model="DeepSeek-V4-Flash", n_gpus="8", tp="1", pp="1",
                 vp="1", cp="1", ep="8", etp="1", global_batch_seqs="64", micro_batch="1",
                 notes=f"truncated model: {n} layers") for n in (1, 8)]
    cases, refused = express_all(_write(tmp_path / "v4.csv", rows))
    assert refused == []
    jobs = {c.row["id"]: c.job for c in cases}
    one, eight = jobs["v4_1"], jobs["v4_8"]
    assert (one.csa_layers, one.hca_layers, one.index_topk) == (0, 0, 0)
    assert (eight.csa_layers, eight.hca_layers, eight.index_topk) == (4, 4, 512)


def test_megatron_bridges_nemotron_3_super_nvfp4_rows_run_its_16_bit_layers(tmp_path, moe):
    # (plumbing: a row naming Nemotron 3 Super in NVFP4 from Megatron-Bridge's table takes
    # its perf recipe's last 14 layers, attention and latent projections in bf16)
    base = next(r for r in moe.values() if r["model"].startswith("Nemotron-3-Nano")
                and r["source"].startswith("Megatron-Bridge"))
    rows = [dict(base, id=f"sup_{p}", model="Nemotron_3_Super", n_gpus="64", tp="2", pp="1",
                 vp="", cp="1", ep="64", etp="1", global_batch_seqs="512", micro_batch="1",
                 precision=p, recompute="", other_flags="") for p in ("NVFP4", "MXFP8")]
    # (a row stating its recompute, B300's selective moe_act and layernorm, keeps them)
    rows.append(dict(rows[0], id="sup_b300", gpu="B300", system="DGX-B300",
                     recompute="recompute_modules=['moe_act', 'layernorm']"))
    cases, refused = express_all(_write(tmp_path / "sup.csv", rows))
    assert refused == []
    jobs = {c.row["id"]: c.job for c in cases}
    fp4, mx, b300 = jobs["sup_NVFP4"], jobs["sup_MXFP8"], jobs["sup_b300"]
    for job in (fp4, b300):
        assert (job.bf16_first_layers, job.bf16_last_layers, job.bf16_attention,
                job.bf16_latent) == (0, 14, True, True)
    assert b300.recompute_moe_act and b300.recompute_norms
    assert (fp4.mamba_out_dtype, mx.mamba_out_dtype) == ("mxfp8", "")
    notes = {c.row["id"]: " ".join(c.assumptions) for c in cases}
    assert "per-layer precision" in notes["sup_NVFP4"]
    assert "per-layer precision" not in notes["sup_MXFP8"]
    assert (mx.bf16_last_layers, mx.bf16_attention, mx.bf16_latent) == (0, False, False)


def test_the_held_out_file_is_expressed_and_apart_from_the_data():
    """docs/heldout: Megatron-Bridge's newer releases, every row expressed (its flags read),
    none of them in the shipped files the calibration is fitted on."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "heldout" / \
        "megatron-bridge-26.04-26.08.csv"
    held = read_runs(path)
    cases, refused = express_all(held)
    assert len(held) == len(cases) == 154 and not refused
    shipped = read_data(list(SHIPPED))
    assert not {r["id"] for r in held} & {r["id"] for r in shipped}
    with open(path, newline="") as fh:
        raw = list(csv.DictReader(fh))
    releases = set()
    for shipped_path in SHIPPED:
        with open(shipped_path, newline="") as fh:
            releases |= {r.get("release") for r in csv.DictReader(fh)}
    assert {r["release"] for r in raw}.isdisjoint(releases)
    assert all("cfg=" in r["other_flags"] for r in raw)

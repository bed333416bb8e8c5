"""`sweep validate` against the public measured runs, and `sweep validate` / `sweep calibrate`
as a user runs them on their own CSV.

The thresholds are the bars of the calibrated profile (docs/model.md, "Validation"): they fail if a
model change makes the predictions of real runs worse.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml

from sweep.analysis.calibration import Evaluator
from sweep.analysis.express import express, express_all, flops_convention
from sweep.analysis.measured import DEFAULT_DATA, read_runs
from sweep.analysis.validate import (
    catalog_parameters,
    report,
    spearman,
)
from sweep.cli import main
from sweep.engine.catalog import REPO_ROOT, load_calibration


@pytest.fixture(scope="module")
def rows():
    return read_runs(DEFAULT_DATA)


@pytest.fixture(scope="module")
def all_rows():
    """Both shipped files: what hardware/calibration.yaml is fitted on."""
    from sweep.analysis.measured import SHIPPED, read_data

    return read_data(list(SHIPPED))


@pytest.fixture(scope="module")
def shipped(all_rows):
    """The report of the shipped parameters on both shipped files, in sample."""
    cases, _ = express_all(all_rows)
    return report(all_rows, catalog_parameters(cases), loso=False)


@pytest.fixture(scope="module")
def shipped_loso(all_rows):
    """The same with leave-one-source-out (one re-fit per source, on two worker processes:
    about a minute on 2 cores, so its tests are slow ones)."""
    cases, _ = express_all(all_rows)
    return report(all_rows, catalog_parameters(cases), loso=True, workers=2)


#: whichever test of the leave-one-source-out report runs first also waits for its fixture
#: (a re-fit per source: 1 - 2 minutes on 2 cores, twice that on a slow host)
LOSO_TIMEOUT_S = 1200


def _predictions_at(cases, points) -> list:
    """Each case's predicted metric at each of ``points`` (parameter sets, applied in turn),
    as `sweep validate`'s re-fits evaluate them."""
    from sweep.analysis.calibration import predictions

    ev = Evaluator(cases)
    out = []
    for params in points:
        ev.set_parameters(params)
        out.append(predictions(ev)[0])
    return out


@pytest.mark.slow
def test_leave_one_source_out_is_the_same_in_a_worker_process(all_rows):
    """`sweep validate` re-fits in spawned worker processes; the fit is deterministic given
    its objective, so the worker's folds equal this process's when every evaluation of the
    objective does: the predictions of every timed run at a sequence of parameter sets
    (dense, MoE and memory ones, so the reused per-layer terms too), bit for bit."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    cases, _ = express_all(all_rows)
    timed = [c for c in cases if c.metric]
    shipped = load_calibration(REPO_ROOT / "hardware" / "calibration.yaml")
    points = [{g: dict(shipped[g]) for g in ("ampere", "hopper", "blackwell")},
              {"blackwell": {"grouped_gemm_eff": 0.41, "a2a_eff": 0.52}},
              {"memory": {"reserve_GiB": 7.5}},
              {"hopper": {"gemm_eff": 0.66, "kernel_us": 9.0, "expert_us": 30.0}}]
    here = _predictions_at(timed, points)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        there = pool.submit(_predictions_at, timed, points).result(timeout=240)
    assert len(there) == len(points)
    for mine, theirs in zip(here, there):
        assert np.array_equal(mine, theirs, equal_nan=True)
    assert not np.array_equal(here[0], here[1], equal_nan=True)


@pytest.mark.slow
@pytest.mark.timeout(LOSO_TIMEOUT_S)
def test_leave_one_source_out_bars(shipped_loso):
    """Issue 15's leave-one-source-out bars for the dense models: median 10 %, 90th
    percentile 25 %; every GPU generation's median within 15 %."""
    dense_loso = shipped_loso["loso"]["per_model_kind"]["dense"]
    assert dense_loso["median_abs"] <= 0.10
    assert dense_loso["p90_abs"] <= 0.25
    assert all(v["median_abs"] <= 0.15
               for k, v in shipped_loso["loso"]["per_generation"].items() if "MoE" not in k)


@pytest.mark.slow
@pytest.mark.timeout(LOSO_TIMEOUT_S)
def test_moe_leave_one_source_out_median(shipped_loso):
    """Issue 16's leave-one-source-out bar for the MoE rows: median 12 % (10.3 % once the
    grouped-GEMM efficiency keeps to its cited range: with 0.35 allowed, a fit without
    dgxc's coarse Grok-1 experts charged DeepSeek's and Qwen's host time to the GEMMs and
    predicted Grok-1 twice too slow)."""
    moe_loso = shipped_loso["loso"]["per_model_kind"]["MoE"]
    assert moe_loso["n"] >= 120 and moe_loso["median_abs"] <= 0.12


def test_rows_expressed(shipped):
    # every dense-file row: MFU-only rows by their formula, batch-less rows from a sibling
    # run; of the MoE / Blackwell file, all but the power-limited B200 without its watts,
    # and MoE rows without a sequence length or batch or with an EP degree that does not
    # fold into the stage's GPUs (the hybrid Mamba-2 models are expressed)
    files = shipped["files"]
    assert files["measured_training_runs.csv"] == {"rows": 271, "expressed": 271}
    assert files["measured_moe_blackwell.csv"]["expressed"] >= 257
    assert set(shipped["refused"]) == {"power-limited GPU not in the hardware catalog",
                                       "seq_len unknown", "global_batch_seqs unknown",
                                       "layout inconsistent"}


def test_time_error_median_p90_and_leave_one_source_out(shipped):
    """The dense models' bars (issue 15): in sample and leave-one-source-out."""
    dense = shipped["per_model_kind"]["dense"]
    assert dense["n"] >= 380
    assert dense["median_abs"] <= 0.08
    assert dense["p90_abs"] <= 0.20
    # every source with dense rows is predicted, none off by more than 15 % in median
    by_source = {}
    for r in shipped["rows"]:
        if r["error"] is not None and "MoE" not in r.get("kind", "dense"):
            by_source.setdefault(r["source"], []).append(abs(r["error"]))
    assert all(np.median(v) <= 0.15 for v in by_source.values())
    # per GPU generation and per precision 10 %, in sample (issue 15)
    generations = {k: v for k, v in shipped["per_generation"].items() if "MoE" not in k}
    assert set(generations) == {"ampere", "hopper", "blackwell"}
    assert all(v["median_abs"] <= 0.10 for v in generations.values())
    precisions = {k: v for k, v in shipped["per_precision"].items() if "MoE" not in k}
    assert {"bf16", "fp8", "mxfp8", "nvfp4"} <= set(precisions)
    assert all(v["median_abs"] <= 0.10 for v in precisions.values())


def test_moe_accuracy(shipped):
    """Mixture-of-experts rows (issue 16), as far as they are met: in-sample median within
    10 %, the memory of SimuMax's runs (measured peaks) within 15 %; the dense rows keep
    their bars (above)."""
    moe = shipped["per_model_kind"]["MoE"]
    assert moe["n"] >= 120 and moe["median_abs"] <= 0.10
    memory = [abs(r["mem_error"]) for r in shipped["rows"]
              if "mem_error" in r and r.get("kind") == "MoE"]
    assert len(memory) >= 16 and max(memory) <= 0.15


def test_memory_and_out_of_memory_rows(shipped):
    mem = shipped["memory"]
    assert mem["n"] >= 90 and mem["median_abs"] <= 0.10 and mem["within_15pct"] >= 0.95
    # 4 of the 6 OOM rows are predicted infeasible. bloom_prequel_71 cannot be by any model
    # monotone in layers and width: bloom_prequel_65 (8 x 13312^2 per stage, more than 71's
    # 7 x 14336^2, same heads and micro-batch) ran in 67 GB. bloom_prequel_57 is predicted
    # within 3 % of the capacity (README)
    assert shipped["oom"]["n"] == 6 and shipped["oom"]["predicted_infeasible"] >= 4
    assert set(shipped["oom"]["missed"]) <= {"bloom_prequel_57", "bloom_prequel_71"}
    # of the dense file, at most two runs that ran are predicted more than 1 % over capacity
    # (closer is within the memory model's own error: MPT-1B on A100-40GB, predicted at
    # 39.9997 of 40 GiB until stop 39's refit moved the reserve by 0.12 GiB, now 0.3 % over);
    # the Megatron-Bridge rows whose recompute / offloading / sharding the table leaves out
    # are predicted as its configs run and reported with their margin
    over = shipped["ran_but_predicted_over_capacity"]
    dense = {r["id"] for r in shipped["rows"] if r.get("kind") == "dense"}
    assert len([e for e in over if e["id"] in dense and not e["id"].startswith("mb_")
                and e["over_pct"] > 1.0]) <= 2
    # MoE rows other than Megatron-Bridge's: within the memory model's own error (dg_001,
    # DeepSeek-V3 on 512 H100 with NeMo 25.04's selective recompute, 4 % over 80 GB)
    assert all(e["over_pct"] < 5.0 for e in over
               if e["id"] not in dense and not e["id"].startswith("mb_"))
    assert all(e["over_pct"] > 0 for e in over)


def test_rankings_within_the_benchmark_tables(shipped):
    rho = {g: v["rho"] for g, v in shipped["spearman"].items()}
    for table in ("MosaicML-llm-foundry / A100 80GB", "MosaicML-llm-foundry / H100 80GB BF16",
                  "NeMo-24.07-perf", "IBM-fms-fsdp", "Korthikanti2022"):
        assert all(r >= 0.9 for g, r in rho.items() if g.startswith(table)), table
    # BLOOM topology sweeps: 4 of 9 at 0.8 or better, median 0.62; not all (README: TP 8 at
    # small micro-batches; sweeps of 3 to 5 configurations 1 - 2 % apart)
    bloom = [r for g, r in rho.items() if g.startswith("BLOOM")]
    assert len(bloom) == 9 and np.median(bloom) >= 0.6 and sum(r >= 0.8 for r in bloom) >= 4


def test_calibration_file_was_fitted_on_the_shipped_data():
    """Both shipped files, in order; Blackwell fitted on its own runs, not borrowed; the
    parameters outside their cited ranges listed in the file."""
    from sweep.analysis.calibration import load_ranges, outside_ranges
    from sweep.analysis.measured import SHIPPED

    raw = yaml.safe_load((REPO_ROOT / "hardware" / "calibration.yaml").read_text())
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SHIPPED)).hexdigest()
    assert raw["fitted"]["data_sha256"] == digest
    assert "blackwell" not in raw["fitted"]["borrowed"] and raw["fitted"]["rows"]["blackwell"]
    table = load_calibration(REPO_ROOT / "hardware" / "calibration.yaml")
    assert {"ampere", "hopper", "blackwell", "memory"} <= set(table)
    assert 0 < table["hopper"]["gemm_eff"] <= 1 and table["memory"]["reserve_GiB"] >= 0.75
    listed = {g: v.split(", ") for g, v in raw["fitted"]["outside_range"].items()}
    assert listed == {g: v for g, v in outside_ranges(table, load_ranges()).items()
                      if g in raw["fitted"]["rows"]}


def test_spearman_with_ties():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties share their average rank (the scipy.stats.spearmanr convention)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)


def test_a_stated_configuration_is_evaluated_as_stated(rows):
    row = next(r for r in rows if r["id"].startswith("kor22_t5"))
    case = express(row)
    assert len(case.options) == 1  # nothing left open: TP, PP, micro-batch, recompute given
    assert case.metric == "iter_time_s"


def test_mfu_alone_is_compared_as_model_tflops(rows):
    row = next(r for r in rows if r["id"] == "mlm24_strong_177B_96")
    assert not row["tflops_per_gpu"] and flops_convention(row) == "model"
    case = express(row)
    assert case.metric == "tflops_per_gpu"
    assert case.measured == pytest.approx(0.47 * 989)
    # GPT-3 shape, f = 4e, MHA: Megatron-Core's count is 72 B s L e^2 (1 + s/6e) + 6 B s e V
    B, s, L, e, V = 1152, 4096, 96, 12288, 131072
    assert case.flops == pytest.approx(72 * B * s * L * e**2 * (1 + s / (6 * e))
                                       + 6 * B * s * e * V)


def test_flops_conventions():
    assert flops_convention({"tflops_definition": "Megatron Eq.3 (includes recompute)"}) \
        == "hardware-eq3"
    assert flops_convention({"tflops_definition": "MFU (model flops, no recompute) / 312"}) \
        == "model"
    assert flops_convention({"tflops_definition": "MFU per README",
                             "framework": "Megatron-Core r0.8.0"}) == "model"
    assert flops_convention({"tflops_definition": "MFU per README", "framework": "x"}) is None
    assert flops_convention({"tflops_definition": ""}) is None


def test_a_row_without_global_batch_borrows_a_siblings(rows):
    abstract = [r for r in rows if r["id"].startswith("kor22_abs")]
    cases, unexpressed = express_all(abstract)
    assert not cases and all("global_batch_seqs unknown" in u["reason"] for u in unexpressed)
    sibling = next(r for r in rows if r["id"] == "nar21_t2_12")  # 530B, 2240 GPUs, TP8 PP35
    cases, unexpressed = express_all(abstract + [sibling])
    assert not unexpressed and len(cases) == 3
    for c, row in zip(cases[:2], abstract):
        assert c.job.global_batch == 2240 and c.row is row
        assert "global batch unstated: 2240 from nar21_t2_12" in c.assumptions


def test_torchtitan_defaults_fill_an_unstated_pipeline(rows):
    # Interleaved 1F1B without v: torchtitan's default 2 stages per rank, and p x v
    # micro-batches of the local batch of 32 -> micro-batch 32 / (8 x 2) = 2
    row = next(r for r in rows if r["id"] == "tt24_t5_Inte")
    assert not row["vp"] and not row["micro_batch"]
    case = express(row)
    assert {(int(o["vpp"]), int(o["mbs"])) for o in case.options} == {(2, 2)}


def test_torchtitan_compiles_its_loss_from_april_2025(rows):
    by_id = {r["id"]: r for r in rows}
    old, new = express(by_id["tt24_t3_378"]), express(by_id["tt25_h200_4n"])
    assert by_id["tt24_t3_378"]["compile"] == by_id["tt25_h200_4n"]["compile"] == "yes"
    assert not old.job.fused_loss and new.job.fused_loss
    eager = express(dict(by_id["tt25_h200_4n"], compile="no"))
    assert not eager.job.fused_loss
    # what the fused loss saves: the fp32 logits and their gradient become 16-bit,
    # 2 x 2 bytes x tokens x vocabulary (128256 needs no padding at TP 1)
    ev_new, ev_off = Evaluator([new]), Evaluator([dataclasses.replace(
        new, job=dataclasses.replace(new.job, fused_loss=False))])
    saved = ev_off.run()["mem_bytes"][0] - ev_new.run()["mem_bytes"][0]
    assert saved == pytest.approx(2 * 2 * 2 * 8192 * 128256)


def _layer_terms_equal(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return a.keys() == b.keys() and all(
        np.array_equal(np.broadcast_to(a[k], np.shape(b[k])), b[k], equal_nan=True)
        for k in a)


def test_the_fit_reuses_layer_terms_only_where_they_do_not_read_the_moved_parameters(
        all_rows):
    """calibration.Evaluator keeps the per-layer terms while only parameters they do not
    read move (the MoE and memory fits: 7x fewer seconds per MoE evaluation). Moving each
    of those parameters leaves calibrated.layer_terms as they were (gemm_eff does change
    them), and an evaluator that reused them predicts exactly what a fresh one does."""
    from sweep.analysis.calibration import (
        MEMORY_PARAMETERS,
        MOE_PARAMETERS,
        NOT_IN_LAYER_TERMS,
        NOT_IN_ROUTED_TERMS,
    )
    from sweep.model.cost import calibrated

    cases, _ = express_all(all_rows)
    timed = [c for c in cases if c.metric and c.hw.generation in ("hopper", "blackwell")]
    pick = [c for c in timed if c.job.is_moe][::4] + [c for c in timed if not c.job.is_moe][::8]
    ev = Evaluator(pick)
    lay, routed = calibrated.layer_terms(ev.x, ev.c)
    assert routed is not None
    for name in ("gemm_eff",) + MOE_PARAMETERS + MEMORY_PARAMETERS:
        moved = Evaluator(pick)
        value = 5.0 if name in ("reserve_GiB", "expert_us") else 0.37
        moved.set_parameters({g: {name: value} for g in ("hopper", "blackwell")})
        got_lay, got_routed = calibrated.layer_terms(moved.x, moved.c)
        assert _layer_terms_equal(lay, got_lay) == (name in NOT_IN_LAYER_TERMS), name
        if name in NOT_IN_ROUTED_TERMS:
            assert _layer_terms_equal(routed, got_routed), name
    # the reuse: after a first run, MoE parameters, then a memory one, then a dense one
    first = ev.run()
    done = []
    for params in ({"blackwell": {"grouped_gemm_eff": 0.41, "a2a_eff": 0.52}},
                   {"memory": {"reserve_GiB": 7.5}},
                   {"hopper": {"gemm_eff": 0.66}}):
        ev.set_parameters(params)
        done.append(params)
        fresh = Evaluator(pick)
        for earlier in done:
            fresh.set_parameters(earlier)
        got, want = ev.run(), fresh.run()
        assert np.any(got["step_time_s"] != first["step_time_s"]) or "memory" in params
        for k in want:
            assert np.array_equal(got[k], want[k], equal_nan=True), (params, k)


def test_deepspeed_accumulates_gradients_outside_the_gemms(rows):
    by_id = {r["id"]: r for r in rows}
    # same 12288 x 106 run, fp16 then DeepSpeed BF16Optimizer (02-27 / 02-28)
    fp16, bf16 = express(by_id["bloom_prequel_51"]), express(by_id["bloom_prequel_52"])
    assert (fp16.job.grad_accum_bytes, bf16.job.grad_accum_bytes) == (6.0, 18.0)
    # Megatron-LM fuses the accumulation into the weight-gradient GEMM
    assert express(by_id["nar21_t1_1"]).job.grad_accum_bytes == 0.0
    # the measured fp16 -> bf16 slow-down, +5.0 %, is predicted within 2 points
    t = Evaluator([fp16, bf16]).run()["step_time_s"]
    measured = float(by_id["bloom_prequel_52"]["iter_time_s"]) / float(
        by_id["bloom_prequel_51"]["iter_time_s"])
    assert abs(t[1] / t[0] - measured) < 0.02


# ------------------------------------------------------------------------------ CLI

def _subset(rows, path, extra=()):
    keep = [r for r in rows if r["source"] in ("Korthikanti2022", "MegatronLM-README-H100")]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        for r in keep + list(extra):
            w.writerow(r)
    return len(keep)


def test_validate_a_users_csv(tmp_path, rows, capsys):
    odd = dict(rows[0], id="my_tpu_run", gpu="TPU v5p")
    mine = dict(rows[0], id="my_stack_run", framework="my own trainer")
    n = _subset(rows, tmp_path / "mine.csv", [odd, mine])
    code = main(["validate", "--data", str(tmp_path / "mine.csv"), "--no-loso"])
    out = capsys.readouterr().out
    assert code == 0
    # what cannot be expressed says what would be: the catalog names, the known stacks
    assert "my_tpu_run" in out and "GPU 'TPU v5p' is not in the hardware catalog" in out
    assert "use a catalog name: A100-40GB, A100-80GB" in out
    assert "framework 'my own trainer' unknown" in out
    assert "Megatron-DeepSpeed, DeepSpeed ZeRO-3, NeMo" in out and "torchtitan)" in out
    assert "median |error|" in out and "Korthikanti2022" in out
    code = main(["validate", "--data", str(tmp_path / "mine.csv"), "--no-loso", "--json"])
    text = capsys.readouterr().out

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    rep = json.loads(text, parse_constant=refuse)  # strict: these rows publish no memory
    # not expressed: the 2 K22 abstract rows (no global batch, and their sibling run, N21
    # Table 2, is not in this file)
    assert code == 0 and len(rep["rows"]) == n - 2
    assert rep["memory"]["median_abs"] is None  # (NaN before: no strict parser read it)


def test_validate_bad_input_is_one_line_exit_2(tmp_path, capsys):
    assert main(["validate", "--data", str(tmp_path / "nope.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope.csv: cannot read" in err
    (tmp_path / "thin.csv").write_text("id,source\nx,y\n")
    assert main(["validate", "--data", str(tmp_path / "thin.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing column(s): framework" in err


def test_validate_nothing_expressible_names_the_rows_and_why(tmp_path, rows, capsys):
    bad = dict(rows[0], id="typo_run", n_gpus="abc")
    with open(tmp_path / "typo.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerow(bad)
    assert main(["validate", "--data", str(tmp_path / "typo.csv"), "--no-loso"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "typo_run: n_gpus 'abc' is not a whole number" in err


def test_explain_shows_the_configuration_validation_chose(all_rows, shipped, capsys):
    """--explain ID: the row's chosen configuration as sweep predict prints it; its step
    time is the one the report predicted, and its ops add up to it."""
    from sweep.analysis.validate import explain

    by_id = {r["id"]: r for r in shipped["rows"]}
    for e in explain(all_rows, ["mb_185", "dg_003", "tt24_t1_370"]):
        rid = e["case"].row["id"]
        assert e["predicted"] == pytest.approx(by_id[rid]["predicted"], rel=1e-9), rid
        assert e["error"] == pytest.approx(by_id[rid]["error"], rel=1e-9, abs=1e-12)
        step = float(e["prediction"].row["step_time_s"])
        assert sum(op["time_s"] for op in e["prediction"].ops) == pytest.approx(step,
                                                                             rel=1e-9)
    assert main(["validate", "--explain", "dg_003"]) == 0
    out = capsys.readouterr().out
    assert "measured iter_time_s 34.168, predicted" in out
    assert "- MLA attention materialized" in out
    assert "model DeepSeek-V3: 61 layers" in out and "the row's stated configuration" in out
    assert "MoE expert GEMMs (grouped)" in out and "multi-token prediction" in out
    assert main(["validate", "--explain", "mb_185", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got[0]["id"] == "mb_185" and got[0]["ops"] and got[0]["metric"] == (
        "tokens_per_s_per_gpu")


def test_explain_prints_the_predict_command_that_gives_the_same(all_rows, capsys):
    """--explain's sweep predict command (the catalog job with the fields the row and its
    stack set, the catalog hardware with the row's system, every configuration column)
    prints the same step time and memory: rows of every kind of expression - a jobs/ model
    with stack settings on an NVL72 rack, a truncated model on SimuMax's measured node, a
    row that gives its dimensions on Jean Zay's Omni-Path, MosaicML's RoCE cluster."""
    import shlex

    from sweep.analysis.validate import explain

    ids = ["mb_179", "sm_003", "bloom_prequel_1", "mpt_a100_40gb_bf16_1b_s2048_g64_b640_m10",
           "nar21_t1_1",
           # (a second review: a shard group of the whole DP group and ZeRO without data
           # parallelism are written as the search enumerates them, 0)
           "tt24_t1_370", "sm_004"]
    for e in explain(all_rows, ids):
        argv = shlex.split(e["predict_command"])
        assert argv[:2] == ["sweep", "predict"]
        assert main(argv[1:] + ["--json"]) == 0, e["predict_command"]
        got = json.loads(capsys.readouterr().out)["result"]
        want = e["prediction"].row
        rid = e["case"].row["id"]
        assert got["step_time_s"] == pytest.approx(float(want["step_time_s"]), rel=1e-12), rid
        assert got["mem_bytes"] == pytest.approx(float(want["mem_bytes"]), rel=1e-12), rid
    assert main(["validate", "--explain", "mb_179"]) == 0
    assert "the same with sweep predict" in capsys.readouterr().out
    # a layout the search does not enumerate (fms-fsdp's 19 of 40 layers recomputed, a
    # virtual-stage count that does not divide a stage) says so instead
    for rid, why in (("fmsfsdp_13B_A100_eager", "first-k recompute is searched at"),
                     ("mb_178", "vpp = 8 needs pp > 1 and to divide")):
        command = explain(all_rows, [rid])[0]["predict_command"]
        assert command.startswith("(none: sweep predict's search does not enumerate") \
            and why in command, command
    # a single stage with a stated vp (dgxc's Llama 4 Maverick on H100): no interleaving,
    # which predict accepts
    single = explain(all_rows, ["dg_012"])[0]
    assert int(single["prediction"].row["vpp"]) == 1 and "vpp=1," in single["predict_command"]
    assert any("read as no interleaving" in a for a in single["case"].assumptions)


def test_explain_a_memory_only_row_and_each_id_once(all_rows, shipped, capsys):
    """A row that only reports running out of memory has no time to compare: its memory
    verdict instead; an id given twice is explained once; memory as validation compares it."""
    from sweep.analysis.validate import explain

    oom = next(r["id"] for r in shipped["rows"] if r["metric"] == "")
    got = explain(all_rows, [oom, " mb_185", "mb_185"])
    assert [e["case"].row["id"] for e in got] == [oom, "mb_185"]
    assert got[0]["predicted"] is None and not got[0]["feasible"]
    row = next(r for r in shipped["rows"] if r["id"] == "tt24_t4_381")
    mem = explain(all_rows, ["tt24_t4_381"])[0]
    assert mem["mem_compared_bytes"] / 2**30 == pytest.approx(row["mem_reported_GiB"])
    assert main(["validate", "--explain", oom]) == 0
    assert "measured: out of memory (no time published)" in capsys.readouterr().out
    assert main(["validate", "--explain", "mb_185", "--markdown"]) == 2
    assert "--markdown: not with --explain" in capsys.readouterr().err


def test_explain_names_an_unknown_or_refused_row_in_one_line(all_rows, capsys):
    assert main(["validate", "--explain", "mb_1855"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no row with that id in" in err
    assert "(nearest: mb_185" in err
    refused = express_all(all_rows)[1][0]
    assert main(["validate", "--explain", refused["id"]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the row is not expressed" in err
    assert refused["reason"] in err


def test_validate_console_script_runs(tmp_path, rows):
    _subset(rows, tmp_path / "mine.csv")
    script = [sys.executable, "-m", "sweep", "validate", "--data", str(tmp_path / "mine.csv"),
              "--no-loso", "--summary"]
    out = subprocess.run(script, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "leave-one-source-out" not in out.stdout and "expressed:" in out.stdout


def test_replicates_are_same_configuration_runs_and_their_spread(rows, capsys, tmp_path):
    base = next(r for r in rows if r["source"] == "Korthikanti2022" and r["iter_time_s"])
    again = dict(base, id="k22_again", iter_time_s=str(float(base["iter_time_s"]) * 1.1))
    other = dict(base, id="k22_fp8", precision="fp8 linears + bf16")  # not the same run
    n = _subset(rows, tmp_path / "mine.csv", [again, other])
    assert n > 2
    code = main(["validate", "--data", str(tmp_path / "mine.csv"), "--no-loso", "--json"])
    rep = yaml.safe_load(capsys.readouterr().out)
    assert code == 0
    groups = [g for g in rep["replicates"] if "k22_again" in g["ids"]]
    assert len(groups) == 1 and groups[0]["ids"] == [base["id"], "k22_again"]
    assert groups[0]["spread"] == pytest.approx(0.1)
    assert not any("k22_fp8" in g["ids"] for g in rep["replicates"])
    main(["validate", "--data", str(tmp_path / "mine.csv"), "--no-loso", "--summary"])
    assert f"  {base['id']}, k22_again: metric 10.0%" in capsys.readouterr().out


# ------------------------------------------------------------------------------ docs/model.md

def _readme_table(first_header: str) -> list[list[str]]:
    """Cells of docs/model.md's markdown table whose header row starts with ``first_header``."""
    lines = (REPO_ROOT / "docs" / "model.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith(f"| {first_header} |"))
    body = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        body.append([c.strip().strip("*`").strip() for c in line.strip("|").split("|")])
    return body


def _printed(value: float, text: str) -> bool:
    """``value`` rounds to the first number in ``text``, at that number's decimals."""
    printed = re.search(r"\d+(\.\d+)?", text).group()
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(value - float(printed)) <= 0.5 * 10.0**-decimals + 1e-9


def test_readme_parameter_table_is_the_calibration_file():
    from sweep.model.cost.calibrated import DEFAULT_PARAMETERS

    table = load_calibration(REPO_ROOT / "hardware" / "calibration.yaml")
    for name, _, ampere, hopper, blackwell, centre in _readme_table("parameter"):
        key = name.split()[0].strip("`")
        assert _printed(DEFAULT_PARAMETERS[key], centre), name
        if name.endswith("(all)"):
            assert _printed(table["memory"][key], ampere), name
            continue
        for generation, text in (("ampere", ampere), ("hopper", hopper),
                                 ("blackwell", blackwell)):
            if text in ("–", "-"):
                assert name not in table[generation], (name, generation)
            else:
                assert _printed(table[generation][name], text), (name, generation, text)


def test_readme_parameters_are_the_calibration_file_with_their_ranges():
    from sweep.analysis.calibration import load_ranges

    table = load_calibration(REPO_ROOT / "hardware" / "calibration.yaml")
    ranges = load_ranges()
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| parameter | Ampere |"))
    rows = [ln for ln in lines[start + 2:] if ln.startswith("| `")]
    assert len(rows) == 12
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        name = cells[0].strip("`")
        for generation, text in zip(("ampere", "hopper", "blackwell"), cells[1:4]):
            if text == "–":
                assert name not in table[generation] or name == "fused_attn_eff"
                continue
            value = table[generation][name]
            assert _printed(value, text.strip("*")), (name, generation, text)
            low, high, _ = ranges[generation][name]
            assert f"({low:g} – {high:g})" in text, (name, generation, text)
            outside = not low - 1e-9 <= value <= high + 1e-9
            assert text.startswith("**") == outside, (name, generation, text)


def test_markdown_states_the_overall_accuracy_with_or_without_refused_rows(shipped):
    from sweep.analysis.validate import markdown

    for refused in (shipped["refused"], {}):
        text = markdown({**shipped, "refused": refused}, ["x.csv"])
        line = next(ln for ln in text.splitlines() if ln.startswith("**All "))
        assert line.endswith(".") and ("refused)" in line) == bool(refused)


@pytest.mark.slow
@pytest.mark.timeout(LOSO_TIMEOUT_S)
def test_validation_md_is_what_validate_markdown_prints(shipped_loso):
    """docs/validation.md is generated (sweep validate --markdown): the same text, but for the
    leave-one-source-out figures, Powell re-fits to a tolerance that a different BLAS may
    land a little elsewhere (within 1 percentage point)."""
    from sweep.analysis.measured import SHIPPED
    from sweep.analysis.validate import markdown

    fresh = markdown(shipped_loso, [p.name for p in SHIPPED]).splitlines()
    shipped = (REPO_ROOT / "docs" / "validation.md").read_text().splitlines()
    assert len(fresh) == len(shipped)
    number = re.compile(r"\d+\.\d+ %")
    for new, old in zip(fresh, shipped):
        if new == old:
            continue
        # only LOSO cells may differ: the last two cells of a table row, or the summary
        assert number.sub("#", new) == number.sub("#", old), (new, old)
        if new.startswith("|"):
            assert new.split("|")[1:-3] == old.split("|")[1:-3], (new, old)
        for a, b in zip(number.findall(new), number.findall(old)):
            assert abs(float(a[:-2]) - float(b[:-2])) < 1.0, (new, old)


# ------------------------------------------------------------------------------ fitting

def test_the_prior_is_zero_at_its_centres_and_grows_in_log_space():
    from sweep.analysis.calibration import PRIOR_WEIGHT, log_prior
    from sweep.model.cost.calibrated import DEFAULT_PARAMETERS as centre

    names = ["gemm_eff", "nvl_eff", "kernel_us"]
    assert log_prior(names, [centre[n] for n in names]) == 0.0
    # twice or half the centre costs the same: PRIOR_WEIGHT x log(2)^2
    assert log_prior(["nvl_eff"], [2 * centre["nvl_eff"]]) == pytest.approx(
        PRIOR_WEIGHT * np.log(2.0) ** 2)
    assert log_prior(["nvl_eff"], [centre["nvl_eff"] / 2]) == pytest.approx(
        log_prior(["nvl_eff"], [2 * centre["nvl_eff"]]))
    # no kernel overhead at all is allowed: log((0 + 1) / (5 + 1))^2
    assert log_prior(["kernel_us"], [0.0]) == pytest.approx(
        PRIOR_WEIGHT * np.log(1.0 / (centre["kernel_us"] + 1.0)) ** 2)


def test_leaving_a_physical_range_costs_linearly_in_log_space():
    from sweep.analysis.calibration import RANGE_WEIGHT, range_penalty

    ranges = {"gemm_eff": (0.75, 1.0), "kernel_us": (1.6, 10.0)}
    assert range_penalty(["gemm_eff", "kernel_us"], [0.8, 5.0], ranges) == 0.0
    assert range_penalty(["gemm_eff"], [0.5], ranges) == pytest.approx(
        RANGE_WEIGHT * np.log(0.75 / 0.5))
    # 20 µs: log((20 + 1) / (10 + 1)); a parameter without a range pays nothing
    assert range_penalty(["kernel_us", "fp8_eff"], [20.0, 0.1], ranges) == pytest.approx(
        RANGE_WEIGHT * np.log(21.0 / 11.0))


def test_a_value_just_past_its_bound_is_put_on_it_when_the_runs_do_not_care():
    from sweep.analysis.calibration import _onto_bounds

    flat = _onto_bounds(lambda t: 0.0, np.array([0.7995, 0.5]), [(0.8, 1.0), (0.4, 0.6)])
    assert list(flat) == [0.8, 0.5]
    # a steep objective keeps it; further than 1 % away it is not touched
    steep = _onto_bounds(lambda t: 10.0 * t[0], np.array([0.7995]), [(0.8, 1.0)])
    assert list(steep) == [0.7995]
    far = _onto_bounds(lambda t: 0.0, np.array([0.6]), [(0.8, 1.0)])
    assert list(far) == [0.6]


def test_rounding_a_fitted_value_never_crosses_a_step_of_the_objective():
    from sweep.analysis.calibration import _rounded

    # a reserve fitted up to where a run just fits: rounding to 4 decimals would cross it
    def objective(theta):
        return float(theta[0] > 0.99996) + 1e-3 * (1.0 - theta[0])

    assert _rounded(objective, np.array([0.99995])) == [0.99995]
    assert _rounded(objective, np.array([0.51234567])) == [0.5123]  # no step nearby


@pytest.mark.slow  # (a whole calibration: 30 - 50 s on 2 cores; CI runs -m slow)
def test_calibrate_writes_the_shipped_parameters_again(tmp_path, capsys):
    """The calibration depends on the code and the data only: `sweep calibrate --write` on
    both shipped files, from the prior centres, writes hardware/calibration.yaml again (to
    2 %, whatever the BLAS), a file the catalog loads, with the generation that has no
    measured runs borrowed and saying so."""
    target = tmp_path / "calibration.yaml"
    code = main(["calibrate", "--write", "--output", str(target)])
    out = capsys.readouterr().out
    assert code == 0 and f"wrote {target}" in out
    fitted = load_calibration(target)
    shipped = load_calibration(REPO_ROOT / "hardware" / "calibration.yaml")
    assert set(fitted) == set(shipped) == {"volta", "ampere", "hopper", "blackwell", "memory"}
    for gen, values in shipped.items():
        assert set(fitted[gen]) == set(values), gen
        for name, value in values.items():
            assert fitted[gen][name] == pytest.approx(value, rel=0.02), (gen, name)
    assert fitted["volta"] == fitted["ampere"]
    assert "no measured runs" in yaml.safe_load(target.read_text())["fitted"]["borrowed"][
        "volta"]

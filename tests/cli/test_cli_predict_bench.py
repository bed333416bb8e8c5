"""`sweep predict` and `sweep bench` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sweep.cli import main
from tests.conftest import REPO


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_predict_table_rows_sum_to_the_step_time(capsys):
    code, out, _ = run(capsys, "predict", "--profile", "nersc2024", "--job", "gpt3_1T",
                       "--hardware", "nersc-B200", "--nvlink-domain", "8", "--gpus", "4096",
                       "--strategy", "2d",
                       "--config", "tp=4,tp2=1,pp=128,mbs=1", "--json")
    assert code == 0
    report = json.loads(out)
    step = report["result"]["step_time_s"]
    assert sum(op["time_s"] for op in report["ops"]) == pytest.approx(step, rel=1e-12)
    assert report["result"]["samples_per_s"] == pytest.approx(479.376, abs=5e-4)  # published
    names = [op["name"] for op in report["ops"]]
    assert names[:3] == ["fc1", "fc1-bias", "act1"] and names[-1] == "data-parallel comm"
    # the same time columns as the calibrated profile's rows (EP: none in nersc2024)
    assert all({"compute_s", "memory_s", "tp_comm_s", "cp_comm_s", "ep_comm_s",
                "other_s"} <= set(op) for op in report["ops"])
    code, text, _ = run(capsys, "predict", "--profile", "nersc2024", "--job", "gpt3_1T",
                        "--hardware", "nersc-B200", "--nvlink-domain", "8", "--gpus", "4096",
                        "--strategy", "2d",
                        "--config", "tp=4,tp2=1,pp=128,mbs=1")
    assert code == 0 and "fusedla" in text and "total" in text and "100.0%" in text


def test_calibrated_predict_json_has_no_per_op_flops_it_does_not_compute(capsys):
    """The calibrated op table itemises times only: its JSON rows carry no FLOPs or bytes
    (they read 0 before, as if measured); the totals are in the result."""
    code, out, _ = run(capsys, "predict", "--job", "llama3_8b", "--hardware", "H100-SXM",
                       "--gpus", "8", "--config", "tp=1,pp=1,mbs=1", "--json")
    assert code == 0
    report = json.loads(out)
    assert all(set(op) >= {"name", "time_s", "compute_s"} and
               not set(op) & {"flops", "weight_bytes", "act_bytes"} for op in report["ops"])
    assert report["result"]["hardware_flops"] > 0 and report["result"]["hfu"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--config", "tp=3"], "tp x pp = 3 does not divide 4096 GPUs"),
    (["--config", "tp=7,pp=1,dp=1"], "dp x tp x pp = 7, not 4096 GPUs"),
    (["--config", "tq=3"], "--config: unknown key 'tq'; valid: dp, tp"),
    (["--config", "tp=x"], "--config: tp: expected an integer, got 'x'"),
    (["--config", "tp=8,tp=4"], "--config: tp is given twice"),
    (["--strategy", "3d"], "--strategy: '3d' is not a strategy of nersc2024"),
])
def test_predict_bad_input_is_one_line_exit_2(capsys, argv, message):
    code, out, err = run(capsys, "predict", "--profile", "nersc2024", "--job", "gpt3_1T",
                         "--hardware", "nersc-B200", "--gpus", "4096", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize("argv, message", [
    (["--job", "llama3_70b", "--hardware", "H100-SXM", "--gpus", "256", "--config",
      "tp=8,pp=4,mbs=1,recompute=first-k,recompute_layers=2"],
     "first-k recompute is searched at recompute_layers = 5, 10, 15"),
    (["--job", "llama3_70b", "--hardware", "H100-SXM", "--gpus", "256", "--config",
      "tp=8,pp=4,mbs=1,recompute_layers=3"], "recompute_layers needs recompute = first-k"),
    (["--profile", "nersc2024", "--job", "gpt3_1T", "--hardware", "nersc-B200", "--gpus",
      "4096", "--config", "tp=4,pp=8,recompute=full"],
     "recompute = 2: nersc2024 searches tp, tp2 / cp, pp, dp, mbs"),
    (["--profile", "nersc2024", "--job", "gpt3_1T", "--hardware", "nersc-B200", "--gpus",
      "4096", "--config", "tp=4,pp=8,zero=1"], "zero = 1: nersc2024 searches"),
    # (an outside review: "sp / tp_overlap need tp > 1", and "the default configuration is
    # not a candidate" where no configuration exists at all)
    (["--job", "llama3_8b", "--hardware", "H100-SXM", "--gpus", "8", "--config", "sp=2"],
     "--config: sp: expected 0 or 1 (sequence parallelism), got 2"),
    # (a second outside review: an out-of-range switch, stage or policy is named as such)
    (["--job", "llama3_8b", "--hardware", "H100-SXM", "--gpus", "8", "--config",
      "cp=4,cp_comm=2"], "--config: cp_comm: expected 0 or 1 (context parallelism's K/V"),
    (["--job", "llama3_8b", "--hardware", "H100-SXM", "--gpus", "8", "--config", "zero=4"],
     "--config: zero: expected a ZeRO stage 0 - 3, got 4"),
    (["--job", "llama3_8b", "--hardware", "H100-SXM", "--gpus", "8", "--config",
      "recompute=9"], "--config: recompute: expected one of first, first-k"),
    (["--job", "llama3_8b", "--hardware", "H100-SXM", "--gpus", "64", "--config",
      "tp=3,recompute=full"], "tp=3,recompute=full is not a calibrated/1d candidate"),
    (["--job", "llama3_8b", "--hardware", "H100-SXM", "--gpus", "17"],
     "llama3_8b has no calibrated/1d configuration on 17 GPUs (the default layout"),
    (["--profile", "nersc2024", "--job", "gpt3_1T[training=false]", "--hardware",
      "nersc-B200", "--gpus", "4096"], "has training: false (forward only)"),
])
def test_predict_names_the_knob_the_search_does_not_try(capsys, argv, message):
    """A value the search never tries is named as such (it read "no NVLink placement
    matches the nv_* given" though no nv_* was given)."""
    code, out, err = run(capsys, "predict", *argv)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert message in err and "matches the nv_" not in err


@pytest.mark.parametrize("job, in_spec, message", [
    ("llama2_13b", "llama2_13b",
     "nersc2024 models a two-matrix GELU MLP; job llama2_13b has mlp: swiglu"),
    ("llama3_8b", "llama3_8b",
     "nersc2024 models multi-head attention with n_heads x head_dim = hidden"),
    ("gpt3_1T[dtype=fp8]", "{name: gpt3_1T, dtype: fp8}", "nersc2024 models 16-bit training"),
])
def test_predict_refuses_what_nersc2024_cannot_cost_as_a_spec_does(capsys, tmp_path, job,
                                                                   in_spec, message):
    """A job the published model would mis-cost (a SwiGLU MLP costed as GELU gave MFU
    83 % above HFU 72 %) is refused by predict as by a spec, in the same words."""
    code, out, err = run(capsys, "predict", "--profile", "nersc2024", "--job", job,
                         "--hardware", "H100-SXM", "--gpus", "64")
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err
    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: s\ncost_model: nersc2024\njobs: [{in_spec}]\ngpus: [64]\n"
                    "hardware: {base: nersc-B200}\n")
    code, _, err = run(capsys, "plan", str(spec))
    assert code == 2 and f"jobs[0]: {message}" in err


def test_unknown_hardware_lists_known(capsys, tmp_path):
    code, _, err = run(capsys, "predict", "--job", "gpt3_1T", "--hardware", "X900",
                       "--gpus", "8")
    assert code == 2 and "unknown hardware 'X900'" in err and "H100-SXM" in err
    # a file name that is not there: the path looked for, not jobs/<name>.yaml.yaml
    missing = tmp_path / "nothere.yaml"
    code, _, err = run(capsys, "predict", "--job", str(missing), "--hardware", "H100-SXM",
                       "--gpus", "8")
    assert code == 2 and err.count("\n") == 1
    assert f"job file '{missing}' not found (looked for {missing})" in err


@pytest.mark.slow  # (10 s: every workload run; CI runs it with the slow tests)
def test_bench_reports_rates(capsys):
    code, out, _ = run(capsys, "bench", "--repeat", "1", "--json")
    assert code == 0
    report = json.loads(out)
    assert [w["candidates"] for w in report["workloads"]] == [2544, 59390, 22712, 1316852,
                                                          3741066, 1140984, 929600]
    assert report["moe_candidates_per_core_second"] > 0
    assert report["hybrid_candidates_per_core_second"] > 0
    many = report["workloads"][-1]  # 400 hardware variants of one 2,324-candidate space
    assert many["cases"] == 400 and many["candidates"] == 400 * 2324
    assert report["many_case_us_per_case"] == pytest.approx(1e6 * many["cpu_seconds"] / 400)
    assert all(w["candidates_per_core_second"] > 0 for w in report["workloads"])


def test_bench_only_times_the_named_workloads(capsys):
    code, out, _ = run(capsys, "bench", "--repeat", "1", "--only", "1D B200 nvs8 4096",
                       "--json")
    assert code == 0
    report = json.loads(out)
    assert [w["workload"] for w in report["workloads"]] == ["gpt3_1T 1d B200 nvs8 4096"]
    assert report["workloads"][0]["candidates"] == 2544
    assert report["standard_candidates_per_core_second"] == \
        report["workloads"][0]["candidates_per_core_second"] > 0
    assert report["moe_candidates_per_core_second"] is None
    assert report["hybrid_candidates_per_core_second"] is None
    assert report["many_case_us_per_case"] is None
    code, out, _ = run(capsys, "bench", "--repeat", "1", "--only", "1d B200 nvs8 4096")
    assert code == 0 and "standard workloads together" in out and "mixture" not in out
    code, _, err = run(capsys, "bench", "--only", "nothing")
    assert code == 2 and err.count("\n") == 1
    assert "--only nothing: no workload matches; workloads: gpt3_1T 1d" in err


def test_console_script_and_module_entry_points():
    script = Path(sys.executable).parent / "sweep"
    for cmd in ([str(script), "--version"], [sys.executable, "-m", "sweep", "--version"]):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith("sweep ")


def test_predict_names_a_pipeline_split_that_leaves_a_stage_empty(capsys):
    # 80 layers over 32 stages: 31 stages of 3 hold 93 > 80, the last holds none
    code, out, err = run(capsys, "predict", "--job", "llama3_70b", "--hardware", "H100-SXM",
                         "--gpus", "256", "--config", "tp=8,pp=32")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "32 stages of ceil(80 / 32) layers leave the last without one" in err


def test_predict_takes_recompute_by_the_names_it_prints():
    from sweep.analysis.predict import parse_config
    from sweep.analysis.show import RECOMPUTE_NAMES
    from sweep.errors import SweepError

    for code, name in RECOMPUTE_NAMES.items():  # (what predict prints: recompute=none)
        assert parse_config(f"recompute={name},tp=2") == {"recompute": code, "tp": 2}
    assert parse_config("recompute=op") == parse_config("recompute=4")  # (show's rc=op)
    with pytest.raises(SweepError, match="expected an integer or one of first, first-k"):
        parse_config("recompute=most")


def test_predict_says_2d_is_for_dense_blocks(capsys):
    code, out, err = run(capsys, "predict", "--job", "qwen3_30b_a3b", "--hardware", "H100-SXM",
                         "--gpus", "8", "--strategy", "2d")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "SUMMA is modelled for dense multi-head blocks only; job qwen3_30b_a3b has MoE" in err


@pytest.mark.slow  # (eight predictions, ~16 s; CI runs -m slow)
def test_predict_takes_the_labels_show_prints(capsys, tmp_path):
    """A case of a spec with job overrides and a grid point, by the labels show prints,
    predicts what a job file with that override on that hardware does (before, the label was
    refused and the catalog's bf16 job used); --config may be given in parts."""
    job = tmp_path / "q.yaml"
    job.write_text((REPO / "jobs" / "qwen3_30b_a3b.yaml").read_text().replace(
        "\ndtype: bf16", "\ndtype: mxfp8"))
    hw = tmp_path / "g.yaml"
    hw.write_text((REPO / "hardware" / "GB200-NVL72.yaml").read_text().replace(
        "\nnvlink_domain: 72", "\nnvlink_domain: 8"))
    config = ["--gpus", "32", "--config", "dp=32,tp=1,pp=1,mbs=8,ep=32", "--config",
              "a2a_overlap=1", "--json"]
    by_label = json.loads(run(capsys, "predict", "--job", "qwen3_30b_a3b[dtype=mxfp8]",
                              "--hardware", "GB200-NVL72[nvlink_domain=8]", *config)[1])
    by_file = json.loads(run(capsys, "predict", "--job", str(job), "--hardware", str(hw),
                             *config)[1])
    assert by_label["result"]["step_time_s"] == by_file["result"]["step_time_s"]
    assert by_label["result"]["a2a_overlap"] == 1 and by_label["nvlink_domain"] == 8
    assert by_label["job"] == "qwen3_30b_a3b[dtype=mxfp8]"
    # a quantity axis given with units in a spec (hbm_bandwidth: ['8 TB/s']) is labelled in
    # SI, as a bare number (refused before: "a bare number has no unit")
    hw = tmp_path / "g6.yaml"  # (a new file: the catalog keeps what it read)
    hw.write_text((tmp_path / "g.yaml").read_text().replace("\nhbm_GBps: 8000",
                                                            "\nhbm_GBps: 6000"))
    assert "\nhbm_GBps: 6000" in hw.read_text()
    by_label = json.loads(run(capsys, "predict", "--job", "qwen3_30b_a3b[dtype=mxfp8]",
                              "--hardware", "GB200-NVL72[nvlink_domain=8,hbm_bandwidth=6e+12]",
                              *config)[1])
    by_file = json.loads(run(capsys, "predict", "--job", str(job), "--hardware", str(hw),
                             *config)[1])
    assert by_label["result"]["step_time_s"] == by_file["result"]["step_time_s"]
    # a per-precision peak table in a label (what a zip axis of tables sets): the commas
    # inside it do not split the label (it was cut at the first: 'not a YAML value')
    hw = tmp_path / "g7.yaml"
    hw.write_text((tmp_path / "g.yaml").read_text().replace(
        "\nmatrix_tflops: {bf16: 2500, fp16: 2500, fp8: 5000,",
        "\nmatrix_tflops: {bf16: 2000, fp16: 2500, fp8: 7000,"))
    assert "bf16: 2000, fp16: 2500, fp8: 7000," in hw.read_text()
    by_label = json.loads(run(capsys, "predict", "--job", "qwen3_30b_a3b[dtype=mxfp8]",
                              "--hardware", "GB200-NVL72[nvlink_domain=8,matrix_tflops={bf16: "
                              "2000, fp8: 7000}]", *config)[1])
    by_file = json.loads(run(capsys, "predict", "--job", str(job), "--hardware", str(hw),
                             *config)[1])
    # (the label holds the catalog entry's exponential rate where the file derives it from
    # its own 16-bit peak - a grid that sweeps the tensor peak keeps the SFUs - so their
    # attention times differ; the step is the overlapped all-to-all's, compute + (a2a -
    # compute), equal but for the last bits: 1e-12)
    assert by_label["result"]["step_time_s"] == pytest.approx(
        by_file["result"]["step_time_s"], rel=1e-12)
    for argv, message in (
            (["--job", "qwen3_30b_a3b[dtype=mxfp9]"], "--job: dtype: expected one of"),
            (["--job", "qwen3_30b_a3b[dtype]"], ("--job: 'dtype' in 'qwen3_30b_a3b[dtype]' is "
                                                 "not key=value")),
            (["--hardware", "B200[memory=2]"], ("--hardware: memory in 'B200[memory=2]' is not a "
                                                "hardware parameter: a zip or interpolate axis")),
            # (the label named 72 and the prediction used 8: an outside test's finding)
            (["--hardware", "B200[nvlink_domain=72]", "--nvlink-domain", "8"],
             "--nvlink-domain 8 contradicts nvlink_domain=72 in --hardware")):
        argv = {"--job": "qwen3_30b_a3b", "--hardware": "B200", **dict(zip(argv[::2], argv[1::2]))}
        code, out, err = run(capsys, "predict", "--gpus", "8",
                             *[x for kv in argv.items() for x in kv])
        assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("argv", [["run", "--limit", "0", "x.yaml"],
                                  ["predict", "--gpus", "0", "--job", "a", "--hardware", "b"],
                                  ["predict", "--nvlink-domain", "100000000", "--gpus", "8",
                                   "--job", "a", "--hardware", "b"],
                                  ["plan", "--ranks", "99999999999", "x.yaml"],
                                  ["plan", "--max-memory=-1GiB", "x.yaml"],
                                  ["run", "--max-memory", "0B", "x.yaml"],
                                  ["frobnicate"], []])
def test_an_argument_error_is_one_line_and_exit_2(capsys, argv):
    """Bad arguments (argparse's own checks) are one line and exit 2 like every other bad
    input, not the usage block first."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "error:" in err
    assert "--help)" in err and "usage:" not in err


def test_an_unknown_option_names_its_subcommand_and_other_ranks_keep_quiet(capsys,
                                                                         monkeypatch):
    """'sweep show F --all' pointed at 'sweep --help'; under mpiexec -n 4 every rank printed
    the same line (from an outside tester)."""
    with pytest.raises(SystemExit) as exc:
        main(["show", "x.h5", "--all"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err == "sweep show: error: unrecognized arguments: --all (see sweep show --help)\n"
    monkeypatch.setenv("PMI_RANK", "3")
    with pytest.raises(SystemExit) as exc:
        main(["run", "--limit", "0", "x.yaml"])
    assert exc.value.code == 2 and capsys.readouterr().err == ""
    monkeypatch.setenv("PMI_RANK", "0")
    with pytest.raises(SystemExit):
        main(["run", "--limit", "0", "x.yaml"])
    assert capsys.readouterr().err.startswith("sweep run: error: argument --limit")


def test_hardware_without_a_generation_is_refused_by_the_calibrated_profile(capsys, tmp_path):
    """The fitted parameters are per GPU generation: a user's file without one was costed
    with none of them (an H100 file 1.5 x faster than with generation: hopper)."""
    import pathlib

    shipped = pathlib.Path(__file__).resolve().parents[2] / "hardware" / "H100-SXM.yaml"
    (tmp_path / "hardware").mkdir()
    own = tmp_path / "hardware" / "nogen.yaml"
    own.write_text("".join(line for line in shipped.read_text().splitlines(keepends=True)
                           if not line.startswith("generation")))
    code, out, err = run(capsys, "predict", "--job", "llama3_8b", "--hardware", str(own),
                         "--gpus", "64")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"{own}: generation: missing; the calibrated profile's parameters" in err
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\njobs: [llama3_8b]\ngpus: [64]\nhardware: {base: nogen}\n")
    code, _, err = run(capsys, "plan", str(spec))
    assert code == 2 and f"{own}: generation: missing" in err
    # the published model reads no calibrated parameter: the file is fine there
    code, out, _ = run(capsys, "predict", "--profile", "nersc2024", "--job", "gpt3_1T",
                       "--hardware", str(own), "--gpus", "4096")
    assert code == 0 and "step time" in out


def test_a_configuration_that_never_fits_is_answered_by_its_fastest_placement(capsys):
    """No candidate of tp=8, mbs=4 fits a 70B model on 64 H100: of those needing the least
    memory (every NVLink placement of the same layout needs the same), predict answers with
    the fastest - TP inside the node, not spread over eight."""
    argv = ["predict", "--job", "llama3_70b", "--hardware", "H100-SXM", "--gpus", "64",
            "--config", "tp=8,pp=1,cp=1,mbs=4,recompute=none,zero=1,sp=1,tp_overlap=1",
            "--json"]
    code, out, _ = run(capsys, *argv)
    assert code == 0
    chosen = json.loads(out)["result"]
    assert not chosen["feasible"] and chosen["nv_tp"] == 8
    code, out, _ = run(capsys, *argv[:-2], argv[-2] + ",nv_tp=1", "--json")
    spread = json.loads(out)["result"]
    assert spread["mem_bytes"] == chosen["mem_bytes"]
    assert spread["step_time_s"] > 2 * chosen["step_time_s"]


def test_predict_prints_how_context_parallelism_exchanges_k_and_v(capsys):
    """cp_comm changes the time, so the config line names it (a ring, 0, or one
    all-gather, 1) whenever cp > 1."""
    lines = {}
    for comm in (0, 1):
        code, out, _ = run(capsys, "predict", "--job", "llama3_8b", "--hardware", "H100-SXM",
                           "--gpus", "64", "--config", f"cp_comm={comm},cp=4,tp=1,pp=1,mbs=1,"
                           "zero=1,recompute=none,nv_cp=4")
        assert code == 0
        lines[comm] = next(x for x in out.splitlines() if x.startswith("config:"))
    assert lines[0].endswith("cp_comm=0") and lines[1].endswith("cp_comm=1")


def test_tp_overlap_needs_the_tp_group_inside_one_nvlink_domain(capsys):
    """Transformer Engine's userbuffers overlap runs between the TP group's GPUs over NVLink
    (TE issue #1071, PR #1470): a layout that pins TP across domains with the overlap is
    not runnable (Reason.NOT_EXPRESSIBLE), the search never returns it, and predict says so;
    left free, the placement keeps the TP pair inside a domain."""
    argv = ("predict", "--job", "llama3_8b", "--hardware", "B200", "--gpus", "16", "--json",
            "--config")
    code, out, _ = run(capsys, *argv, "tp=2,sp=1,tp_overlap=1,mbs=1,nv_tp=1,nv_dp=8")
    assert code == 0
    row = json.loads(out)["result"]
    assert not row["feasible"] and row["reason"] == "not_expressible"
    code, text, _ = run(capsys, *argv[:-2], "--config",
                        "tp=2,sp=1,tp_overlap=1,mbs=1,nv_tp=1,nv_dp=8")
    assert "INFEASIBLE: not runnable: TP communication overlap" in text
    code, out, _ = run(capsys, *argv, "tp=2,sp=1,tp_overlap=1,mbs=1")
    row = json.loads(out)["result"]
    assert row["feasible"] and row["nv_tp"] == 2
    # without the overlap TP may cross the NICs (NCCL): runnable
    code, out, _ = run(capsys, *argv, "tp=2,sp=1,tp_overlap=0,mbs=1,nv_tp=1,nv_dp=8")
    assert json.loads(out)["result"]["reason"] == "ok"


def test_a_label_quotes_what_yaml_would_misread(tmp_path, capsys):
    """A spec's override ``mtp_pattern: "*E"`` (a YAML alias unquoted) and an empty string
    (null unquoted) are labelled quoted, and sweep predict takes the label as printed."""
    from sweep.engine.spec import load_spec

    spec = tmp_path / "s.yaml"
    spec.write_text('name: s\njobs: [{name: nemotron_3_nano, mtp_layers: 1, mtp_pattern: "*E",'
                    ' mtp_shared: true}, {name: nemotron_3_super, mtp_layers: 0}]\n'
                    'gpus: [8]\nhardware: {base: B200}\nstrategies: [1d]\n')
    jobs = load_spec(str(spec)).jobs
    assert jobs[0].name == 'nemotron_3_nano[mtp_layers=1,mtp_pattern="*E",mtp_shared=True]'
    out = json.loads(run(capsys, "predict", "--job", jobs[0].name, "--hardware", "B200",
                         "--gpus", "8", "--config", "dp=8,tp=1,pp=1,mbs=1,ep=8", "--json")[1])
    assert out["job"] == jobs[0].name and out["result"]["step_time_s"] > 0
    from sweep.cli.predict import _label
    from sweep.engine.catalog import label_value

    # every value comes back through the label's key=value list as it went in, a text with
    # a comma, brackets, braces, an equals sign or quotes among them (an outside review: a
    # note "lr sweep,mtp_layers=0" came back as a second override)
    values = ("", "*E", "M-*", "null", "~", "yes", "1e3", "0x10", 8192, 0.5, 1e-07, True,
              "mxfp8", "lr sweep,mtp_layers=0", "a{b", "x]y", 'say "hi", twice', "a\\b",
              "tab\there", "é")
    label = "j[" + ",".join(f"k{i}={label_value(v)}" for i, v in enumerate(values)) + "]"
    name, overrides = _label(label, "--job")
    assert name == "j" and overrides == {f"k{i}": v for i, v in enumerate(values)}
    assert label_value("mxfp8") == "mxfp8" and label_value(8192) == "8192"  # (unquoted)

"""The sbatch scripts are pure functions of the templates and the options (golden files)."""

from __future__ import annotations

import dataclasses
import difflib
import os

import pytest

from sweep.cli import main
from sweep.engine.slurm import TEMPLATE, SbatchOptions, render_sbatch, render_scripts
from sweep.errors import SweepError
from tests.conftest import REPO

GOLDEN_DIR = REPO / "tests" / "golden"
GOLDEN = GOLDEN_DIR / "sweep.sbatch"
OPTIONS = SbatchOptions(spec="/home/u/specs/big sweep.yaml", out="/scratch/u/results/big",
                        job_name="big", python="/home/u/venv/bin/python", workdir="/home/u",
                        version="0.0.0", nodes=4, ntasks_per_node=128, time="02:00:00",
                        partition="regular", account="m1234",
                        setup=("module load cray-mpich",), extra=(("qos", "debug"),),
                        mpi="pmi2")


ARRAY = dataclasses.replace(OPTIONS, nodes=1, ntasks_per_node=64, shards=16, max_running=4)


@pytest.mark.parametrize("options, name", [(OPTIONS, "sweep.sbatch"),
                                           (ARRAY, "sweep-array.sbatch"),
                                           (ARRAY, "reduce.sbatch")])
def test_render_matches_golden(options, name):
    golden = GOLDEN_DIR / name
    text = render_scripts(options)[name]
    if os.environ.get("SWEEP_RECORD_GOLDEN") == "1":  # re-record after an intended change
        golden.write_text(text)
    expected = golden.read_text()
    if text != expected:
        diff = "\n".join(difflib.unified_diff(expected.splitlines(), text.splitlines(),
                                              "golden", "rendered", lineterm=""))
        pytest.fail(f"rendered script differs from {golden}:\n{diff}\n"
                    f"If the change is intended, re-record with SWEEP_RECORD_GOLDEN=1.")


def test_an_array_has_its_scripts_and_runs_shards():
    assert list(render_scripts(OPTIONS)) == ["sweep.sbatch"]
    scripts = render_scripts(ARRAY)
    assert list(scripts) == ["sweep-array.sbatch", "reduce.sbatch"]
    assert "#SBATCH --array=0-15%4\n" in scripts["sweep-array.sbatch"]
    assert '--shard "${SLURM_ARRAY_TASK_ID}/16"' in scripts["sweep-array.sbatch"]
    assert "sweep reduce" not in scripts["sweep-array.sbatch"]
    assert scripts["reduce.sbatch"].splitlines()[-1].endswith(
        "-m sweep reduce /scratch/u/results/big")


@pytest.mark.parametrize("change, message", [
    ({"time": "two hours"}, "--time: 'two hours' is not a Slurm time"),
    ({"launcher": "aprun"}, "--launcher: 'aprun'"),
    ({"extra": (("q o s", "x"),)}, "--sbatch: 'q o s' is not an sbatch option name"),
    # an option the script sets itself: a second, contradicting #SBATCH line
    ({"extra": (("nodes", "4"),)}, "--sbatch nodes: the script sets it; use --nodes"),
    ({"extra": (("qos", "x"), ("t", "5"))}, "--sbatch t: the script sets it; use --time"),
    ({"extra": (("array", "0-3"),)}, "--sbatch array: the script sets it; use --array K"),
    ({"nodes": 0}, "--nodes and --ntasks-per-node must be positive"),
    ({"max_running": 2}, "--max-running limits a job array: give --array K too"),
    ({"shards": -1}, "--array and --max-running must not be negative"),
    ({"shards": 21474}, "--array 21474: at most 21,473 shards"),
    ({"job_name": "big\n"}, "--job-name: 'big\\\\n': expected letters"),
    ({"job_name": "a b"}, "--job-name: 'a b'"),
    ({"partition": "debug\n#SBATCH --x"}, "--partition: .* contains a control character"),
    ({"setup": ("module load x\nrm -rf ~",)}, "--setup: .* contains a control character"),
    ({"mpi": "pmix;rm"}, "--mpi: 'pmix;rm' is not an srun MPI plugin name"),
    ({"mpi": "pmix", "launcher": "mpiexec"}, "--mpi chooses srun's MPI plugin"),
])
def test_bad_options(change, message):

    with pytest.raises(SweepError, match=message.replace("(", r"\(")):
        render_sbatch(TEMPLATE.read_text(), dataclasses.replace(OPTIONS, **change))


def test_srun_uses_the_site_mpi_plugin_unless_one_is_named():
    site = render_sbatch(TEMPLATE.read_text(), dataclasses.replace(OPTIONS, mpi=None))
    assert "\nsrun --kill-on-bad-exit=1 " in site and "--mpi" not in site
    pmix = render_sbatch(TEMPLATE.read_text(), dataclasses.replace(OPTIONS, mpi="pmix"))
    assert "\nsrun --mpi=pmix --kill-on-bad-exit=1 " in pmix


def test_values_are_quoted():
    text = render_sbatch(TEMPLATE.read_text(), OPTIONS)
    assert "'/home/u/specs/big sweep.yaml'" in text
    assert "srun --mpi=pmi2" in text and "--resume" in text
    assert text.splitlines()[-1].endswith("-m sweep reduce /scratch/u/results/big")


def test_set_overrides_reach_the_run_line_quoted(tmp_path, capsys):
    """sweep slurm --set: the job runs the spec with the same overrides (sweep plan and run
    had --set, slurm did not: a slice could not be submitted without copying the spec)."""
    text = render_sbatch(TEMPLATE.read_text(), dataclasses.replace(
        OPTIONS, overrides=("gpus=256", "hardware.grid.nvlink_domain=[8, 72]")))
    spec_line = next(x for x in text.splitlines() if x.startswith("spec=("))
    assert "big sweep.yaml' --set gpus=256 --set 'hardware.grid.nvlink_domain=[8, 72]')" \
        in spec_line
    run_line = next(x for x in text.splitlines() if " -m sweep run " in x)
    assert 'sweep run "${spec[@]}" --out' in run_line
    with pytest.raises(SweepError, match="--set: .* contains a control character"):
        render_sbatch(TEMPLATE.read_text(), dataclasses.replace(OPTIONS, overrides=("a=1\nb",)))
    spec = REPO / "specs" / "quickstart.yaml"
    assert main(["slurm", str(spec), "--set", "gpus=[128]", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "--set 'gpus=[128]'" in out
    assert main(["slurm", str(spec), "--set", "gpus=abc"]) == 2
    assert "gpus[0]: expected a positive integer" in capsys.readouterr().err
    # a folder that holds a run of the spec before --set: the job would stop on it, so
    # slurm says so at once (it rendered the script without a word)
    (tmp_path / "o" / "spec.yaml").write_text("name: quickstart\n")
    assert main(["slurm", str(spec), "--set", "gpus=[128]", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a run of another spec" in err


def test_more_ranks_than_work_units_gets_a_note(tmp_path, capsys):
    from sweep.cli import main
    from tests.conftest import DATA

    small = str(DATA / "specs" / "small.yaml")  # 38 work units
    assert main(["slurm", small, "--ntasks-per-node", "8", "--array", "4", "--out",
                 str(tmp_path / "o")]) == 0
    assert "nothing to do" not in capsys.readouterr().err
    assert (tmp_path / "o" / "sweep-array.sbatch").exists()
    assert main(["slurm", small, "--ntasks-per-node", "8", "--array", "5", "--out",
                 str(tmp_path / "o")]) == 0
    assert "38 work units for 40 ranks, so 2 would have nothing to do" in capsys.readouterr().err


@pytest.mark.parametrize("text, seconds", [
    ("10", 600), ("120", 7200), ("1:30", 90), ("02:00:00", 7200), ("100:00:00", 360000),
    ("2-12", 216000), ("2-12:30", 217800), ("1-00:00:30", 86430), ("UNLIMITED", None),
    ("infinite", None), ("0", None), ("00:00:00", None)])
def test_slurm_time_forms(text, seconds):
    from sweep.engine.slurm import time_limit_s

    assert time_limit_s(text) == seconds


def test_a_time_limit_below_the_estimate_gets_a_note(tmp_path, capsys):
    from sweep.cli import main
    from tests.conftest import DATA

    small = str(DATA / "specs" / "small.yaml")  # well under a core-second
    assert main(["slurm", small, "--time", "1:00", "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "core-seconds of search at this machine's speed" in err and "of --time" not in err
    quick = str(REPO / "specs" / "quickstart.yaml")  # seconds of search on one rank
    assert main(["slurm", quick, "--time", "0:01", "--out", str(tmp_path / "q")]) == 0
    assert "of --time 0:01; the job may stop at its limit" in capsys.readouterr().err
    assert main(["slurm", small, "--time", "1:2:3:4"]) == 2
    assert "--time: '1:2:3:4' is not a Slurm time" in capsys.readouterr().err


def test_a_rendered_script_finds_its_log_folder(tmp_path, capsys):
    """Rendered without --submit (to be submitted by hand), the script's log folder - the
    run folder, which Slurm does not create - exists; --wait without --submit is refused."""
    from sweep.cli import main
    from tests.conftest import DATA

    small = str(DATA / "specs" / "small.yaml")
    assert main(["slurm", small, "--out", str(tmp_path / "o")]) == 0
    script = capsys.readouterr().out
    assert f"--output={tmp_path / 'o'}/slurm-%j.out" in script.replace("'", "")
    assert (tmp_path / "o").is_dir()
    assert main(["slurm", small, "--out", str(tmp_path / "w"), "--wait"]) == 2
    assert "--wait: only with --submit" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_bad_options_are_refused_before_the_estimate_is_printed(tmp_path, capsys):
    from sweep.cli import main
    from tests.conftest import DATA

    code = main(["slurm", str(DATA / "specs" / "small.yaml"), "--job-name", "x\n",
                 "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and "--job-name" in err, err


@pytest.mark.parametrize("options, name", [(OPTIONS, "sweep.sbatch"),
                                           (ARRAY, "sweep-array.sbatch")])
def test_a_resubmission_runs_the_spec_the_run_recorded(tmp_path, options, name):
    """Once the run folder holds spec.yaml (the spec as the run recorded it, its jobs and
    hardware resolved), the script runs that: a job or hardware file edited between
    submissions no longer stops every task with "the spec changed since this run started".
    The script's own lines run in bash, the launcher replaced by echo."""
    import subprocess

    out = tmp_path / "run folder"
    text = render_scripts(dataclasses.replace(options, out=str(out), setup=(),
                                              overrides=("top_n=2",)))[name]
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("spec=("))
    run_line = next(line for line in lines[start:] if " sweep run " in line)
    body = "\n".join(lines[start:start + 2] + ["echo " + run_line.split(" -m sweep ", 1)[1]])

    def ran() -> str:
        env = dict(os.environ, SLURM_ARRAY_TASK_ID="3")
        return subprocess.run(["bash", "-euo", "pipefail", "-c", body], env=env, check=True,
                              capture_output=True, text=True).stdout

    assert ran().startswith(f"run {options.spec} --set top_n=2 --out {out}")
    out.mkdir()
    (out / "spec.yaml").write_text("name: big\n")
    assert ran().startswith(f"run {out / 'spec.yaml'} --out {out}")

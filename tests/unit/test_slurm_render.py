"""The sbatch script is a pure function of the template and the options (golden file)."""

from __future__ import annotations

import difflib

import pytest

from sweep.errors import SweepError
from sweep.slurm import TEMPLATE, SbatchOptions, render_sbatch
from tests.conftest import REPO

GOLDEN = REPO / "tests" / "golden" / "sweep.sbatch"
OPTIONS = SbatchOptions(spec="/home/u/specs/big sweep.yaml", out="/scratch/u/results/big",
                        job_name="big", python="/home/u/venv/bin/python", workdir="/home/u",
                        version="0.0.0", nodes=4, ntasks_per_node=128, time="02:00:00",
                        partition="regular", account="m1234",
                        setup=("module load cray-mpich",), extra=(("qos", "debug"),))


def test_render_matches_golden():
    text = render_sbatch(TEMPLATE.read_text(), OPTIONS)
    expected = GOLDEN.read_text()
    if text != expected:
        diff = "\n".join(difflib.unified_diff(expected.splitlines(), text.splitlines(),
                                              "golden", "rendered", lineterm=""))
        pytest.fail(f"rendered script differs from {GOLDEN}:\n{diff}\n"
                    f"If the change is intended, delete {GOLDEN} and rerun to re-record.")


@pytest.mark.parametrize("change, message", [
    ({"time": "two hours"}, "--time: 'two hours' is not a Slurm time"),
    ({"launcher": "aprun"}, "--launcher: 'aprun'"),
    ({"extra": (("q o s", "x"),)}, "--sbatch: 'q o s' is not an sbatch option name"),
    ({"nodes": 0}, "--nodes and --ntasks-per-node must be positive"),
])
def test_bad_options(change, message):
    import dataclasses

    with pytest.raises(SweepError, match=message.replace("(", r"\(")):
        render_sbatch(TEMPLATE.read_text(), dataclasses.replace(OPTIONS, **change))


def test_values_are_quoted():
    text = render_sbatch(TEMPLATE.read_text(), OPTIONS)
    assert "'/home/u/specs/big sweep.yaml'" in text
    assert "srun --mpi=pmi2" in text and "--resume" in text
    assert text.splitlines()[-1].endswith("-m sweep reduce /scratch/u/results/big")

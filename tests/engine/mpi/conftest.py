"""Helpers to launch ``sweep`` under a real ``mpiexec`` (the one next to this Python).

``SWEEP_TEST_MPIEXEC`` names another launcher (with its options), e.g. Debian's Open MPI:
``SWEEP_TEST_MPIEXEC="/usr/bin/mpirun --oversubscribe"`` (CI runs the fault tests that way
from a venv without the ``mpich`` extra)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
MPIEXEC = shutil.which("mpiexec", path=str(BIN)) or shutil.which("mpiexec")
LONG = Path(__file__).parents[2] / "data" / "specs" / "long.yaml"
LAUNCHER = shlex.split(os.environ.get("SWEEP_TEST_MPIEXEC", "")) or [MPIEXEC]


def mpiexec(n: int, *args: str, env: dict | None = None, timeout: float = 300,
            popen: bool = False):
    """Run ``mpiexec -n N python -m mpi4py -m sweep ARGS``; returns CompletedProcess."""
    if LAUNCHER[0] is None:
        pytest.skip("no mpiexec (install the 'mpich' extra)")
    cmd = [*LAUNCHER, "-n", str(n), sys.executable, "-m", "mpi4py", "-m", "sweep", *args]
    full_env = {**os.environ, **(env or {})}
    full_env.pop("SLURM_STEP_NUM_TASKS", None)
    if popen:
        return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)


def tables(path):
    """(top table bytes, cases table bytes, file attributes) of a results file."""
    import h5py

    with h5py.File(path, "r") as f:
        return f["top"][:].tobytes(), f["cases"][:].tobytes(), dict(f.attrs)


@pytest.fixture(scope="session")
def long_reference(tmp_path_factory):
    """The tables of an uninterrupted 2-rank run of tests/data/specs/long.yaml, which the
    interrupted and resumed runs of several tests must reproduce."""
    out = tmp_path_factory.mktemp("ref") / "long"
    proc = mpiexec(2, "run", str(LONG), "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    return tables(out / "sweep.h5")

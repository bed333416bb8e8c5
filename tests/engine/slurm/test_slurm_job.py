"""A real Slurm: submit a sweep with `sweep slurm --submit --wait`, and refuse srun without
an MPI plugin. Skipped where no Slurm answers, unless SWEEP_REQUIRE_SLURM=1 (CI starts one
with .ci/start_slurm.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from sweep.engine.parallel import SerialComm
from sweep.engine.runner import RunOptions, run_sweep
from tests.conftest import DATA

pytestmark = pytest.mark.slurm

SMALL = str(DATA / "specs" / "small.yaml")
BIN = Path(sys.executable).parent


def slurm_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module", autouse=True)
def need_slurm():
    if not slurm_up():
        if os.environ.get("SWEEP_REQUIRE_SLURM") == "1":
            pytest.fail("SWEEP_REQUIRE_SLURM=1 but no Slurm answers (sinfo)")
        pytest.skip("no Slurm cluster here (start one with .ci/start_slurm.sh)")


def env():
    e = dict(os.environ)
    e["PATH"] = f"{BIN}:{e.get('PATH', '')}"
    for k in [k for k in e if k.startswith("SLURM_") and k != "SLURM_CONF"]:
        del e[k]
    return e


def test_submit_wait_and_reduce(tmp_path):
    out = tmp_path / "slurm-run"
    proc = subprocess.run([str(BIN / "sweep"), "slurm", SMALL, "--ntasks-per-node", "2",
                           "--mpi", "pmi2", "--time", "10", "--out", str(out), "--submit",
                           "--wait", "--wait-timeout", "600"], capture_output=True, text=True,
                          timeout=900, env=env(), cwd=tmp_path)
    log = "".join(p.read_text() for p in out.glob("slurm-*.out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr + log
    assert "COMPLETED" in proc.stdout
    serial = run_sweep(SMALL, SerialComm(), RunOptions(out_dir=tmp_path / "serial"))
    with h5py.File(out / "sweep.h5", "r") as a, h5py.File(serial.reduced.path, "r") as b:
        assert a.attrs["complete"] and a.attrs["ranks"] == "[2]"
        assert a["top"][:].tobytes() == b["top"][:].tobytes()
        assert a["cases"][:].tobytes() == b["cases"][:].tobytes()
    assert len(list(out.glob("part-*.h5"))) == 2


def test_srun_without_mpi_plugin_is_refused(tmp_path):
    """Tasks that MPI sees as singletons each refuse the run. (--kill-on-bad-exit=0: the
    first task to refuse would otherwise get the other one killed before it speaks.)"""
    out = tmp_path / "singletons"
    proc = subprocess.run(["srun", "-n", "2", "--mpi=none", "--kill-on-bad-exit=0",
                           str(BIN / "sweep"), "run", SMALL, "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env(), cwd=tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.count("started as 2 tasks but MPI sees a world of 1 rank") == 2
    assert not out.exists()


def test_job_array_then_reduce_and_a_failed_array_cancels_the_reduce(tmp_path):
    out = tmp_path / "array-run"
    cmd = [str(BIN / "sweep"), "slurm", SMALL, "--array", "3", "--time", "10", "--out", str(out),
           "--submit", "--wait", "--wait-timeout", "600"]
    failed = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path,
                            env={**env(), "SWEEP_TEST_FAIL_RANK": "0"})  # every task fails
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "(reduce): CANCELLED" in failed.stdout and "submitting again continues" in failed.stderr
    assert not (out / "sweep.h5").exists()
    status = subprocess.run([str(BIN / "sweep"), "status", str(out)], capture_output=True,
                            text=True, timeout=120, env=env())
    assert status.returncode == 1, status.stdout + status.stderr  # every task failed at once
    assert "done: 0 of 38 work units" in status.stdout and "no part files yet" in status.stdout
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env(),
                          cwd=tmp_path)
    log = "".join(p.read_text() for p in out.glob("slurm-*.out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr + log
    assert "(reduce): COMPLETED" in proc.stdout
    assert sorted(p.name for p in out.glob("part-*.h5")) == [
        f"part-{i:05d}.h5" for i in (0, 100000, 200000)]
    serial = run_sweep(SMALL, SerialComm(), RunOptions(out_dir=tmp_path / "serial"))
    with h5py.File(out / "sweep.h5", "r") as a, h5py.File(serial.reduced.path, "r") as b:
        assert a.attrs["complete"] and a.attrs["ranks"] == "[3]"
        assert a["top"][:].tobytes() == b["top"][:].tobytes()
        assert a["cases"][:].tobytes() == b["cases"][:].tobytes()

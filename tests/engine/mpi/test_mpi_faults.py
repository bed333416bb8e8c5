"""Faults under a real mpiexec: a signal to one rank, a stop in the middle of long work
units, a corrupt part file on resume, an error on a rank other than 0. None may hang, lose
saved work or give a different result."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import h5py
import pytest

from tests.conftest import DATA, REPO
from tests.engine.mpi.conftest import mpiexec, tables

pytestmark = pytest.mark.mpi

SMALL = str(DATA / "specs" / "small.yaml")
LONG = str(DATA / "specs" / "long.yaml")
QUICKSTART = REPO / "specs" / "quickstart.yaml"


def rank_pids(out: Path, rank: int) -> list[int]:
    """Processes of this run (their command line names ``out``) of MPI rank ``rank``."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ranks = (f"PMI_RANK={rank}".encode(), f"OMPI_COMM_WORLD_RANK={rank}".encode())
        if (str(out).encode() in cmd and b"sweep" in cmd and b"mpi4py" in cmd
                and any(r in env for r in ranks)):
            pids.append(int(d.name))
    return pids


def wait_for(predicate, timeout_s: float, what: str, proc=None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the run ended before {what}: {proc.communicate()[1]}")
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.05)


def test_sigterm_to_one_rank_other_than_0_stops_the_whole_job(tmp_path, long_reference):
    """Before: rank 0 waited in a gather for ever while rank 1 sat in MPI_Finalize."""
    out = tmp_path / "one"
    proc = mpiexec(2, "run", LONG, "--out", str(out), "--quiet", "--checkpoint", "0.2",
                   popen=True)
    wait_for(lambda: len(list(out.glob("part-*.h5"))) == 2, 120, "part files", proc)
    pids = rank_pids(out, 1)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGTERM)
    start = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - start < 30
    assert proc.returncode != 0, "the run finished before it could be interrupted"
    assert "stopped by signal 15 after saving progress" in err, err
    assert f"--out {out} --resume" in err
    assert not (out / "sweep.h5").exists()
    resumed = mpiexec(3, "run", LONG, "--out", str(out), "--resume", "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    a = tables(out / "sweep.h5")
    assert a[0] == long_reference[0] and a[1] == long_reference[1]
    assert a[2]["candidates_evaluated"] == 8552160


@pytest.mark.slow
def test_a_stop_saves_finished_blocks_of_long_units(tmp_path):
    """Work units of several seconds: a stop is honoured within a block (Open MPI's mpirun
    kills the ranks about 1 s after forwarding SIGTERM); the searched part of each unit is
    saved and the resumed run equals an uninterrupted one. (Three runs of the quickstart at
    two GPU counts, 45 s on a 2-core VM: with -m slow, and in CI's Open MPI step.)"""
    spec = tmp_path / "big-units.yaml"
    spec.write_text(QUICKSTART.read_text().replace("gpus: [256]", "gpus: [256, 512]")
                    + "unit_size: 10000000\n")
    out = tmp_path / "stopped"
    proc = mpiexec(2, "run", str(spec), "--out", str(out), "--quiet", popen=True)
    wait_for(lambda: (out / "spec.yaml").exists(), 120, "run folder", proc)
    time.sleep(2.5)  # into the first units (a few seconds each)
    assert not list(out.glob("part-*.h5")), "a part was written before the stop"
    proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    _, err = proc.communicate(timeout=60)
    latency_s = time.monotonic() - start
    assert proc.returncode != 0, "the run finished before it could be interrupted"
    assert "stopped by signal 15 after saving progress" in err, err
    assert latency_s < 5, f"{latency_s:.1f} s from SIGTERM to exit"
    saved = 0
    for part in out.glob("part-*.h5"):
        with h5py.File(part, "r") as f:
            units = f["units"][:]
        assert len(units) and (units["evaluated"] == units["stop"] - units["start"]).all()
        saved += int(units["evaluated"].sum())
    assert saved > 0
    resumed = mpiexec(2, "run", str(spec), "--out", str(out), "--resume", "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    full = mpiexec(2, "run", str(spec), "--out", str(tmp_path / "full"), "--quiet")
    assert full.returncode == 0, full.stderr
    a, b = tables(out / "sweep.h5"), tables(tmp_path / "full" / "sweep.h5")
    assert a[0] == b[0] and a[1] == b[1]
    assert a[2]["candidates_evaluated"] == b[2]["candidates_evaluated"]


def test_a_corrupt_part_is_moved_aside_and_redone_on_resume(tmp_path):
    """Before: a part whose bytes had changed gave a 'complete' sweep.h5 with a fake best
    configuration, and a non-zero rank that hit a corrupt part hung the job silently."""
    out = tmp_path / "c"
    proc = mpiexec(2, "run", SMALL, "--out", str(out), "--quiet", "--no-reduce")
    assert proc.returncode == 0, proc.stderr
    part = out / "part-00001.h5"
    with h5py.File(part, "r") as f:
        info = f["top"].id.get_chunk_info(0)
    raw = bytearray(part.read_bytes())
    middle = info.byte_offset + info.size // 2
    raw[middle:middle + 8] = bytes(b ^ 0xFF for b in raw[middle:middle + 8])
    part.write_bytes(bytes(raw))
    refused = mpiexec(1, "reduce", str(out))
    assert refused.returncode == 2 and "part-00001.h5" in refused.stderr, refused.stderr
    resumed = mpiexec(2, "run", SMALL, "--out", str(out), "--resume", "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert "part-00001.h5" in resumed.stderr and "will be redone" in resumed.stderr
    assert len(list(out.glob("part-00001.h5.corrupt-*"))) == 1
    clean = mpiexec(2, "run", SMALL, "--out", str(tmp_path / "clean"), "--quiet")
    assert clean.returncode == 0, clean.stderr
    a, b = tables(out / "sweep.h5"), tables(tmp_path / "clean" / "sweep.h5")
    assert a[0] == b[0] and a[1] == b[1]


def test_an_error_on_a_rank_other_than_0_is_printed_and_aborts_the_job(tmp_path):
    """Before: only rank 0's errors were printed; rank 1's one-line error vanished and the
    job hung."""
    start = time.monotonic()
    proc = mpiexec(3, "run", SMALL, "--out", str(tmp_path / "e"), "--quiet", timeout=120,
                   env={"SWEEP_TEST_FAIL_RANK": "1", "SWEEP_TEST_FAIL_KIND": "store"})
    assert proc.returncode != 0
    assert "error on rank 1: injected store failure on rank 1" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 60

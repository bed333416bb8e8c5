"""Faults of a run, in process: a stop in the middle of a work unit, checkpoints inside
units, the run-folder lock, OS errors, and the bookkeeping of unit segments."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from sweep.cli import main
from sweep.engine.lock import RunLock
from sweep.engine.parallel import SerialComm
from sweep.engine.partition import unit_progress
from sweep.engine.plan import UNIT_DTYPE, make_plan
from sweep.engine.reduce import reduce_run
from sweep.engine.runner import Interrupted, RunOptions, run_sweep
from sweep.engine.spec import load_spec
from sweep.engine.store import DONE_DTYPE
from sweep.errors import StoreError
from tests.conftest import DATA

SMALL = str(DATA / "specs" / "small.yaml")  # units of 4,096 candidates


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "small"
    run_sweep(SMALL, SerialComm(), RunOptions(out_dir=out))
    return out


def same_tables(a, b) -> bool:
    with h5py.File(a, "r") as x, h5py.File(b, "r") as y:
        return (x["top"][:].tobytes() == y["top"][:].tobytes()
                and x["cases"][:].tobytes() == y["cases"][:].tobytes())


class StopAfter(SerialComm):
    """A serial world where another rank asks to stop after ``polls`` looks."""

    def __init__(self, polls: int) -> None:
        self.polls = polls

    def poll_stop(self) -> int:
        self.polls -= 1
        return 15 if self.polls < 0 else 0


def test_a_stop_inside_a_unit_saves_its_searched_blocks(finished, tmp_path):
    """Blocks of 1,000 candidates in units of 4,096: the stop comes between two blocks of a
    unit; what was searched of it is saved as a segment and the resume does only the rest."""
    run = tmp_path / "stopped"
    with pytest.raises(Interrupted, match=f"--out {run} --resume"):
        run_sweep(SMALL, StopAfter(polls=13), RunOptions(out_dir=run, block_size=1000))
    with h5py.File(run / "part-00000.h5", "r") as f:
        units = f["units"][:]
        assert not f.attrs["complete"]
    plan = make_plan(load_spec(SMALL)).units[units["unit_id"]]
    whole = (units["start"] == plan["start"]) & (units["stop"] == plan["stop"])
    assert whole[:-1].all() and not whole[-1]  # the last unit was cut between two blocks
    assert (units["stop"][-1] - units["start"][-1]) % 1000 == 0
    assert (units["evaluated"] == units["stop"] - units["start"]).all()
    run_sweep(SMALL, SerialComm(), RunOptions(out_dir=run, resume=True))
    with h5py.File(run / "sweep.h5", "r") as f, h5py.File(finished / "sweep.h5", "r") as g:
        assert f.attrs["candidates_evaluated"] == g.attrs["candidates_evaluated"]
        assert f.attrs["complete"] and f.attrs["n_units_done"] == g.attrs["n_units_done"]
    assert same_tables(run / "sweep.h5", finished / "sweep.h5")


def test_checkpoints_inside_units_change_nothing(finished, tmp_path):
    """A checkpoint every block (checkpoint_s = 0) cuts every unit into segments."""
    run = tmp_path / "segments"
    run_sweep(SMALL, SerialComm(), RunOptions(out_dir=run, block_size=1500, checkpoint_s=0))
    with h5py.File(run / "part-00000.h5", "r") as f:
        assert len(f["units"]) > 38  # more segments than units
    assert same_tables(run / "sweep.h5", finished / "sweep.h5")


def test_a_second_run_in_a_locked_folder_is_refused(finished, tmp_path, capsys):
    """Before: two runs started together in one folder both reported success."""
    run = tmp_path / "locked"
    shutil.copytree(finished, run)
    (run / "sweep.h5").unlink()
    with RunLock(run):
        code = main(["run", SMALL, "--out", str(run), "--resume", "--serial", "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and "another sweep run or reduce is using this folder" in err, err
        assert "pid " in err
        assert main(["reduce", str(run)]) == 2
        assert "is using this folder" in capsys.readouterr().err
        # the shards of an array share the folder with each other, not with a plain run
        assert main(["run", SMALL, "--out", str(run), "--shard", "0/2", "--serial"]) == 2
    assert not (run / "sweep.h5").exists()
    with RunLock(run, shard=0):
        assert main(["run", SMALL, "--out", str(run), "--shard", "1/2", "--serial",
                     "--quiet"]) == 0
        assert main(["run", SMALL, "--out", str(run), "--shard", "0/2", "--serial"]) == 2
        assert "another run of shard 0" in capsys.readouterr().err
    assert main(["reduce", str(run)]) == 0


def test_a_folder_that_cannot_be_made_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    code = main(["run", SMALL, "--out", str(tmp_path / "file" / "run"), "--serial", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "file/run: cannot create the run folder (Not a directory)" in err


def test_the_interrupted_message_names_the_out_folder(tmp_path):
    with pytest.raises(Interrupted) as info:
        run_sweep(SMALL, StopAfter(polls=3), RunOptions(out_dir=tmp_path / "o"))
    # the folder's own resolved spec: it resumes even a run started with --set overrides
    stored = tmp_path / "o" / "spec.yaml"
    assert f"sweep run {stored} --out {tmp_path / 'o'} --resume" in str(info.value)
    assert run_sweep(str(stored), SerialComm(), RunOptions(out_dir=tmp_path / "o",
                                                           resume=True)).reduced.complete


def segments(rows):
    out = np.zeros(len(rows), DONE_DTYPE)
    for i, (u, start, stop) in enumerate(rows):
        out[i]["unit_id"], out[i]["start"], out[i]["stop"] = u, start, stop
    return out


UNITS = np.array([(0, 0, 0, 100), (1, 0, 100, 150), (2, 1, 0, 80)], dtype=UNIT_DTYPE)


@pytest.mark.parametrize("rows, progress, kept", [
    ([], [0, 0, 0], []),
    ([(0, 0, 100), (1, 100, 120)], [100, 20, 0], [1, 1]),
    ([(2, 10, 80)], [0, 0, 0], [1]),  # a gap at the unit's start: nothing counts as done
    ([(0, 0, 40), (0, 0, 40), (0, 40, 100), (2, 0, 30), (2, 0, 50), (2, 50, 60)],
     [100, 0, 60], [1, 0, 1, 0, 1, 1]),  # copies count once; the longer of two overlaps
    ([(0, 60, 100), (0, 0, 30)], [30, 0, 0], [1, 1]),  # a gap at 30..60
])
def test_unit_progress_by_hand(rows, progress, kept):
    got, keep = unit_progress(UNITS, segments(rows))
    assert got.tolist() == progress and keep.astype(int).tolist() == kept


def test_segments_outside_the_plan_are_refused(finished, tmp_path):
    run = tmp_path / "outside"
    shutil.copytree(finished, run)
    part = run / "part-00000.h5"
    from sweep.engine.store import read_part, write_part

    attrs, done, top = read_part(part)
    done["stop"][0] += 1  # one past its unit
    write_part(part, attrs, done, top)
    with pytest.raises(StoreError, match="records work units that are not in the plan"):
        reduce_run(run)


def test_mpich_under_open_mpi_is_refused_before_mpi_init(monkeypatch):
    """With the mpich extra installed, Open MPI's mpirun would start ranks that die in
    MPI_Init; get_comm says why first (this venv's mpi4py loads the extra's MPICH)."""
    from sweep.engine.parallel import check_library
    from sweep.errors import WorldError

    pytest.importorskip("mpi4py._mpiabi")
    from mpi4py import _mpiabi

    if _mpiabi._get_mpiabi() != "mpich":
        pytest.skip("mpi4py loads another MPI here")
    check_library()  # not launched by Open MPI: nothing to say
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(WorldError, match="MPI4PY_LIBMPI=libmpi.so.40"):
        check_library()


def test_status_does_not_suggest_a_resume_that_would_be_refused(finished, tmp_path, capsys):
    """After spec.yaml was edited, status used to suggest the resume that then failed."""
    run = tmp_path / "edited"
    shutil.copytree(finished, run)
    spec = run / "spec.yaml"
    spec.write_text(spec.read_text().replace("top_n: 5", "top_n: 4"))
    assert main(["status", str(run)]) == 1
    out = capsys.readouterr().out
    assert "part-00000.h5 was written for another spec" in out and "--resume" not in out


def test_a_signal_while_rank_0_merges_stops_cleanly_and_reduce_finishes(tmp_path,
                                                                        monkeypatch):
    """A SIGTERM while the parts are merged at the end used to kill the process with no
    word (MPICH: 'BAD TERMINATION'); it stops the merge, leaves no temporary file, says the
    run is complete and how to merge it (found by an outside tester)."""
    import os
    import signal

    from sweep.engine import reduce as reduce_module

    real = reduce_module.ResultsWriter.append

    def append_then_signal(self, name, rows):
        real(self, name, rows)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(reduce_module.ResultsWriter, "append", append_then_signal)
    run = tmp_path / "merge"
    with pytest.raises(Interrupted, match=r"stopped by signal 15 while merging the part "
                                          r"files .* merge them with 'sweep reduce"):
        run_sweep(SMALL, SerialComm(), RunOptions(out_dir=run))
    assert not (run / "sweep.h5").exists()
    assert sorted(p.name for p in run.iterdir()) == [".sweep.lock", "part-00000.h5",
                                                     "spec.yaml"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    monkeypatch.setattr(reduce_module.ResultsWriter, "append", real)
    assert main(["reduce", str(run)]) == 0 and (run / "sweep.h5").exists()


def _catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM (Linux: SigCgt in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(ln for ln in status.splitlines() if ln.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_sigterm_while_the_command_loads_is_one_line_then_the_signal(tmp_path):
    """SIGTERM in a command's first second (Python importing numpy and the subcommands, a
    run planning) killed it silently, and Ctrl-C printed a traceback (an outside review);
    now either prints one line and dies by that signal, as a launcher expects."""
    proc = subprocess.Popen([sys.executable, "-m", "sweep", "plan", SMALL],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not _catches_sigterm(proc.pid) and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.002)
    assert proc.poll() is None, "the command loaded and ended without a SIGTERM handler"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("the plan finished before the signal arrived")
    assert proc.returncode == -signal.SIGTERM, err
    # (one line: the command's own once it has loaded, else the entry point's)
    assert err.strip() in ("sweep: interrupted (signal 15)",
                           "sweep plan: interrupted (signal 15)"), err

"""The engine under a real mpiexec: rank-count independence, interrupt and resume with
another rank count, and no hang when one rank fails."""

from __future__ import annotations

import signal
import time

import h5py
import numpy as np
import pytest

from tests.conftest import DATA
from tests.engine.mpi.conftest import mpiexec, tables

pytestmark = pytest.mark.mpi

SMALL = str(DATA / "specs" / "small.yaml")
SMALL_CALIBRATED = str(DATA / "specs" / "small-calibrated.yaml")
LONG = str(DATA / "specs" / "long.yaml")


def resume_matches_a_full_run(tmp_path, killed, ranks_resume, ranks_full):
    """Resume the stopped LONG run in ``killed`` and compare it with an uninterrupted one."""
    resumed = mpiexec(ranks_resume, "run", LONG, "--out", str(killed), "--resume", "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    full = mpiexec(ranks_full, "run", LONG, "--out", str(tmp_path / "full"), "--quiet")
    assert full.returncode == 0, full.stderr
    a, b = tables(killed / "sweep.h5"), tables(tmp_path / "full" / "sweep.h5")
    assert a[0] == b[0] and a[1] == b[1]
    return a, b


@pytest.mark.parametrize("spec", [SMALL, pytest.param(SMALL_CALIBRATED, marks=pytest.mark.slow)],
                         ids=["nersc2024", "calibrated"])  # (calibrated: ~12 s; CI -m slow)
def test_one_two_three_ranks_reduce_to_identical_tables(tmp_path, spec):
    results = {}
    for n in (1, 2, 3):
        out = tmp_path / f"n{n}"
        proc = mpiexec(n, "run", spec, "--out", str(out), "--quiet")
        assert proc.returncode == 0, proc.stderr
        assert len(list(out.glob("part-*.h5"))) == n
        results[n] = tables(out / "sweep.h5")
        assert results[n][2]["complete"]
    assert results[1][0] == results[2][0] == results[3][0]
    assert results[1][1] == results[2][1] == results[3][1]


def test_a_slow_rank_leaves_the_shared_tail_to_the_other(tmp_path):
    """Rank 1 sleeps before each group of units: rank 0 takes the plan's shared tail (all
    of it but at most the one piece rank 1 asked for), and the tables are the 1-rank ones."""
    from sweep.engine.partition import share_units
    from sweep.engine.plan import make_plan
    from sweep.engine.spec import load_spec
    from sweep.engine.store import read_part

    units = make_plan(load_spec(SMALL)).units
    sizes = units["stop"] - units["start"]
    owner, piece = share_units(sizes, 2)
    assert piece.max() >= 2  # a tail of several pieces to take
    out = tmp_path / "slow"
    proc = mpiexec(2, "run", SMALL, "--out", str(out), "--quiet",
                   env={"SWEEP_TEST_SLOW_RANK": "1:0.2"})
    assert proc.returncode == 0, proc.stderr
    searched = {}
    for rank in (0, 1):
        _, done, _ = read_part(out / f"part-{rank:05d}.h5")
        searched[rank] = set(done["unit_id"].tolist())
    assert searched[0] | searched[1] == set(range(len(units)))
    assert set(np.flatnonzero(owner == 1)) <= searched[1]  # its own share, slowly
    assert set(np.flatnonzero(owner == 0)) <= searched[0]
    tail_of_1 = set(piece[sorted(searched[1])][piece[sorted(searched[1])] >= 0].tolist())
    assert len(tail_of_1) <= 1, tail_of_1
    serial = mpiexec(1, "run", SMALL, "--out", str(tmp_path / "one"), "--quiet")
    assert serial.returncode == 0, serial.stderr
    a, b = tables(out / "sweep.h5"), tables(tmp_path / "one" / "sweep.h5")
    assert a[0] == b[0] and a[1] == b[1]


@pytest.mark.slow  # (~15 s with its reference run; CI runs -m slow)
def test_sigterm_midway_then_resume_on_three_ranks(tmp_path, long_reference):
    killed = tmp_path / "killed"
    proc = mpiexec(2, "run", LONG, "--out", str(killed), "--quiet", "--checkpoint", "0.2",
                   popen=True)
    deadline = time.monotonic() + 120
    while len(list(killed.glob("part-*.h5"))) < 2 and proc.poll() is None:
        assert time.monotonic() < deadline, "no part files appeared"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # what Slurm's time limit does
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, "the run finished before it could be interrupted"
    assert "stopped by signal 15 after saving progress" in err
    for part in killed.glob("part-*.h5"):
        with h5py.File(part, "r") as f:
            assert not f.attrs["complete"]
    assert not (killed / "sweep.h5").exists()
    resumed = mpiexec(3, "run", LONG, "--out", str(killed), "--resume", "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    a = tables(killed / "sweep.h5")
    assert a[0] == long_reference[0] and a[1] == long_reference[1]
    assert a[2]["candidates_evaluated"] == long_reference[2]["candidates_evaluated"] == 8552160


@pytest.mark.slow
def test_sigterm_while_a_rank_searches_the_shared_tail_then_resume(tmp_path):
    """Rank 0 is slowed, so rank 1 takes pieces of the shared tail (asking for the next one
    ahead); a SIGTERM then stops both with their progress saved (no message left in flight)
    and a resumed run gives the tables of an uninterrupted one."""
    from sweep.engine.partition import share_units
    from sweep.engine.plan import make_plan
    from sweep.engine.spec import load_spec
    from sweep.engine.store import read_part_done
    from sweep.errors import StoreError

    units = make_plan(load_spec(LONG)).units
    owner, _ = share_units(units["stop"] - units["start"], 2)
    tail = set(np.flatnonzero(owner < 0).tolist())
    killed = tmp_path / "killed"
    proc = mpiexec(2, "run", LONG, "--out", str(killed), "--quiet", "--checkpoint", "0.1",
                   env={"SWEEP_TEST_SLOW_RANK": "0:0.05"}, popen=True)
    deadline = time.monotonic() + 120
    while proc.poll() is None:
        assert time.monotonic() < deadline, "rank 1 never reached the shared tail"
        try:
            _, done = read_part_done(killed / "part-00001.h5")
        except StoreError:  # not written yet (parts are replaced whole, never half-written)
            done = None
        if done is not None and tail & set(done["unit_id"].tolist()):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, "the run finished before it could be interrupted"
    assert "stopped by signal 15 after saving progress" in err, err
    assert "aborting" not in err
    resume_matches_a_full_run(tmp_path, killed, 2, 1)


def test_failure_on_one_rank_aborts_all_ranks(tmp_path):
    start = time.monotonic()
    proc = mpiexec(3, "run", SMALL, "--out", str(tmp_path / "f"), "--quiet",
                   env={"SWEEP_TEST_FAIL_RANK": "1"}, timeout=120)
    assert proc.returncode != 0
    assert "injected failure on rank 1" in proc.stderr
    assert "rank 1 failed; aborting all ranks" in proc.stderr
    assert time.monotonic() - start < 60


def test_bad_spec_exits_2_on_every_rank(tmp_path):
    proc = mpiexec(2, "run", str(DATA / "bad_specs" / "08-zero-gpus.yaml"), "--out",
                   str(tmp_path / "b"), timeout=120)
    assert proc.returncode == 2
    assert "gpus[1]: expected a positive integer, got 0" in proc.stderr
    assert not (tmp_path / "b").exists()


def test_rank_zero_reports_progress_of_all_ranks(tmp_path):
    """Off a terminal, rank 0 logs the whole run's progress, the last line once every rank
    has finished: the total counts candidates of every rank, not just rank 0's."""
    proc = mpiexec(2, "run", SMALL, "--out", str(tmp_path / "p"))
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "ranks done" in ln]
    assert lines, proc.stderr
    with h5py.File(tmp_path / "p" / "sweep.h5", "r") as f:
        total = int(f.attrs["candidates_total"])
    assert lines[-1].endswith(f"100.0% of {total:,} candidates, 2/2 ranks done, ETA 0 s")


def test_shards_on_different_numbers_of_ranks_share_no_part_file(tmp_path):
    """Tasks of one array resubmitted with other --ntasks: shard 1 of 3 on one rank and
    shards 0 and 2 on two each own the same shares and write their own files (a shard's
    share does not depend on its ranks); together they reduce to the single run."""
    out = tmp_path / "shards"
    for i, ranks in ((1, 1), (2, 2), (0, 2)):
        proc = mpiexec(ranks, "run", SMALL, "--out", str(out), "--shard", f"{i}/3", "--quiet")
        assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.glob("part-*.h5")) == [
        f"part-{w:05d}.h5" for w in (0, 1, 100000, 200000, 200001)]
    again = mpiexec(2, "run", SMALL, "--out", str(out), "--shard", "1/3")
    assert again.returncode == 0 and "(shard 1/3): nothing left to compute" in again.stdout, \
        again.stdout + again.stderr
    reduced = mpiexec(1, "reduce", str(out))
    assert reduced.returncode == 0 and "complete" in reduced.stdout, reduced.stderr
    single = mpiexec(1, "run", SMALL, "--out", str(tmp_path / "single"), "--quiet")
    assert single.returncode == 0, single.stderr
    a, b = tables(out / "sweep.h5"), tables(tmp_path / "single" / "sweep.h5")
    assert a[0] == b[0] and a[1] == b[1]


def test_two_shards_of_two_ranks_reduce_to_the_single_run(tmp_path):
    """A job array of MPI jobs: rank r of shard I of K writes part I * 100000 + r."""
    out = tmp_path / "shards"
    for i in (1, 0):
        proc = mpiexec(2, "run", SMALL, "--out", str(out), "--shard", f"{i}/2", "--quiet")
        assert proc.returncode == 0, proc.stderr
        assert f"shard {i}/2 done" in proc.stdout and not (out / "sweep.h5").exists()
    assert sorted(p.name for p in out.glob("part-*.h5")) == [
        f"part-{w:05d}.h5" for w in (0, 1, 100000, 100001)]
    reduced = mpiexec(1, "reduce", str(out))
    assert reduced.returncode == 0 and "complete" in reduced.stdout, reduced.stderr
    single = mpiexec(1, "run", SMALL, "--out", str(tmp_path / "single"), "--quiet")
    assert single.returncode == 0, single.stderr
    a, b = tables(out / "sweep.h5"), tables(tmp_path / "single" / "sweep.h5")
    assert a[0] == b[0] and a[1] == b[1] and a[2]["ranks"] == "[4]"

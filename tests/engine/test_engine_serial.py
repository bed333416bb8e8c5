"""The engine run serially, in process: results file, resume after a real SIGTERM, reduce
failure modes, and `sweep show`."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from sweep.cli import main
from sweep.engine.parallel import SerialComm
from sweep.engine.reduce import reduce_run
from sweep.engine.runner import Interrupted, RunOptions, run_sweep
from sweep.engine.store import write_part
from sweep.errors import StoreError, SweepError
from sweep.model.search import search_case
from tests.conftest import DATA, REPO

SMALL = str(DATA / "specs" / "small.yaml")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "small"
    summary = run_sweep(SMALL, SerialComm(), RunOptions(out_dir=out))
    return out, summary


def test_results_file_contract(finished):
    out, summary = finished
    with h5py.File(out / "sweep.h5", "r") as f:
        a = dict(f.attrs)
        assert a["complete"] and a["cost_model"] == "nersc2024" and a["sweep_version"]
        assert a["spec"] == (out / "spec.yaml").read_text()
        assert len(a["spec_sha256"]) == 64 and json.loads(a["ranks"]) == [1]
        cases, top = f["cases"][:], f["top"][:]
        columns = json.loads(f["top"].attrs["columns"])
        assert columns["step_time_s"]["unit"] == "s" and columns["mem_bytes"]["unit"] == "B"
        assert json.loads(f["cases"].attrs["columns"])["hbm_bytes_per_s"]["unit"] == "B/s"
    assert len(cases) == 16 and (cases["evaluated"] == cases["candidates"]).all()
    assert summary.evaluated == cases["candidates"].sum() == a["candidates_evaluated"]
    for name in ("job", "strategy", "n_gpus", "hardware", "nvlink_domain", "hbm_capacity_bytes",
                 "matrix_fp16_flops_per_s", "feasible", "out_of_memory", "complete"):
        assert name in cases.dtype.names
    # /top: best first per case, at most top_n, and all feasible
    for cid in np.unique(top["case_id"]):
        rows = top[top["case_id"] == cid]
        assert list(rows["place"]) == list(range(len(rows))) and len(rows) <= 5
        assert (np.diff(rows["samples_per_s"]) <= 0).all() and rows["feasible"].all()


def test_engine_equals_direct_search(finished):
    """Split into work units and merged, a case gives exactly what one search gives."""
    out, summary = finished
    with h5py.File(out / "sweep.h5", "r") as f:
        top = f["top"][:]
    for case in summary.plan.cases:
        direct = search_case("nersc2024", case.job, case.variant.hardware, case.strategy,
                             case.n_gpus, 5).top
        mine = top[top["case_id"] == case.case_id]
        assert len(mine) == len(direct)
        for name in direct.dtype.names:
            assert (mine[name] == direct[name]).all(), name


@pytest.mark.slow  # (12 s; the nersc2024 engine test above runs by default)
def test_calibrated_engine_equals_direct_search(tmp_path):
    """The calibrated profile through the engine (work units, parts, reduce) gives what one
    direct search of each case gives."""
    spec = str(DATA / "specs" / "small-calibrated.yaml")
    summary = run_sweep(spec, SerialComm(), RunOptions(out_dir=tmp_path / "cal"))
    with h5py.File(tmp_path / "cal" / "sweep.h5", "r") as f:
        top = f["top"][:]
        assert f.attrs["cost_model"] == "calibrated"
    for case in summary.plan.cases:
        direct = search_case("calibrated", case.job, case.variant.hardware, case.strategy,
                             case.n_gpus, 5).top
        mine = top[top["case_id"] == case.case_id]
        assert len(mine) == len(direct) > 0
        for name in direct.dtype.names:
            assert (mine[name] == direct[name]).all(), name


def test_reduce_is_idempotent(finished):
    out, _ = finished
    before = (out / "sweep.h5").read_bytes()
    reduce_run(out)
    assert (out / "sweep.h5").read_bytes() == before


def test_sigterm_then_resume_equals_uninterrupted(finished, tmp_path):
    out, _ = finished
    run = tmp_path / "again"
    sent = []

    calls = []

    reports = []

    def progress(p):  # a real SIGTERM to this process after a few units (one call each)
        calls.append(p["candidates_done"])
        reports.append(p)
        if len(calls) == 5 and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Interrupted, match="--resume"):
        run_sweep(SMALL, SerialComm(), RunOptions(out_dir=run, progress=progress))
    # the last report says the rank stopped (the progress line: "1/1 ranks stopped,
    # progress saved", not "1/1 ranks done" with an ETA)
    assert reports[-1]["ranks_done"] == 1 and reports[-1]["ranks_stopped"] == 1
    assert all(r["ranks_stopped"] == 0 for r in reports[:-1])
    from sweep.cli.run import _Progress
    lines = io.StringIO()
    _Progress(stream=lines)(reports[-1])
    assert lines.getvalue().rstrip().endswith("1/1 ranks stopped, progress saved")
    with h5py.File(run / "part-00000.h5", "r") as f:
        assert not f.attrs["complete"] and 0 < len(f["units"]) < 40
    assert not (run / "sweep.h5").exists()
    with pytest.raises(StoreError, match="run incomplete: .* work units missing"):
        reduce_run(run)
    partial = reduce_run(run, partial=True)
    with h5py.File(partial.path, "r") as f:
        assert not f.attrs["complete"] and not f["cases"]["complete"].all()
    with pytest.raises(StoreError, match="holds an earlier run; continue it with --resume"):
        run_sweep(SMALL, SerialComm(), RunOptions(out_dir=run))
    resumed = run_sweep(SMALL, SerialComm(), RunOptions(out_dir=run, resume=True))
    assert resumed.resumed_units > 0
    with h5py.File(run / "sweep.h5", "r") as a, h5py.File(out / "sweep.h5", "r") as b:
        assert a["top"][:].tobytes() == b["top"][:].tobytes()
        assert a["cases"][:].tobytes() == b["cases"][:].tobytes()


def test_reduce_refuses_bad_folders(finished, tmp_path):
    out, _ = finished
    with pytest.raises(StoreError, match="no spec.yaml here"):
        reduce_run(tmp_path)
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    (bad / "part-00000.h5").write_bytes(b"not hdf5 at all")
    with pytest.raises(StoreError, match="part-00000.h5: unreadable or corrupt HDF5 file"):
        reduce_run(bad)
    (bad / "part-00000.h5").unlink()
    with pytest.raises(StoreError, match="no part files"):
        reduce_run(bad)
    other = tmp_path / "other"
    shutil.copytree(out, other)
    (other / "spec.yaml").write_text((other / "spec.yaml").read_text().replace("top_n: 5",
                                                                               "top_n: 4"))
    with pytest.raises(StoreError, match="written for another spec"):
        reduce_run(other)


def test_changed_spec_refuses_resume(finished, tmp_path):
    out, _ = finished
    run = tmp_path / "copy"
    shutil.copytree(out, run)
    changed = tmp_path / "small.yaml"
    changed.write_text(open(SMALL).read().replace("top_n: 5", "top_n: 3"))
    for resume in (True, False):  # (without --resume it said "continue it with --resume")
        with pytest.raises(SweepError, match="changed since this run started") as raised:
            run_sweep(str(changed), SerialComm(), RunOptions(out_dir=run, resume=resume))
        assert f"sweep run {run / 'spec.yaml'} --out {run} --resume" in str(raised.value)
    # what the message says continues the run as it started
    again = run_sweep(str(run / "spec.yaml"), SerialComm(), RunOptions(out_dir=run, resume=True))
    assert again.evaluated == 0
    forced = run_sweep(str(changed), SerialComm(), RunOptions(out_dir=run, force=True))
    assert forced.reduced.complete
    # a spec of another name into that folder: not 'changed' (it read as if the user had
    # edited it, and pointed at resuming someone else's run: an outside test's finding)
    other = tmp_path / "other.yaml"
    other.write_text(Path(SMALL).read_text().replace("name: small", "name: other"))
    assert "name: other" in other.read_text()
    with pytest.raises(SweepError, match="holds a run of another spec \\('small'\\); "
                                         "continue that run as it started"):
        run_sweep(str(other), SerialComm(), RunOptions(out_dir=run))


def test_world_of_one_under_srun_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")
    code = main(["run", SMALL, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "started as 4 tasks but MPI sees a world of 1 rank" in err
    assert not (tmp_path / "o").exists()
    # --serial under a launcher of several tasks says so (an outside review: it named srun's
    # MPI plugin instead)
    code = main(["run", SMALL, "--serial", "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2 and "--serial under a launcher that started 4 tasks" in err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_show_formats(finished, capsys, fmt):
    out, _ = finished
    assert main(["show", str(out / "sweep.h5"), "--format", fmt, "--top", "2"]) == 0
    text = capsys.readouterr().out
    if fmt == "json":
        rows = json.loads(text)["rows"]
        assert len(rows) == 32 and rows[0]["place"] == 0 and "samples_per_s" in rows[0]
    elif fmt == "csv":
        lines = text.splitlines()
        assert lines[0].startswith("case_id,job,strategy") and len(lines) == 33
    else:
        assert "nersc-A100[nvlink_domain=4]" in text and "samples/s" in text


def test_show_of_a_missing_file(capsys, tmp_path):
    assert main(["show", str(tmp_path / "none.h5")]) == 2
    assert "no such results file" in capsys.readouterr().err


def test_a_run_folder_given_for_a_file_says_which_file(finished, capsys):
    """show DIR said "no such results file" and run DIR "no such spec file", of folders
    that exist (from an outside tester)."""
    out, _ = finished
    assert main(["show", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out}: a folder, not a results file; its results: " \
        f"{out / 'sweep.h5'}" in err
    assert main(["run", str(out), "--serial"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out}: a folder, not a spec file; a run folder's spec " \
        f"is {out / 'spec.yaml'}" in err


def _same_tables(a_path, b_path):
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        return (a["top"][:].tobytes() == b["top"][:].tobytes()
                and a["cases"][:].tobytes() == b["cases"][:].tobytes())


def test_shards_in_any_order_reduce_to_the_single_run(finished, tmp_path):
    out, _ = finished
    run = tmp_path / "shards"
    summaries = [run_sweep(SMALL, SerialComm(), RunOptions(out_dir=run, shard=(i, 3)))
                 for i in (2, 0, 1)]
    assert all(s.reduced is None for s in summaries)  # shards leave the merge to reduce
    assert sum(s.evaluated for s in summaries) == 126202  # every candidate exactly once
    units = []
    for part in sorted(run.glob("part-*.h5")):
        with h5py.File(part, "r") as f:
            units.append(f["units"]["unit_id"][:])
            assert f.attrs["size"] == 3 and f.attrs["complete"]
    ids = np.concatenate(units)
    with h5py.File(out / "sweep.h5", "r") as f:
        n_units = f.attrs["n_units"]
    assert len(units) == 3 and all(len(u) for u in units)
    assert len(np.unique(ids)) == len(ids) == n_units  # disjoint, together all of the plan
    assert reduce_run(run).complete and _same_tables(run / "sweep.h5", out / "sweep.h5")
    again = run_sweep(SMALL, SerialComm(), RunOptions(out_dir=run, shard=(1, 3)))
    assert again.evaluated == 0 and again.resumed_units == len(units[1])
    # another layout: the one shard of 1 continues part-00000 and redoes what the other two
    # parts hold; the reduction drops the duplicates
    other = run_sweep(SMALL, SerialComm(), RunOptions(out_dir=run, shard=(0, 1)))
    assert other.resumed_units == len(units[0]) and 0 < other.evaluated < 126202
    assert reduce_run(run).complete and _same_tables(run / "sweep.h5", out / "sweep.h5")


def test_a_shard_removes_only_its_own_temporaries(tmp_path):
    """Shards hold the folder lock shared: a starting shard must not delete the file another
    shard is writing (.part-<worker>.h5.<random>.tmp), nor a reduction's; its own stale
    ones it does."""
    run = tmp_path / "shards"
    run.mkdir()
    others = [run / ".part-200000.h5.a1b2.tmp", run / ".part-00000.h5.c3d4.tmp",
              run / ".sweep.h5.e5f6.tmp"]
    own = [run / ".part-100000.h5.g7h8.tmp", run / ".part-100001-0002.h5.i9j0.tmp"]
    for p in others + own:
        p.write_bytes(b"half written")
    run_sweep(SMALL, SerialComm(), RunOptions(out_dir=run, shard=(1, 3)))
    assert all(p.exists() for p in others) and not any(p.exists() for p in own)


def test_a_shard_then_a_plain_resume_finishes_the_rest(finished, tmp_path):
    out, _ = finished
    run = tmp_path / "mixed"
    first = run_sweep(SMALL, SerialComm(), RunOptions(out_dir=run, shard=(0, 2)))
    rest = run_sweep(SMALL, SerialComm(), RunOptions(out_dir=run, resume=True))
    assert first.evaluated + rest.evaluated == 126202
    assert rest.reduced.complete and _same_tables(rest.reduced.path, out / "sweep.h5")


def test_bad_shards_are_refused(tmp_path, capsys):
    with pytest.raises(SweepError, match="shard 2/2: expecting I/K with 0 <= I < K"):
        run_sweep(SMALL, SerialComm(), RunOptions(out_dir=tmp_path / "a", shard=(2, 2)))
    with pytest.raises(SweepError, match="shard 0/21474: at most 21,473 shards"):
        run_sweep(SMALL, SerialComm(), RunOptions(out_dir=tmp_path / "a", shard=(0, 21474)))
    with pytest.raises(StoreError, match="--force cannot be used with --shard"):
        run_sweep(SMALL, SerialComm(), RunOptions(out_dir=tmp_path / "b", shard=(0, 2),
                                                   force=True))
    for bad in ("3/3", "1", "a/b", "-1/2", "0/0"):
        with pytest.raises(SystemExit) as exc:
            main(["run", SMALL, "--serial", "--out", str(tmp_path / "c"), f"--shard={bad}"])
        assert exc.value.code == 2
        assert f"expected I/K with 0 <= I < K (shard I of K), got '{bad}'" in \
            capsys.readouterr().err
    # a checkpoint interval that is no interval (0 rewrote the part files after every unit,
    # nan never)
    for bad in ("0", "-5", "nan", "inf"):
        with pytest.raises(SystemExit) as exc:
            main(["run", SMALL, "--serial", "--out", str(tmp_path / "c"), f"--checkpoint={bad}"])
        assert exc.value.code == 2
        assert f"expected a positive finite number, got '{bad}'" in capsys.readouterr().err
    assert not any((tmp_path / d).exists() for d in "abc")


def test_show_rows_equal_a_case_by_case_reading(finished, tmp_path):
    """load_rows (linear: one sort, one pass) gives what reading case by case gives."""
    from sweep.analysis.show import load_rows

    out, _ = finished
    path = tmp_path / "sweep.h5"  # a copy in which case 2 has no feasible configuration
    with h5py.File(out / "sweep.h5", "r") as f, h5py.File(path, "w") as g:
        cases, top = f["cases"][:], f["top"][:]
        top = top[top["case_id"] != 2]
        g.attrs.update(dict(f.attrs))
        g["cases"], g["top"], g["units"] = cases, top, f["units"][:]

    def plain(v):
        return v.decode() if isinstance(v, bytes) else v.item()

    def reference(k, only=None):
        rows = []
        for c in cases:
            if only is not None and c["case_id"] != only:
                continue
            base = {n if n != "feasible" else "feasible_case": plain(c[n])
                    for n in cases.dtype.names}
            mine = top[(top["case_id"] == c["case_id"]) & (top["place"] < k)]
            none = {n: None for n in top.dtype.names if n != "case_id"}
            rows += [{**base, **none, "place": None}] if len(mine) == 0 else [
                {**base, **{n: plain(r[n]) for n in top.dtype.names}} for r in mine]
        return rows

    def same(a, b):  # NaN columns (absent calibration parameters) compare as text
        return json.dumps(a) == json.dumps(b)

    for k in (1, 3, 9):
        assert same(load_rows(path, top=k)[1], reference(k))
    assert same(load_rows(path, top=2, case=5)[1], reference(2, only=5))
    assert load_rows(path, top=2, case=2)[1][0]["place"] is None
    assert same(load_rows(path, top=2, case=2)[1], reference(2, only=2))
    assert same(load_rows(path, top=2, limit=4)[1],
                [r for r in reference(2) if r["case_id"] < 4])


class _PostCounter:
    """A non-zero rank of a world of ``size`` that counts its progress posts."""

    rank = 1

    def __init__(self, size):
        self.size, self.posts = size, []

    def post(self, obj):
        self.posts.append(obj)


def test_progress_posts_are_thinned_with_the_rank_count(monkeypatch):
    from sweep.engine import runner

    clock = [100.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])
    for size, every_s in ((2, 0.5), (500, 0.5), (4096, 4.096)):
        comm = _PostCounter(size)
        tracker = runner._Tracker(comm, None, 1000, start=clock[0])
        assert tracker.every_s == pytest.approx(every_s)
        for step in range(80):  # a unit finished every 1/8 s for 10 s, then the final post
            clock[0] += 0.125
            tracker.update(step, final=False)
        tracker.update(100, final=True)
        progress = comm.posts[:-1]  # the first at once, then one per interval
        assert abs(len(progress) - 10.0 / every_s) <= 1
        assert comm.posts[-1] == {"rank": 1, "done": 100, "final": True, "stopped": False}
        # what all ranks together send rank 0: at most MAX_POSTS_PER_S (or 2 per rank-second)
        assert size / every_s <= max(runner._Tracker.MAX_POSTS_PER_S, 2.0 * size) + 1e-9


def test_status_of_an_array_run_from_start_to_finish(finished, tmp_path, capsys):
    out, _ = finished
    run = tmp_path / "array"
    assert main(["status", str(run)]) == 2 and "no such run folder" in capsys.readouterr().err
    first = run_sweep(SMALL, SerialComm(), RunOptions(out_dir=run, shard=(0, 3)))
    assert main(["status", str(run), "--json"]) == 1  # exit 1: units missing
    st = json.loads(capsys.readouterr().out)
    assert st["units"] == 38 and st["units_done"] == first.units_mine
    assert st["candidates_done"] == first.evaluated and st["candidates"] == 126202
    assert st["shards"] == 3 and st["unfinished_shards"] == [1, 2] and st["results"] is None
    assert st["parts"][0]["shard"] == "0/3" and st["parts"][0]["complete"]
    # (its worker id and count over all shards; its rank and ranks within its shard, as the
    # table shows them)
    assert {k: st["parts"][0][k] for k in ("worker", "workers", "rank", "ranks")} == \
        {"worker": 0, "workers": 3, "rank": 0, "ranks": 1}
    reduce_run(run, partial=True)
    run_sweep(SMALL, SerialComm(), RunOptions(out_dir=run, shard=(2, 3)))
    assert main(["status", str(run)]) == 1
    text = capsys.readouterr().out
    assert "job array of 3 shards: 1 unfinished (1)" in text
    assert "sweep.h5: partial (12 units)" in text and "submit the array again" in text
    # while a shard of it runs (holds its lock), status says so instead of a resume that
    # the lock would refuse
    from sweep.engine.lock import RunLock

    with RunLock(run, shard=1):
        assert main(["status", str(run)]) == 1
        busy = capsys.readouterr().out
        assert "in progress: shard 1: pid" in busy and "--resume" not in busy
    # the command it suggests finishes the run (on one rank here), from the stored spec
    hint = next(line for line in text.splitlines() if line.startswith("next:"))
    assert f"sweep run {run}/spec.yaml --out {run} --resume" in hint
    assert main(["run", f"{run}/spec.yaml", "--out", str(run), "--resume", "--serial",
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["status", str(run)]) == 0
    text = capsys.readouterr().out
    assert "done: 38 of 38 work units (100.0%), 126,202 of 126,202 candidates" in text
    assert "every shard finished" in text and f"next: sweep show {run}/sweep.h5" in text
    assert main(["status", str(run / "sweep.h5")]) == 2
    assert f"a file, not a run folder (sweep status takes the folder: {run})" in \
        capsys.readouterr().err
    assert main(["reduce", str(run / "sweep.h5")]) == 2  # (was "no such run folder")
    assert f"a file, not a run folder (sweep reduce takes the folder: {run})" in \
        capsys.readouterr().err
    assert _same_tables(run / "sweep.h5", out / "sweep.h5")


def test_running_a_finished_spec_again_shows_its_results(finished, tmp_path):
    """The README's first command run twice: the same spec run to the end before is shown,
    not refused (nothing is recomputed or lost); another spec, or an unfinished run,
    is still refused without --resume / --force (test above)."""
    out, _ = finished
    again = tmp_path / "again"
    shutil.copytree(out, again)
    with h5py.File(again / "part-00000.h5", "r") as f:
        units_before, top_before = f["units"][:], f["top"][:]
    said = []
    summary = run_sweep(SMALL, SerialComm(), RunOptions(out_dir=again, warn=said.append))
    assert summary.evaluated == 0 and summary.reduced.complete
    assert "already holds a complete run of this spec" in said[0]
    from contextlib import redirect_stdout

    from sweep.cli.run import _print_run_summary
    printed = io.StringIO()
    with redirect_stdout(printed):  # (not "0 candidates evaluated ... (0 per busy core-second)")
        _print_run_summary(summary)
    assert printed.getvalue() == (f"sweep small: nothing left to compute: its "
                                  f"{summary.resumed_units} work unit(s) were done by an "
                                  f"earlier attempt\n")
    with h5py.File(again / "sweep.h5", "r") as a, h5py.File(out / "sweep.h5", "r") as b:
        assert a["top"][:].tobytes() == b["top"][:].tobytes()
        assert a["cases"][:].tobytes() == b["cases"][:].tobytes()
    with h5py.File(again / "part-00000.h5", "r") as f:  # its part file kept everything
        assert len(f["units"]) == len(units_before) > 0
        assert f["top"][:].tobytes() == top_before.tobytes()
    # the part files removed after the reduction: sweep.h5 stands, nothing is recomputed
    # (it used to say so and then search every candidate again)
    for part in again.glob("part-*.h5"):
        part.unlink()
    before = (again / "sweep.h5").read_bytes()
    said.clear()
    summary = run_sweep(SMALL, SerialComm(), RunOptions(out_dir=again, warn=said.append))
    assert summary.evaluated == 0 and summary.reduced is None
    assert summary.resumed_units == len(summary.plan.units)
    assert "already holds a complete run of this spec" in said[0]
    assert (again / "sweep.h5").read_bytes() == before and not list(again.glob("part-*"))
    assert main(["status", str(again)]) == 0
    (again / "spec.yaml").write_text((again / "spec.yaml").read_text() + "# edited\n")
    with pytest.raises(StoreError, match="changed since this run started|holds an earlier"):
        run_sweep(SMALL, SerialComm(), RunOptions(out_dir=again))


def test_a_complete_unreduced_run_run_again_is_reduced(finished, tmp_path):
    """A run finished with --no-reduce, run again without --resume: every unit is done, so
    there is nothing to continue by mistake; it is reduced (was refused: 'holds an earlier
    run'), and with --no-reduce again nothing is done. A part file short of a unit is still
    refused."""
    out, _ = finished
    again = tmp_path / "again"
    shutil.copytree(out, again)
    (again / "sweep.h5").unlink()
    said = []
    summary = run_sweep(SMALL, SerialComm(), RunOptions(out_dir=again, reduce=False,
                                                        warn=said.append))
    assert summary.evaluated == 0 and summary.reduced is None
    assert not (again / "sweep.h5").exists()
    assert said == [(f"{again} already holds a complete run of this spec, not reduced: "
                     f"nothing to do (--force computes it again)")]
    said.clear()
    summary = run_sweep(SMALL, SerialComm(), RunOptions(out_dir=again, warn=said.append))
    assert summary.evaluated == 0 and summary.reduced.complete
    assert said == [(f"{again} already holds a complete run of this spec, not reduced: "
                     f"reducing it (--force computes it again)")]
    assert _same_tables(again / "sweep.h5", out / "sweep.h5")
    # one unit short: an unfinished run, refused without --resume as before
    short = tmp_path / "short"
    shutil.copytree(out, short)
    (short / "sweep.h5").unlink()
    with h5py.File(short / "part-00000.h5", "r") as f:
        attrs, units, top = dict(f.attrs), f["units"][:], f["top"][:]
    (short / "part-00000.h5").unlink()
    write_part(short / "part-00000.h5", attrs, units[1:], top)
    with pytest.raises(StoreError, match="holds an earlier run; continue it with --resume"):
        run_sweep(SMALL, SerialComm(), RunOptions(out_dir=short))
    # reduced with --partial meanwhile, then finished (as shards are): reduced all the same
    assert not reduce_run(short, partial=True).complete
    (short / "part-00000.h5").unlink()
    write_part(short / "part-00000.h5", attrs, units, top)
    said.clear()
    summary = run_sweep(SMALL, SerialComm(), RunOptions(out_dir=short, warn=said.append))
    assert summary.evaluated == 0 and summary.reduced.complete and len(said) == 1
    assert _same_tables(short / "sweep.h5", out / "sweep.h5")


def test_bounded_memory_paths_give_the_same_tables(finished, tmp_path, monkeypatch):
    """Sealed part files (a rank past SEAL_ROWS), a reduction in slices of a few cases and a
    results file streamed to disk give the tables of the plain run, also across a SIGTERM
    and a resume with sealed parts on disk."""
    from sweep.engine import reduce as reduce_module
    from sweep.engine import runner as runner_module
    from sweep.engine import store as store_module

    out, _ = finished
    monkeypatch.setattr(runner_module, "SEAL_ROWS", 10)
    monkeypatch.setattr(reduce_module, "ROWS_PER_SLICE", 7)
    monkeypatch.setattr(store_module, "IMAGE_BYTES", 0)
    run = tmp_path / "bounded"
    summary = run_sweep(SMALL, SerialComm(), RunOptions(out_dir=run))
    sealed = sorted(p.name for p in run.glob("part-00000-*.h5"))
    assert len(sealed) >= 3 and sealed[0] == "part-00000-0000.h5"
    assert summary.reduced.complete and _same_tables(run / "sweep.h5", out / "sweep.h5")
    with h5py.File(run / "sweep.h5", "r") as a, h5py.File(out / "sweep.h5", "r") as b:
        assert len(a["units"]) == len(b["units"])
        assert a["top"].attrs["sha256"] == b["top"].attrs["sha256"]
        assert a["cases"].attrs["sha256"] == b["cases"].attrs["sha256"]
    assert not list(run.glob(".sweep.h5.*"))  # no temporary file left

    again = tmp_path / "bounded-resumed"
    calls = []

    def progress(p):
        calls.append(p)
        if len(calls) == 20:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Interrupted):
        run_sweep(SMALL, SerialComm(), RunOptions(out_dir=again, progress=progress))
    before = sorted(p.name for p in again.glob("part-00000-*.h5"))
    assert before  # sealed parts on disk when it stopped
    resumed = run_sweep(SMALL, SerialComm(), RunOptions(out_dir=again, resume=True))
    after = sorted(p.name for p in again.glob("part-00000-*.h5"))
    assert after[:len(before)] == before and len(after) > len(before)  # numbered on
    assert resumed.reduced.complete and _same_tables(again / "sweep.h5", out / "sweep.h5")


def test_a_results_file_sweep_did_not_write_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "sweep.h5").write_text("someone else's")
    assert main(["run", SMALL, "--serial", "--out", str(out), "--quiet"]) == 2
    assert "holds a sweep.h5 that is not a sweep run's" in capsys.readouterr().err
    assert (out / "sweep.h5").read_text() == "someone else's"
    assert main(["run", SMALL, "--serial", "--out", str(out), "--quiet", "--force",
                 "--resume"]) == 2
    assert "--force and --resume: choose one" in capsys.readouterr().err
    assert (out / "sweep.h5").read_text() == "someone else's"
    assert main(["run", SMALL, "--serial", "--out", str(out), "--quiet", "--force"]) == 0


def test_a_piece_of_the_shared_tail_reopens_a_final_case():
    """runner._State: a case whose units are all done is final (sealable); a piece of the
    tail that brings more of it takes it out of the final set and its rows out of the
    count that triggers a seal, until those units are done too."""
    from types import SimpleNamespace

    from sweep.engine.plan import UNIT_DTYPE
    from sweep.engine.runner import _State
    from sweep.model.schema import RESULT_DTYPE

    units = np.zeros(3, UNIT_DTYPE)
    units["unit_id"], units["case_id"] = [0, 1, 2], [7, 7, 9]
    units["start"], units["stop"] = [0, 10, 0], [10, 20, 10]
    top = np.zeros(2, RESULT_DTYPE)
    top["feasible"], top["samples_per_s"], top["index"] = True, [2.0, 1.0], [0, 1]

    def result(stop):
        return SimpleNamespace(stop=stop, reasons={}, evaluated=10, feasible=2, top=top)

    state = _State(top_n=2, units_left=np.bincount([7, 9], minlength=10))  # units 0 and 2
    state.add(units[0], 0, result(10), 0.1, 0)
    assert state.final == {7: 3} and state.final_held == 3  # 2 top rows + 1 segment
    state.take(units[1:2])  # the tail brings unit 1 of case 7
    assert state.final == {} and state.final_held == 0 and state.units_left[7] == 1
    state.add(units[2], 0, result(10), 0.1, 0)
    assert list(state.final) == [9]
    sealed = state.pop_final()
    assert set(sealed.tops) == {9} and 7 in state.tops  # case 7 is not sealed half-done
    state.add(units[1], 10, result(20), 0.1, 0)
    assert state.final == {7: 3}


def test_a_case_the_shared_tail_still_holds_is_not_sealed_in_pieces():
    """A case with units in pieces of the shared tail not yet handed out is held, not
    sealed: pieces go out in order, so only once this rank has taken a later piece (or
    the last) can no more of it come here. Sealing it each time it finished here cut a
    top_n = 200,000 case into ~11 parts a rank (an outside review: 2.4 GB on rank 0 where
    sweep plan said 0.44)."""
    from types import SimpleNamespace

    from sweep.engine.plan import UNIT_DTYPE
    from sweep.engine.runner import _State
    from sweep.model.schema import RESULT_DTYPE

    units = np.zeros(4, UNIT_DTYPE)  # case 7: dealt, piece 0 and piece 2; case 9: piece 1
    units["unit_id"], units["case_id"] = [0, 1, 2, 3], [7, 7, 9, 7]
    units["start"], units["stop"] = [0, 10, 0, 20], [10, 20, 10, 30]
    top = np.zeros(2, RESULT_DTYPE)
    top["feasible"], top["samples_per_s"], top["index"] = True, [2.0, 1.0], [0, 1]

    def result(stop):
        return SimpleNamespace(stop=stop, reasons={}, evaluated=10, feasible=2, top=top)

    last = np.full(10, -1)
    last[7], last[9] = 2, 1
    state = _State(top_n=2, units_left=np.bincount([7], minlength=10), last_piece=last)
    state.add(units[0], 0, result(10), 0.1, 0)
    assert state.final == {} and state.held == {7}  # piece 0 and 2 may bring more
    state.take(units[1:2], 0)
    state.add(units[1], 10, result(20), 0.1, 0)
    assert state.final == {} and state.held == {7}  # (piece 1 went to another rank)
    state.take(units[3:4], 2)
    state.add(units[3], 20, result(30), 0.1, 0)
    assert state.final == {7: 3} and state.held == set()
    # a held case turns final when this rank takes a piece past its last one
    last[7], last[9] = 1, 2
    state = _State(top_n=2, units_left=np.bincount([7], minlength=10), last_piece=last)
    state.add(units[0], 0, result(10), 0.1, 0)
    assert state.held == {7}
    state.take(units[2:3], 2)  # piece 2: case 9 only
    assert state.final == {7: 3} and state.held == set() and state.units_left[9] == 1


def test_every_hardware_column_has_its_unit():
    """/cases' hardware columns carry their unit (exp_per_s read "s", and the calibration
    parameters named in microseconds and GiB had none)."""
    from sweep.engine.catalog import load_hardware
    from sweep.engine.reduce import hardware_unit

    record = load_hardware("GB200-NVL72").record()
    units = {k: hardware_unit(k) for k, v in record.items() if not isinstance(v, str)}
    assert units["exp_per_s"] == "1/s" and units["hbm_bytes_per_s"] == "B/s"
    assert units["calibration_kernel_us"] == units["calibration_expert_us"] == "us"
    assert units["calibration_reserve_GiB"] == "GiB" and units["nvlink_latency_s"] == "s"
    assert units["matrix_bf16_flops_per_s"] == "FLOP/s" and units["hbm_capacity_bytes"] == "B"
    unitless = {k for k, u in units.items() if u == ""}
    assert all(k.startswith(("calibration_", "gemm_tile", "nics", "sm_", "nvlink_domain"))
               or k.endswith(("_efficiency", "_fraction")) for k in unitless), unitless


def test_a_job_file_beside_the_spec_runs_and_resumes_from_anywhere(tmp_path, monkeypatch):
    """A job given as a path relative to the spec: the run folder's spec.yaml holds its
    definition under the name the spec gives it (by the job's own name it was looked for
    again on disk, relative to the run folder: the run failed unless started in the spec's
    folder), and that spec.yaml continues the run."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "myjob.yaml").write_text(
        (REPO / "jobs" / "llama3_8b.yaml").read_text().replace("name: llama3_8b", "name: own"))
    (folder / "spec.yaml").write_text("name: rel\njobs: [myjob.yaml]\ngpus: [8]\n"
                                      "hardware:\n  base: H100-SXM\ntop_n: 2\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    out = tmp_path / "out"
    first = run_sweep(str(folder / "spec.yaml"), SerialComm(), RunOptions(out_dir=out))
    assert first.reduced.complete and first.plan.spec.jobs[0].name == "own"
    again = run_sweep(str(out / "spec.yaml"), SerialComm(), RunOptions(out_dir=out,
                                                                         resume=True))
    assert again.evaluated == 0



def _slow_first_block(monkeypatch, runner, seconds=0.3):
    """The first search call of each run (of the runner) takes ``seconds`` longer, as a
    first block that compiles does."""
    for name in ("search_range", "search_cases"):
        real = getattr(runner, name)

        def slow(*args, _real=real, **kw):
            if not calls:
                time.sleep(seconds)
            calls.append(1)
            return _real(*args, **kw)
        monkeypatch.setattr(runner, name, slow)
    calls: list = []
    return calls


def test_a_slow_start_says_it_compiles(monkeypatch, tmp_path, capsys):
    """Numba compiles the loops before the first block is done (a minute or two, once per
    machine for each kind of job), which printed nothing: rank 0 says so once when its
    first block is not done STARTUP_NOTICE_S after the search starts; not when it is, nor
    with nothing to search, nor under --quiet, nor with numpy. (A slow first block stands
    in for the compiling.)"""
    from sweep.engine import runner

    monkeypatch.setattr(runner, "STARTUP_NOTICE_S", 0.05)
    calls = _slow_first_block(monkeypatch, runner)
    # (the suite evaluates with numpy, SWEEP_FUSE=0: as if the loops were compiled)
    monkeypatch.setattr(runner._StartupNotice, "compiles", staticmethod(lambda: True))
    said = []
    run_sweep(SMALL, SerialComm(), RunOptions(out_dir=tmp_path / "a", notice=said.append))
    assert len(said) == 1 and said[0].startswith("nothing searched yet after 0 s: numba is "
                                                 "compiling the model's loops")
    said.clear()  # a complete run shown again: nothing to search
    run_sweep(SMALL, SerialComm(), RunOptions(out_dir=tmp_path / "a", notice=said.append))
    assert said == []
    calls.clear()
    assert main(["run", "--serial", SMALL, "--out", str(tmp_path / "b"), "--limit", "1"]) == 0
    assert "sweep run: nothing searched yet" in capsys.readouterr().err
    calls.clear()
    assert main(["run", "--serial", SMALL, "--out", str(tmp_path / "c"), "--quiet"]) == 0
    assert "nothing searched yet" not in capsys.readouterr().err
    calls.append(1)  # (no slow first block)
    monkeypatch.setattr(runner, "STARTUP_NOTICE_S", 5.0)  # (blocks here take milliseconds)
    run_sweep(SMALL, SerialComm(), RunOptions(out_dir=tmp_path / "d", notice=said.append))
    assert said == []
    monkeypatch.undo()  # numpy (the suite's SWEEP_FUSE=0): nothing compiles, nothing to say
    monkeypatch.setattr(runner, "STARTUP_NOTICE_S", 0.05)
    _slow_first_block(monkeypatch, runner)
    run_sweep(SMALL, SerialComm(), RunOptions(out_dir=tmp_path / "e", notice=said.append))
    assert said == []

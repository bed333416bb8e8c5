"""sweep report and sweep plot never delete or overwrite a file they did not write."""

from __future__ import annotations

import os
import shutil

import pytest

from sweep.analysis.report import MARKER, write_report
from sweep.analysis.results import open_results
from sweep.cli import main
from sweep.engine.parallel import SerialComm
from sweep.engine.runner import RunOptions, run_sweep
from sweep.errors import SweepError
from tests.conftest import DATA


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "small"
    run_sweep(str(DATA / "specs" / "small.yaml"), SerialComm(), RunOptions(out_dir=out))
    return out


def _snapshot(folder):
    """{relative path: bytes} of every file under ``folder`` (hidden ones too)."""
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(capsys, args, *expect):
    assert main(["report", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    for text in expect:
        assert text in err, err
    return err


def test_the_working_directory_is_never_wiped(run, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    (work / "thesis.tex").write_text("\\chapter{Results}")
    (work / "figs").mkdir()
    (work / "figs" / "a.pdf").write_bytes(b"%PDF")
    before = _snapshot(tmp_path)
    monkeypatch.chdir(work)
    _refused(capsys, [str(run / "sweep.h5"), "-o", "."], f". (= {work})",
             f"is not empty and was not written by sweep report (no {MARKER} in it)")
    _refused(capsys, [str(run / "sweep.h5"), "-o", str(work)], str(work))
    assert _snapshot(tmp_path) == before  # nothing deleted, no temporary folder left


def test_a_run_folder_is_never_written(run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    before = _snapshot(tmp_path)
    _refused(capsys, [str(copy / "sweep.h5"), "-o", str(copy)],
             f"{copy} holds the results file sweep.h5; a report never writes into a run "
             f"folder; choose a new folder, e.g. -o {copy}/report")
    _refused(capsys, [str(copy / "sweep.h5"), "-o", f"{copy}/"], "holds the results file")
    (tmp_path / "link").symlink_to(copy)
    _refused(capsys, [str(copy / "sweep.h5"), "-o", str(tmp_path / "link")],
             f"link (= {copy}) holds the results file")
    # another run folder, even one with only a part file or only a spec, is refused too
    for keep in ("part-00000.h5", "spec.yaml"):
        other = tmp_path / f"other-{keep}"
        other.mkdir()
        shutil.copy(copy / keep, other / keep)
        _refused(capsys, [str(copy / "sweep.h5"), "-o", str(other)],
                 f"{other} is a sweep run folder (it holds {keep})")
    after = _snapshot(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("other-")} == before
    # a results file copied somewhere: its folder is not a report folder either
    shutil.copy(copy / "sweep.h5", tmp_path / "results.h5")
    _refused(capsys, [str(tmp_path / "results.h5"), "-o", str(tmp_path)],
             "holds the results file results.h5")
    # a folder inside the run folder is fine
    assert main(["report", str(copy / "sweep.h5"), "-o", str(copy / "report"),
                 "--kind", "scaling"]) == 0
    assert (copy / "report" / "index.html").exists()
    assert {k: v for k, v in _snapshot(copy).items() if not k.startswith("report/")} == \
        {k[len("run/"):]: v for k, v in before.items() if k.startswith("run/")}


def test_a_file_or_a_folder_of_other_files_is_refused(run, tmp_path, capsys):
    paper = tmp_path / "paper"
    paper.mkdir()
    (paper / "thesis.tex").write_text("x")
    (tmp_path / "file.txt").write_text("y")
    before = _snapshot(tmp_path)
    _refused(capsys, [str(run / "sweep.h5"), "-o", str(paper)], str(paper), "not empty")
    _refused(capsys, [str(run / "sweep.h5"), "-o", str(tmp_path / "file.txt")],
             "exists and is not a folder")
    _refused(capsys, [str(run / "sweep.h5"), "-o", str(tmp_path / "no" / "such")],
             f"{tmp_path / 'no'} does not exist")
    assert _snapshot(tmp_path) == before


def test_rewriting_a_report_replaces_only_its_own_files(run, tmp_path):
    res = open_results(run / "sweep.h5")
    out = tmp_path / "report"
    write_report(res, out, ["scaling", "memory"])
    names = {"index.html", "best.csv", "scaling.png", "memory.png"}
    assert {p.name for p in out.iterdir()} == names | {MARKER}
    listed = [n for n in (out / MARKER).read_text().splitlines() if not n.startswith("#")]
    assert sorted(listed) == sorted(names)
    assert out.stat().st_mode & 0o700 == 0o700 and (out / MARKER).stat().st_mode & 0o444
    # the user adds files; the next report keeps them and drops its own stale memory.png
    (out / "notes.txt").write_text("mine")
    (out / "sub").mkdir()
    (tmp_path / "outside.txt").write_text("keep")
    with open(out / MARKER, "a") as fh:  # names a report never removes
        fh.write("../outside.txt\nsub\n/etc/hostname\nnotes.txt/\n")
    old_index = (out / "index.html").read_bytes()
    write_report(res, out, ["scaling", "layout"])
    assert {p.name for p in out.iterdir()} == {"index.html", "best.csv", "scaling.png",
                                               "layout.png", MARKER, "notes.txt", "sub"}
    assert (out / "notes.txt").read_text() == "mine" and (out / "sub").is_dir()
    assert (tmp_path / "outside.txt").read_text() == "keep"
    assert (out / "index.html").read_bytes() != old_index and "layout.png" in \
        (out / "index.html").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders


def test_an_empty_folder_is_used(run, tmp_path, monkeypatch):
    out = tmp_path / "made-by-hand"
    out.mkdir()
    monkeypatch.chdir(out)
    write_report(open_results(run / "sweep.h5"), ".", ["scaling"])
    assert {p.name for p in out.iterdir()} == {"index.html", "best.csv", "scaling.png",
                                               MARKER}


def test_a_failed_report_leaves_everything_as_it_was(run, tmp_path, monkeypatch):
    import sweep.analysis.report

    res = open_results(run / "sweep.h5")
    out = tmp_path / "report"
    write_report(res, out, ["scaling"])
    before = _snapshot(tmp_path)

    def broken(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sweep.analysis.report, "_html", broken)
    with pytest.raises(SweepError, match="report: cannot write the report: No space left"):
        write_report(res, out, ["scaling"])
    with pytest.raises(SweepError, match="new: cannot write the report"):
        write_report(res, tmp_path / "new", ["scaling"])
    assert _snapshot(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["report"]


def test_plot_temporary_file_is_random_and_never_followed(run, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "plots"
    out.mkdir()
    (out / ".s.png.tmp.png").symlink_to(victim)  # the name the old code used
    assert main(["plot", str(run / "sweep.h5"), "--kind", "scaling",
                 "-o", str(out / "s.png")]) == 0
    assert victim.read_text() == "precious"
    assert (out / "s.png").read_bytes().startswith(b"\x89PNG")
    assert sorted(os.listdir(out)) == [".s.png.tmp.png", "s.png"]


def test_a_killed_reports_temporary_folder_is_removed_by_the_next(run, tmp_path):
    """A report killed with SIGKILL leaves its temporary folder beside the output: the next
    report of the same folder removes it once its process is gone and it is old enough;
    one of a live process, a recent one, another output's and a look-alike stay."""
    import subprocess
    import time

    from sweep.analysis import report

    res = open_results(run / "sweep.h5")
    out = tmp_path / "report"
    done = subprocess.run(["true"], check=True)  # (a pid that has exited)
    dead = subprocess.Popen(["true"])
    dead.wait()
    old = time.time() - 2 * report.STALE_AFTER_S
    folders = {
        "killed": tmp_path / f".report.report-{dead.pid}-abc123",
        "live": tmp_path / f".report.report-{os.getpid()}-def456",
        "recent": tmp_path / f".report.report-{dead.pid}-ghi789",
        "other": tmp_path / f".other.report-{dead.pid}-jkl012",
        "odd": tmp_path / ".report.report-notapid-x",
    }
    for name, folder in folders.items():
        folder.mkdir()
        (folder / "scaling.png").write_bytes(b"half-written")
        if name != "recent":
            os.utime(folder, (old, old))
    assert done.returncode == 0
    write_report(res, out, ["scaling"])
    assert not folders["killed"].exists()
    assert all(folders[k].exists() for k in ("live", "recent", "other", "odd"))
    assert (out / "index.html").is_file()

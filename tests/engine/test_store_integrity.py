"""sweep.engine.store: checksummed tables, random temporary names, clean errors on a full or
read-only disk."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

from sweep.cli import main
from sweep.engine.parallel import SerialComm
from sweep.engine.runner import RunOptions, run_sweep
from sweep.engine.store import (
    DONE_DTYPE,
    TOP_DTYPE,
    CorruptFileError,
    read_part,
    read_part_done,
    read_results,
    write_part,
    write_text_atomic,
)
from sweep.errors import StoreError
from tests.conftest import DATA, REPO


def _tables(n_top=12, n_done=3, noise=False):
    top = (np.frombuffer(os.urandom(n_top * TOP_DTYPE.itemsize), TOP_DTYPE).copy() if noise
           else np.zeros(n_top, TOP_DTYPE))
    top["case_id"] = np.arange(n_top) // 4
    top["place"] = np.arange(n_top) % 4
    top["samples_per_s"] = 1234.5678 - np.arange(n_top)  # distinct, easy to find on disk
    top["feasible"] = True
    done = np.zeros(n_done, DONE_DTYPE)
    done["unit_id"] = np.arange(n_done)
    return done, top


def _write(path, n_top=12, noise=False):
    done, top = _tables(n_top, noise=noise)
    write_part(path, {"spec_sha256": "x" * 64, "rank": 0, "size": 1, "complete": True},
               done, top)
    return done, top


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("store") / "small"
    run_sweep(str(DATA / "specs" / "small.yaml"), SerialComm(), RunOptions(out_dir=out))
    return out


def _flip_float_on_disk(path, table, value, new_value):
    """Overwrite the 8 bytes of ``value`` in the (uncompressed) first chunk of ``table``."""
    with h5py.File(path, "r") as f:
        ds = f[table]
        assert ds.compression is None  # small tables are stored uncompressed
        start = ds.id.get_chunk_info(0).byte_offset
    raw = bytearray(path.read_bytes())
    at = raw.find(np.float64(value).tobytes(), start)
    assert at >= start
    raw[at:at + 8] = np.float64(new_value).tobytes()
    path.write_bytes(bytes(raw))


# ------------------------------------------------------------------------------ contract

def test_every_table_is_chunked_with_fletcher32_and_a_sha256(run):
    import pandas as pd

    for name in ("part-00000.h5", "sweep.h5"):
        with h5py.File(run / name, "r") as f:
            for key in f:
                ds = f[key]
                assert ds.chunks and ds.fletcher32, (name, key)
                assert ds.attrs["sha256"] == hashlib.sha256(ds[()].tobytes()).hexdigest()
                assert json.loads(ds.attrs["columns"])  # units and descriptions kept
            assert len(pd.DataFrame(f["top"][:])) == len(f["top"])
    done, _ = _write(run.parent / "empty.h5", n_top=0)  # an empty table is chunked too
    _, d, t = read_part(run.parent / "empty.h5")
    assert len(t) == 0 and d.tobytes() == done.tobytes()


# ------------------------------------------------------------------------------ corruption

def test_changed_bytes_on_disk_are_detected(tmp_path, capsys):
    path = tmp_path / "part-00000.h5"
    done, top = _write(path)
    _, d, t = read_part(path)
    assert t.tobytes() == top.tobytes() and d.tobytes() == done.tobytes()
    _flip_float_on_disk(path, "top", top["samples_per_s"][5], 1e12)  # a fake best
    with pytest.raises(CorruptFileError, match=r"part-00000.h5: corrupt: checksum of /top "
                                               r"does not match"):
        read_part(path)
    assert issubclass(CorruptFileError, StoreError)


def _copy_with_a_fake_best(run, bad):
    """A copy of the finished run ``run`` without its sweep.h5, part 0's best throughput
    changed on disk (its checksum no longer matches)."""
    shutil.copytree(run, bad)
    (bad / "sweep.h5").unlink()
    with h5py.File(bad / "part-00000.h5", "r") as f:
        best = float(f["top"]["samples_per_s"][0])
    _flip_float_on_disk(bad / "part-00000.h5", "top", best, best * 10)


def test_reduce_refuses_a_corrupt_part(run, tmp_path, capsys):
    bad = tmp_path / "bad"
    _copy_with_a_fake_best(run, bad)
    assert main(["reduce", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{bad}/part-00000.h5: corrupt: checksum of /top does not match" in err
    assert not (bad / "sweep.h5").exists()


def test_status_verify_finds_a_corrupt_top_table_and_resume_repairs_it(run, tmp_path,
                                                                       capsys):
    bad = tmp_path / "bad"
    _copy_with_a_fake_best(run, bad)
    # the units tables alone are sound: done, and the hint to check the rest
    assert main(["status", str(bad)]) == 0
    assert "--verify checks every table first" in capsys.readouterr().out
    assert main(["status", str(bad), "--verify"]) == 1
    out = capsys.readouterr().out
    assert "CORRUPT" in out and "checksum of /top does not match" in out
    assert "--resume sets the damaged part file(s) aside" in out
    assert main(["status", str(bad), "--verify", "--json"]) == 1
    st = json.loads(capsys.readouterr().out)
    assert st["corrupt_parts"] == ["part-00000.h5"] and st["units_done"] < st["units"]
    assert main(["run", str(bad / "spec.yaml"), "--out", str(bad), "--resume",
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["status", str(bad), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "CORRUPT" not in out and "checked: every table's checksum matches" in out
    # a damaged sweep.h5: said, and the reduce that writes it again
    with h5py.File(bad / "sweep.h5", "r") as f:
        best = float(f["top"]["samples_per_s"][0])
    _flip_float_on_disk(bad / "sweep.h5", "top", best, best * 10)
    assert main(["status", str(bad), "--verify"]) == 1
    out = capsys.readouterr().out
    assert "sweep.h5: CORRUPT" in out and f"next: sweep reduce {bad} writes sweep.h5" in out
    assert main(["reduce", str(bad)]) == 0
    assert main(["status", str(bad), "--verify"]) == 0


@pytest.mark.parametrize("name", ["part-00000.h5", "sweep.h5"])
def test_damage_anywhere_in_the_first_40_percent_is_one_line_not_a_traceback(run, tmp_path,
                                                                            capsys, name):
    """8 bytes flipped at 0, 2, ..., 38 % of a part file (then reduce) or of sweep.h5 (then
    show): HDF5's object headers and B-trees live there; a damaged one used to surface as
    a KeyError traceback from h5py (found by an outside tester)."""
    size = (run / name).stat().st_size
    for percent in range(0, 40, 2):
        bad = tmp_path / f"b{percent}"
        shutil.copytree(run, bad)
        raw = bytearray((bad / name).read_bytes())
        at = size * percent // 100
        raw[at:at + 8] = bytes(b ^ 0xFF for b in raw[at:at + 8])
        (bad / name).write_bytes(bytes(raw))
        if name == "sweep.h5":
            code = main(["show", str(bad / "sweep.h5")])
        else:
            (bad / "sweep.h5").unlink()
            code = main(["reduce", str(bad)])
        err = capsys.readouterr().err
        assert code in (0, 2), (percent, code, err)
        if code == 2:
            assert err.count("\n") == 1 and str(bad) in err, (percent, err)


def test_a_corrupt_results_file_is_refused(run, tmp_path, capsys):
    path = tmp_path / "sweep.h5"
    shutil.copy(run / "sweep.h5", path)
    with h5py.File(path, "r") as f:
        best = float(f["cases"]["best_samples_per_s"][3])
    _flip_float_on_disk(path, "cases", best, best * 10)
    with pytest.raises(CorruptFileError, match=r"corrupt: checksum of /cases does not match"):
        read_results(path)
    assert main(["show", str(path)]) == 2
    assert "corrupt: checksum of /cases" in capsys.readouterr().err


def test_a_spec_given_for_its_results_is_named_so(tmp_path, capsys):
    """sweep show SPEC.yaml said "unreadable or corrupt HDF5 file (file signature not
    found)" (an outside tester's finding)."""
    spec = tmp_path / "mine.yaml"
    spec.write_text("name: mine\njobs: [gpt3_1T]\ngpus: [8]\nhardware: {base: nersc-B200}\n")
    assert main(["show", str(spec)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{spec}: a spec, not a results file" in err


def test_changed_root_attributes_are_detected(run, tmp_path):
    """The spec text lives in HDF5's global heap, which has no checksum of its own."""
    from sweep.engine.store import read_results_attrs

    path = tmp_path / "sweep.h5"
    raw = bytearray((run / "sweep.h5").read_bytes())
    at = raw.find(b"cost_model: nersc2024")
    assert at > 0
    raw[at:at + 10] = b"cost_model"[::-1]
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptFileError, match="checksum of the root attributes does not "
                                               "match"):
        read_results_attrs(path)


def test_sha256_catches_a_change_that_keeps_fletcher32_valid(tmp_path):
    """Rewritten through HDF5 (its Fletcher32 sums recomputed), the data no longer matches
    the sha256 stored with it."""
    path = tmp_path / "part-00000.h5"
    _write(path)
    with h5py.File(path, "r+") as f:
        row = f["top"][0]
        row["samples_per_s"] = 1e12
        f["top"][0] = row
    with pytest.raises(CorruptFileError, match=r"checksum of /top does not match its data"):
        read_part(path)
    read_part_done(path)  # /units is intact


def test_files_without_checksums(run, tmp_path):
    """Parts from before checksums are refused (their work can be redone); results files
    from before are still read."""
    old = tmp_path / "part-00000.h5"
    done, top = _tables()
    with h5py.File(old, "w") as f:
        f.attrs.update({"schema_version": 1, "kind": "part", "spec_sha256": "x" * 64})
        f["units"], f["top"] = done, top
    for read in (read_part, read_part_done):
        with pytest.raises(CorruptFileError, match=r"/(top|units) has no checksum \(written by an "
                                                   r"older sweep version\)"):
            read(old)
    results = tmp_path / "sweep.h5"
    with h5py.File(run / "sweep.h5", "r") as f, h5py.File(results, "w") as g:
        g.attrs.update(dict(f.attrs))
        for name in ("cases", "top", "units"):
            g[name] = f[name][()]
    _, data = read_results(results)
    assert data["top"].tobytes() == read_results(run / "sweep.h5")[1]["top"].tobytes()


def test_garbage_is_unreadable_not_a_crash(tmp_path):
    path = tmp_path / "part-00000.h5"
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(300))
    with pytest.raises(CorruptFileError, match="unreadable or corrupt HDF5 file"):
        read_part(path)
    with pytest.raises(StoreError, match="no such file"):
        read_part(tmp_path / "part-00001.h5")


# ------------------------------------------------------------------------------ temp files

def test_temporary_files_have_random_names_and_never_follow_links(tmp_path, monkeypatch):
    victim = tmp_path / "outside.txt"
    victim.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    # the names the old code used, planted as links to a file outside the folder
    for name in ("part-00000.h5", "sweep.h5", "spec.yaml"):
        (run / f".{name}.tmp-{os.getpid()}").symlink_to(victim)
    renamed = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (renamed.append(a), real_replace(a, b)))
    _write(run / "part-00000.h5")
    _write(run / "part-00000.h5")
    write_text_atomic(run / "spec.yaml", "name: x\n")
    assert victim.read_text() == "precious"
    # (not the old ".NAME.tmp-PID": a random name may contain the pid's digits by chance, as
    # a small pid on a fresh CI machine did)
    assert len(set(renamed)) == 3 and all(not os.path.basename(a).endswith(f".tmp-{os.getpid()}")
                                          for a in renamed)
    assert (run / "spec.yaml").read_text() == "name: x\n"
    read_part(run / "part-00000.h5")
    left = {p.name for p in run.iterdir()} - {"part-00000.h5", "spec.yaml"}
    assert all((run / n).is_symlink() for n in left)  # only the planted links remain
    assert oct((run / "part-00000.h5").stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    import sweep.engine.store

    path = tmp_path / "part-00000.h5"
    _write(path)
    before = path.read_bytes()

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(sweep.engine.store.os, "write", full)
    with pytest.raises(StoreError, match=r"part-00000.h5: cannot write: No space left on "
                                         r"device; free some space"):
        _write(path, n_top=100)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["part-00000.h5"]


# ------------------------------------------------------------------------------ real disks

@pytest.fixture
def tmpfs(tmp_path):
    """A 512 KiB tmpfs (root only; skipped where mounting is not permitted)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    yield disk
    if subprocess.run(["umount", str(disk)], capture_output=True).returncode:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _remount_read_only(disk) -> None:
    """Make the tmpfs ``disk`` read-only (skipped where remounting is not permitted)."""
    ro = subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True,
                        text=True, check=False)
    if ro.returncode:
        pytest.skip(f"cannot remount read-only: {ro.stderr.strip()}")


def _fill(disk, leave):
    """Fill ``disk`` up, then free ``leave`` bytes."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, bytes(4096)):
            pass
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


def test_disk_full_for_real(run, tmpfs):
    for name in ("spec.yaml", "part-00000.h5"):
        shutil.copy(run / name, tmpfs / name)
    filler = _fill(tmpfs, leave=16 * 1024)  # sweep.h5 needs ~56 KB
    reduce = subprocess.run([sys.executable, "-m", "sweep", "reduce", str(tmpfs)],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert reduce.returncode == 2, reduce.stderr  # not a traceback, not a segfault (139)
    assert reduce.stderr.count("\n") == 1
    assert f"{tmpfs}/sweep.h5: cannot write: No space left on device" in reduce.stderr
    with pytest.raises(StoreError, match="part-00001.h5: cannot write: No space left"):
        _write(tmpfs / "part-00001.h5", n_top=2000, noise=True)  # 520 KB
    left = set(os.listdir(tmpfs)) - {"filler", "part-00000.h5", "spec.yaml", ".sweep.lock"}
    assert not left  # no temporary file
    filler.unlink()
    assert main(["reduce", str(tmpfs)]) == 0
    assert read_results(tmpfs / "sweep.h5")[1]["top"].tobytes() == \
        read_results(run / "sweep.h5")[1]["top"].tobytes()


def test_read_only_folder(tmp_path, tmpfs):
    _write(tmpfs / "part-00000.h5")
    before = (tmpfs / "part-00000.h5").read_bytes()
    _remount_read_only(tmpfs)
    with pytest.raises(StoreError, match="part-00000.h5: cannot write: Read-only file system"):
        _write(tmpfs / "part-00000.h5", n_top=50)
    with pytest.raises(StoreError, match="spec.yaml: cannot write: Read-only file system"):
        write_text_atomic(tmpfs / "spec.yaml", "x")
    assert os.listdir(tmpfs) == ["part-00000.h5"]
    assert (tmpfs / "part-00000.h5").read_bytes() == before


def test_a_complete_run_in_a_read_only_folder_is_shown(tmpfs, capsys):
    """`sweep run` of the same spec into a folder holding its complete run shows the results
    again; on a read-only file system it does so without writing (it took the folder lock
    first and failed: an outside tester's finding), and what would write says so in one
    line."""
    spec = str(DATA / "specs" / "small.yaml")
    out = tmpfs / "run"
    assert main(["run", spec, "--serial", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    _remount_read_only(tmpfs)
    assert main(["run", spec, "--serial", "--out", str(out)]) == 0
    shown = capsys.readouterr()
    assert "showing its results (the folder is read-only here: nothing written)" in shown.err
    assert "nothing left to compute" in shown.out and f"results: {out}/sweep.h5" in shown.out
    assert "gpt3_1T" in shown.out
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    assert main(["run", spec, "--serial", "--out", str(out), "--force"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Read-only file system" in err[0], err


def test_read_only_folder_as_a_user(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into any folder; the tmpfs test covers root")
    _write(tmp_path / "part-00000.h5")
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(StoreError, match="part-00000.h5: cannot write: Permission denied"):
            _write(tmp_path / "part-00000.h5", n_top=50)
        assert os.listdir(tmp_path) == ["part-00000.h5"]
    finally:
        tmp_path.chmod(0o755)


def test_a_large_results_file_needs_room_first(run, tmp_path, monkeypatch, capsys):
    """Results too large to build in memory go straight to disk, but only once the folder
    has room for the tables uncompressed: otherwise one line, exit 2, no temporary file,
    the earlier sweep.h5 untouched."""
    from collections import namedtuple

    from sweep.engine import store as store_module

    folder = tmp_path / "big"
    shutil.copytree(run, folder)
    before = (folder / "sweep.h5").read_bytes()
    monkeypatch.setattr(store_module, "IMAGE_BYTES", 0)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(store_module.shutil, "disk_usage", lambda p: usage(10**6, 10**6, 4096))
    assert main(["reduce", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sweep.h5: cannot write: No space left on device (the " \
        "results need about" in err
    assert (folder / "sweep.h5").read_bytes() == before
    assert not [p for p in os.listdir(folder) if p.endswith(".tmp")]
    (folder / ".sweep.h5.abc123.tmp").write_bytes(b"left by a killed reduction")
    monkeypatch.undo()
    monkeypatch.setattr(store_module, "IMAGE_BYTES", 0)
    assert main(["reduce", str(folder)]) == 0  # with room: streamed, same tables
    assert not (folder / ".sweep.h5.abc123.tmp").exists()  # the stale one removed
    with h5py.File(folder / "sweep.h5") as a, h5py.File(run / "sweep.h5") as b:
        assert a["top"].attrs["sha256"] == b["top"].attrs["sha256"]
        assert a["cases"][()].tobytes() == b["cases"][()].tobytes()


def test_show_streams_a_file_slice_by_slice(run):
    """Slices of a few cases give, together, the rows and the CSV / JSON of the whole file
    read at once (what sweep show does with a file of more than SLICE_CASES cases)."""
    import io
    import itertools
    import json

    from sweep.analysis.show import format_rows, iter_rows, load_rows, write_rows

    path = run / "sweep.h5"
    attrs, whole = load_rows(path, top=3)
    for size in (1, 2, 5, 1000):
        sliced = list(iter_rows(path, top=3, slice_cases=size))
        assert len(sliced) == -(-attrs["n_cases"] // size)
        streamed_rows = list(itertools.chain.from_iterable(r for _, r in sliced))
        assert repr(streamed_rows) == repr(whole)  # (repr: NaN equals NaN)
        for kind in ("csv", "json", "table"):
            out = io.StringIO()
            write_rows(out, sliced, kind)
            streamed, at_once = out.getvalue().rstrip("\n"), format_rows(attrs, whole, kind)
            if kind == "json":
                assert json.loads(streamed) == json.loads(at_once)
            elif kind == "csv" or size == 1000:
                assert streamed == at_once
            else:  # the table keeps its first slice's widths: the same cells
                def cells(text):
                    lines = text.splitlines()
                    return [line.split() for line in lines[:1] + lines[2:]]  # (not the rule)
                assert cells(streamed) == cells(at_once)


def test_a_corrupt_file_streamed_is_refused_before_its_first_slice(run, tmp_path):
    from sweep.analysis.show import iter_rows

    path = tmp_path / "sweep.h5"
    shutil.copy(run / "sweep.h5", path)
    with h5py.File(path, "r") as f:
        best = float(f["cases"]["best_samples_per_s"][3])
    _flip_float_on_disk(path, "cases", best, best * 10)
    sliced = iter_rows(path, slice_cases=2)
    with pytest.raises(CorruptFileError, match=r"corrupt: checksum of /cases"):
        next(sliced)  # nothing of a corrupt file is given (sweep show prints nothing)

"""A corpus of bad specs: each gets one line naming the file and the key, exit code 2, and
nothing written. Every file in tests/data/bad_specs starts with ``# expect: <message>``."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep.cli import main
from tests.conftest import DATA

CORPUS = sorted((DATA / "bad_specs").glob("*.yaml"))


def expected(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: ")
    return first[len("# expect: "):]


def test_corpus_is_there():
    assert len(CORPUS) >= 53


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
@pytest.mark.parametrize("command", ["plan", "run", "slurm"])
def test_bad_spec(path, command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    argv = {"plan": ["plan", str(path)],
            "run": ["run", str(path), "--out", str(out), "--serial"],
            "slurm": ["slurm", str(path), "--out", str(out), "--submit"]}[command]
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert f"{path}: " in lines[0] and expected(path) in lines[0], lines[0]
    assert not out.exists() and not (tmp_path / "results").exists()

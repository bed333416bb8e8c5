"""The results of every shipped spec stay what they were: each run's ``/cases`` and ``/top``
tables against fingerprints recorded in tests/data/results_fingerprints.json (issue 19:
batched evaluation, lazy plans, sealed parts and a sliced reduction changed how results
are computed and written, not what they are).

A fingerprint is the table's SHA-256 (bit for bit) and, per column, the SHA-256 of an
integer or text column and the exact sum of a float one (math.fsum). Bit-identical tables
pass; on another CPU, where numpy's exp / log / power may round the last bit differently,
the integer and text columns must still be identical (same layouts chosen, same order) and
every float column's sum equal to 1e-12 relative. The specs that take more than a few
seconds run under ``mpiexec -n 2`` with ``-m slow`` (CI runs them as a step of its own;
the MoE study among them, with its table and report).

Regenerate after a deliberate change of results (and say so in the commit):
``python -m tests.engine.test_results_identity RUN_DIR...`` (one run folder per spec, named
as the spec or the ids below).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.conftest import DATA, REPO
from tests.engine.mpi.conftest import mpiexec

FINGERPRINTS = DATA / "results_fingerprints.json"

#: id -> (spec, --set overrides, slow)
SPECS = {
    "nersc-quickstart": ("nersc-quickstart", (), False),
    "quickstart": ("quickstart", (), True),
    "nersc-generations-gpt3_1T": ("nersc-generations-gpt3_1T", (), False),
    "nersc-flops-capacity": ("nersc-flops-capacity", (), True),
    "scale-1m-variants-cut": ("scale-1m-variants", (
        "hardware.grid.hbm_GBps={from: 1000, to: 20000, points: 4}",
        "hardware.grid.hbm_GB={from: 80, to: 1280, points: 5}",
        "hardware.grid.matrix_tflops={from: 1000, to: 10000, points: 2}",
        "hardware.grid.scaleout_Gbps={from: 100, to: 1600, points: 2}"), False),
    "nersc-generations-vit_era5": ("nersc-generations-vit_era5", (), True),
    "nersc-b200-hbm-grid": ("nersc-b200-hbm-grid", (), True),
    "scale-80k-variants": ("scale-80k-variants", (), True),
    "moe-nvlink-domain-64": ("moe-nvlink-domain", ("gpus=64",), True),
    "hybrid-long-context": ("hybrid-long-context", (), False),
    "latent-moe-nvlink": ("latent-moe-nvlink", (), True),
    "deepseek-v4-nvlink": ("deepseek-v4-nvlink", (), False),
    "sparse-attention-long-context": ("sparse-attention-long-context", (), True),
}


def fingerprint(path: Path) -> dict:
    """Fingerprints of a sweep.h5's /cases and /top."""
    out = {}
    with h5py.File(path, "r") as f:
        for name in ("cases", "top"):
            data = f[name][()]
            columns = {}
            for col in data.dtype.names:
                values = data[col]
                if values.dtype.kind == "f":
                    finite = np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
                    columns[col] = [math.fsum(finite.tolist()),
                                    int(np.count_nonzero(np.isnan(values)))]
                else:
                    columns[col] = hashlib.sha256(
                        np.ascontiguousarray(values).view(np.uint8)).hexdigest()
            out[name] = {"sha256": f[name].attrs["sha256"], "rows": len(data),
                         "columns": columns}
    return out


def _compare(got: dict, want: dict) -> None:
    for name in ("cases", "top"):
        g, w = got[name], want[name]
        if g["sha256"] == w["sha256"]:
            continue  # bit for bit
        assert g["rows"] == w["rows"], name
        assert sorted(g["columns"]) == sorted(w["columns"]), name
        for col, value in w["columns"].items():
            if isinstance(value, str):
                assert g["columns"][col] == value, f"/{name} column {col} changed"
            else:
                assert g["columns"][col][1] == value[1], f"/{name} column {col}: NaNs"
                assert g["columns"][col][0] == pytest.approx(value[0], rel=1e-12, abs=0), \
                    f"/{name} column {col} changed"


def _run(spec_id: str, out: Path) -> Path:
    """The spec run serially (the quick ones) or under ``mpiexec -n 2`` (the slow ones),
    with fused evaluation where numba is installed (fuse.py; the fingerprints were recorded
    with numpy)."""
    spec, overrides, slow = SPECS[spec_id]
    fused = {"SWEEP_FUSE": "1"}
    args = ["run", str(REPO / "specs" / f"{spec}.yaml"), "--out", str(out), "--quiet"]
    for item in overrides:
        args += ["--set", item]
    if slow:
        proc = mpiexec(2, *args, timeout=1200, env=fused)
    else:
        proc = subprocess.run([sys.executable, "-m", "sweep", *args, "--serial"],
                              capture_output=True, text=True, timeout=900, cwd=REPO,
                              env={**os.environ, **fused})
    assert proc.returncode == 0, proc.stderr
    return out / "sweep.h5"


@pytest.mark.parametrize("spec_id", [
    pytest.param(k, marks=[pytest.mark.slow, pytest.mark.mpi, pytest.mark.timeout(1200)]
                 if slow else [])
    for k, (_, _, slow) in SPECS.items()])
def test_shipped_spec_results_unchanged(spec_id, tmp_path, capsys):
    want = json.loads(FINGERPRINTS.read_text())[spec_id]
    results = _run(spec_id, tmp_path / spec_id)
    _compare(fingerprint(results), want)
    if spec_id == "moe-nvlink-domain-64":  # the MoE study end to end: table and report
        from sweep.cli import main

        capsys.readouterr()
        assert main(["show", str(results), "--format", "csv"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert sum(("deepseek_v3" in x) or ("qwen3" in x) for x in lines) == 16
        assert main(["report", str(results), "-o", str(tmp_path / "report")]) == 0
        assert (tmp_path / "report" / "index.html").is_file()


def test_every_shipped_spec_is_fingerprinted():
    shipped = {p.stem for p in (REPO / "specs").glob("*.yaml")}
    assert shipped == {spec for spec, _, _ in SPECS.values()}
    assert set(json.loads(FINGERPRINTS.read_text())) == set(SPECS)


def test_a_changed_number_is_caught(tmp_path):
    """The comparison fails on one changed float (not only on a changed hash)."""
    want = json.loads(FINGERPRINTS.read_text())["nersc-quickstart"]
    got = json.loads(json.dumps(want))
    got["top"]["sha256"] = "0" * 64
    _compare(got, want)  # same columns: passes
    got["top"]["columns"]["samples_per_s"][0] *= 1 + 1e-9
    with pytest.raises(AssertionError, match="samples_per_s"):
        _compare(got, want)


if __name__ == "__main__":  # python -m tests.engine.test_results_identity RUN_DIR...
    table = json.loads(FINGERPRINTS.read_text()) if FINGERPRINTS.exists() else {}
    for folder in sys.argv[1:]:
        table[Path(folder).name] = fingerprint(Path(folder) / "sweep.h5")
    FINGERPRINTS.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")

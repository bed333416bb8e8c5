"""Results files the analysis tests share: a small calibrated sweep and its report."""

from __future__ import annotations

import pytest

from sweep.cli import main
from sweep.engine.parallel import SerialComm
from sweep.engine.runner import RunOptions, run_sweep

GRID_SPEC = """
name: grid
jobs: [llama3_8b]
gpus: [16, 32]
hardware:
  base: H100-SXM
  grid:
    hbm_GBps: [2000, 3350]
    hbm_GiB: [40, 80]
top_n: 3
"""


@pytest.fixture(scope="session")
def grid(tmp_path_factory):
    """calibrated: HBM bandwidth x capacity on H100, 1d and 2d, 16 and 32 GPUs."""
    d = tmp_path_factory.mktemp("grid")
    (d / "grid.yaml").write_text(GRID_SPEC)
    run_sweep(str(d / "grid.yaml"), SerialComm(), RunOptions(out_dir=d / "out"))
    return d / "out" / "sweep.h5"


@pytest.fixture(scope="session")
def grid_report(grid, tmp_path_factory):
    """The folder ``sweep report GRID -o NEW`` writes (every figure kind: 5 - 8 s to draw,
    so drawn once for the tests that read it)."""
    target = tmp_path_factory.mktemp("grid-report") / "new"
    assert main(["report", str(grid), "-o", str(target)]) == 0
    return target

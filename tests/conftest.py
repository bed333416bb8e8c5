"""Shared fixtures: the repository root and catalog lookups."""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from sweep.engine.catalog import load_hardware, load_job

# The suite evaluates with numpy unless a test turns fused evaluation on (test_fuse.py and
# the results-identity runs do): the compiled loops are checked against numpy there, and
# the rest of the suite does not pay their compilation on a fresh machine.
os.environ.setdefault("SWEEP_FUSE", "0")
# Traces of the model kept on disk go to a folder of the session's own (removed at its end):
# some tests patch model constants, which a trace kept in the user's cache must not see.
_TRACES = tempfile.mkdtemp(prefix="sweep-test-traces-")
os.environ["SWEEP_TRACE_DIR"] = _TRACES
atexit.register(shutil.rmtree, _TRACES, True)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


@pytest.fixture(scope="session", autouse=True)
def _bytecode_for_child_processes():
    """With PYTHONDONTWRITEBYTECODE set (some CI images and sandboxes set it), each of the
    suite's few hundred child processes (mpiexec ranks, command-line runs) compiles sweep's
    modules again: 0.6 s a process, 1.5 of the 5 minutes the suite took on 2 cores. The
    session compiles them once where Python looks for them and removes what it wrote at
    the end, so outside the run the setting holds."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        yield
        return
    import compileall
    import importlib.util

    import sweep

    package = Path(sweep.__file__).parent
    caches = [Path(importlib.util.cache_from_source(str(p))) for p in package.rglob("*.py")]
    new_files = [c for c in caches if not c.exists()]
    new_dirs = {c.parent for c in new_files if not c.parent.exists()}
    compileall.compile_dir(package, quiet=2)  # (a read-only install: nothing written)
    try:
        yield
    finally:
        for c in new_files:
            c.unlink(missing_ok=True)
        for d in new_dirs:
            try:
                d.rmdir()
            except OSError:  # something else wrote there meanwhile: left as it is
                pass


@pytest.fixture
def nersc_hw():
    """nersc_hw(system, nvlink_domain) -> the NERSC system with that domain size."""
    def make(system: str, nvs: int | None = None):
        hw = load_hardware(f"nersc-{system}")
        return dataclasses.replace(hw, nvlink_domain=nvs) if nvs else hw
    return make


@pytest.fixture
def job():
    return load_job


def candidate_block(n: int = 1, **kw) -> dict:
    """Column block of ``n`` identical calibrated-profile candidates: degrees 1 unless given,
    each group inside one NVLink domain of 8 unless its nv_* is given, EP ranks per domain
    from that placement (candidates.expert_ranks_per_domain)."""
    import numpy as np

    from sweep.model.candidates import expert_ranks_per_domain
    from sweep.model.schema import CANDIDATE_DTYPE, empty_candidates

    c = empty_candidates(n)
    c["dp"] = c["tp"] = c["pp"] = c["mbs"] = 1
    for k, v in kw.items():
        c[k] = v
    for nv, g in (("nv_tp", "tp"), ("nv_tp2", "tp2"), ("nv_cp", "cp"), ("nv_dp", "dp"),
                  ("nv_pp", "pp")):
        if nv not in kw:
            c[nv] = np.minimum(c[g], 8)
    cols = {k: c[k].astype(np.int64) for k in CANDIDATE_DTYPE.names}
    if "nv_ep" not in kw:
        cols["nv_ep"] = expert_ranks_per_domain(cols)
    return cols


def calibrated_context(job, hardware: str = "H100-SXM") -> dict:
    """The calibrated profile's context of ``job`` on a catalog GPU, at its generation's
    calibration."""
    from sweep.engine.catalog import load_hardware
    from sweep.model.cost import calibrated

    hw = load_hardware(hardware)
    return calibrated.make_context(job, hw, hw.calibration)


def calibrated_step(job, hardware: str = "H100-SXM", n: int = 1, **config) -> dict:
    """One candidate of ``config`` (candidate_block) evaluated by the calibrated profile on
    ``n`` GPUs, data parallel over what tp x cp x pp leave."""
    import numpy as np

    from sweep.model.cost import calibrated

    c = candidate_block(1, **config)
    c["dp"] = np.asarray([n // (c["tp"][0] * c["cp"][0] * c["pp"][0])])
    return calibrated.evaluate(calibrated_context(job, hardware), c)

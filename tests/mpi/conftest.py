"""Helpers to launch ``sweep`` under a real ``mpiexec`` (the one next to this Python)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
MPIEXEC = shutil.which("mpiexec", path=str(BIN)) or shutil.which("mpiexec")


def mpiexec(n: int, *args: str, env: dict | None = None, timeout: float = 300,
            popen: bool = False):
    """Run ``mpiexec -n N python -m mpi4py -m sweep ARGS``; returns CompletedProcess."""
    if MPIEXEC is None:
        pytest.skip("no mpiexec (install the 'mpich' extra)")
    cmd = [MPIEXEC, "-n", str(n), sys.executable, "-m", "mpi4py", "-m", "sweep", *args]
    full_env = {**os.environ, **(env or {})}
    full_env.pop("SLURM_STEP_NUM_TASKS", None)
    if popen:
        return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)

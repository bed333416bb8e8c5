"""The pure core imports no MPI, HDF5, YAML, logging and does no I/O or printing."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "sweep"
PURE = [*sorted((PKG / "cost").glob("*.py")), PKG / "candidates.py", PKG / "topn.py",
        PKG / "search.py"]
FORBIDDEN_MODULES = {"mpi4py", "h5py", "yaml", "logging", "pickle", "subprocess"}
FORBIDDEN_CALLS = {"print", "open", "input"}


def test_pure_modules_exist():
    assert len(PURE) >= 8


def test_no_forbidden_imports_or_calls():
    for path in PURE:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[0]}
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in FORBIDDEN_CALLS, f"{path.name}: {node.func.id}()"
                continue
            else:
                continue
            assert not names & FORBIDDEN_MODULES, f"{path.name} imports {names}"


def test_one_module_imports_mpi4py_and_one_writes_hdf5():
    mpi, h5 = [], []
    for path in PKG.rglob("*.py"):
        text = path.read_text()
        if "import mpi4py" in text or "from mpi4py" in text:
            mpi.append(path.name)
        if "import h5py" in text:
            h5.append(path.name)
    assert mpi in ([], ["parallel.py"])
    assert h5 in ([], ["store.py"])

"""The package's layers, read from the source: cli -> analysis -> engine -> model.

* ``sweep.model`` (and the pure partition code) imports no MPI, HDF5, YAML or logging and
  does no I/O or printing;
* one module imports mpi4py (engine/parallel.py) and one writes HDF5 (engine/store.py);
* imports point one way between layers, and no two modules import each other, even through
  a chain or inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "sweep"
PURE = [*sorted((PKG / "model").rglob("*.py")), PKG / "engine" / "partition.py"]
FORBIDDEN_MODULES = {"mpi4py", "h5py", "yaml", "logging", "pickle", "subprocess"}
FORBIDDEN_CALLS = {"print", "open", "input"}
#: what each layer may import from sweep besides itself (errors and _version: every layer)
ALLOWED = {"model": set(), "engine": {"model"}, "analysis": {"engine", "model"},
           "cli": {"analysis", "engine", "model"}}
SHARED = {"sweep", "sweep.errors", "sweep._version"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def sweep_imports(name: str) -> set[str]:
    """The sweep modules ``name`` imports anywhere in its source (function bodies too)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("sweep"):
                continue
            for alias in node.names:  # `from . import fmt` imports a module
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("sweep")}
    return found - {name}


def layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


def test_pure_modules_exist():
    assert len(PURE) >= 15
    assert all(p.exists() for p in PURE)


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
            mpi.append(path.relative_to(PKG).as_posix())
        if "import h5py" in text:
            h5.append(path.relative_to(PKG).as_posix())
    assert mpi in ([], ["engine/parallel.py"])
    assert h5 in ([], ["engine/store.py"])


def test_every_module_belongs_to_a_layer():
    # (the process's entry points, python -m sweep and the console script, sit above cli)
    loose = {n for n in MODULES if layer(n) is None} - SHARED - {"sweep.__main__",
                                                                  "sweep._entry"}
    assert not loose, f"modules outside model/engine/analysis/cli: {sorted(loose)}"


def test_imports_point_one_way():
    wrong = []
    for name in MODULES:
        own = layer(name)
        if own is None:
            continue
        for target in sweep_imports(name):
            other = layer(target)
            if other not in (None, own) and other not in ALLOWED[own]:
                wrong.append(f"{name} -> {target}")
            if other is None and target not in SHARED:
                wrong.append(f"{name} -> {target}")
    assert not wrong, "imports against the layering: " + ", ".join(sorted(wrong))


def test_shared_modules_import_only_downwards():
    # errors and _version are imported by every layer and import none of them
    for name in ("sweep.errors", "sweep._version"):
        assert not sweep_imports(name), name


def test_no_import_cycles():
    graph = {n: {t for t in sweep_imports(n) if t in MODULES and t != "sweep"} for n in MODULES}
    # package __init__ files re-exporting their own modules are not cycles: a module
    # importing its parent package's __init__ (`from . import x`) resolves to x above
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for t in sorted(graph[n]):
            if state.get(t) == 1 and not n.startswith(t + "."):
                cycle = stack[stack.index(t):] + [t]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)


def test_importing_the_model_loads_no_other_layer():
    """`import sweep.model...` must not drag in the engine (YAML), HDF5 or MPI: the package
    root re-exports its conveniences lazily."""
    import subprocess
    import sys

    code = ("import sys, sweep.model.cost, sweep.model.search; "
            "print(sorted(m for m in ('yaml', 'h5py', 'mpi4py', 'sweep.engine', "
            "'sweep.analysis', 'sweep.cli') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr

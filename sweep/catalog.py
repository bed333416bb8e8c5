"""Finding and loading ``hardware/*.yaml`` and ``jobs/*.yaml`` by name.

A name is looked up, in order, in: the directories of ``SWEEP_CATALOG_PATH`` (``:``
separated, each holding ``hardware/`` and ``jobs/``), the directory of the spec that refers
to it, the current directory, and the catalogs shipped at the top of this repository. A
name may also be a path to a YAML file.
"""

from __future__ import annotations

import dataclasses
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError
from .hardware import Hardware, parse_hardware
from .job import Job, parse_job

__all__ = ["load_hardware", "load_job", "read_yaml", "search_roots", "list_names",
           "load_calibration", "REPO_ROOT", "CALIBRATION_FILE"]

#: the repository checkout this package lives in (catalogs ship at its top level)
REPO_ROOT = Path(__file__).resolve().parents[1]


def read_yaml(path: Path) -> Any:
    """Parse one YAML file; any parse error becomes a one-line SpecError."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(str(path), "", f"cannot read: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(str(path), "", f"malformed YAML: {where}{problem}") from None


def search_roots(near: Path | None = None) -> list[Path]:
    """Directories searched for ``hardware/`` and ``jobs/``, in order."""
    roots = [Path(p) for p in os.environ.get("SWEEP_CATALOG_PATH", "").split(":") if p]
    if near is not None:
        roots.append(near)
    roots += [Path.cwd(), REPO_ROOT]
    seen, out = set(), []
    for r in roots:
        key = r.resolve()
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _find(kind: str, name: str, near: Path | None) -> Path | None:
    if kind == "hardware" and name == Path(CALIBRATION_FILE).stem:
        return None
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml"):
        for base in ([near] if near else []) + [Path.cwd()]:
            p = candidate if candidate.is_absolute() else base / candidate
            if p.is_file():
                return p
        return None
    for root in search_roots(near):
        for ext in (".yaml", ".yml"):
            p = root / kind / f"{name}{ext}"
            if p.is_file():
                return p
    return None


def list_names(kind: str, near: Path | None = None) -> list[str]:
    """Every name available in the catalogs of ``kind`` (``hardware`` or ``jobs``)."""
    names = set()
    for root in search_roots(near):
        d = root / kind
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.y*ml")
                         if not (kind == "hardware" and p.name == CALIBRATION_FILE))
    return sorted(names)


def _unknown(kind: str, name: str, source: str, key: str, near: Path | None) -> SpecError:
    known = list_names(kind, near)
    hint = f"; known: {', '.join(known)}" if known else ""
    return SpecError(source, key, f"unknown {kind[:-1] if kind == 'jobs' else kind} "
                                  f"{name!r} (no {kind}/{name}.yaml found){hint}")


#: per-generation parameters of the calibrated profile, next to the hardware files
CALIBRATION_FILE = "calibration.yaml"


@lru_cache(maxsize=64)
def load_calibration(path: Path) -> dict[str, dict[str, float]]:
    """``hardware/calibration.yaml``: generation -> {parameter: value} (plus ``memory``)."""
    raw = read_yaml(path) or {}
    if not isinstance(raw, dict):
        raise SpecError(str(path), "", "expected a mapping of generation -> parameters")
    out: dict[str, dict[str, float]] = {}
    for gen, params in raw.items():
        if gen == "fitted":
            continue
        if not isinstance(params, dict):
            raise SpecError(str(path), str(gen), "expected a mapping of parameter -> number")
        for k, v in params.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise SpecError(str(path), f"{gen}.{k}", f"expected a number, got {v!r}")
        out[str(gen)] = {str(k): float(v) for k, v in params.items()}
    return out


@lru_cache(maxsize=256)
def _load_hardware_file(path: Path) -> Hardware:
    hw = parse_hardware(read_yaml(path), str(path), path.stem)
    cal_path = path.parent / CALIBRATION_FILE
    if cal_path.is_file():
        table = load_calibration(cal_path)
        merged = {**table.get("memory", {}), **table.get(hw.generation, {}), **hw.calibration}
        hw = dataclasses.replace(hw, calibration=merged)
    return hw


@lru_cache(maxsize=256)
def _load_job_file(path: Path) -> Job:
    return parse_job(read_yaml(path), str(path), path.stem)


def load_hardware(name: str, source: str = "<command line>", key: str = "hardware",
                  near: Path | None = None) -> Hardware:
    """Load a hardware catalog entry by name (or path).

    Raises:
        SpecError: naming ``source`` and ``key`` when the name is unknown, or naming the
            hardware file when its content is invalid.
    """
    path = _find("hardware", str(name), near)
    if path is None:
        raise _unknown("hardware", str(name), source, key, near)
    return _load_hardware_file(path.resolve())


def load_job(name: str, source: str = "<command line>", key: str = "job",
             near: Path | None = None) -> Job:
    """Load a job catalog entry by name (or path); errors as :func:`load_hardware`."""
    path = _find("jobs", str(name), near)
    if path is None:
        raise _unknown("jobs", str(name), source, key, near)
    return _load_job_file(path.resolve())

"""Sweep specs: ``specs/*.yaml`` -> :class:`SweepSpec`; all user-input validation lives here.

Example (every key but ``name``, ``jobs``, ``gpus`` and ``hardware`` has a default)::

    name: gpt3-1T-generations
    cost_model: nersc2024            # cost profile
    jobs: [gpt3_1T]                  # or [{name: llama3_8b, global_batch: 1024}]
    gpus: {from: 128, to: 16384, factor: 2}   # or 512, or [256, 1024]
    strategies: [1d, 2d, 2d-seqp]    # default: every strategy of the profile
    hardware:                        # one group, or a list of groups
      base: [nersc-A100, nersc-H200, nersc-B200]
      grid:                          # cartesian product of the axes
        nvlink_domain: [4, 8, 64]
        hbm_GBps: {from: 500, to: 16000, points: 28}
        memory: {zip: {hbm_GB: [80, 141], hbm_GBps: [2000, 4800]}}
        generation:
          interpolate: [nersc-A100, nersc-H200, nersc-B200]
          points_per_segment: 4
          keys: [hbm_bandwidth, hbm_capacity]
    top_n: 10

A loaded spec is *resolved*: the job and hardware definitions it uses are copied into it,
and :func:`resolved_yaml` / :func:`spec_hash` describe exactly what runs. A run folder keeps
that text, so resuming or reducing never depends on catalog files that may have changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .catalog import load_hardware, load_job, read_yaml
from .cost import PROFILES
from .errors import SpecError
from .hardware import Hardware, apply_overrides, parse_hardware
from .job import Job, override_job, parse_job

__all__ = ["SweepSpec", "HardwareGroup", "GridAxis", "load_spec", "parse_spec", "resolved_yaml",
           "spec_hash", "TOP_KEYS", "INTERPOLATABLE"]

#: top-level keys of a spec, with their meaning (listed in "unknown key" errors)
TOP_KEYS = {
    "name": "sweep name; results go to results/<name>/",
    "description": "free text",
    "cost_model": f"cost profile: {', '.join(PROFILES)} (default calibrated)",
    "jobs": "list of job names or {name: ..., <job field>: override}",
    "gpus": "GPU counts: an integer, a list, or {from, to, factor | step}",
    "strategies": "parallelization strategies (default: all of the profile)",
    "hardware": "{base: [names], grid: {axis: values}} or a list of such groups",
    "top_n": "configurations kept per case (default 10)",
    "unit_size": "candidates per work unit (default 65536)",
    "offload": "search offloading to the host memory tier (calibrated profile; default false)",
    "resolved": "written by sweep: the job and hardware definitions used",
}
#: hardware quantities an ``interpolate`` axis may interpolate -> Hardware field
INTERPOLATABLE = {
    "hbm_bandwidth": "hbm_bytes_per_s", "hbm_capacity": "hbm_capacity_bytes",
    "nvlink_bandwidth": "nvlink_bytes_per_s", "scaleout_bandwidth": "scaleout_bytes_per_s",
    "nvlink_latency": "nvlink_latency_s", "scaleout_latency": "scaleout_latency_s",
    "matrix_flops": "matrix_flops_per_s", "vector_flops": "vector_flops_per_s",
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
DEFAULT_TOP_N = 10
DEFAULT_UNIT = 65536


@dataclass(frozen=True)
class GridAxis:
    """One axis of a hardware grid: a named list of points, each a set of overrides.

    ``points[i]`` maps hardware override keys (spec units, as in hardware files) or, for
    interpolation, Hardware field names (SI, prefixed ``=``) to values; ``labels[i]`` is the
    value recorded as swept (a number).
    """

    name: str
    points: tuple[Mapping[str, Any], ...]
    labels: tuple[float, ...]
    paths: tuple[Mapping[str, str], ...] = ()  # per point: override key -> spec key path


@dataclass(frozen=True)
class HardwareGroup:
    """Bases x grid axes."""

    bases: tuple[str, ...]
    axes: tuple[GridAxis, ...]


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep."""

    name: str
    source: str  # file the spec came from
    cost_model: str
    jobs: tuple[Job, ...]  # as swept (overrides applied; such jobs are named base[k=v])
    job_bases: Mapping[str, Job]  # the catalog definitions the jobs come from, by name
    gpus: tuple[int, ...]
    strategies: tuple[str, ...]
    hardware: tuple[HardwareGroup, ...]
    bases: Mapping[str, Hardware]  # every hardware definition the spec uses, by name
    top_n: int
    unit_size: int
    description: str = ""
    offload: bool = False  # the search space includes offload to the host tier
    raw: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)


# ------------------------------------------------------------------------------ helpers

def _fail(source: str, key: str, msg: str) -> SpecError:
    return SpecError(source, key, msg)


def _pos_int(value: Any, source: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(source, key, f"expected a positive integer, got {value!r}")
    return value


def _number(value: Any, source: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(source, key, f"expected a number, got {value!r}")
    return float(value)


def _range(spec: Mapping[str, Any], source: str, key: str, integer: bool) -> list[float]:
    """{from, to, factor} (geometric), {from, to, step} (arithmetic) or {from, to, points}."""
    allowed = {"from", "to", "factor", "step", "points"}
    unknown = set(spec) - allowed
    if unknown:
        raise _fail(source, f"{key}.{sorted(unknown)[0]}",
                    "unknown key; valid: from, to and one of factor, step, points")
    if "from" not in spec or "to" not in spec:
        raise _fail(source, key, "a range needs 'from' and 'to'")
    kinds = [k for k in ("factor", "step", "points") if k in spec]
    if len(kinds) != 1:
        raise _fail(source, key, "a range needs exactly one of factor, step, points")
    conv = _pos_int if integer else _number
    lo, hi = conv(spec["from"], source, f"{key}.from"), conv(spec["to"], source, f"{key}.to")
    if hi < lo:
        raise _fail(source, f"{key}.to", f"must be >= from ({lo}), got {hi}")
    kind = kinds[0]
    if kind == "points":
        n = _pos_int(spec["points"], source, f"{key}.points")
        values = np.linspace(lo, hi, n).tolist()  # exactly np.linspace, as the NERSC sweeps
        if integer and any(v != int(v) for v in values):
            raise _fail(source, key, "points do not fall on integers; use step or factor")
        return values
    step = conv(spec[kind], source, f"{key}.{kind}")
    if kind == "factor" and step <= 1:
        raise _fail(source, f"{key}.factor", f"must be > 1, got {step}")
    if kind == "step" and step <= 0:
        raise _fail(source, f"{key}.step", f"must be > 0, got {step}")
    out, v = [], lo
    while v <= hi * (1 + 1e-12) and len(out) < 100_000:
        out.append(v)
        v = v * step if kind == "factor" else v + step
    return out


def _values(raw: Any, source: str, key: str, integer: bool = False) -> list:
    """A scalar, a list, or a range mapping -> list of values."""
    if isinstance(raw, Mapping):
        return _range(raw, source, key, integer)
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise _fail(source, key, "empty list")
    if integer:
        return [_pos_int(v, source, f"{key}[{i}]") for i, v in enumerate(items)]
    return list(items)


# ------------------------------------------------------------------------------ sections

def _parse_jobs(raw: Any, source: str, near: Path | None, resolved: Mapping
                ) -> tuple[tuple[Job, ...], dict[str, Job]]:
    """Jobs of the spec (an overridden job is named ``base[key=value,...]``) and the base
    definitions they come from."""
    if raw is None:
        raise _fail(source, "jobs", "missing")
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise _fail(source, "jobs", "empty list")
    out, bases = [], {}
    for i, item in enumerate(items):
        key = f"jobs[{i}]" if isinstance(raw, list) else "jobs"
        if isinstance(item, str):
            name, overrides = item, {}
        elif isinstance(item, Mapping) and "name" in item:
            name, overrides = str(item["name"]), {k: v for k, v in item.items() if k != "name"}
        else:
            raise _fail(source, key, "expected a job name or a mapping with 'name'")
        if name not in bases:
            bases[name] = (parse_job(resolved[name], source, name) if name in resolved
                           else load_job(name, source, key, near))
        job = bases[name]
        if overrides:
            label = f"{job.name}[{','.join(f'{k}={v}' for k, v in overrides.items())}]"
            job = dataclasses.replace(override_job(job, overrides, source, key), name=label)
        out.append(job)
    if len({j.name for j in out}) != len(out):
        raise _fail(source, "jobs", "the same job (with the same overrides) is listed twice")
    return tuple(out), {j.name: j for j in bases.values()}


def _interpolate_axis(name: str, raw: Mapping, source: str, key: str, near: Path | None,
                      bases: dict[str, Hardware], resolved: Mapping) -> GridAxis:
    allowed = {"interpolate", "points_per_segment", "keys"}
    unknown = set(raw) - allowed
    if unknown:
        raise _fail(source, f"{key}.{sorted(unknown)[0]}",
                    "unknown key; valid: interpolate, points_per_segment, keys")
    gens = raw["interpolate"]
    if not isinstance(gens, list) or len(gens) < 2:
        raise _fail(source, f"{key}.interpolate", "expected a list of at least two hardware names")
    hws = [_load_base(str(g), source, f"{key}.interpolate[{i}]", near, bases, resolved)
           for i, g in enumerate(gens)]
    k = _pos_int(raw.get("points_per_segment", 2), source, f"{key}.points_per_segment")
    if k < 2:
        raise _fail(source, f"{key}.points_per_segment", "must be at least 2")
    keys = raw.get("keys")
    if not isinstance(keys, list) or not keys:
        raise _fail(source, f"{key}.keys", f"expected a list of: {', '.join(INTERPOLATABLE)}")
    for i, q in enumerate(keys):
        if q not in INTERPOLATABLE:
            raise _fail(source, f"{key}.keys[{i}]",
                        f"cannot interpolate {q!r}; valid: {', '.join(INTERPOLATABLE)}")
    # NERSC construction (sweeps/sweep_utils.py): np.linspace per consecutive pair, the shared
    # end point kept once -> (G - 1)(k - 1) + 1 points
    points: list[dict[str, Any]] = []
    labels: list[float] = []
    for seg, (a, b) in enumerate(zip(hws[:-1], hws[1:])):
        last = seg == len(hws) - 2
        for j in range(k if last else k - 1):
            point: dict[str, Any] = {}
            for q in keys:
                f = INTERPOLATABLE[q]
                va, vb = getattr(a, f), getattr(b, f)
                if isinstance(va, Mapping):
                    point["=" + f] = {d: float(np.linspace(va[d], vb[d], k)[j])
                                      for d in va if d in vb}
                else:
                    point["=" + f] = float(np.linspace(va, vb, k)[j])
            points.append(point)
            labels.append(seg + j / (k - 1))
    return GridAxis(name, tuple(points), tuple(labels))


def _load_base(name: str, source: str, key: str, near: Path | None,
               bases: dict[str, Hardware], resolved: Mapping) -> Hardware:
    if name not in bases:
        if name in resolved:
            bases[name] = parse_hardware(resolved[name], source, name)
        else:
            bases[name] = load_hardware(name, source, key, near)
    return bases[name]


def _parse_axis(name: str, raw: Any, source: str, key: str, near, bases, resolved) -> GridAxis:
    if isinstance(raw, Mapping) and "interpolate" in raw:
        return _interpolate_axis(name, raw, source, key, near, bases, resolved)
    if isinstance(raw, Mapping) and "zip" in raw:
        if set(raw) != {"zip"} or not isinstance(raw["zip"], Mapping) or not raw["zip"]:
            raise _fail(source, key, "expected {zip: {key: [values], ...}}")
        cols = {k: _values(v, source, f"{key}.zip.{k}") for k, v in raw["zip"].items()}
        lengths = {len(v) for v in cols.values()}
        if len(lengths) != 1:
            raise _fail(source, f"{key}.zip", "every zipped list must have the same length")
        n = lengths.pop()
        points = tuple({k: cols[k][i] for k in cols} for i in range(n))
        paths = tuple({k: f"{key}.zip.{k}[{i}]" for k in cols} for i in range(n))
        return GridAxis(name, points, tuple(float(i) for i in range(n)), paths)
    values = _values(raw, source, key, integer=(name == "nvlink_domain"))
    labels = tuple(float(v) if isinstance(v, (int, float)) else float(i)
                   for i, v in enumerate(values))
    listed = isinstance(raw, (list, Mapping))
    paths = tuple({name: f"{key}[{i}]" if listed else key} for i in range(len(values)))
    return GridAxis(name, tuple({name: v} for v in values), labels, paths)


def _parse_hardware(raw: Any, source: str, near: Path | None, resolved: Mapping
                    ) -> tuple[tuple[HardwareGroup, ...], dict[str, Hardware]]:
    if raw is None:
        raise _fail(source, "hardware", "missing")
    groups_raw = raw if isinstance(raw, list) else [raw]
    if not groups_raw:
        raise _fail(source, "hardware", "empty list")
    bases: dict[str, Hardware] = {}
    groups = []
    for gi, group in enumerate(groups_raw):
        gkey = f"hardware[{gi}]" if isinstance(raw, list) else "hardware"
        if isinstance(group, str):
            group = {"base": group}
        if not isinstance(group, Mapping):
            raise _fail(source, gkey, "expected {base: [...], grid: {...}}")
        unknown = set(group) - {"base", "grid"}
        if unknown:
            raise _fail(source, f"{gkey}.{sorted(unknown)[0]}", "unknown key; valid: base, grid")
        if "base" not in group:
            raise _fail(source, f"{gkey}.base", "missing")
        names = group["base"] if isinstance(group["base"], list) else [group["base"]]
        if not names:
            raise _fail(source, f"{gkey}.base", "empty list")
        for i, n in enumerate(names):
            _load_base(str(n), source, f"{gkey}.base[{i}]", near, bases, resolved)
        grid = group.get("grid") or {}
        if not isinstance(grid, Mapping):
            raise _fail(source, f"{gkey}.grid", "expected a mapping of axis -> values")
        axes = tuple(_parse_axis(str(k), v, source, f"{gkey}.grid.{k}", near, bases, resolved)
                     for k, v in grid.items())
        group_obj = HardwareGroup(tuple(str(n) for n in names), axes)
        # validate every override once, against each base (errors name the grid key)
        for n in group_obj.bases:
            for ax in axes:
                for pi, point in enumerate(ax.points):
                    user = {k: v for k, v in point.items() if not k.startswith("=")}
                    if user:
                        apply_overrides(bases[n], user, source, ax.paths[pi])
        groups.append(group_obj)
    return tuple(groups), bases


def parse_spec(raw: Any, source: str, near: Path | None = None) -> SweepSpec:
    """Validate a spec mapping.

    Raises:
        SpecError: naming ``source`` and the key path of the first problem.
    """
    if not isinstance(raw, Mapping):
        raise _fail(source, "", f"expected a mapping of spec keys, got {type(raw).__name__}")
    unknown = [k for k in raw if k not in TOP_KEYS]
    if unknown:
        raise _fail(source, str(unknown[0]), f"unknown key; valid keys: {', '.join(TOP_KEYS)}")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _fail(source, "name", f"expected a name of letters, digits, '.', '_', '-', "
                                    f"got {name!r}")
    profile = raw.get("cost_model", "calibrated")
    if profile not in PROFILES:
        raise _fail(source, "cost_model", f"unknown profile {profile!r}; valid: "
                                          f"{', '.join(PROFILES)}")
    resolved = raw.get("resolved") or {}
    if not isinstance(resolved, Mapping):
        raise _fail(source, "resolved", "expected a mapping (written by sweep)")
    jobs, job_bases = _parse_jobs(raw.get("jobs"), source, near, resolved.get("jobs") or {})
    if "gpus" not in raw:
        raise _fail(source, "gpus", "missing")
    gpus = tuple(sorted({int(g) for g in _values(raw["gpus"], source, "gpus", integer=True)}))
    strategies_raw = raw.get("strategies", list(PROFILES[profile]))
    strategies = _values(strategies_raw, source, "strategies")
    for i, s in enumerate(strategies):
        if s not in PROFILES[profile]:
            raise _fail(source, f"strategies[{i}]" if isinstance(strategies_raw, list)
                        else "strategies", f"{s!r} is not a strategy of {profile}; valid: "
                                           f"{', '.join(PROFILES[profile])}")
    if len(set(strategies)) != len(strategies):
        raise _fail(source, "strategies", "a strategy is listed twice")
    groups, bases = _parse_hardware(raw.get("hardware"), source, near,
                                    resolved.get("hardware") or {})
    top_n = _pos_int(raw.get("top_n", DEFAULT_TOP_N), source, "top_n")
    unit = _pos_int(raw.get("unit_size", DEFAULT_UNIT), source, "unit_size")
    offload = raw.get("offload", False)
    if not isinstance(offload, bool):
        raise _fail(source, "offload", f"expected true or false, got {offload!r}")
    if offload and profile != "calibrated":
        raise _fail(source, "offload", f"only the calibrated profile models offload, not "
                                       f"{profile}")
    for j in jobs:
        if profile == "nersc2024" and j.dtype not in ("bf16", "fp16"):
            raise _fail(source, "cost_model", f"nersc2024 models 16-bit training only; job "
                                              f"{j.name} uses {j.dtype}")
    return SweepSpec(name=name, source=source, cost_model=profile, jobs=jobs,
                     job_bases=job_bases, gpus=gpus,
                     strategies=tuple(strategies), hardware=groups, bases=bases, top_n=top_n,
                     unit_size=unit, description=str(raw.get("description", "")),
                     offload=offload, raw=dict(raw))


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a spec file (errors name the file and the key)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(str(path), "", "no such spec file")
    return parse_spec(read_yaml(p), str(path), p.resolve().parent)


# ------------------------------------------------------------------------------ resolution

def _hardware_yaml(hw: Hardware) -> dict[str, Any]:
    """A hardware definition in file form, SI numbers under unit-suffixed keys (exact)."""
    out: dict[str, Any] = {
        "name": hw.name, "source": hw.source,
        "matrix_flops": dict(hw.matrix_flops_per_s), "vector_flops": dict(hw.vector_flops_per_s),
        "hbm_Bps": hw.hbm_bytes_per_s, "hbm_B": hw.hbm_capacity_bytes,
        "nvlink_Bps": hw.nvlink_bytes_per_s, "nvlink_latency_s": hw.nvlink_latency_s,
        "nvlink_efficiency": hw.nvlink_efficiency, "nvlink_domain": hw.nvlink_domain,
        "scaleout_Bps": hw.scaleout_bytes_per_s, "scaleout_latency_s": hw.scaleout_latency_s,
        "scaleout_efficiency": hw.scaleout_efficiency, "nics_per_gpu": hw.nics_per_gpu,
        "sm_count": hw.sm_count, "gemm_tile": list(hw.gemm_tile),
    }
    if hw.generation:
        out["generation"] = hw.generation
    if hw.host_memory_bytes:
        out.update(host_memory_B=hw.host_memory_bytes, host_link_Bps=hw.host_link_bytes_per_s)
    if hw.calibration:
        out["calibration"] = dict(hw.calibration)
    return out


def resolved_yaml(spec: SweepSpec) -> str:
    """The spec as it runs: the user's keys plus every job and hardware definition used."""
    raw = {k: v for k, v in spec.raw.items() if k != "resolved"}
    raw.setdefault("cost_model", spec.cost_model)
    raw.setdefault("top_n", spec.top_n)
    raw.setdefault("unit_size", spec.unit_size)
    raw.setdefault("strategies", list(spec.strategies))
    raw["resolved"] = {"jobs": {n: dataclasses.asdict(j) for n, j in spec.job_bases.items()},
                       "hardware": {n: _hardware_yaml(h) for n, h in sorted(spec.bases.items())}}
    return yaml.safe_dump(raw, sort_keys=False, width=100)


def spec_hash(spec: SweepSpec) -> str:
    """sha256 of the resolved spec text."""
    return hashlib.sha256(resolved_yaml(spec).encode()).hexdigest()

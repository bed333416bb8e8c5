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

Limits, checked before anything is expanded (a spec is hand-written; these only stop typos
and hostile files from hanging or exhausting memory): every number is finite; a list or
range has at most :data:`MAX_AXIS_POINTS` values; GPU counts are at most :data:`MAX_GPUS`,
``top_n`` at most :data:`MAX_TOP_N`, ``unit_size`` at most :data:`MAX_UNIT_SIZE`; the
hardware grid expands to at most ``max_variants`` variants (default
:data:`DEFAULT_MAX_VARIANTS`) and the spec to at most :data:`MAX_CASES_PER_VARIANT` x
``max_variants`` cases. Job and hardware limits: :mod:`sweep.model.job`,
:mod:`sweep.model.hardware`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..errors import SpecError
from ..model.cost import PROFILES, unmodelled
from ..model.hardware import (MAX_NVLINK_DOMAIN, Hardware, apply_overrides, is_parameter,
                              override_field, parse_hardware, quantity_dimension)
from ..model.job import Job, override_job, parse_job
from ..model.units import brief, finite_float, integral, parse_quantity
from .catalog import (check_generation, label_value, load_hardware, load_job, parse_value,
                      read_yaml)

__all__ = ["SweepSpec", "HardwareGroup", "GridAxis", "load_spec", "parse_spec", "resolved_yaml",
           "spec_hash", "TOP_KEYS", "INTERPOLATABLE", "DEFAULT_MAX_VARIANTS",
           "MAX_CASES_PER_VARIANT", "MAX_AXIS_POINTS", "MAX_GPUS", "MAX_TOP_N", "MAX_UNIT_SIZE"]

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
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # fullmatch: a folder name
DEFAULT_TOP_N = 10
DEFAULT_UNIT = 65536
#: hardware variants a spec may expand to unless the caller allows more (``--max-variants``);
#: the 80,000-variant scale spec needs ~0.7 GB, so this is already a multi-GB plan
DEFAULT_MAX_VARIANTS = 1_000_000
#: cases (variants x jobs x strategies x GPU counts) allowed per allowed variant
MAX_CASES_PER_VARIANT = 10
#: values of one list or range (GPU counts, one grid axis, jobs, bases, strategies)
MAX_AXIS_POINTS = 100_000
#: GPUs of one case, at most (~100x the largest machines); keeps divisor searches fast
MAX_GPUS = 2**24
#: configurations kept per case, at most
MAX_TOP_N = 2**20
#: candidates per work unit, at most (a unit's columns take ~250 bytes per candidate)
MAX_UNIT_SIZE = 2**24


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
    job_bases: Mapping[str, Job]  # the definitions the jobs come from, as the spec names them
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


def _pos_int(value: Any, source: str, key: str, maximum: int | None = None) -> int:
    value = integral(value)  # (1.6e1, exponent form, is 16)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(source, key, f"expected a positive integer, got {brief(value)}")
    if maximum is not None and value > maximum:
        raise _fail(source, key, f"expected at most {maximum}, got {brief(value)}")
    return value


def _number(value: Any, source: str, key: str) -> float:
    number = finite_float(value)
    if number is None:
        raise _fail(source, key, f"expected a finite number, got {brief(value)}")
    return number


def _too_long(source: str, key: str, n: int) -> SpecError:
    return _fail(source, key, f"{n:,} values; a list or range has at most {MAX_AXIS_POINTS:,}")


def _range(spec: Mapping[str, Any], source: str, key: str, integer: bool,
           maximum: int | None = None) -> list[float]:
    """{from, to, factor} (geometric), {from, to, step} (arithmetic) or {from, to, points};
    at most MAX_AXIS_POINTS values."""
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
    if integer:
        lo = _pos_int(spec["from"], source, f"{key}.from", maximum)
        hi = _pos_int(spec["to"], source, f"{key}.to", maximum)
    else:
        lo, hi = _number(spec["from"], source, f"{key}.from"), _number(spec["to"], source,
                                                                         f"{key}.to")
    if hi < lo:
        raise _fail(source, f"{key}.to", f"must be >= from ({lo}), got {hi}")
    kind = kinds[0]
    conv = _pos_int if integer else _number
    if kind == "points":
        n = _pos_int(spec["points"], source, f"{key}.points")
        if n > MAX_AXIS_POINTS:
            raise _too_long(source, f"{key}.points", n)
        if n == 1 and hi != lo:  # (np.linspace would keep 'from' and drop 'to')
            raise _fail(source, f"{key}.points", f"one point cannot span from {lo} to {hi}; "
                                                  f"give at least 2, or from = to")
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
    while v <= hi * (1 + 1e-12):
        if len(out) == MAX_AXIS_POINTS:
            raise _fail(source, key, f"the range has more than {MAX_AXIS_POINTS:,} values, the "
                                     f"most a list or range may have; use a larger step or factor")
        out.append(v)
        v = v * step if kind == "factor" else v + step
    return out


def _values(raw: Any, source: str, key: str, integer: bool = False,
            maximum: int | None = None) -> list:
    """A scalar, a list, or a range mapping -> list of values (integers up to ``maximum``)."""
    if isinstance(raw, Mapping):
        return _range(raw, source, key, integer, maximum)
    items = _items(raw, source, key)
    if integer:
        return [_pos_int(v, source, f"{key}[{i}]", maximum) for i, v in enumerate(items)]
    return list(items)


def _items(raw: Any, source: str, key: str) -> list:
    """A scalar or a non-empty list of at most MAX_AXIS_POINTS values -> list."""
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise _fail(source, key, "empty list")
    if len(items) > MAX_AXIS_POINTS:
        raise _too_long(source, key, len(items))
    return items


# ------------------------------------------------------------------------------ sections

def _parse_jobs(raw: Any, source: str, near: Path | None, resolved: Mapping
                ) -> tuple[tuple[Job, ...], dict[str, Job]]:
    """Jobs of the spec (an overridden job is named ``base[key=value,...]``) and the base
    definitions they come from."""
    if raw is None:
        raise _fail(source, "jobs", "missing")
    items = _items(raw, source, "jobs")
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
            bases[name] = (_resolved(parse_job, resolved[name], source, f"resolved.jobs.{name}",
                                     name) if name in resolved
                           else load_job(name, source, key, near))
        job = bases[name]
        if overrides:
            items = ",".join(f"{k}={label_value(v)}" for k, v in overrides.items())
            label = f"{job.name}[{items}]"
            job = dataclasses.replace(override_job(job, overrides, source, key), name=label)
        out.append(job)
    if len({j.name for j in out}) != len(out):
        raise _fail(source, "jobs", "the same job (with the same overrides) is listed twice")
    seen: dict[str, int] = {}
    for i, j in enumerate(out):  # (an override of a value the job has: its cases twice)
        same = seen.setdefault(repr(dataclasses.replace(j, name="")), i)
        if same != i:
            raise _fail(source, f"jobs[{i}]" if isinstance(raw, list) else "jobs",
                        f"{j.name} is the same job as {out[same].name} (its overrides change "
                        f"nothing)")
    # (keyed as the spec names them, a path or a catalog name, so that the run folder's
    # spec.yaml finds them under resolved: by the job's own name a job given as a path was
    # looked for again on disk, relative to the run folder)
    return tuple(out), dict(bases)


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
    k = _pos_int(raw.get("points_per_segment", 2), source, f"{key}.points_per_segment")
    if k < 2:
        raise _fail(source, f"{key}.points_per_segment", "must be at least 2")
    if (len(gens) - 1) * (k - 1) + 1 > MAX_AXIS_POINTS:
        raise _too_long(source, key, (len(gens) - 1) * (k - 1) + 1)
    hws = [_load_base(str(g), source, f"{key}.interpolate[{i}]", near, bases, resolved)
           for i, g in enumerate(gens)]
    keys = raw.get("keys")
    if not isinstance(keys, list) or not keys:
        raise _fail(source, f"{key}.keys", f"expected a list of: {', '.join(INTERPOLATABLE)}")
    for i, q in enumerate(keys):
        if not isinstance(q, str) or q not in INTERPOLATABLE:
            raise _fail(source, f"{key}.keys[{i}]",
                        f"cannot interpolate {brief(q)}; valid: {', '.join(INTERPOLATABLE)}")
    # NERSC construction (sweeps/sweep_utils.py): np.linspace per consecutive pair, the shared
    # end point kept once -> (G - 1)(k - 1) + 1 points
    points: list[dict[str, Any]] = []
    labels: list[float] = []
    for seg, (a, b) in enumerate(zip(hws[:-1], hws[1:])):
        last = seg == len(hws) - 2
        lines: dict[str, Any] = {}  # field -> the segment's np.linspace (per dtype for peaks)
        for q in keys:
            f = INTERPOLATABLE[q]
            va, vb = getattr(a, f), getattr(b, f)
            lines[f] = ({d: np.linspace(va[d], vb[d], k) for d in va if d in vb}
                        if isinstance(va, Mapping) else np.linspace(va, vb, k))
        for j in range(k if last else k - 1):
            point: dict[str, Any] = {}
            for f, line in lines.items():
                point["=" + f] = ({d: float(v[j]) for d, v in line.items()}
                                  if isinstance(line, dict) else float(line[j]))
            points.append(point)
            labels.append(seg + j / (k - 1))
    return GridAxis(name, tuple(points), tuple(labels))


def _resolved(parse, raw: Any, source: str, path: str, name: str):
    """``parse(raw, source, name)`` of a definition stored under ``resolved:``, its errors
    keyed by their place there (``resolved.jobs.<name>.<key>``)."""
    try:
        return parse(raw, source, name)
    except SpecError as exc:
        where = f"{exc.source}: {exc.key}: " if exc.key else f"{exc.source}: "
        raise _fail(source, f"{path}.{exc.key}" if exc.key else path,
                    str(exc).removeprefix(where)) from None


def _load_base(name: str, source: str, key: str, near: Path | None,
               bases: dict[str, Hardware], resolved: Mapping) -> Hardware:
    if name not in bases:
        if name in resolved:
            bases[name] = _resolved(parse_hardware, resolved[name], source,
                                    f"resolved.hardware.{name}", name)
        else:
            bases[name] = load_hardware(name, source, key, near)
    return bases[name]


def _axis_label_value(name: str, value: Any, position: int) -> float:
    """The number a grid value is recorded as (GridAxis.labels)."""
    number = finite_float(value)
    if number is not None:
        return number
    dimension = quantity_dimension(name)
    if dimension is not None and isinstance(value, str):
        try:
            return parse_quantity(value, dimension)
        except ValueError:  # (the override's own validation names the error)
            pass
    return float(position)


def _one_axis_per_field(axes: Sequence[GridAxis], source: str, key: str) -> None:
    """SpecError where two axes of one grid set the same hardware field (hbm_bandwidth and
    hbm_GBps, a zip and a plain axis of one key, an interpolation's keys and an axis): the
    last would win while both labelled every variant. (Not the FLOP peaks: axes may set
    different precisions of them, applied in grid order.)"""
    owner: dict[str, str] = {}
    for axis in axes:
        fields = set()
        for k in (axis.points[0] if axis.points else {}):
            field = k[1:] if k.startswith("=") else override_field(k)
            if field and not field.endswith("_flops_per_s"):  # (peaks: per precision, merged)
                fields.add(field)
        for field in sorted(fields):
            if field in owner and owner[field] != axis.name:
                raise _fail(source, f"{key}.{axis.name}", f"sets {field} as axis "
                                                         f"{owner[field]!r} does: one axis "
                                                         f"per hardware parameter")
            owner[field] = axis.name


def _distinct_points(axis: GridAxis, source: str, key: str) -> GridAxis:
    """``axis`` if no two of its points set the same values (two equal points make every
    one of their cases twice: a zip repeating a row, an interpolation between one system)."""
    seen: dict[str, int] = {}
    for i, point in enumerate(axis.points):
        same = seen.setdefault(repr(sorted(point.items())), i)
        if same != i:
            raise _fail(source, key, f"points {same} and {i} are the same hardware")
    return axis


def _parse_axis(name: str, raw: Any, source: str, key: str, near, bases, resolved) -> GridAxis:
    kind = next((k for k in ("interpolate", "zip") if isinstance(raw, Mapping) and k in raw),
                None)
    if kind and is_parameter(name):
        # (its values are the points' numbers 0, 1, ...: a label nvlink_domain=1 would read
        # as a hardware value in sweep show, the plots and sweep predict)
        article = "an" if kind == "interpolate" else "a"
        raise _fail(source, key, f"{article} {kind} axis takes a name of its own, not a hardware "
                                 f"parameter's (its values are the numbers of its points); "
                                 f"e.g. mem or gen")
    if kind == "interpolate":
        return _distinct_points(
            _interpolate_axis(name, raw, source, key, near, bases, resolved), source, key)
    if kind == "zip":
        if set(raw) != {"zip"} or not isinstance(raw["zip"], Mapping) or not raw["zip"]:
            raise _fail(source, key, "expected {zip: {key: [values], ...}}")
        cols = {k: _values(v, source, f"{key}.zip.{k}") for k, v in raw["zip"].items()}
        lengths = {len(v) for v in cols.values()}
        if len(lengths) != 1:
            raise _fail(source, f"{key}.zip", "every zipped list must have the same length")
        n = lengths.pop()
        points = tuple({k: cols[k][i] for k in cols} for i in range(n))
        paths = tuple({k: f"{key}.zip.{k}[{i}]" for k in cols} for i in range(n))
        return _distinct_points(GridAxis(name, points, tuple(float(i) for i in range(n)),
                                         paths), source, f"{key}.zip")
    # (a FLOP peak's value may be a per-precision table; a mapping of none of a range's keys
    # under such a key is one, not a range)
    peaks = (override_field(name) or "").endswith("_flops_per_s")
    one_table = (peaks and isinstance(raw, Mapping) and raw
                 and not {"from", "to", "factor", "step", "points"} & set(raw))
    values = [raw] if one_table else _values(raw, source, key, integer=(name == "nvlink_domain"),
                                             maximum=MAX_NVLINK_DOMAIN)
    table = next((i for i, v in enumerate(values) if isinstance(v, Mapping)), None) \
        if peaks else None
    if table is not None:
        # (a plain axis is labelled by its values; a table would be labelled by its position,
        # matrix_tflops=1, which sweep show, the plots and sweep predict read as 1 TFLOP/s)
        where = f"{key}[{table}]" if isinstance(raw, list) else key
        raise _fail(source, where, f"a per-precision table cannot label a plain axis; give the "
                                   f"tables as a zip axis of a name of its own: e.g. compute: "
                                   f"{{zip: {{{name}: [...]}}}}")
    # the value itself where it is a number, in SI where it is a string with a unit under
    # a canonical quantity key ("3.35 TB/s" -> 3.35e12), else its position (values are
    # validated with the overrides)
    labels = tuple(_axis_label_value(name, v, i) for i, v in enumerate(values))
    seen: dict = {}
    for i, (v, label) in enumerate(zip(values, labels)):
        if finite_float(v) is None and label == float(i):
            continue  # (labelled by its position: not a value to compare)
        if label in seen:  # (the same value twice would make every one of its cases twice)
            where = f"{key}[{i}]" if isinstance(raw, list) else key
            raise _fail(source, where, f"{brief(v)} is the same value as "
                                       f"{brief(values[seen[label]])} listed before it")
        seen[label] = i
    listed = isinstance(raw, (list, Mapping))
    paths = tuple({name: f"{key}[{i}]" if listed else key} for i in range(len(values)))
    return GridAxis(name, tuple({name: v} for v in values), labels, paths)


_COUNT_CAP = 10**18  # counts stop here: a grid of 10**5 axes would be a 30,000-digit number


def _count_variants(groups: Any) -> int:
    """Variants the groups expand to (bases x points of each axis, summed over groups), or
    _COUNT_CAP + 1 if more."""
    total = 0
    for g in groups:
        n = len(g.bases)
        for ax in g.axes:
            n = min(n * len(ax.points), _COUNT_CAP + 1)
        total = min(total + n, _COUNT_CAP + 1)
    return total


def _parse_hardware(raw: Any, source: str, near: Path | None, resolved: Mapping,
                    max_variants: int) -> tuple[tuple[HardwareGroup, ...], dict[str, Hardware]]:
    if raw is None:
        raise _fail(source, "hardware", "missing")
    groups_raw = _items(raw, source, "hardware")
    bases: dict[str, Hardware] = {}
    groups = []
    n_variants = 0
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
        names = _items(group["base"], source, f"{gkey}.base")
        for i, n in enumerate(names):
            if str(n) in map(str, names[:i]):  # (every one of its cases twice)
                raise _fail(source, f"{gkey}.base[{i}]", f"{brief(n)} is listed twice")
            _load_base(str(n), source, f"{gkey}.base[{i}]", near, bases, resolved)
        grid = group.get("grid") or {}
        if not isinstance(grid, Mapping):
            raise _fail(source, f"{gkey}.grid", "expected a mapping of axis -> values")
        axes = tuple(_parse_axis(str(k), v, source, f"{gkey}.grid.{k}", near, bases, resolved)
                     for k, v in grid.items())
        _one_axis_per_field(axes, source, f"{gkey}.grid")
        group_obj = HardwareGroup(tuple(str(n) for n in names), axes)
        # a base in two groups of the same grid (none, or equal axes): every case twice
        for gj, other in enumerate(groups):
            same_grid = [(a.name, a.points) for a in axes] == [(a.name, a.points)
                                                               for a in other.axes]
            twice = set(group_obj.bases) & set(other.bases) if same_grid else set()
            if twice:
                raise _fail(source, gkey, f"{brief(min(twice))} is in hardware[{gj}] "
                                          f"with the same grid already")
        # count the variants before validating or expanding anything (a product of lengths)
        n_variants += _count_variants([group_obj])
        if n_variants > max_variants:
            more = "at least " if gi < len(groups_raw) - 1 else ""
            count = f"{n_variants:,}" if n_variants <= _COUNT_CAP else f"over {_COUNT_CAP:.0e}"
            raise _fail(source, "hardware", f"{more}{count} hardware variants (bases x "
                        f"the points of each grid axis) exceed the limit of {max_variants:,}; "
                        f"raise it with --max-variants")
        # validate every override once, against each base (errors name the grid key)
        for n in group_obj.bases:
            for ax in axes:
                for pi, point in enumerate(ax.points):
                    user = {k: v for k, v in point.items() if not k.startswith("=")}
                    if user:
                        apply_overrides(bases[n], user, source, ax.paths[pi])
        groups.append(group_obj)
    return tuple(groups), bases


def apply_point(hw: Hardware, axis, i: int, source: str) -> Hardware:
    """``hw`` with point ``i`` of a grid axis applied (errors name ``source``)."""
    point = axis.points[i]
    user = {k: v for k, v in point.items() if not k.startswith("=")}
    if user:
        hw = apply_overrides(hw, user, source, axis.paths[i])
    direct = {k[1:]: v for k, v in point.items() if k.startswith("=")}
    if direct:
        hw = dataclasses.replace(hw, **direct)
    return hw


#: most variants of the groups sharing a base that duplicate_variant compares one by one
DUPLICATE_CHECK_VARIANTS = 100_000


def duplicate_variant(groups: Sequence[HardwareGroup], bases: Mapping[str, Hardware],
                      source: str) -> tuple[str, str, str] | None:
    """(key of the later group, the variant's label, the earlier group's key) of a hardware
    variant that two groups both make (the same base with the same resolved parameters,
    e.g. a grid point equal to the base's own value in one group and no grid in another),
    else None. Only bases listed in more than one group are compared, variant by variant,
    while their variants number at most DUPLICATE_CHECK_VARIANTS (beyond, not checked)."""
    shared = {b for i, g in enumerate(groups) for b in g.bases
              if any(b in h.bases for h in groups[:i])}
    if not shared or _count_variants(
            dataclasses.replace(g, bases=tuple(b for b in g.bases if b in shared))
            for g in groups) > DUPLICATE_CHECK_VARIANTS:
        return None
    seen: dict[tuple, str] = {}
    for gi, g in enumerate(groups):
        gkey = f"hardware[{gi}]" if len(groups) > 1 else "hardware"
        for base in g.bases:
            if base not in shared:
                continue
            for combo in itertools.product(*(range(len(ax.points)) for ax in g.axes)):
                hw = bases[base]
                for ax, k in zip(g.axes, combo):
                    hw = apply_point(hw, ax, k, source)
                key = (base,) + tuple(sorted((k, v) for k, v in hw.record().items()
                                             if k != "hardware"))
                label = base + ("[" + ",".join(f"{ax.name}={float(ax.labels[k]):g}"
                                               for ax, k in zip(g.axes, combo)) + "]"
                                if g.axes else "")
                if key in seen and seen[key] != gkey:
                    return gkey, label, seen[key]
                seen.setdefault(key, gkey)
    return None


def parse_spec(raw: Any, source: str, near: Path | None = None, *,
               max_variants: int = DEFAULT_MAX_VARIANTS, max_cases: int | None = None
               ) -> SweepSpec:
    """Validate a spec mapping.

    Args:
        max_variants: most hardware variants the grid may expand to (counted from the axes'
            lengths, before anything is expanded).
        max_cases: most cases (variants x jobs x strategies x GPU counts); default
            MAX_CASES_PER_VARIANT x max_variants.

    Raises:
        SpecError: naming ``source`` and the key path of the first problem.
    """
    if not isinstance(raw, Mapping):
        raise _fail(source, "", f"expected a mapping of spec keys, got {type(raw).__name__}")
    unknown = [k for k in raw if k not in TOP_KEYS]
    if unknown:
        raise _fail(source, str(unknown[0]), "unknown key; valid keys: " + ", ".join(
            k for k in TOP_KEYS if k != "resolved"))  # (resolved: written by sweep only)
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _fail(source, "name", f"expected a name of letters, digits, '.', '_', '-' (at "
                                    f"most 128), got {brief(name)}")
    profile = raw.get("cost_model", "calibrated")
    if not isinstance(profile, str) or profile not in PROFILES:
        raise _fail(source, "cost_model", f"unknown profile {brief(profile)}; valid: "
                                          f"{', '.join(PROFILES)}")
    resolved = raw.get("resolved") or {}
    if not isinstance(resolved, Mapping):
        raise _fail(source, "resolved", "expected a mapping (written by sweep)")
    for part in ("jobs", "hardware"):
        if not isinstance(resolved.get(part) or {}, Mapping):
            raise _fail(source, f"resolved.{part}", "expected a mapping of names to "
                                                   "definitions (written by sweep)")
    jobs, job_bases = _parse_jobs(raw.get("jobs"), source, near, resolved.get("jobs") or {})
    if "gpus" not in raw:
        raise _fail(source, "gpus", "missing")
    gpus_raw = [int(g) for g in _values(raw["gpus"], source, "gpus", integer=True,
                                        maximum=MAX_GPUS)]
    seen_gpus: set[int] = set()
    for i, g in enumerate(gpus_raw):
        if g in seen_gpus:  # (as a grid value given twice: every case of it twice)
            raise _fail(source, f"gpus[{i}]" if isinstance(raw["gpus"], list) else "gpus",
                        f"{g} is listed twice")
        seen_gpus.add(g)
    gpus = tuple(sorted(gpus_raw))
    strategies_raw = raw.get("strategies", list(PROFILES[profile]))
    strategies = _values(strategies_raw, source, "strategies")
    for i, s in enumerate(strategies):
        if not isinstance(s, str) or s not in PROFILES[profile]:
            raise _fail(source, f"strategies[{i}]" if isinstance(strategies_raw, list)
                        else "strategies", f"{brief(s)} is not a strategy of {profile}; valid: "
                                           f"{', '.join(PROFILES[profile])}")
    if len(set(strategies)) != len(strategies):
        raise _fail(source, "strategies", "a strategy is listed twice")
    groups, bases = _parse_hardware(raw.get("hardware"), source, near,
                                    resolved.get("hardware") or {}, max_variants)
    for base, hw in bases.items():
        check_generation(hw, base, profile, source, "hardware", near)
    n_variants = _count_variants(groups)
    n_cases = n_variants * len(jobs) * len(strategies) * len(gpus)
    max_cases = MAX_CASES_PER_VARIANT * max_variants if max_cases is None else max_cases
    if n_cases > max_cases:
        raise _fail(source, "", f"{n_cases:,} cases ({n_variants:,} variants x {len(jobs):,} "
                    f"jobs x {len(strategies):,} strategies x {len(gpus):,} GPU counts) exceed "
                    f"the limit of {max_cases:,}; sweep fewer, or raise the limit with "
                    f"--max-variants (cases may be {MAX_CASES_PER_VARIANT} x that)")
    top_n = _pos_int(raw.get("top_n", DEFAULT_TOP_N), source, "top_n", MAX_TOP_N)
    unit = _pos_int(raw.get("unit_size", DEFAULT_UNIT), source, "unit_size", MAX_UNIT_SIZE)
    offload = raw.get("offload", False)
    if not isinstance(offload, bool):
        raise _fail(source, "offload", f"expected true or false, got {brief(offload)}")
    if offload and profile != "calibrated":
        raise _fail(source, "offload", f"only the calibrated profile models offload, not "
                                       f"{profile}")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise _fail(source, "description", f"expected text, got {brief(description)}")
    twice = duplicate_variant(groups, bases, source)
    if twice:
        raise _fail(source, twice[0], f"{twice[1]} is also a variant of {twice[2]} (every "
                                      f"one of its cases twice)")
    for i, j in enumerate(jobs):  # (a job the profile cannot cost: named by its place)
        why = unmodelled(j, profile)  # (MoE, MLA, MTP: refused by name, before their shape)
        if why:
            raise _fail(source, f"jobs[{i}]", why if why.startswith(profile) else
                        f"job {j.name}: {why}")
    return SweepSpec(name=name, source=source, cost_model=profile, jobs=jobs,
                     job_bases=job_bases, gpus=gpus,
                     strategies=tuple(strategies), hardware=groups, bases=bases, top_n=top_n,
                     unit_size=unit, description=description,
                     offload=offload, raw=dict(raw))


def load_spec(path: str | Path, *, max_variants: int = DEFAULT_MAX_VARIANTS,
              max_cases: int | None = None, overrides: Sequence[str] = ()) -> SweepSpec:
    """Read and validate a spec file (errors name the file and the key); limits as
    :func:`parse_spec`. ``overrides``: ``KEY=VALUE`` items replacing a key of the file
    (:func:`set_keys`), before it is validated."""
    p = Path(path)
    if p.is_dir():
        stored = p / "spec.yaml"
        raise SpecError(str(path), "", "a folder, not a spec file" + (
            f"; a run folder's spec is {stored} (continue it with sweep run {stored} --out "
            f"{p} --resume)" if stored.is_file() else ""))
    if not p.is_file():
        raise SpecError(str(path), "", "no such spec file")
    raw = set_keys(read_yaml(p), overrides, str(path))
    return parse_spec(raw, str(path), p.resolve().parent, max_variants=max_variants,
                      max_cases=max_cases)


def set_keys(raw: Any, overrides: Sequence[str], source: str) -> Any:
    """``raw`` (a spec mapping) with each ``KEY=VALUE`` of ``overrides`` applied: KEY a key
    or a dotted path of keys (``hardware.grid.nvlink_domain``), VALUE read as YAML
    (``gpus=256``, ``gpus=[256, 1024]``, ``jobs=[llama3_8b]``); the spec is validated as a
    whole afterwards, so a bad value is reported like one in the file.

    Raises:
        SpecError: an item without ``=``, an empty key, a path through a non-mapping, or a
            value that is not YAML.
    """
    import copy

    import yaml

    if not overrides:
        return raw
    if not isinstance(raw, dict):  # (not a spec: parse_spec says so)
        return raw
    out = copy.deepcopy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise SpecError(source, "--set", f"{item!r} is not KEY=VALUE")
        if "[" in key:  # (errors name list items so: jobs[0].global_batch)
            raise SpecError(source, f"--set {key}", "a list item cannot be set alone; give "
                                                    "the whole list, e.g. --set 'jobs=[...]'")
        try:
            value = parse_value(text)
        except yaml.YAMLError as exc:
            why = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise SpecError(source, f"--set {key}", f"{brief(text)} is not a YAML value "
                                                    f"({why})") from None
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node, dict):
                break
            node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise SpecError(source, f"--set {key}",
                            f"{'.'.join(parts[:-1])} is not a mapping in the spec")
        node[parts[-1]] = value
    return out


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
    if hw.matrix_sustained_fraction:
        out["matrix_sustained_fraction"] = hw.matrix_sustained_fraction
    if hw.exp_per_s:
        out["exp_per_s"] = hw.exp_per_s
    if hw.nvlink_half_bandwidth_per_rank_bytes:
        out["nvlink_half_bandwidth_per_rank_B"] = hw.nvlink_half_bandwidth_per_rank_bytes
    if hw.scaleout_half_bandwidth_per_rank_bytes:
        out["scaleout_half_bandwidth_per_rank_B"] = hw.scaleout_half_bandwidth_per_rank_bytes
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

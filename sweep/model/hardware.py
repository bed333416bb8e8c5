"""GPU systems: ``hardware/*.yaml`` -> :class:`Hardware` (SI units inside).

A hardware file describes one GPU and the two network tiers it sits in: the scale-up domain
(NVLink / NVSwitch, ``nvlink_domain`` GPUs) and the scale-out network (InfiniBand or
Ethernet, ``nics_per_gpu`` NICs of ``scaleout`` bandwidth each). Example::

    name: H100-SXM
    source: NVIDIA H100 datasheet (2023)
    matrix_tflops: {bf16: 989.4, fp16: 989.4, fp8: 1978.9}
    vector_tflops: {bf16: 133.8, fp32: 66.9}
    hbm_GBps: 3350
    hbm_GiB: 80
    nvlink_GBps: 450          # per GPU, per direction
    nvlink_domain: 8
    scaleout_Gbps: 400        # per NIC, per direction
    nics_per_gpu: 1

Every quantity can instead be given as a string with its unit
(``hbm_bandwidth: "3.35 TB/s"``); a bare number under such a key (``hbm_bandwidth: 3350``)
is refused, as its unit is unknown. The ``calibration`` mapping holds the parameters of the
``calibrated`` cost profile for this generation.

Limits: every number is finite (also once scaled to SI); ``nvlink_domain`` is at most
:data:`MAX_NVLINK_DOMAIN`, ``sm_count`` and each ``gemm_tile`` side at most
:data:`MAX_HW_COUNT`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import SpecError
from .units import brief, finite_float, name_problem, parse_quantity, split_unit_key

__all__ = ["GENERATION_DEFAULTS", "Hardware", "parse_hardware", "apply_overrides",
           "override_field", "DTYPES", "MAX_NVLINK_DOMAIN", "MAX_HW_COUNT",
           "CALIBRATION_BOUNDS", "check_calibration"]

#: GPUs per NVLink domain, at most: 100x the largest announced domain (NVL576). The candidate
#: enumeration lists every ordered factorisation of the domain size, which grows quickly.
MAX_NVLINK_DOMAIN = 2**16
#: the calibrated profile's parameters (hardware/calibration.yaml, a hardware file's
#: ``calibration:``) and their physical bounds: efficiencies are fractions of a datasheet or
#: sustained peak, times per kernel and per expert in microseconds, the memory reserve in
#: GiB (a CUDA context alone takes about half a GiB) and the allocator's cache a fraction of
#: activation memory; the fit stays inside them (analysis/calibration.py) and a file may not
#: leave them either
CALIBRATION_BOUNDS = {
    "gemm_eff": (0.3, 1.0), "attn_eff": (0.15, 1.0), "fused_attn_eff": (0.15, 1.0),
    "hbm_eff": (0.3, 1.0), "kernel_us": (0.0, 60.0), "nvl_eff": (0.3, 1.0),
    "net_eff": (0.2, 1.0), "fp8_eff": (0.3, 1.0), "fp4_eff": (0.2, 1.0),
    "grouped_gemm_eff": (0.2, 1.0), "expert_us": (0.0, 200.0), "a2a_eff": (0.2, 1.0),
    "reserve_GiB": (0.75, 8.0), "allocator_cache": (0.0, 1.0)}


def check_calibration(params: Mapping[str, Any], source: str, key: str) -> dict[str, float]:
    """``params`` (parameter -> number) as floats, each a known parameter inside its
    CALIBRATION_BOUNDS; errors name ``key.<parameter>``."""
    out = {}
    for k, v in params.items():
        where = f"{key}.{k}"
        if k not in CALIBRATION_BOUNDS:
            raise _fail(source, where, f"unknown parameter; valid: "
                                       f"{', '.join(CALIBRATION_BOUNDS)}")
        number = finite_float(v)
        if number is None:
            raise _fail(source, where, f"expected a finite number, got {brief(v)}")
        lo, hi = CALIBRATION_BOUNDS[k]
        if not lo <= number <= hi:
            raise _fail(source, where, f"{number:g} is outside its physical range [{lo:g}, "
                                       f"{hi:g}]")
        out[str(k)] = number
    return out
#: streaming multiprocessors and GEMM tile sides, at most (real: ~100-200 SMs, 256 tiles)
MAX_HW_COUNT = 2**16

#: Precisions a peak FLOP rate may be given for.
DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "fp4")

#: canonical quantity -> (dimension, key prefix used with a unit suffix)
_QUANTITIES: dict[str, tuple[str, str]] = {
    "hbm_bandwidth": ("bytes_per_s", "hbm"),
    "hbm_capacity": ("bytes", "hbm"),
    "nvlink_bandwidth": ("bytes_per_s", "nvlink"),
    "nvlink_latency": ("s", "nvlink_latency"),
    "scaleout_bandwidth": ("bytes_per_s", "scaleout"),
    "scaleout_latency": ("s", "scaleout_latency"),
    # per ring member: a ring of n reaches half its peak bus bandwidth at n x this many bytes
    # (nccl-tests curves)
    "nvlink_half_bandwidth_per_rank": ("bytes", "nvlink_half_bandwidth_per_rank"),
    "scaleout_half_bandwidth_per_rank": ("bytes", "scaleout_half_bandwidth_per_rank"),
    "host_memory": ("bytes", "host_memory"),
    "host_link": ("bytes_per_s", "host_link"),
}
_BY_PREFIX = {(prefix, dim): name for name, (dim, prefix) in _QUANTITIES.items()}
#: canonical quantity -> (a string with a unit, the same under a unit-suffixed key)
_SPELLINGS = {
    "hbm_bandwidth": ("'3.35 TB/s'", "hbm_GBps"), "hbm_capacity": ("'80 GiB'", "hbm_GiB"),
    "nvlink_bandwidth": ("'450 GB/s'", "nvlink_GBps"),
    "nvlink_latency": ("'3 us'", "nvlink_latency_us"),
    "scaleout_bandwidth": ("'400 Gb/s'", "scaleout_Gbps"),
    "scaleout_latency": ("'5 us'", "scaleout_latency_us"),
    "nvlink_half_bandwidth_per_rank": ("'4 MiB'", "nvlink_half_bandwidth_per_rank_MiB"),
    "scaleout_half_bandwidth_per_rank": ("'2 MiB'", "scaleout_half_bandwidth_per_rank_MiB"),
    "host_memory": ("'256 GiB'", "host_memory_GiB"), "host_link": ("'64 GB/s'", "host_link_GBps"),
}
_PEAKS = ("matrix", "vector")  # matrix_tflops / vector_tflops / matrix_flops: {dtype: ...}
_PLAIN = {
    "name": "a short id; defaults to the file name",
    "source": "where the numbers come from",
    "notes": "free text",
    "nvlink_efficiency": "achievable fraction of NVLink bandwidth, in (0, 1]",
    "scaleout_efficiency": "achievable fraction of scale-out bandwidth, in (0, 1]",
    "nvlink_domain": "GPUs in one NVLink (scale-up) domain",
    "nics_per_gpu": "scale-out NICs per GPU (may be fractional, e.g. 0.5)",
    "calibration": "parameters of the calibrated cost profile (mapping)",
    "generation": "architecture (volta, ampere, hopper, blackwell): selects calibration",
    "sm_count": "streaming multiprocessors (GEMM wave quantization)",
    "gemm_tile": "[M, N] output tile of the typical tensor-core GEMM kernel",
    "matrix_sustained_fraction": "best-shape GEMM throughput measured on this GPU (power and "
                                 "clock limits; e.g. a MAMF search) / its datasheet peak, in "
                                 "(0, 1]; default: the generation's",
    "matrix_flops_per_exp": "16-bit tensor-core FLOPs per special-function exponential, per "
                            "SM and clock (attention's softmax), at this file's tensor peak; "
                            "default: the generation's",
    "exp_per_s": "special-function exponentials per second (instead of "
                 "matrix_flops_per_exp; what a resolved spec records)",
}


#: the architecture families a hardware file's ``generation`` may name
GENERATIONS = ("volta", "ampere", "hopper", "blackwell")

#: typical values, per generation, of the hardware facts a file may leave out (a sustained
#: fraction left out is 0 in a Hardware and cost/calibrated.py applies its generation's; the
#: FLOPs per exponential become the file's exp_per_s when it is read):
#: * matrix_sustained_fraction: best-shape bf16 GEMM throughput / datasheet dense peak: A100
#:   SXM 271.2 of 312 TFLOP/s, H100 SXM 794.5 of 989, B200 1745 of 2250 (ml-engineering,
#:   compute/accelerator "Maximum Achievable Matmul FLOPS" table); Volta as Ampere [inferred]
#: * matrix_flops_per_exp: dense bf16/fp16 tensor FLOPs per SM per clock (V100 1024, A100
#:   2048, H100 4096, B200 8192: datasheet peak / (SMs x boost clock)) over 16 exp2 per SM
#:   per clock on every generation (CUDA C++ Programming Guide, "Arithmetic Instructions"
#:   throughput table; FA3 paper, arXiv 2407.08608, section 3: H100 989 TFLOPS matmul
#:   against 3.9 TFLOPS of special functions); Blackwell Ultra doubles the exponentials (32
#:   per SM per clock: NVIDIA, "Inside NVIDIA Blackwell Ultra", 2025), set in the B300 and
#:   GB300 files
GENERATION_DEFAULTS: dict[str, dict[str, float]] = {
    "matrix_sustained_fraction": {"volta": 0.869, "ampere": 0.869, "hopper": 0.803,
                                  "blackwell": 0.776},
    "matrix_flops_per_exp": {"volta": 64.0, "ampere": 128.0, "hopper": 256.0,
                             "blackwell": 512.0},
}


@dataclass(frozen=True)
class Hardware:
    """One GPU system. All quantities in SI units."""

    name: str
    matrix_flops_per_s: Mapping[str, float]  # dense tensor-core peak per precision
    vector_flops_per_s: Mapping[str, float]  # non-tensor-core (CUDA core) peak per precision
    hbm_bytes_per_s: float  # HBM bandwidth
    hbm_capacity_bytes: float  # HBM capacity per GPU
    nvlink_bytes_per_s: float  # scale-up bandwidth per GPU, per direction
    nvlink_latency_s: float  # per-hop latency inside the domain
    nvlink_domain: int  # GPUs per scale-up domain
    scaleout_bytes_per_s: float  # per NIC, per direction
    scaleout_latency_s: float  # per-hop latency between domains
    nics_per_gpu: float = 1.0
    nvlink_efficiency: float = 1.0  # achievable fraction of nvlink_bytes_per_s
    scaleout_efficiency: float = 1.0  # achievable fraction of scaleout_bytes_per_s
    host_memory_bytes: float = 0.0  # second memory tier (offload target); 0 = none
    host_link_bytes_per_s: float = 0.0  # bandwidth to the second tier
    # a ring collective of n GPUs reaches half its peak bus bandwidth at a buffer of n x this,
    # inside the NVLink domain and across domains (nccl-tests curves; 0 = at every size)
    nvlink_half_bandwidth_per_rank_bytes: float = 0.0
    scaleout_half_bandwidth_per_rank_bytes: float = 0.0
    calibration: Mapping[str, float] = field(default_factory=dict)
    generation: str = ""  # architecture family; the calibrated profile's parameters key
    sm_count: int = 108  # SMs, for wave quantization of GEMMs
    gemm_tile: tuple[int, int] = (128, 128)  # output tile (M, N) of typical GEMM kernels
    # best-shape GEMM throughput this GPU sustains / its datasheet peak (0 = its generation's)
    matrix_sustained_fraction: float = 0.0
    # special-function-unit exponentials per second (attention's softmax; 0 = not known): a
    # file's matrix_flops_per_exp (or its generation's) at its own 16-bit tensor peak, held
    # when a spec sweeps the tensor peak (the SFUs are not the tensor cores)
    exp_per_s: float = 0.0
    source: str = ""

    def matrix_peak(self, dtype: str) -> float:
        """Tensor-core peak FLOP/s for ``dtype`` (falls back to the 16-bit peak)."""
        return _peak(self.matrix_flops_per_s, dtype, self.name, "matrix")

    def vector_peak(self, dtype: str) -> float:
        """Vector (non-tensor-core) peak FLOP/s for ``dtype``."""
        return _peak(self.vector_flops_per_s, dtype, self.name, "vector")

    @property
    def sustained_fraction(self) -> float:
        """The fraction of its datasheet tensor peak this GPU sustains on its best GEMM shape
        (power and clock limits): its own measurement, else its generation's, else 1."""
        return float(self.matrix_sustained_fraction
                     or GENERATION_DEFAULTS["matrix_sustained_fraction"].get(self.generation,
                                                                              1.0))

    def record(self) -> dict[str, float | str]:
        """Flat SI record of every parameter, for the ``/cases`` table."""
        out: dict[str, float | str] = {"hardware": self.name}
        for d in DTYPES:
            out[f"matrix_{d}_flops_per_s"] = float(self.matrix_flops_per_s.get(d, 0.0))
            out[f"vector_{d}_flops_per_s"] = float(self.vector_flops_per_s.get(d, 0.0))
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[f.name] = float(v)
        # (one the file leaves out: its generation's, which the calibrated profile applies)
        out["matrix_sustained_fraction"] = self.sustained_fraction
        out["gemm_tile_m"], out["gemm_tile_n"] = map(float, self.gemm_tile)
        for k, v in sorted(self.calibration.items()):
            out[f"calibration_{k}"] = float(v)
        return out


def _peak(table: Mapping[str, float], dtype: str, name: str, kind: str) -> float:
    if dtype in table:
        return table[dtype]
    for alt in ("bf16", "fp16") if dtype in ("bf16", "fp16") else ():
        if alt in table:
            return table[alt]
    raise KeyError(f"hardware {name!r} has no {kind} peak for {dtype!r}")


def _fail(source: str, key: str, msg: str) -> SpecError:
    return SpecError(source, key, msg)


#: the least rate a hardware file, grid point or override may give, in SI: far below any
#: accelerator, memory or link (1 MB/s, 1 GFLOP/s, a million exponentials a second), so a
#: smaller one is a unit mistake; 1e-300 B/s would make every time 1e300 s or infinite
MIN_RATES = {"bytes_per_s": (1e6, "1 MB/s"), "flops_per_s": (1e9, "1 GFLOP/s"),
             "exp_per_s": (1e6, "1e6 a second")}
#: the least efficiency, sustained fraction or NICs per GPU (one NIC per 1,000 GPUs)
MIN_FRACTION = 1e-3


def _at_least(number: float, dim: str | None, source: str, key: str, value: Any) -> float:
    """``number`` (SI), unless a rate below MIN_RATES for ``dim``."""
    if dim in MIN_RATES and number < MIN_RATES[dim][0]:
        raise _fail(source, key, f"{brief(value)} is below {MIN_RATES[dim][1]}, slower than "
                                 f"any accelerator, memory or link (a unit mistake?)")
    return number


def _fraction(value: Any, source: str, key: str) -> float:
    """A number in [MIN_FRACTION, 1]: an efficiency or a sustained fraction."""
    number = finite_float(value)
    if isinstance(value, bool) or number is None or not 0 < number <= 1:
        raise _fail(source, key, f"expected a number in (0, 1], got {brief(value)}")
    if number < MIN_FRACTION:
        raise _fail(source, key, f"{brief(value)} is below {MIN_FRACTION}: no link or GPU "
                                 f"sustains so little of its peak (a unit mistake?)")
    return number


def _dimension(name: str) -> str | None:
    """The dimension of a canonical quantity or peak table (``matrix_peaks``)."""
    return "flops_per_s" if name.endswith("_peaks") else _QUANTITIES.get(name, (None,))[0]


def _positive(value: Any, source: str, key: str, *, integer: bool = False,
              scale: float = 1.0, maximum: int | None = None, dim: str | None = None) -> float:
    """A positive finite number times ``scale`` (the key's unit to SI), finite too, and at
    least MIN_RATES' floor if ``dim`` is a rate's."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(source, key, f"expected a positive {'integer' if integer else 'number'}, "
                                 f"got {brief(value)}")
    number = finite_float(value)
    if number is None:
        raise _fail(source, key, f"expected a finite number, got {brief(value)}")
    if integer and not (isinstance(value, int) or number.is_integer()):
        raise _fail(source, key, f"expected a positive integer, got {brief(value)}")
    if not number > 0:
        raise _fail(source, key, f"expected a positive value, got {brief(value)}")
    if maximum is not None and number > maximum:
        raise _fail(source, key, f"expected at most {maximum}, got {brief(value)}")
    if finite_float(number * scale) is None:
        raise _fail(source, key, f"{brief(value)} is out of range")
    return _at_least(number * scale, dim, source, key, value)


def _quantity(value: Any, name: str, source: str, key: str) -> float:
    """A canonical quantity (``hbm_bandwidth``): a positive string with a unit, in SI."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        text, suffixed = _SPELLINGS[name]
        raise _fail(source, key, f"a bare number has no unit: give a unit, e.g. {text}, "
                                 f"or use {suffixed}; got {brief(value)}")
    try:
        out = parse_quantity(value, _QUANTITIES[name][0])
    except ValueError as exc:
        raise _fail(source, key, str(exc)) from None
    if not out > 0:
        raise _fail(source, key, f"expected a positive value, got {brief(value)}")
    return _at_least(out, _QUANTITIES[name][0], source, key, value)


def _parse_peaks(value: Any, scale: float | None, source: str, key: str) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise _fail(source, key, f"expected a mapping of precision -> peak, got {brief(value)}")
    out = {}
    for dt, v in value.items():
        if dt not in DTYPES:
            raise _fail(source, f"{key}.{dt}", f"unknown precision; valid: {', '.join(DTYPES)}")
        if scale is None:
            try:
                out[dt] = parse_quantity(v, "flops_per_s")
            except ValueError as exc:
                raise _fail(source, f"{key}.{dt}", str(exc)) from None
        else:
            out[dt] = _positive(v, source, f"{key}.{dt}", scale=scale)
        if not out[dt] > 0:
            raise _fail(source, f"{key}.{dt}", f"expected a positive value, got {brief(v)}")
        _at_least(out[dt], "flops_per_s", source, f"{key}.{dt}", v)
    return out


def quantity_dimension(key: str) -> str | None:
    """The dimension of a canonical quantity key that takes a string with a unit
    (``hbm_bandwidth`` -> ``bytes_per_s``), or None for any other key."""
    return _QUANTITIES[key][0] if key in _QUANTITIES else None


#: hardware parameters an override or a grid axis sets by name, besides the quantities
_NAMED_PARAMETERS = ("nvlink_domain", "nics_per_gpu", "nvlink_efficiency",
                     "scaleout_efficiency", "matrix_sustained_fraction")


def is_parameter(key: str) -> bool:
    """Whether ``key`` names a hardware parameter (as apply_overrides reads it)."""
    return key in _NAMED_PARAMETERS or _canonical(key) is not None


def _canonical(key: str) -> tuple[str, float | None] | None:
    """Map a user key to (canonical quantity, SI factor or None for a unit string)."""
    if key in _QUANTITIES:
        return key, None
    split = split_unit_key(key)
    if split is None:
        return None
    prefix, dim, factor = split
    if prefix in _PEAKS and dim == "flops_per_s":
        return f"{prefix}_peaks", factor
    name = _BY_PREFIX.get((prefix, dim))
    return (name, factor) if name else None


def _valid_keys() -> str:
    keys = sorted(_PLAIN) + sorted(_QUANTITIES) + [
        "hbm_GBps", "hbm_GiB", "hbm_GB", "nvlink_GBps", "nvlink_latency_us", "scaleout_GBps",
        "scaleout_Gbps", "scaleout_latency_us", "matrix_tflops", "vector_tflops",
        "host_memory_GiB", "host_link_GBps", "nvlink_half_bandwidth_per_rank_MiB",
        "scaleout_half_bandwidth_per_rank_MiB"]
    return ", ".join(keys) + " (any unit suffix of the right dimension works)"


def parse_hardware(raw: Mapping[str, Any], source: str, default_name: str = "") -> Hardware:
    """Validate a hardware mapping (one YAML file) and convert it to SI.

    Raises:
        SpecError: unknown key, missing key, wrong unit or non-positive value.
    """
    if not isinstance(raw, Mapping):
        raise _fail(source, "", f"expected a mapping of hardware parameters, got "
                                f"{type(raw).__name__}")
    values: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for key, value in raw.items():
        key = str(key)
        if key in _PLAIN:
            values[key] = value
            continue
        canon = _canonical(key)
        if canon is None:
            raise _fail(source, key, f"unknown key; valid keys: {_valid_keys()}")
        name, factor = canon
        if name in values:
            raise _fail(source, key, f"{name} is given twice ({given_as[name]} and {key})")
        given_as[name] = key
        if name.endswith("_peaks"):
            values[name] = _parse_peaks(value, factor, source, key)
        elif factor is None:
            values[name] = _quantity(value, name, source, key)
        else:
            values[name] = _positive(value, source, key, scale=factor, dim=_dimension(name))
    for flops_key in ("matrix_peaks", "vector_peaks"):
        if flops_key not in values:
            raise _fail(source, flops_key.replace("_peaks", "_tflops"), "missing")
    # what the cost models read: a 16-bit tensor peak (other precisions fall back on it),
    # and fp32 and 16-bit vector peaks (norms, softmax, optimizer; docs/specs.md)
    for flops_key, what, any_of in (("matrix_peaks", "a bf16 or fp16", {"bf16", "fp16"}),
                                    ("vector_peaks", "a bf16 or fp16", {"bf16", "fp16"}),
                                    ("vector_peaks", "an fp32", {"fp32"})):
        have = values[flops_key]
        if not any_of & set(have):
            raise _fail(source, flops_key.replace("_peaks", "_tflops"),
                        f"needs {what} peak; has {', '.join(have) or 'none'}")
    required = ["hbm_bandwidth", "hbm_capacity", "nvlink_bandwidth", "nvlink_latency",
                "scaleout_bandwidth", "scaleout_latency", "nvlink_domain"]
    for req in required:
        if req not in values:
            raise _fail(source, req, "missing")
    eff = {}
    # fractions in (0, 1]; an unmeasured sustained fraction is 0 (its generation's applies)
    for k, default in (("nvlink_efficiency", 1.0), ("scaleout_efficiency", 1.0),
                       ("matrix_sustained_fraction", None)):
        if k not in values and default is None:
            eff[k] = 0.0
            continue
        eff[k] = _fraction(values.get(k, default), source, k)
    domain = _positive(values["nvlink_domain"], source, "nvlink_domain", integer=True,
                       maximum=MAX_NVLINK_DOMAIN)
    nics = _positive(values.get("nics_per_gpu", 1.0), source, "nics_per_gpu")
    _fraction(min(nics, 1.0), source, "nics_per_gpu")  # (at least one NIC per 1,000 GPUs)
    calibration = values.get("calibration", {}) or {}
    if not isinstance(calibration, Mapping):
        raise _fail(source, "calibration", "expected a mapping of parameter -> number")
    cal = check_calibration(calibration, source, "calibration")
    sm = _positive(values.get("sm_count", 108), source, "sm_count", integer=True,
                   maximum=MAX_HW_COUNT)
    tile = values.get("gemm_tile", [128, 128])
    if (not isinstance(tile, (list, tuple)) or len(tile) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_HW_COUNT
                       for v in tile)):
        raise _fail(source, "gemm_tile", f"expected [M, N] positive integers (at most "
                                         f"{MAX_HW_COUNT}), got {brief(tile)}")
    generation = str(values.get("generation", "")).lower()  # (Hopper is hopper)
    if "generation" in values and generation not in GENERATIONS:
        raise _fail(source, "generation", f"unknown generation {brief(values['generation'])}; "
                                          f"known: {', '.join(GENERATIONS)}")
    if "exp_per_s" in values:
        exp_per_s = _positive(values["exp_per_s"], source, "exp_per_s", dim="exp_per_s")
        if "matrix_flops_per_exp" in values:  # (one or the other: exp_per_s wins; both checked)
            _positive(values["matrix_flops_per_exp"], source, "matrix_flops_per_exp")
    else:
        ratio = (_positive(values["matrix_flops_per_exp"], source, "matrix_flops_per_exp")
                 if "matrix_flops_per_exp" in values
                 else GENERATION_DEFAULTS["matrix_flops_per_exp"].get(generation, 0.0))
        peak16 = values["matrix_peaks"].get("bf16", values["matrix_peaks"].get("fp16", 0.0))
        exp_per_s = peak16 / ratio if ratio and peak16 else 0.0
    why = name_problem(values["name"]) if "name" in values else None
    if why:
        raise _fail(source, "name", why)
    return Hardware(
        name=str(values.get("name", default_name) or default_name),
        generation=generation, sm_count=int(sm), gemm_tile=(int(tile[0]), int(tile[1])),
        matrix_flops_per_s=values["matrix_peaks"],
        vector_flops_per_s=values["vector_peaks"],
        hbm_bytes_per_s=values["hbm_bandwidth"],
        hbm_capacity_bytes=values["hbm_capacity"],
        nvlink_bytes_per_s=values["nvlink_bandwidth"],
        nvlink_latency_s=values["nvlink_latency"],
        nvlink_domain=int(domain),
        scaleout_bytes_per_s=values["scaleout_bandwidth"],
        scaleout_latency_s=values["scaleout_latency"],
        nics_per_gpu=nics,
        nvlink_efficiency=eff["nvlink_efficiency"],
        scaleout_efficiency=eff["scaleout_efficiency"],
        matrix_sustained_fraction=eff["matrix_sustained_fraction"],
        exp_per_s=exp_per_s,
        host_memory_bytes=values.get("host_memory", 0.0),
        host_link_bytes_per_s=values.get("host_link", 0.0),
        nvlink_half_bandwidth_per_rank_bytes=values.get("nvlink_half_bandwidth_per_rank", 0.0),
        scaleout_half_bandwidth_per_rank_bytes=values.get("scaleout_half_bandwidth_per_rank",
                                                          0.0),
        calibration=cal,
        source=str(values.get("source", "")),
    )


#: override key -> Hardware field for keys that are not unit-bearing quantities
_FIELD_OF = {
    "hbm_bandwidth": "hbm_bytes_per_s",
    "hbm_capacity": "hbm_capacity_bytes",
    "nvlink_bandwidth": "nvlink_bytes_per_s",
    "nvlink_latency": "nvlink_latency_s",
    "scaleout_bandwidth": "scaleout_bytes_per_s",
    "scaleout_latency": "scaleout_latency_s",
    "host_memory": "host_memory_bytes",
    "host_link": "host_link_bytes_per_s",
    "nvlink_half_bandwidth_per_rank": "nvlink_half_bandwidth_per_rank_bytes",
    "scaleout_half_bandwidth_per_rank": "scaleout_half_bandwidth_per_rank_bytes",
}
#: keys a spec grid may override, with a description (listed in error messages)
OVERRIDABLE = {
    "nvlink_domain": "GPUs per NVLink domain",
    "nics_per_gpu": "scale-out NICs per GPU",
    "nvlink_efficiency": "NVLink efficiency",
    "scaleout_efficiency": "scale-out efficiency",
    "matrix_sustained_fraction": "sustained best-shape GEMM fraction of the tensor peak",
    "matrix_tflops": "16-bit tensor peak (other precisions scale with it)",
    "vector_tflops": "16-bit vector peak (other precisions scale with it)",
    "<quantity>_<unit>": "hbm_GBps, hbm_GiB, hbm_GB, nvlink_GBps, scaleout_GBps, "
                         "scaleout_Gbps, nvlink_latency_us, scaleout_latency_us, "
                         "host_memory_GiB, host_link_GBps, "
                         "nvlink_half_bandwidth_per_rank_MiB, "
                         "scaleout_half_bandwidth_per_rank_MiB",
}


#: override keys that name a Hardware field directly (no unit suffix)
_DIRECT_KEYS = ("nvlink_domain", "nics_per_gpu", "nvlink_efficiency", "scaleout_efficiency",
                "matrix_sustained_fraction")


def override_field(key: str) -> str | None:
    """The Hardware field a grid override key sets (None: not an override key)."""
    if key in _DIRECT_KEYS:
        return key
    canon = _canonical(key)
    if canon is None:
        return None
    name = canon[0]
    if name.endswith("_peaks"):
        return "matrix_flops_per_s" if name.startswith("matrix") else "vector_flops_per_s"
    return _FIELD_OF[name]


def _scaled_peaks(peaks: Mapping[str, float], new16: float) -> dict[str, float]:
    ref = peaks.get("bf16", peaks.get("fp16"))
    if not ref:
        return {d: new16 for d in peaks}
    return {d: v * new16 / ref for d, v in peaks.items()}


def apply_overrides(hw: Hardware, overrides: Mapping[str, Any], source: str,
                    paths: Mapping[str, str] | None = None) -> Hardware:
    """Return a copy of ``hw`` with spec-grid overrides applied (values in the key's unit).

    A scalar ``matrix_tflops`` / ``vector_tflops`` sets the 16-bit peak; the other
    precisions keep their ratio to it (fp8 stays 2x bf16).

    Args:
        paths: key -> the key path to name in error messages (default: the key).

    Raises:
        SpecError: unknown key or invalid value (the message names ``source`` and the path).
    """
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        path = (paths or {}).get(key, key)
        if key == "nvlink_domain":
            changes["nvlink_domain"] = int(_positive(value, source, path, integer=True,
                                                     maximum=MAX_NVLINK_DOMAIN))
        elif key in ("nics_per_gpu",):
            changes["nics_per_gpu"] = _positive(value, source, path)
            _fraction(min(changes["nics_per_gpu"], 1.0), source, path)
        elif key in ("nvlink_efficiency", "scaleout_efficiency", "matrix_sustained_fraction"):
            _positive(value, source, path)  # (its messages for what is not a number)
            changes[key] = _fraction(value, source, path)
        else:
            canon = _canonical(key)
            if canon is None:
                valid = ", ".join(k for k in OVERRIDABLE if not k.startswith("<"))
                raise _fail(source, path, f"unknown hardware parameter; valid: {valid}, "
                                          f"{OVERRIDABLE['<quantity>_<unit>']} (or another "
                                          f"unit suffix)")
            name, factor = canon
            if name.endswith("_peaks"):
                attr = override_field(key)
                if isinstance(value, Mapping):
                    changes[attr] = {**getattr(hw, attr),
                                     **_parse_peaks(value, factor, source, path)}
                else:
                    new16 = _positive(value, source, path, scale=factor or 1.0,
                                      dim="flops_per_s")
                    changes[attr] = _scaled_peaks(getattr(hw, attr), new16)
                if any(finite_float(v) is None for v in changes[attr].values()):
                    raise _fail(source, path, f"{brief(value)} is out of range")
            elif factor is None:
                changes[override_field(key)] = _quantity(value, name, source, path)
            else:
                changes[override_field(key)] = _positive(value, source, path, scale=factor,
                                                         dim=_dimension(name))
    return dataclasses.replace(hw, **changes)

"""Units of the input files, converted to SI exactly once, when a file is loaded.

A quantity is written either with its unit in the key name (``hbm_GBps: 3350``) or as a
string with a unit (``hbm_bandwidth: "3.35 TB/s"``). Inside the package every quantity is
SI and its name carries the unit: ``_bytes``, ``_bytes_per_s``, ``_s``, ``_flops_per_s``.

Decimal prefixes are powers of 1000, binary prefixes (KiB, GiB) powers of 1024; a lower-case
``b`` means bits (``Gbps``, ``Gb/s``), an upper-case ``B`` bytes.
"""

from __future__ import annotations

import re

__all__ = ["DIMENSIONS", "parse_quantity", "unit_scale", "split_unit_key"]

_DECIMAL = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}


def _table() -> dict[str, dict[str, float]]:
    size: dict[str, float] = {}
    rate: dict[str, float] = {}
    for p, s in {**_DECIMAL, **_BINARY}.items():
        size[f"{p}B"] = s
        rate[f"{p}Bps"] = s
        rate[f"{p}B/s"] = s
        rate[f"{p}bps"] = s / 8.0  # bits per second
        rate[f"{p}b/s"] = s / 8.0
    flops: dict[str, float] = {}
    for p, s in _DECIMAL.items():
        for word in ("flops", "FLOPS", "FLOP/s", "flop/s"):
            flops[f"{p}{word}"] = s
        flops[f"{p.lower()}flops"] = s
    time = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    return {"bytes": size, "bytes_per_s": rate, "flops_per_s": flops, "s": time}


#: dimension -> {unit spelling -> SI factor}; SI units: bytes, bytes/s, flop/s, seconds.
DIMENSIONS: dict[str, dict[str, float]] = _table()

_EXAMPLES = {"bytes": "GB, GiB, TB", "bytes_per_s": "GB/s, TB/s, GiB/s, Gb/s for bits",
             "flops_per_s": "TFLOPS, PFLOPS", "s": "s, ms, us, ns"}
_NUMBER_UNIT = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/]+)\s*$")


def unit_scale(unit: str) -> tuple[str, float] | None:
    """Return ``(dimension, factor to SI)`` of a unit spelling, or None if unknown."""
    for dim, units in DIMENSIONS.items():
        if unit in units:
            return dim, units[unit]
    return None


def split_unit_key(key: str) -> tuple[str, str, float] | None:
    """Split ``hbm_GBps`` into ``("hbm", "bytes_per_s", 1e9)``; None if no unit suffix."""
    base, sep, unit = key.rpartition("_")
    if not sep or not base:
        return None
    found = unit_scale(unit)
    if found is None:
        return None
    return base, found[0], found[1]


def parse_quantity(value: object, dimension: str) -> float:
    """Convert ``"3.35 TB/s"`` (or a bare number already in SI) to SI.

    Raises:
        ValueError: the value is not a number with a unit of the right dimension.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a quantity in {dimension}, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a quantity in {dimension}, got {value!r}")
    m = _NUMBER_UNIT.match(value)
    if not m:
        raise ValueError(f"expected '<number> <unit>' in {dimension}, got {value!r}")
    found = unit_scale(m.group(2))
    if found is None or found[0] != dimension:
        raise ValueError(f"unit {m.group(2)!r} is not a unit of {dimension} "
                         f"(e.g. {_EXAMPLES[dimension]})")
    return float(m.group(1)) * found[1]

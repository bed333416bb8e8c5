"""Units of the input files, converted to SI exactly once, when a file is loaded.

A quantity is written either with its unit in the key name (``hbm_GBps: 3350``) or as a
string with a unit (``hbm_bandwidth: "3.35 TB/s"``); a bare number under a key without a unit
is refused, never guessed to be SI. Inside the package every quantity is SI and its name
carries the unit: ``_bytes``, ``_bytes_per_s``, ``_s``, ``_flops_per_s``. Every number must
be finite (no ``.inf``, ``.nan``, nor a value that overflows a float once scaled to SI).

Decimal prefixes are powers of 1000, binary prefixes (KiB, GiB) powers of 1024; a lower-case
``b`` means bits (``Gbps``, ``Gb/s``), an upper-case ``B`` bytes.
"""

from __future__ import annotations

import math
import re

__all__ = ["DIMENSIONS", "parse_quantity", "unit_scale", "split_unit_key", "finite_float",
           "integral", "brief", "name_problem"]

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
# unambiguous (no two ways to split a digit run), so a long string fails in linear time
_NUMBER_UNIT = re.compile(
    r"\s*([-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/]+)\s*")


def brief(value: object, width: int = 40) -> str:
    """``repr(value)``, cut to about ``width`` characters (an error message quotes it)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**width else \
        f"an integer of {len(str(abs(value)))} digits"
    return text if len(text) <= width else text[:width - 3] + "..."


def name_problem(value: object) -> str | None:
    """Why ``value`` cannot be the ``name`` of a job or hardware file (None: it can): a name
    is text of at most 128 printable characters, without the brackets, commas and equals
    signs of the labels that name a spec's overrides (``llama3_8b[seq_len=8192]``)."""
    if not isinstance(value, str) or not value:
        return f"expected a non-empty name, got {brief(value)}"
    if len(value) > 128 or not value.isprintable() or any(c in value for c in "[],="):
        return (f"expected at most 128 printable characters without '[', ']', ',' or '=', "
                f"got {brief(value)}")
    return None


def finite_float(value: object) -> float | None:
    """``value`` as a finite float; None for a non-number (bools included), an infinity,
    NaN, or an integer beyond the float range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        out = float(value)
    except OverflowError:  # an int above ~1.8e308
        return None
    return out if math.isfinite(out) else None


def integral(value: object) -> object:
    """An integer written as a float (YAML reads ``1.6e1``, exponent form, as 16.0) as that
    int, up to 2**53 where floats hold every integer; anything else unchanged."""
    if type(value) is float and value.is_integer() and abs(value) <= 2.0**53:
        return int(value)
    return value


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
    """Convert ``"3.35 TB/s"`` to SI (finite). A bare number is refused: its unit is unknown.

    Raises:
        ValueError: the value is not a number with a unit of the right dimension.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(f"a bare number has no unit: give one ({_EXAMPLES[dimension]}), "
                         f"got {brief(value)}")
    if not isinstance(value, str):
        raise ValueError(f"expected a quantity in {dimension}, got {brief(value)}")
    m = _NUMBER_UNIT.fullmatch(value)
    if not m:
        raise ValueError(f"expected '<number> <unit>' in {dimension}, got {brief(value)}")
    found = unit_scale(m.group(2))
    if found is None or found[0] != dimension:
        raise ValueError(f"unit {brief(m.group(2))} is not a unit of {dimension} "
                         f"(e.g. {_EXAMPLES[dimension]})")
    out = float(m.group(1)) * found[1]
    if not math.isfinite(out):
        raise ValueError(f"expected a finite quantity, got {brief(value)}")
    return out

"""Plain-text formatting of tables and quantities for the command line (no math here)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["table", "seconds", "gigabytes", "percent", "si"]


def table(header: Sequence[str], rows: Sequence[Sequence[object]], align: str = "") -> str:
    """Fixed-width text table; ``align`` is one char per column, 'l' or 'r' (default r,
    first column l)."""
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    align = align or "l" + "r" * (len(header) - 1)
    lines = []
    for k, r in enumerate(cells):
        parts = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, widths, align)]
        lines.append("  ".join(parts).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def seconds(x: float) -> str:
    """1.234 s, 12.3 ms, 45.6 us."""
    if x == 0:
        return "0"
    if abs(x) >= 1:
        return f"{x:.4g} s"
    if abs(x) >= 1e-3:
        return f"{x * 1e3:.4g} ms"
    return f"{x * 1e6:.4g} us"


def gigabytes(x: float, spec: str = ".2f") -> str:
    """Bytes as decimal GB (1e9), the unit of hardware datasheets (and of every memory
    figure sweep prints)."""
    return f"{x / 1e9:{spec}} GB"


def percent(x: float) -> str:
    return f"{100 * x:.1f}%"


def si(x: float, unit: str = "") -> str:
    """1.23e12 -> '1.23 T<unit>'."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}".rstrip()


"""Hardware variants: every combination of a spec's hardware grid, in a fixed order.

Worked example: ``base: [A, B]`` with ``grid: {nvlink_domain: [4, 8], hbm_GBps: [1000, 2000]}``
gives 2 x 2 x 2 = 8 variants, ids 0..7, in this order (the last axis varies fastest)::

    0 A[nvlink_domain=4,hbm_GBps=1000]   1 A[nvlink_domain=4,hbm_GBps=2000]
    2 A[nvlink_domain=8,hbm_GBps=1000]   3 A[nvlink_domain=8,hbm_GBps=2000]
    4 B[...]                             ...

Groups of a ``hardware:`` list follow one another. The same spec always yields the same
variants with the same ids, which is what makes ids stable across runs and resumes.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from ..model.hardware import Hardware, apply_overrides
from .spec import SweepSpec

__all__ = ["Variant", "expand_variants"]


@dataclass(frozen=True)
class Variant:
    """One hardware variant: a base system with some parameters swept."""

    variant_id: int
    label: str  # base[axis=value,...]; also the Hardware's name
    base: str
    swept: tuple[tuple[str, float], ...]  # (axis, value) in grid order
    hardware: Hardware


def _fmt(v: float) -> str:
    return f"{v:g}"


def _apply_point(hw: Hardware, axis, i: int, spec: SweepSpec) -> Hardware:
    """``hw`` with point ``i`` of a grid axis applied."""
    point = axis.points[i]
    user = {k: v for k, v in point.items() if not k.startswith("=")}
    if user:
        hw = apply_overrides(hw, user, spec.source, axis.paths[i])
    direct = {k[1:]: v for k, v in point.items() if k.startswith("=")}
    if direct:
        hw = dataclasses.replace(hw, **direct)
    return hw


def expand_variants(spec: SweepSpec) -> list[Variant]:
    """All hardware variants of a spec, ids 0..V-1 in a deterministic order.

    Axes apply in grid order; the hardware after the first ``d`` axes is kept while only
    later axes change, so a grid of V variants costs about V overrides, not V x axes.
    """
    out: list[Variant] = []
    for group in spec.hardware:
        axes = group.axes
        for base_name in group.bases:
            # prefix[d]: the base with the current points of axes[:d] applied
            prefix: list[Hardware] = [spec.bases[base_name]] * (len(axes) + 1)
            previous: tuple[int, ...] | None = None
            for combo in itertools.product(*[range(len(ax.points)) for ax in axes]):
                changed = 0 if previous is None else next(
                    d for d, (a, b) in enumerate(zip(previous, combo)) if a != b)
                for d in range(changed, len(axes)):
                    prefix[d + 1] = _apply_point(prefix[d], axes[d], combo[d], spec)
                previous = combo
                swept = tuple((ax.name, float(ax.labels[i])) for ax, i in zip(axes, combo))
                label = base_name + ("[" + ",".join(f"{a}={_fmt(v)}" for a, v in swept) + "]"
                                     if swept else "")
                hw = dataclasses.replace(prefix[-1], name=label)
                out.append(Variant(len(out), label, base_name, swept, hw))
    return out

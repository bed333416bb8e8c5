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
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..model.hardware import Hardware, override_field
from .spec import HardwareGroup, SweepSpec, apply_point

__all__ = ["Variant", "Variants", "Lookup", "expand_variants"]


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




class Variants(Sequence[Variant]):
    """The hardware variants of a spec by id, each built when asked for (never all held).

    A variant's hardware is its base with the points of its axes applied in grid order, as
    :func:`expand_variants` builds them; the hardware after the first ``d`` axes of the last
    variant asked for is kept, so walking the ids in order costs about one override per
    variant. Memory: a few hardware records, whatever the grid's size.
    """

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        # (first id, group, base name, points per axis) per base of each group
        self._blocks: list[tuple[int, HardwareGroup, str, tuple[int, ...]]] = []
        start = 0
        for group in spec.hardware:
            sizes = tuple(len(ax.points) for ax in group.axes)
            for base in group.bases:
                self._blocks.append((start, group, base, sizes))
                start += math.prod(sizes)
        self._len = start
        self._firsts = np.array([b[0] for b in self._blocks], dtype=np.int64)
        self._last: tuple[int, tuple[int, ...], list[Hardware]] | None = None

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._len))]
        i = int(i)
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"variant {i} of {self._len}")
        b = int(np.searchsorted(self._firsts, i, side="right")) - 1
        first, group, base, sizes = self._blocks[b]
        combo = tuple(int(x) for x in np.unravel_index(i - first, sizes)) if sizes else ()
        axes = group.axes
        if self._last is not None and self._last[0] == b:
            _, previous, prefix = self._last
            changed = next((d for d, (x, y) in enumerate(zip(previous, combo)) if x != y),
                           len(axes))
        else:
            prefix, changed = [self.spec.bases[base]] * (len(axes) + 1), 0
        prefix = list(prefix)
        for d in range(changed, len(axes)):
            prefix[d + 1] = apply_point(prefix[d], axes[d], combo[d], self.spec.source)
        self._last = (b, combo, prefix)
        swept = tuple((ax.name, float(ax.labels[k])) for ax, k in zip(axes, combo))
        label = base + ("[" + ",".join(f"{a}={_fmt(v)}" for a, v in swept) + "]"
                        if swept else "")
        return Variant(i, label, base, swept, dataclasses.replace(prefix[-1], name=label))

    def axis_names(self) -> list[str]:
        """Every swept axis name, sorted."""
        return sorted({ax.name for _, group, _, _ in self._blocks for ax in group.axes})

    def widths(self) -> dict[str, int]:
        """Longest label, base name and swept-values JSON of any variant, in UTF-8 bytes
        (each part of a label takes its longest value independently of the others, and
        the grid holds every combination, so the longest combination is a variant)."""
        out = {"hardware": 1, "base": 1, "swept": 1}
        for _, group, base, _ in self._blocks:
            axes = group.axes
            parts = [max(len(f"{ax.name}={_fmt(float(v))}".encode()) for v in ax.labels)
                     for ax in axes]
            label = len(base.encode()) + (2 + sum(parts) + len(parts) - 1 if axes else 0)
            pairs = [max(len(f"{json.dumps(ax.name)}: {json.dumps(float(v))}".encode())
                         for v in ax.labels) for ax in axes]
            swept = 2 + sum(pairs) + 2 * max(len(pairs) - 1, 0)
            out = {"hardware": max(out["hardware"], label),
                   "base": max(out["base"], len(base.encode())),
                   "swept": max(out["swept"], swept)}
        return out

    def record_keys(self) -> list[str]:
        """Every key of the variants' hardware records (Hardware.record), sorted: a base's
        variants share the keys of its first (overrides change values, not keys)."""
        keys: set[str] = set()
        for first, _, _, _ in self._blocks:
            keys |= set(self[first].hardware.record())
        return sorted(keys)

    def setters(self, fields: frozenset[str]) -> tuple:
        """Per (group, base) block, the axes that set any of ``fields``: fields with the same
        setters can share one :meth:`lookup`."""
        return tuple(tuple(d for d, ax in enumerate(group.axes) if _sets_any(ax, fields))
                     for _, group, _, _ in self._blocks)

    def lookup(self, fields: frozenset[str], value) -> Lookup:
        """``value(hardware)`` of any variant, computed once per distinct combination of the
        grid axes that set any of ``fields`` (Hardware field names) rather than once per
        variant: every other axis leaves those fields as they are, and an axis sets a field
        from that field's own value (absolute values, or peaks scaled by their ratio), so
        the base with only those axes applied has the variant's values of ``fields``."""
        values: list = []
        layout = []
        for _, group, base, sizes in self._blocks:
            axes = group.axes
            touching = [d for d, ax in enumerate(axes) if _sets_any(ax, fields)]
            sub = tuple(sizes[d] for d in touching)
            layout.append((touching, sub, len(values)))
            for combo in itertools.product(*[range(n) for n in sub]):
                hw = self.spec.bases[base]
                for d, k in zip(touching, combo):
                    hw = apply_point(hw, axes[d], k, self.spec.source)
                values.append(value(hw))
        return Lookup(self, layout, values)

    def per_variant(self, fields: frozenset[str], value) -> tuple[np.ndarray, list]:
        """(index of every variant's value in the distinct values, the distinct values) of
        ``value(hardware)``; see :meth:`lookup`."""
        found = self.lookup(fields, value)
        return found.index(np.arange(self._len, dtype=np.int64)), found.values

    def points(self, variant_ids: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """Per (group, base) block holding some of ``variant_ids``: (block, positions of
        those ids in ``variant_ids``) - vectorised grouping for per-axis lookups."""
        ids = np.asarray(variant_ids, dtype=np.int64)
        block = np.searchsorted(self._firsts, ids, side="right") - 1
        return [(int(b), np.flatnonzero(block == b)) for b in np.unique(block)]

    def axis_points(self, block: int, variant_ids: np.ndarray) -> tuple:
        """The point index of each axis of ``block`` for variants of that block."""
        first, _, _, sizes = self._blocks[block]
        if not sizes:
            return ()
        return np.unravel_index(np.asarray(variant_ids, dtype=np.int64) - first, sizes)

    def labels(self, variant_ids: np.ndarray) -> dict[str, list]:
        """Label, base, swept JSON and each swept axis' value of ``variant_ids`` without
        building their hardware (strings in lists; axis values per axis name, NaN where
        a variant's group does not sweep it)."""
        ids = np.asarray(variant_ids, dtype=np.int64)
        n = len(ids)
        out: dict[str, list] = {"hardware": [""] * n, "base": [""] * n, "swept": [""] * n}
        values: dict[str, np.ndarray] = {a: np.full(n, np.nan) for a in self.axis_names()}
        for block, at in self.points(ids):
            _, group, base, _ = self._blocks[block]
            position = self.axis_points(block, ids[at])
            parts, pairs = [], []
            for ax, k in zip(group.axes, position):
                labels = np.array([float(v) for v in ax.labels])
                values[ax.name][at] = labels[k]
                # (each of the axis' few points formatted once, then picked per variant)
                name = json.dumps(ax.name)
                part = np.array([f"{ax.name}={_fmt(v)}" for v in labels], dtype=object)
                pair = np.array([f"{name}: {json.dumps(v)}" for v in labels.tolist()],
                                dtype=object)
                parts.append(part[k].tolist())
                pairs.append(pair[k].tolist())
            for i, j in enumerate(at.tolist()):
                out["base"][j] = base
                out["hardware"][j] = (base + "[" + ",".join(p[i] for p in parts) + "]"
                                      if parts else base)
                out["swept"][j] = "{" + ", ".join(p[i] for p in pairs) + "}"
        return {**out, **{f"swept_{a}": v for a, v in values.items()}}


class Lookup:
    """Values per distinct combination of the axes that set some fields (Variants.lookup),
    and which one each variant has."""

    def __init__(self, variants: Variants, layout: list, values: list) -> None:
        self.variants, self.layout, self.values = variants, layout, values

    def index(self, variant_ids: np.ndarray) -> np.ndarray:
        """Position in ``values`` of each of ``variant_ids`` (vectorised)."""
        ids = np.asarray(variant_ids, dtype=np.int64)
        out = np.empty(len(ids), dtype=np.int64)
        for block, at in self.variants.points(ids):
            touching, sub, offset = self.layout[block]
            position = self.variants.axis_points(block, ids[at])
            out[at] = offset + (np.ravel_multi_index([position[d] for d in touching], sub)
                                if touching else 0)
        return out


def _sets_any(axis, fields: frozenset[str]) -> bool:
    """Whether any point of ``axis`` sets one of the Hardware ``fields``."""
    for point in axis.points:
        for key in point:
            field = key[1:] if key.startswith("=") else override_field(key)
            if field is None or field in fields:  # unknown: assume it might
                return True
    return False


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
                    prefix[d + 1] = apply_point(prefix[d], axes[d], combo[d], spec.source)
                previous = combo
                swept = tuple((ax.name, float(ax.labels[i])) for ax, i in zip(axes, combo))
                label = base_name + ("[" + ",".join(f"{a}={_fmt(v)}" for a, v in swept) + "]"
                                     if swept else "")
                hw = dataclasses.replace(prefix[-1], name=label)
                out.append(Variant(len(out), label, base_name, swept, hw))
    return out

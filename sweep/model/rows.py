"""Several hardware variants in one block of candidates: :class:`HardwareRows`.

Cases that differ only in hardware parameters (HBM bandwidth, capacity, NIC count, FLOP/s)
share one candidate space. Evaluating them one call per case costs the cost core's fixed
per-call overhead (about 1 ms of numpy calls) once per case; a grid of 100,000 variants
with a thousand candidates each spends most of its time there. Instead the search stacks
the spaces of ``k`` variants into one block, row ``i`` belonging to variant ``row[i]``,
and hands the cost core a ``HardwareRows`` where it expects a ``Hardware``.

A ``HardwareRows`` answers every numeric field and peak of ``Hardware`` with the value of
each row's variant (an array aligned with the rows), or with the plain number where every
variant agrees. The cost core's arithmetic is elementwise, so each row gets bit for bit the
numbers an evaluation of its variant alone computes (tested: a batched block equals the
cases evaluated one by one). Pure numpy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .hardware import Hardware

__all__ = ["HardwareRows"]


class HardwareRows:
    """The hardware of each row of a block: ``variants[row[i]]`` for row ``i``."""

    def __init__(self, variants: Sequence[Hardware], row: np.ndarray) -> None:
        if not variants:
            raise ValueError("HardwareRows needs at least one variant")
        self.variants = tuple(variants)
        self.row = np.asarray(row, dtype=np.int64)
        self._values: dict[tuple, object] = {}

    def take(self, positions: np.ndarray) -> HardwareRows:
        """The hardware of rows ``positions`` of this block (e.g. its distinct rows)."""
        return HardwareRows(self.variants, self.row[positions])

    def of_variants(self, variant_index: np.ndarray) -> HardwareRows:
        """Rows whose variants are ``variant_index`` (positions in ``variants``)."""
        return HardwareRows(self.variants, variant_index)

    def _by_row(self, key: tuple, values: list):
        """One value per row, or the shared value itself when every variant agrees (so a
        block of one variant is evaluated exactly as a plain ``Hardware``)."""
        if key not in self._values:
            first = values[0]
            if all(v == first for v in values[1:]):
                self._values[key] = first
            else:
                self._values[key] = np.asarray(values)[self.row]
        return self._values[key]

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in _FIELDS:
            raise AttributeError(name)
        return self._by_row(("field", name), [getattr(h, name) for h in self.variants])

    def matrix_peak(self, dtype: str):
        """Tensor-core peak FLOP/s for ``dtype`` of each row's variant."""
        return self._by_row(("matrix", dtype), [h.matrix_peak(dtype) for h in self.variants])

    def vector_peak(self, dtype: str):
        """Vector peak FLOP/s for ``dtype`` of each row's variant."""
        return self._by_row(("vector", dtype), [h.vector_peak(dtype) for h in self.variants])


#: the scalar fields of Hardware a HardwareRows answers row by row
_FIELDS = frozenset(f.name for f in Hardware.__dataclass_fields__.values()
                    if f.type in ("float", "int", "str"))

"""sweep: an MPI-parallel design-space sweep engine for distributed transformer training.

Pipeline (one module per stage)::

    spec -> variants -> cases -> candidates -> cost (pure numpy) -> top-N -> store -> reduce

The public entry points are the ``sweep`` command (sweep.cli) and the functions re-exported
here.
"""

from __future__ import annotations

from ._version import __version__
from .errors import SpecError, StoreError, SweepError, WorldError

__all__ = ["__version__", "load_hardware", "load_job", "evaluate", "evaluate_columns",
           "search_case", "SweepError", "SpecError", "StoreError", "WorldError"]

#: re-exports loaded on first use, so that importing one layer (say sweep.model) does not
#: load the others (the engine's YAML catalog, MPI, HDF5)
_LAZY = {"load_hardware": "engine.catalog", "load_job": "engine.catalog",
         "evaluate": "model.cost", "evaluate_columns": "model.cost",
         "search_case": "model.search"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

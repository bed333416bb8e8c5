"""sweep: an MPI-parallel design-space sweep engine for distributed transformer training.

Pipeline (one module per stage)::

    spec -> variants -> cases -> candidates -> cost (pure numpy) -> top-N -> store -> reduce

The public entry points are the ``sweep`` command (sweep.cli) and the functions re-exported
here.
"""

from __future__ import annotations

from ._version import __version__
from .engine.catalog import load_hardware, load_job
from .errors import SpecError, StoreError, SweepError, WorldError
from .model.cost import evaluate, evaluate_columns
from .model.search import search_case

__all__ = ["__version__", "load_hardware", "load_job", "evaluate", "evaluate_columns",
           "search_case", "SweepError", "SpecError", "StoreError", "WorldError"]

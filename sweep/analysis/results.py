"""Reduced sweep results as pandas DataFrames, with the questions people ask of them.

::

    from sweep.analysis.results import open_results
    res = open_results("results/quickstart/sweep.h5")
    res.cases            # one row per case (job, strategy, GPUs, hardware variant, ...)
    res.top              # one row per (case, place), joined with its case
    res.best()           # the best configuration of every case
    res.best_per_system()  # best over strategies, per (job, hardware variant, GPU count)
    res.grid("samples_per_s", "hbm_GBps", "hbm_GiB", n_gpus=8192)   # a 2-axis table

Needs pandas (``pip install -e '.[results]'`` in the checkout). Partial runs open too:
``res.complete`` is False, ``res.note`` says so, and every case carries its own ``complete`` flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SweepError, install_hint

__all__ = ["Results", "open_results", "TIME_PARTS", "MEMORY_PARTS", "DEGREES"]

#: time breakdown columns of /top, in stacking order, with their labels
TIME_PARTS = {"t_compute_s": "compute", "t_memory_s": "exposed memory",
              "t_tp_comm_s": "TP comm", "t_cp_comm_s": "CP comm",
              "t_ep_comm_s": "EP all-to-all", "t_dp_comm_s": "DP comm",
              "t_pp_comm_s": "PP comm", "t_bubble_s": "pipeline bubble",
              "t_optimizer_s": "optimizer", "t_offload_s": "offload"}
#: memory breakdown columns of /top, in stacking order, with their labels
MEMORY_PARTS = {"mem_weights_bytes": "weights", "mem_grads_bytes": "gradients",
                "mem_optimizer_bytes": "optimizer state",
                "mem_activations_bytes": "activations",
                "mem_other_bytes": "other (workspace, buffers, reserve)"}
#: parallel degrees of a configuration
DEGREES = ("tp", "tp2", "cp", "pp", "dp", "ep", "etp")
_TEXT = ("job", "strategy", "hardware", "base", "swept")


def _pandas():
    try:
        import pandas
    except ImportError:  # pragma: no cover - pandas is in the results / plot / test extras
        raise SweepError(f"needs pandas: {install_hint('plot')} for plots and reports "
                         f"(the 'results' extra is enough for tables)") from None
    return pandas


def _frame(table: np.ndarray):
    pd = _pandas()
    df = pd.DataFrame(table)
    for name in df.columns:
        if df[name].dtype == object or name in _TEXT:
            df[name] = [v.decode() if isinstance(v, bytes) else v for v in df[name]]
    return df


@dataclass
class Results:
    """A reduced ``sweep.h5``: attributes, ``cases`` and ``top`` (joined with ``cases``)."""

    path: Path
    attrs: dict[str, Any]
    cases: Any  # pandas.DataFrame
    top: Any  # pandas.DataFrame
    units: dict[str, dict[str, str]] = field(default_factory=dict)  # column -> unit, meaning

    @property
    def complete(self) -> bool:
        return bool(self.attrs.get("complete", False))

    @property
    def note(self) -> str:
        """'' for a complete run; otherwise what is missing."""
        if self.complete:
            return ""
        done = int(self.cases["complete"].sum())
        return (f"partial results: {done} of {len(self.cases)} cases complete, "
                f"{self.attrs.get('candidates_evaluated', 0):,} of "
                f"{self.attrs.get('candidates_total', 0):,} candidates evaluated")

    @property
    def name(self) -> str:
        return str(self.attrs.get("name", self.path.parent.name))

    @property
    def cost_model(self) -> str:
        return str(self.attrs.get("cost_model", ""))

    @property
    def swept_axes(self) -> list[str]:
        """Hardware grid axes of the sweep (the ``swept_<axis>`` columns)."""
        return [c[len("swept_"):] for c in self.cases.columns if c.startswith("swept_")]

    def best(self):
        """The best configuration of every case that has one (place 0), with its case."""
        return self.top[self.top["place"] == 0].reset_index(drop=True)

    def best_per_system(self):
        """Best over strategies per (job, hardware variant, GPU count); column ``strategy``
        says which won. Ties go to the strategy listed first in the spec."""
        best = self.best()
        if best.empty:
            return best
        order = best.sort_values(["job", "variant_id", "n_gpus", "samples_per_s", "case_id"],
                                 ascending=[True, True, True, False, True], kind="mergesort")
        return order.groupby(["job", "variant_id", "n_gpus"], sort=True).head(1) \
            .reset_index(drop=True)

    def grid(self, metric: str, x: str, y: str, n_gpus: int | None = None,
             job: str | None = None, strategy: str | None = None, variants=None):
        """``metric`` of the best configuration as a table over two swept axes (rows ``y``,
        columns ``x``), at one GPU count (default: the largest) and job (default: the first),
        best over strategies unless ``strategy`` is given. Every value the sweep has on the
        two axes is a row or column; a cell without a result (no feasible configuration, or
        pending in a partial run) is NaN. ``variants``: only these hardware variant ids."""
        for axis in (x, y):
            if axis not in self.swept_axes:
                raise SweepError(f"{axis!r} is not a swept axis of {self.path}; swept: "
                                 f"{', '.join(self.swept_axes) or 'none'}")
        best = self.best() if strategy else self.best_per_system()
        if strategy:
            best = best[best["strategy"] == strategy]
        cases = self.cases
        if variants is not None:
            best = best[best["variant_id"].isin(list(variants))]
            cases = cases[cases["variant_id"].isin(list(variants))]
        job = job or (sorted(best["job"].unique())[0] if len(best) else None)
        best = best[best["job"] == job]
        if n_gpus is None and len(best):
            n_gpus = int(best["n_gpus"].max())
        best = best[best["n_gpus"] == n_gpus]
        if metric not in best.columns:
            raise SweepError(f"unknown metric {metric!r}")
        table = best.pivot_table(index=f"swept_{y}", columns=f"swept_{x}", values=metric,
                                 aggfunc="max")
        # every value the spec sweeps, also where no case has a result (none feasible, or
        # pending in a partial run): a blank row or column, not one left out
        cases = cases[(cases["job"] == job) & (cases["n_gpus"] == n_gpus)]
        if strategy:
            cases = cases[cases["strategy"] == strategy]
        table = table.reindex(index=sorted(cases[f"swept_{y}"].dropna().unique()),
                              columns=sorted(cases[f"swept_{x}"].dropna().unique()))
        table.index.name, table.columns.name = y, x
        return table


def open_results(path: str | Path) -> Results:
    """Read a reduced ``sweep.h5`` (complete or partial).

    Raises:
        SweepError: missing, unreadable or not a reduced sweep file.
    """
    from ..engine.store import read_columns, read_results

    path = Path(path)
    attrs, data = read_results(path)
    attrs = {k: v.item() if isinstance(v, np.generic) else v for k, v in attrs.items()}
    cases = _frame(data["cases"])
    top = _frame(data["top"])
    # also when empty: the same columns as a full file (a case's counts get "_case")
    top = top.merge(cases, on="case_id", how="left", suffixes=("", "_case"))
    return Results(path, attrs, cases, top, read_columns(path))

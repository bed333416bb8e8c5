"""Collective communication time, vectorised over candidates.

A collective is described by its kind, its volume in bytes (for all-gather, reduce-scatter
and all-reduce: the full, un-sharded buffer), the number of GPUs in the communicator and how
many of them share one NVLink domain (``per_domain``). Pure numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..hardware import Hardware
from .fuse import Tracer, as_array

__all__ = ["Collective", "KINDS", "nersc_collective_s", "comm_context"]

KINDS = ("allgather", "reducescatter", "allreduce", "broadcast", "reduce", "p2p")


@dataclass(frozen=True)
class Collective:
    """One collective of one op, for every candidate of a block (arrays of shape (n,))."""

    kind: str
    volume_bytes: np.ndarray
    group: np.ndarray  # GPUs in the communicator
    per_domain: np.ndarray  # of those, GPUs inside one NVLink domain
    bucket: str = "tp"  # breakdown column: tp | cp | dp | pp


def comm_context(hw) -> dict:
    """The numbers of ``hw`` a collective's time reads (per row for a HardwareRows): the
    scale-out and NVLink bandwidths times their efficiencies, their latencies, NICs per GPU."""
    return {"bs": hw.scaleout_bytes_per_s * hw.scaleout_efficiency,
            "bf": hw.nvlink_bytes_per_s * hw.nvlink_efficiency,
            "ls": hw.scaleout_latency_s, "lf": hw.nvlink_latency_s, "nics": hw.nics_per_gpu}


def _some(mask) -> bool:
    """Whether any row takes a branch. In a trace (fuse.py) every branch is computed: the
    np.where that follows picks the same values either way."""
    return True if isinstance(mask, Tracer) else bool(np.any(mask))


def nersc_collective_s(c: Collective, hw: Hardware | Mapping,
                       scale: float | np.ndarray = 1.0) -> np.ndarray:
    """Time of a collective in the NERSC two-tier ring model (nersc2024_model.md section 2).

    bs = scale-out bandwidth x efficiency, bf = NVLink bandwidth x efficiency (per GPU),
    ls / lf their latencies, t = per_domain, nodes = group // t, c = (n - 1) / n for
    all-gather / reduce-scatter / all-reduce and 1 for broadcast / reduce:

    * p2p: t == 1 -> ls + V / bs, else lf + V / bf;
    * t == 1 (every member in its own domain): ls (n - 1) + c V / bs;
    * nodes == 1 (one domain): lf (n - 1) + c V / bf;
    * otherwise (one ring per NIC): max(c V / (nic t bs), c V / bf), x2 for all-reduce,
      plus ls (nodes - 1) + lf (n - nodes).

    A zero volume or a group of one costs nothing. ``scale`` divides the volume (SUMMA panels).
    ``hw``: a Hardware (or HardwareRows) or its :func:`comm_context`.
    """
    hx = hw if isinstance(hw, Mapping) else comm_context(hw)
    vol = as_array(c.volume_bytes, dtype=np.float64) / scale
    n = as_array(c.group, dtype=np.int64)
    t = as_array(c.per_domain, dtype=np.int64)
    active = (vol != 0) & (n > 1)
    if not _some(active):  # nothing to send anywhere in this block
        return np.zeros(np.broadcast_shapes(np.shape(vol), np.shape(n), np.shape(t)))
    bs, bf, ls, lf = hx["bs"], hx["bf"], hx["ls"], hx["lf"]
    if c.kind == "p2p":
        time = np.where(t == 1, ls + vol / bs, lf + vol / bf)
        return np.where(active, time, 0.0)
    nf = n.astype(np.float64)
    ring = (nf - 1.0) / nf if c.kind in ("allgather", "reducescatter", "allreduce") else 1.0
    cv = ring * vol
    nodes = nf / t  # exact: the per-domain count divides the group size
    all_ib = t == 1
    one_domain = (nodes == 1) & ~all_ib
    hier = ~(all_ib | one_domain)
    time = 0.0
    if _some(all_ib):
        time = np.where(all_ib, ls * (nf - 1.0) + cv / bs, time)
    if _some(one_domain):
        time = np.where(one_domain, lf * (nf - 1.0) + cv / bf, time)
    if _some(hier):
        multi = np.maximum(cv / (hx["nics"] * t * bs), cv / bf)
        if c.kind == "allreduce":
            multi = 2.0 * multi  # BUG? kept: only the multi-domain branch doubles all-reduce
        time = np.where(hier, multi + ls * (nodes - 1.0) + lf * (nf - nodes), time)
    return np.where(active, time, 0.0)

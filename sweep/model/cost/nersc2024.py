"""The ``nersc2024`` profile: the published model of Subramanian et al. 2024 (arXiv 2410.00273).

Reproduces the code behind the paper (transformer-perf-estimates @ 54278b0) formula by
formula, defects included, so that its published results come out exactly; see
``reference/nersc2024_model.md``. The defects are named in :class:`NerscDefects` and are on
only here. Section numbers below refer to that document.

Pure numpy: every function takes a block of candidates and returns arrays. ``evaluate``
runs the per-layer terms (on a block's distinct layers) and the totals each as one compiled
loop when numba is installed (fuse.py: the same operations in the same order, so the same
numbers; without numba, or with SWEEP_FUSE=0, the numpy functions themselves).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import astuple, dataclass
from types import SimpleNamespace

import numpy as np

from ..hardware import Hardware
from ..job import Job
from ..rows import HardwareRows
from .collectives import Collective, comm_context, nersc_collective_s
from .dedup import unique_rows
from .fuse import Gathered, Tracer, as_array, fused
from .fuse import enabled as fuse_enabled
from .ops import (
    OpCost,
    activation,
    bias,
    dropout,
    fused_attention,
    layernorm,
    layernorm_2d,
    linear,
    linear_summa,
)

__all__ = ["NerscDefects", "DEFECTS", "OpTime", "layer_ops", "time_ops", "summarize_layer",
           "evaluate", "totals", "op_table", "STRATEGIES", "LAYER_KEY", "hardware_context"]

STRATEGIES = ("1d", "2d", "2d-seqp")

#: section 1: every op pays a fixed launch overhead per pass, inside its compute time
OP_OVERHEAD_S = 20e-6
#: section 1: one flat GEMM (and vector) efficiency
COMPUTE_EFFICIENCY = 0.8
#: section 0: fp16/bf16 elements, 1-byte dropout masks
ELEM_BYTES = 2.0
MASK_BYTES = 1.0
#: section 7: fp32 master weights + Adam moments = 12 bytes = 6 x the 2-byte weights
OPTIMIZER_BYTES_PER_WEIGHT_BYTE = 6.0


@dataclass(frozen=True)
class NerscDefects:
    """Behaviours of the published code that look wrong, reproduced for exactness.

    Attributes:
        layernorm2d_seq_width: LayerNorm2D uses the local width l // m1 instead of e // m1
            (section 11, bug 1). It changes LN FLOPs, bytes, weights and activations in the
            SUMMA strategy, and the pipeline p2p volume, which is LN's activation buffer.
        pp_slow_links_free: with part of a pipeline inside NVLink domains, the p2p time is a
            link-count-weighted average in which the hops between domains cost nothing (the
            code calls the collective with a group of 1, which returns 0); found by matching
            the published per-component times.
    """

    layernorm2d_seq_width: bool = True
    pp_slow_links_free: bool = True


DEFECTS = NerscDefects()


@dataclass
class OpTime:
    """Timed op: per layer, per micro-batch, for every candidate (arrays (n,))."""

    name: str
    t_fwd_s: np.ndarray
    t_bwd_s: np.ndarray
    compute_s: np.ndarray  # fwd + bwd roofline compute side
    memory_s: np.ndarray  # fwd + bwd exposed memory time
    comm_s: dict[str, np.ndarray]  # exposed communication by bucket (tp / cp)
    flops: np.ndarray
    weight_bytes: np.ndarray
    act_bytes: np.ndarray


def hardware_context(hw) -> dict:
    """The numbers of ``hw`` the model reads (per row for a HardwareRows): 16-bit matrix and
    vector peaks, HBM bandwidth and the collectives' (collectives.comm_context)."""
    return {"matrix_peak": hw.matrix_peak("fp16"), "vector_peak": hw.vector_peak("fp16"),
            "hbm_Bps": hw.hbm_bytes_per_s, **comm_context(hw)}


def _context(hw) -> Mapping:
    return hw if isinstance(hw, Mapping) else hardware_context(hw)


def layer_ops(job: Job, hw: Hardware | Mapping, strategy: str, c: np.ndarray,
              defects: NerscDefects = DEFECTS) -> list[OpCost]:
    """The ops of one transformer layer (MLP block then attention block), sections 3-5.
    ``hw``: a Hardware (or HardwareRows) or its :func:`hardware_context`."""
    hx = _context(hw)
    b = as_array(c["mbs"], dtype=np.int64)
    l, e, f, h = job.seq_len, job.hidden, job.ffn_hidden, job.n_heads
    q = e // h
    eb, mb = ELEM_BYTES, MASK_BYTES
    kappa = hx["matrix_peak"] / hx["vector_peak"]
    one = np.ones_like(b)
    tp, t_tp = as_array(c["tp"], np.int64), as_array(c["nv_tp"], np.int64)
    if strategy == "1d":
        m, t = tp, t_tp  # modules.mlp_1d / sa_1d(flash_attention=True)
        return [
            linear("fc1", b, l, e, f, one, m, one, t, eb),
            bias("fc1-bias", b, l, f, one, m, eb),
            activation("act1", b * l * (f // m), eb),
            dropout("dpr1", b * l * (f // m), eb, mb),
            linear("fc2", b, l, f, e, m, one, t, one, eb),
            bias("fc2-bias", b, l, e, one, one, eb),  # BUG? kept: not sharded (section 11.3)
            dropout("dpr2", b * (l // m) * e, eb, mb),
            layernorm("ln1", b, l, e, m, t, eb),
            linear("qkv", b, l, e, 3 * e, one, m, one, t, eb),
            fused_attention("fusedla", b, l, q, h // m, one, one, kappa, eb),
            linear("vproj", b, l, e, e, m, one, t, one, eb),
            bias("vproj-bias", b, l, e, one, one, eb),  # BUG? kept: not sharded
            dropout("dpr_v", b * (l // m) * e, eb, mb),
            layernorm("ln2", b, l, e, m, t, eb),
        ]
    if strategy == "2d":
        m1, t1 = tp, t_tp  # modules.mlp_2d + sa_2d_seqp: SUMMA linears, CP flash attention
        m2, t2 = as_array(c["tp2"], np.int64), as_array(c["nv_tp2"], np.int64)
        nb = as_array(c["nb"], np.int64)
        ln_defect = defects.layernorm2d_seq_width
        return [
            linear_summa("fc1", b, l, e, f, m1, m2, t1, t2, nb, eb),
            bias("fc1-bias", b, l, f, m2, m1, eb),
            activation("act1", b * (l // m2) * (f // m1), eb),
            dropout("dpr1", b * (l // m2) * (f // m1), eb, mb),
            linear_summa("fc2", b, l, f, e, m1, m2, t1, t2, nb, eb),
            bias("fc2-bias", b, l, e, m2, m1, eb),
            dropout("dpr2", b * (l // m2) * (e // m1), eb, mb),
            layernorm_2d("ln1", b, l, e, m1, m2, t1, eb, ln_defect),
            linear_summa("qkv", b, l, e, 3 * e, m1, m2, t1, t2, nb, eb),
            fused_attention("fusedla", b, l, q, h // m1, m2, t2, kappa, eb),
            linear_summa("vproj", b, l, e, e, m1, m2, t1, t2, nb, eb),
            bias("vproj-bias", b, l, e, m2, m1, eb),
            dropout("dpr_v", b * (l // m2) * (e // m1), eb, mb),
            layernorm_2d("ln2", b, l, e, m1, m2, t1, eb, ln_defect),
        ]
    if strategy == "2d-seqp":
        m1, t1 = tp, t_tp  # modules.mlp_seqp / sa_seqp: 1D TP over m1, sequence over m2
        m2, t2 = as_array(c["cp"], np.int64), as_array(c["nv_cp"], np.int64)
        ls = l // m2
        return [
            linear("fc1", b, ls, e, f, one, m1, one, t1, eb),
            bias("fc1-bias", b, l, f, m2, m1, eb),
            activation("act1", b * (l // m2) * (f // m1), eb),
            dropout("dpr1", b * (l // m2) * (f // m1), eb, mb),
            linear("fc2", b, ls, f, e, m1, one, t1, one, eb),
            bias("fc2-bias", b, ls, e, m1, one, eb),  # section 11.7: odd dims, kept
            dropout("dpr2", b * (l // (m1 * m2)) * e, eb, mb),
            layernorm("ln1", b, ls, e, m1, t1, eb),
            linear("qkv", b, ls, e, 3 * e, one, m1, one, t1, eb),
            fused_attention("fusedla", b, l, q, h // m1, m2, t2, kappa, eb),
            linear("vproj", b, ls, e, e, m1, one, t1, one, eb),
            bias("vproj-bias", b, l, e, m2, m1, eb),
            dropout("dpr_v", b * (l // (m1 * m2)) * e, eb, mb),
            layernorm("ln2", b, ls, e, m1, t1, eb),
        ]
    raise ValueError(f"unknown nersc2024 strategy {strategy!r}")


def _comm_total(colls: list[Collective], hx: Mapping, scale=1.0) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for coll in colls:
        t = nersc_collective_s(coll, hx, scale)
        out[coll.bucket] = out[coll.bucket] + t if coll.bucket in out else t
    return out


def _time_pass(op: OpCost, flops, nbytes, colls, hx: Mapping):
    """One pass of one op: (time, compute, exposed memory, {bucket: exposed comm})."""
    peak = hx["matrix_peak"] if op.tensor_core else hx["vector_peak"]
    t_comp = OP_OVERHEAD_S + flops / (COMPUTE_EFFICIENCY * peak)  # section 1
    t_mem = nbytes / hx["hbm_Bps"]
    t_compute = np.maximum(t_comp, t_mem)
    if op.summa_panels is None:  # section 1: roofline, then the collectives in series
        comm = _comm_total(colls, hx)
    else:  # section 4: pipelined SUMMA, only the first panel's collectives are exposed
        nb = op.summa_panels.astype(np.float64)
        per_panel = _comm_total(colls, hx, nb)
        tau = sum(per_panel.values()) if per_panel else 0.0
        exposed = tau + np.maximum(nb * tau - t_compute, 0.0)
        comm = {"tp": exposed}
    total_comm = sum(comm.values()) if comm else 0.0
    return t_compute + total_comm, t_comp, np.maximum(t_mem - t_comp, 0.0), comm


def _shaped(v, like):
    """``v`` broadcast to ``like``'s shape (in a trace, as it is: evaluate broadcasts the
    compiled loop's results)."""
    if isinstance(v, Tracer) or isinstance(like, Tracer):
        return v
    return np.broadcast_to(v, np.shape(like))


def time_ops(ops: list[OpCost], hw: Hardware | Mapping) -> list[OpTime]:
    """Time every op forward and backward (sections 1, 2, 4)."""
    hx = _context(hw)
    out = []
    for op in ops:
        tf, cf, mf, kf = _time_pass(op, op.flops_fwd, op.bytes_fwd, op.comm_fwd, hx)
        tb, cb, mbk, kb = _time_pass(op, op.flops_bwd, op.bytes_bwd, op.comm_bwd, hx)
        comm = {k: kf.get(k, 0.0) + kb.get(k, 0.0) for k in sorted(set(kf) | set(kb))}
        out.append(OpTime(op.name, tf, tb, cf + cb, mf + mbk, comm,
                          op.flops_fwd + op.flops_bwd, _shaped(op.weight_bytes, tf),
                          _shaped(op.act_bytes, tf)))
    return out


def _sum(arrs):
    total = 0.0
    for a in arrs:
        total = total + a
    return total


#: the columns the per-layer model depends on (evaluated once per distinct key)
LAYER_KEY = ("mbs", "tp", "tp2", "cp", "nb", "nv_tp", "nv_tp2", "nv_cp")


def summarize_layer(timed: list[OpTime]) -> dict[str, np.ndarray]:
    """Per-layer, per-micro-batch sums over the ops of one layer."""
    comm = {"tp": 0.0, "cp": 0.0}
    for o in timed:
        for k, v in o.comm_s.items():
            comm[k] = comm[k] + v
    shape = np.shape(timed[0].t_fwd_s)
    layer = {
        "t_fwd_s": _sum(o.t_fwd_s for o in timed),
        "t_bwd_s": _sum(o.t_bwd_s for o in timed),
        "compute_s": _sum(o.compute_s for o in timed),
        "memory_s": _sum(o.memory_s for o in timed),
        "tp_comm_s": comm["tp"],
        "cp_comm_s": comm["cp"],
        "flops": _sum(o.flops for o in timed),
        "weight_bytes": _sum(o.weight_bytes for o in timed),
        "act_bytes": _sum(o.act_bytes for o in timed),
        # section 6: the p2p volume is the activation buffer of ln1 (first op of a layer)
        "p2p_bytes": next(o.act_bytes for o in timed if o.name == "ln1"),
    }
    if any(isinstance(v, Tracer) for v in layer.values()):
        return layer  # (a trace: evaluate broadcasts the compiled loop's results)
    return {k: np.broadcast_to(np.asarray(v, dtype=np.float64), shape) for k, v in layer.items()}


def data_parallel_s(layer_weight_bytes, t_fwd_layer, t_bwd_layer, c, layers_per_stage, hw,
                    strategy):
    """Section 6: per-layer all-gather (fwd) and reduce-scatter (bwd) of one layer's weights;
    the first is exposed, each later one only by its excess over one layer's compute of one
    micro-batch. In 2d-seqp the group is dp x cp (weights replicated over the sequence)."""
    group = c["dp"]
    per_domain = c["nv_dp"]
    if strategy == "2d-seqp":
        group = group * c["cp"]
        per_domain = per_domain * c["nv_cp"]
    hx = _context(hw)
    ag = nersc_collective_s(Collective("allgather", layer_weight_bytes, group, per_domain), hx)
    rs = nersc_collective_s(Collective("reducescatter", layer_weight_bytes, group, per_domain),
                            hx)
    rest = layers_per_stage - 1
    return ((ag + rest * np.maximum(ag - t_fwd_layer, 0.0))
            + (rs + rest * np.maximum(rs - t_bwd_layer, 0.0)))


def pipeline_p2p_s(volume_bytes, c, n_microbatches, hw, defects: NerscDefects = DEFECTS):
    """Section 6: one p2p of the stage-boundary activation per micro-batch, fwd and bwd.

    With nv_pp > 1, (pp - 1) links of which int(pp / nv_pp - 1) leave the domain; the time is
    the link-count-weighted average (slow hops free under ``pp_slow_links_free``)."""
    hx = _context(hw)
    pp = c["pp"]
    t = c["nv_pp"]
    two = 2  # a p2p pairs two GPUs
    fast = nersc_collective_s(Collective("p2p", volume_bytes, two, t), hx)
    links = np.maximum(pp - 1, 1).astype(np.float64)
    slow_links = np.floor(pp / t - 1.0)
    fast_links = links - slow_links
    if defects.pp_slow_links_free:
        slow = 0.0
    else:
        slow = nersc_collective_s(Collective("p2p", volume_bytes, two, np.ones_like(t)), hx)
    mixed = fast_links / links * fast + slow_links / links * slow
    per_p2p = np.where(t > 1, mixed, fast)
    return np.where(pp == 1, 0.0, 2.0 * n_microbatches * per_p2p)


def evaluate(job: Job, hw: Hardware, strategy: str, c, defects: NerscDefects = DEFECTS,
             scores_only: bool = False) -> dict[str, np.ndarray]:
    """Iteration time, its breakdown and memory of every candidate (section 7).

    The per-layer terms are found once per distinct layer (LAYER_KEY, and variant) and the
    totals composed per candidate, each as one compiled loop when fused evaluation is on
    (the numpy functions otherwise; the same numbers).

    Args:
        c: a column block (or record array) of candidates.
        scores_only: the compiled loop may compute ``step_time_s`` and ``mem_bytes`` alone
            (what a search ranks by; without numba every column comes back).

    Returns:
        a dict of RESULT columns (seconds, bytes, FLOPs).
    """
    if isinstance(hw, HardwareRows):  # several variants: a layer row per key and variant
        keyed = {k: c[k] for k in LAYER_KEY}
        keyed["variant"] = hw.row
        uniq, inverse = unique_rows(keyed, LAYER_KEY + ("variant",))
        hw_layer = hw.of_variants(uniq["variant"])
    else:
        uniq, inverse = unique_rows(c, LAYER_KEY)
        hw_layer = hw
    distinct = len(uniq[LAYER_KEY[0]])
    hx = hardware_context(hw_layer)
    flags = astuple(defects)  # (every flag, as numbers the trace can read)
    layer = _fused_layer({k: getattr(job, k) for k in _LAYER_JOB}, hx, strategy, flags,
                         {k: uniq[k] for k in LAYER_KEY})
    layer = {k: v if type(v) is np.ndarray and v.shape == (distinct,) and v.dtype == np.float64
             else np.broadcast_to(np.asarray(v, dtype=np.float64), (distinct,))
             for k, v in layer.items()}
    lazy = fuse_enabled()
    per_row = {k: Gathered(v, inverse) if lazy else v[inverse] for k, v in layer.items()}
    return (_fused_scores if scores_only else _fused_totals)(
        job.n_layers, job.global_batch, strategy, flags, {k: c[k] for k in _TOTALS_KEY},
        per_row, comm_context(hw))


#: the Job fields the per-layer terms read, and the candidate columns the totals read
_LAYER_JOB = ("seq_len", "hidden", "ffn_hidden", "n_heads")
_TOTALS_KEY = ("pp", "dp", "mbs", "cp", "nv_dp", "nv_cp", "nv_pp")


def _layer_terms(numbers: Mapping, hx: Mapping, strategy: str, flags: tuple,
                 keys: Mapping) -> dict[str, np.ndarray]:
    """Per-layer terms of the distinct layers ``keys`` (elementwise: fuse.py traces it)."""
    defects = NerscDefects(*flags)
    return summarize_layer(time_ops(layer_ops(SimpleNamespace(**numbers), hx, strategy, keys,
                                              defects), hx))


def _totals(n_layers, global_batch, strategy: str, flags: tuple, c: Mapping, layer: Mapping,
            hx: Mapping) -> dict[str, np.ndarray]:
    job = SimpleNamespace(n_layers=n_layers, global_batch=global_batch)
    return totals(job, strategy, c, layer, hx, NerscDefects(*flags))


def _scores(n_layers, global_batch, strategy: str, flags: tuple, c: Mapping, layer: Mapping,
            hx: Mapping) -> dict[str, np.ndarray]:
    out = _totals(n_layers, global_batch, strategy, flags, c, layer, hx)
    return {"step_time_s": out["step_time_s"], "mem_bytes": out["mem_bytes"]}


# compiled whatever the number of rows: the per-layer terms of a block's few distinct
# layers, and the totals of the few rows a search keeps (one call each instead of hundreds
# of numpy calls on short arrays)
_fused_layer = fused(_layer_terms, min_rows=1)
_fused_totals = fused(_totals, min_rows=1)
_fused_scores = fused(_scores, min_rows=1, fallback=_totals)


def totals(job: Job, strategy: str, c, layer: dict[str, np.ndarray], hw: Hardware,
           defects: NerscDefects = DEFECTS) -> dict[str, np.ndarray]:
    """Compose per-layer costs into per-iteration totals (section 7, execution.totals)."""
    pp = c["pp"]
    dp = c["dp"]
    layers_per_stage = job.n_layers // pp
    n_mb = (job.global_batch // dp) // c["mbs"]
    reps = (n_mb * layers_per_stage).astype(np.float64)
    t_dp = data_parallel_s(layer["weight_bytes"], layer["t_fwd_s"], layer["t_bwd_s"], c,
                           layers_per_stage, hw, strategy)
    t_pp = pipeline_p2p_s(layer["p2p_bytes"], c, n_mb, hw, defects)
    t_stage = (layer["t_fwd_s"] + layer["t_bwd_s"]) * reps + t_pp
    t_bubble = (pp - 1) * t_stage / n_mb  # 1F1B bubble, includes p2p time
    weights = layer["weight_bytes"] * layers_per_stage
    seq_shards = c["cp"] if strategy == "2d-seqp" else 1
    optimizer = OPTIMIZER_BYTES_PER_WEIGHT_BYTE * weights / (dp * seq_shards)
    in_flight = np.minimum(pp, n_mb)  # 1F1B keeps at most pp micro-batches
    acts = layer["act_bytes"] * layers_per_stage * in_flight
    return {
        "step_time_s": t_stage + t_bubble + t_dp,
        "t_compute_s": layer["compute_s"] * reps,
        "t_memory_s": layer["memory_s"] * reps,
        "t_tp_comm_s": layer["tp_comm_s"] * reps,
        "t_cp_comm_s": layer["cp_comm_s"] * reps,
        "t_dp_comm_s": t_dp,
        "t_pp_comm_s": t_pp,
        "t_bubble_s": t_bubble,
        "hardware_flops": layer["flops"] * reps,
        "mem_weights_bytes": weights,
        "mem_grads_bytes": weights,  # bf16 grads, not sharded (section 7)
        "mem_optimizer_bytes": optimizer,
        "mem_activations_bytes": acts,
        "mem_bytes": weights + weights + optimizer + acts,
    }


def op_table(job: Job, hw: Hardware, strategy: str, c,
             defects: NerscDefects = DEFECTS) -> list[dict[str, np.ndarray]]:
    """Per-iteration seconds of every op (summed over micro-batches and the stage's layers),
    then the pipeline p2p, the bubble and the data-parallel rows: they add up to
    ``step_time_s``. Each row: name, time_s, compute_s, memory_s, tp_comm_s, cp_comm_s,
    ep_comm_s (0: no experts here), other_s (the non-op rows), flops, weight_bytes,
    act_bytes (per GPU, whole stage)."""
    timed = time_ops(layer_ops(job, hw, strategy, c, defects), hw)
    layer = summarize_layer(timed)
    tot = totals(job, strategy, c, layer, hw, defects)
    pp, dp = c["pp"], c["dp"]
    layers_per_stage = job.n_layers // pp
    n_mb = (job.global_batch // dp) // c["mbs"]
    reps = (n_mb * layers_per_stage).astype(np.float64)
    in_flight = np.minimum(pp, n_mb)
    zero = np.zeros(np.shape(reps))
    rows = []
    for o in timed:
        rows.append({"name": o.name, "time_s": (o.t_fwd_s + o.t_bwd_s) * reps,
                     "compute_s": o.compute_s * reps, "memory_s": o.memory_s * reps,
                     "tp_comm_s": o.comm_s.get("tp", zero) * reps,
                     "cp_comm_s": o.comm_s.get("cp", zero) * reps, "ep_comm_s": zero,
                     "other_s": zero,
                     "flops": o.flops * reps, "weight_bytes": o.weight_bytes * layers_per_stage,
                     "act_bytes": o.act_bytes * layers_per_stage * in_flight})
    for name, key in (("pipeline p2p", "t_pp_comm_s"), ("pipeline bubble", "t_bubble_s"),
                      ("data-parallel comm", "t_dp_comm_s")):
        rows.append({"name": name, "time_s": tot[key], "compute_s": zero, "memory_s": zero,
                     "tp_comm_s": zero, "cp_comm_s": zero, "ep_comm_s": zero,
                     "other_s": tot[key], "flops": zero, "weight_bytes": zero,
                     "act_bytes": zero})
    return rows

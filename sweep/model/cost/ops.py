"""Per-operation FLOPs, HBM bytes, stored activations, weights and collectives.

Each function returns an :class:`OpCost` for one op of one transformer layer and ONE
micro-batch, vectorised over the candidates of a block: every array has shape (n,) (or
broadcasts to it). The formulas here are those of the NERSC model (Subramanian et al. 2024,
arXiv 2410.00273; code transformer-perf-estimates layers.py), described op by op in
``reference/nersc2024_model.md`` sections 3-5. Counting convention of that paper: a GEMM
(M x K)(K x N) costs M N (K mults + (K - 1) adds); sizes in elements, times ``elem_bytes``.

Names: b micro-batch, l sequence, e / f input / output width of a linear, h heads, q head
width; ``m_*`` shard degrees, ``t_*`` GPUs of that group inside one NVLink domain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .collectives import Collective
from .fuse import as_array

__all__ = ["OpCost", "linear", "linear_summa", "bias", "activation", "dropout", "layernorm",
           "layernorm_2d", "fused_attention"]


def F(v):
    """``v`` as float64 (np.float64(v), but a fuse.py tracer passes)."""
    return as_array(v, dtype=np.float64)


@dataclass
class OpCost:
    """Cost of one op (one layer, one micro-batch) for every candidate of a block."""

    name: str
    tensor_core: bool  # timed at the matrix (tensor-core) peak, else the vector peak
    flops_fwd: np.ndarray
    flops_bwd: np.ndarray
    bytes_fwd: np.ndarray  # HBM traffic of the forward pass
    bytes_bwd: np.ndarray
    act_bytes: np.ndarray  # activations kept for the backward pass
    weight_bytes: np.ndarray | float = 0.0
    comm_fwd: list[Collective] = field(default_factory=list)
    comm_bwd: list[Collective] = field(default_factory=list)
    summa_panels: np.ndarray | None = None  # SUMMA: collectives pipelined over nb panels


def _gemm_flops(rows, inner, cols):
    """rows x cols outputs, each inner mults + (inner - 1) adds (layers.py Linear)."""
    return F(rows) * F(cols) * (2.0 * F(inner) - 1.0)


def linear(name, b, l, e, f, m_in, m_out, t_in, t_out, elem_bytes):
    """Megatron 1D linear (layers.Linear): weight (e/m_in, f/m_out), full sequence l.

    Forward reduce-scatter of the (b, l, f) output over m_in when the input is sharded;
    backward reduce-scatter of the (b, l, e) input gradient over m_out (section 3 table).
    """
    e_loc, f_loc = e // m_in, f // m_out
    bl = F(b) * F(l)
    flops_fwd = _gemm_flops(bl, e_loc, f_loc)
    act = bl * e_loc * elem_bytes
    w = F(e_loc) * f_loc * elem_bytes
    bytes_fwd = (bl * e_loc + bl * f_loc + F(e_loc) * f_loc) * elem_bytes
    flops_bwd = _gemm_flops(bl, f_loc, e_loc) + _gemm_flops(F(e_loc) * f_loc, bl, 1)
    # weight grad + input grad + 2 x output grad + weights + stored input
    bytes_bwd = w + bl * e_loc * elem_bytes + 2 * bl * f_loc * elem_bytes + w + act
    comm_fwd = [Collective("reducescatter", np.where(m_in > 1, bl * f * elem_bytes, 0.0),
                           m_in, t_in)]
    comm_bwd = [Collective("reducescatter", np.where(m_out > 1, bl * e * elem_bytes, 0.0),
                           m_out, t_out)]
    return OpCost(name, True, flops_fwd, flops_bwd, bytes_fwd, bytes_bwd, act, w,
                  comm_fwd, comm_bwd)


def linear_summa(name, b, l, e, f, m1, m2, t1, t2, nb, elem_bytes):
    """2D SUMMA linear (layers.LinearSumma) on an m1 x m2 grid with nb panels (section 4).

    Activations (b, l/m2, e/m1), weights (e/m2, f/m1). Forward: broadcast the input panel
    over m1 and the weight panel over m2; backward: broadcast W, reduce dX, broadcast X,
    reduce dW. The output tile is re-read and written once per panel.
    """
    l_loc, f_loc = l // m2, f // m1
    bl = F(b) * F(l_loc)
    flops_fwd = bl * f_loc * 2.0 * e  # e mults and e adds per output (all panels)
    act = bl * (e // m1) * elem_bytes
    w = F(e // m2) * f_loc * elem_bytes
    nbf = F(nb)
    bytes_fwd = (bl * e + F(e) * f_loc + bl * f_loc * nbf) * elem_bytes
    flops_bwd = _gemm_flops(bl, f_loc, e) + _gemm_flops(F(e) * f_loc, bl, 1)
    bytes_bwd = ((F(f_loc) * e + bl * f_loc * nbf + bl * e)
                 + (F(e) * bl + bl * f_loc * nbf + F(e) * f_loc)) * elem_bytes
    x_panel = np.where(m1 > 1, bl * e * elem_bytes, 0.0)
    w_panel = np.where(m2 > 1, F(e) * f_loc * elem_bytes, 0.0)
    comm_fwd = [Collective("broadcast", x_panel, m1, t1), Collective("broadcast", w_panel, m2, t2)]
    comm_bwd = [Collective("broadcast", w_panel, m2, t2), Collective("reduce", x_panel, m1, t1),
                Collective("broadcast", x_panel, m1, t1), Collective("reduce", w_panel, m2, t2)]
    return OpCost(name, True, flops_fwd, flops_bwd, bytes_fwd, bytes_bwd, act, w,
                  comm_fwd, comm_bwd, summa_panels=nb)


def bias(name, b, l, f, m_l, m_f, elem_bytes):
    """Bias add on (b, l/m_l, f/m_f) (layers.Bias); its gradient all-reduce is not modelled."""
    n_elem = F(b) * F(l // m_l) * F(f // m_f)
    w = F(f // m_f) * elem_bytes
    traffic = n_elem * elem_bytes + w
    zero = np.zeros_like(n_elem)
    return OpCost(name, False, n_elem, n_elem, traffic, traffic, zero, w)


def activation(name, n_elem, elem_bytes):
    """GELU (layers.Act): 8 FLOPs per element forward, 13 backward (ELECTRA flop counts)."""
    n_elem = F(n_elem)
    return OpCost(name, False, 8.0 * n_elem, 13.0 * n_elem, 2.0 * n_elem * elem_bytes,
                  3.0 * n_elem * elem_bytes, n_elem * elem_bytes)


def dropout(name, n_elem, elem_bytes, mask_bytes):
    """Dropout (layers.DropOut): 1 FLOP per element each way; keeps a 1-byte mask."""
    n_elem = F(n_elem)
    return OpCost(name, False, n_elem, n_elem, n_elem * (2.0 * elem_bytes + mask_bytes),
                  n_elem * (2.0 * elem_bytes + mask_bytes), n_elem * mask_bytes)


def _norm(name, b, l_loc, e_loc, elem_bytes, comm_fwd, comm_bwd):
    ble = F(b) * F(l_loc) * F(e_loc)
    bl = F(b) * F(l_loc)
    flops_fwd = 9.0 * ble  # mean 2, variance 3, scale 2, affine 2 per element
    flops_bwd = 8.0 * ble + 4.0 * bl * (F(e_loc) - 1.0)
    act = ble * elem_bytes
    w = 2.0 * F(e_loc) * elem_bytes
    bytes_fwd = (2.0 * ble + 2.0 * bl) * elem_bytes + w  # in, mean/std, out, gamma/beta
    bytes_bwd = 4.0 * ble * elem_bytes + w + act
    return OpCost(name, False, flops_fwd, flops_bwd, bytes_fwd, bytes_bwd, act, w,
                  comm_fwd, comm_bwd)


def layernorm(name, b, l, e, m, t, elem_bytes):
    """LayerNorm on the sequence-sharded (b, l/m, e) region of Megatron-SP (layers.LayerNorm):
    all-gather of (b, l, e) forward, reduce-scatter backward, over m."""
    vol = np.where(m > 1, F(b) * F(l) * F(e) * elem_bytes, 0.0)
    return _norm(name, b, l // m, e, elem_bytes, [Collective("allgather", vol, m, t)],
                 [Collective("reducescatter", vol, m, t)])


def layernorm_2d(name, b, l, e, m1, m2, t1, elem_bytes, seq_width_defect: bool):
    """LayerNorm on a SUMMA-sharded (b, l/m2, e/m1) tile (layers.LayerNorm2D): all-reduce of
    the row statistics over m1 forward, of statistics and gamma/beta gradients backward.

    ``seq_width_defect`` reproduces the published code, whose local width is l // m1
    instead of e // m1 (nersc2024_model.md section 11, bug 1).
    """
    l_loc = l // m2
    e_loc = l // m1 if seq_width_defect else e // m1
    fwd = np.where(m1 > 1, 2.0 * F(b) * F(l_loc) * elem_bytes, 0.0)
    bwd = np.where(m1 > 1, F((2 * e) // m1 + (2 * b * l) // m2) * elem_bytes, 0.0)
    return _norm(name, b, l_loc, e_loc, elem_bytes, [Collective("allreduce", fwd, m1, t1)],
                 [Collective("allreduce", bwd, m1, t1)])


def fused_attention(name, b, l, q, h_loc, m_seq, t_seq, vector_penalty, elem_bytes):
    """Flash attention (layers.FusedLA / FusedLASeqp): h_loc heads, l / m_seq query rows
    against l keys; K and V all-gathered over the sequence group m_seq (context parallel).

    Softmax and dropout FLOPs are scaled by ``vector_penalty`` = matrix peak / vector peak
    because the op is timed at the tensor-core rate. The backward pass recomputes logits,
    softmax and dropout. Activations kept: Q, K, V, output, RNG state, softmax statistics.
    """
    lq = l // m_seq
    bh = F(b) * F(h_loc)
    score = bh * F(lq) * F(l)  # elements of the local score matrix
    logits = _gemm_flops(bh * lq, q, l)
    softmax_fwd = vector_penalty * (2.0 * score + bh * lq * (F(l) - 1.0))
    drop = vector_penalty * score
    attend = _gemm_flops(bh * lq, l, q)
    flops_fwd = logits + softmax_fwd + drop + attend
    grad_q = _gemm_flops(bh * lq, l, q)  # dQ = dA K
    grad_k = _gemm_flops(bh * l, lq, q)  # dK = dA^T Q
    softmax_bwd = vector_penalty * (3.0 * score + bh * lq * (F(l) - 1.0))
    grad_a = _gemm_flops(bh * lq, q, l)  # dA = dY V^T
    grad_v = _gemm_flops(bh * l, lq, q)  # dV = A^T dY
    flops_bwd = (grad_q + grad_k + softmax_bwd + drop + grad_a + grad_v
                 + logits + softmax_fwd + drop)  # + recompute of the forward score path
    act = (4.0 * bh * lq * q + 2.0 * bh * lq) * elem_bytes
    bytes_fwd = (bh * lq * q + 2.0 * bh * l * q + bh * lq + bh * lq * q) * elem_bytes
    bytes_bwd = (2.0 * bh * l * q + 2.0 * bh * lq * q) * elem_bytes + act
    kv = np.where(m_seq > 1, 2.0 * bh * l * q * elem_bytes, 0.0)
    comm_fwd = [Collective("allgather", kv, m_seq, t_seq, "cp")]
    comm_bwd = [Collective("allgather", kv, m_seq, t_seq, "cp"),
                Collective("reducescatter", kv, m_seq, t_seq, "cp")]
    return OpCost(name, True, flops_fwd, flops_bwd, bytes_fwd, bytes_bwd, act, 0.0,
                  comm_fwd, comm_bwd)

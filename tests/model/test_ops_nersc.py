"""Hand-computed single-op costs of the NERSC formulas (nersc2024_model.md sections 3-5)."""

from __future__ import annotations

import numpy as np
import pytest

from sweep.model.cost import ops

ONE = np.array([1])


def test_linear_column_parallel():
    """(b=2, l=4, e=8) x (8, f=16), output sharded over m_out=2: f_loc = 8.
    fwd = b l f_loc (2 e - 1) = 8 * 8 * 15; bwd = xgrad b l e (2 f_loc - 1) + wgrad
    e f_loc (2 b l - 1) = 8*8*15 + 64*15; bytes at 2 bytes per element."""
    op = ops.linear("fc1", np.array([2]), 4, 8, 16, ONE, np.array([2]), ONE, np.array([2]), 2.0)
    assert op.flops_fwd[0] == 8 * 8 * 15
    assert op.flops_bwd[0] == 8 * 8 * 15 + 64 * 15
    assert op.bytes_fwd[0] == (64 + 64 + 64) * 2
    assert op.act_bytes[0] == 64 * 2
    assert op.weight_bytes[0] == 64 * 2
    # backward reduce-scatter of the (b, l, e) input gradient over the 2 TP ranks
    assert op.comm_bwd[0].volume_bytes[0] == 2 * 4 * 8 * 2
    assert op.comm_fwd[0].volume_bytes[0] == 0  # input not sharded: no forward collective


def test_linear_summa_panels():
    """SUMMA on a 2 x 2 grid, nb = 4: output tile (b l/m2) x f/m1 re-read once per panel."""
    op = ops.linear_summa("fc", np.array([1]), 8, 16, 32, np.array([2]), np.array([2]),
                          np.array([2]), np.array([2]), np.array([4]), 2.0)
    bl, f_loc = 4, 16
    assert op.flops_fwd[0] == bl * f_loc * 2 * 16
    assert op.bytes_fwd[0] == (bl * 16 + 16 * f_loc + bl * f_loc * 4) * 2
    assert [c.kind for c in op.comm_fwd] == ["broadcast", "broadcast"]
    assert [c.kind for c in op.comm_bwd] == ["broadcast", "reduce", "broadcast", "reduce"]
    assert op.comm_fwd[0].volume_bytes[0] == bl * 16 * 2  # input panel row over m1
    assert op.comm_fwd[1].volume_bytes[0] == 16 * f_loc * 2  # weight panel over m2
    assert op.summa_panels[0] == 4


def test_elementwise_ops():
    gelu = ops.activation("act", np.array([10]), 2.0)
    assert (gelu.flops_fwd[0], gelu.flops_bwd[0]) == (80, 130)
    assert (gelu.bytes_fwd[0], gelu.bytes_bwd[0], gelu.act_bytes[0]) == (40, 60, 20)
    drop = ops.dropout("d", np.array([10]), 2.0, 1.0)
    assert (drop.flops_fwd[0], drop.bytes_fwd[0], drop.act_bytes[0]) == (10, 50, 10)
    b = ops.bias("b", np.array([2]), 4, 8, ONE, np.array([2]), 2.0)
    assert (b.flops_fwd[0], b.weight_bytes, b.act_bytes[0]) == (32, 8.0, 0)


def test_layernorm_sequence_parallel():
    """(b=1, l=8, e=4) over m=2: local (1, 4, 4); fwd 9 FLOPs/elt; bwd 8 per elt + 4 b l (e-1)."""
    ln = ops.layernorm("ln", ONE, 8, 4, np.array([2]), np.array([2]), 2.0)
    assert ln.flops_fwd[0] == 9 * 16
    assert ln.flops_bwd[0] == 8 * 16 + 4 * 4 * 3
    assert ln.act_bytes[0] == 16 * 2 and np.ravel(ln.weight_bytes)[0] == 8 * 2
    assert ln.comm_fwd[0].kind == "allgather" and ln.comm_fwd[0].volume_bytes[0] == 32 * 2


def test_layernorm2d_width_defect_switch():
    """LayerNorm2D's local width is l // m1 in the published code, e // m1 when fixed."""
    args = (ONE, 64, 16, np.array([4]), np.array([2]), np.array([4]), 2.0)
    bug = ops.layernorm_2d("ln", *args, seq_width_defect=True)
    fixed = ops.layernorm_2d("ln", *args, seq_width_defect=False)
    assert bug.act_bytes[0] == 1 * 32 * 16 * 2  # (b, l/m2, l/m1) = (1, 32, 16)
    assert fixed.act_bytes[0] == 1 * 32 * 4 * 2  # (b, l/m2, e/m1) = (1, 32, 4)
    # collectives do not depend on the width: mean/var forward, stats + grads backward
    assert bug.comm_fwd[0].volume_bytes[0] == fixed.comm_fwd[0].volume_bytes[0] == 2 * 32 * 2
    assert bug.comm_bwd[0].volume_bytes[0] == ((2 * 16) // 4 + (2 * 64) // 2) * 2


def test_fused_attention_counts():
    """Flash attention, b=1, 2 local heads, l=4, q=3, no sequence split, kappa = 2:
    fwd = logits 2*4*4*(2*3-1) + kappa*(2*32 + 2*4*3) + kappa*32 + attend 2*4*3*(2*4-1)."""
    att = ops.fused_attention("fa", ONE, 4, 3, np.array([2]), ONE, ONE, 2.0, 2.0)
    score = 2 * 4 * 4
    logits = score * 5
    attend = 2 * 4 * 3 * 7
    softmax = 2.0 * (2 * score + 2 * 4 * 3)
    assert att.flops_fwd[0] == logits + softmax + 2.0 * score + attend
    # bwd: dQ, dK, dA, dV GEMMs + softmax bwd + dropout + recomputed logits/softmax/dropout
    bwd = (2 * 4 * 3 * 7) * 3 + 2.0 * (3 * score + 2 * 4 * 3) + 2.0 * score + logits * 2 \
        + softmax + 2.0 * score
    assert att.flops_bwd[0] == pytest.approx(bwd)
    assert att.act_bytes[0] == (4 * 2 * 4 * 3 + 2 * 2 * 4) * 2
    assert att.comm_fwd[0].volume_bytes[0] == 0


def test_context_parallel_attention_gathers_kv():
    att = ops.fused_attention("fa", ONE, 8, 2, ONE, np.array([4]), np.array([4]), 1.0, 2.0)
    assert att.comm_fwd[0].kind == "allgather"
    assert att.comm_fwd[0].volume_bytes[0] == 2 * 1 * 8 * 2 * 2  # K and V, full sequence
    assert [c.kind for c in att.comm_bwd] == ["allgather", "reducescatter"]
    assert all(c.bucket == "cp" for c in att.comm_fwd + att.comm_bwd)

"""Hand-computed collective times in the NERSC two-tier model (nersc2024_model.md section 2).

NERSC A100 system: NVLink 300 GB/s x 0.7 = 210 GB/s, 2.5 us; scale-out 25 GB/s x 0.7 =
17.5 GB/s, 5 us; 1 NIC per GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from sweep.model.cost.collectives import Collective, nersc_collective_s

BF, BS, LF, LS = 210e9, 17.5e9, 2.5e-6, 5e-6
V = 104_857_600.0  # one (b=1, l=2048, e=25600) bf16 activation: 2048 * 25600 * 2 bytes


def t(kind, vol, n, per_domain, hw, **kw):
    c = Collective(kind, np.array([vol]), np.array([n]), np.array([per_domain]))
    return float(nersc_collective_s(c, hw, **kw)[0])


def test_hierarchical_allgather(nersc_hw):
    """16 GPUs, 4 per domain: nodes = 4; max(c V / (1 x 4 x bs), c V / bf) + 3 ls + 12 lf.
    This is one of the 8 per-layer TP collectives of the published A100-NVS4 512-GPU top-1,
    whose t_tp_comm = 8 x this x 4096 micro-batches x 4 layers = 189.968 s."""
    c = 15 / 16
    expected = c * V / (4 * BS) + 3 * LS + 12 * LF
    assert t("allgather", V, 16, 4, nersc_hw("A100", 4)) == pytest.approx(expected, rel=1e-14)
    assert 8 * expected * 4096 * 4 == pytest.approx(189.9682669714286, rel=1e-12)


def test_single_domain_and_all_scaleout(nersc_hw):
    hw = nersc_hw("A100", 8)
    assert t("reducescatter", V, 8, 8, hw) == pytest.approx(7 * LF + 7 / 8 * V / BF, rel=1e-14)
    assert t("allgather", V, 8, 1, hw) == pytest.approx(7 * LS + 7 / 8 * V / BS, rel=1e-14)
    # broadcast / reduce: no (n - 1) / n factor
    assert t("broadcast", V, 4, 4, hw) == pytest.approx(3 * LF + V / BF, rel=1e-14)
    assert t("reduce", V, 4, 1, hw) == pytest.approx(3 * LS + V / BS, rel=1e-14)


def test_allreduce_doubles_only_across_domains(nersc_hw):
    """The published code's all-reduce is twice an all-gather only in the multi-domain branch
    (section 11, bug 2); kept for exactness."""
    hw = nersc_hw("A100", 4)
    assert t("allreduce", V, 4, 4, hw) == t("allgather", V, 4, 4, hw)
    ag, ar = t("allgather", V, 16, 4, hw), t("allreduce", V, 16, 4, hw)
    lat = 3 * LS + 12 * LF
    assert ar - lat == pytest.approx(2 * (ag - lat), rel=1e-14)


def test_nic_scaling_and_nvlink_bound(nersc_hw):
    """Inter-domain bandwidth grows with members per domain until NVLink is the bound."""
    hw = nersc_hw("A100", 64)
    c = 63 / 64
    # 64 GPUs, 32 per domain: scale-out bound would be c V / (32 bs) < c V / bf -> NVLink bound
    assert t("allgather", V, 64, 32, hw) == pytest.approx(c * V / BF + LS + 62 * LF, rel=1e-14)


def test_p2p_zero_volume_and_singleton(nersc_hw):
    hw = nersc_hw("A100", 4)
    assert t("p2p", V, 2, 1, hw) == pytest.approx(LS + V / BS, rel=1e-14)
    assert t("p2p", V, 2, 2, hw) == pytest.approx(LF + V / BF, rel=1e-14)
    assert t("allgather", 0.0, 8, 4, hw) == 0.0
    assert t("allgather", V, 1, 1, hw) == 0.0


def test_panels_divide_volume_not_latency(nersc_hw):
    hw = nersc_hw("A100", 4)
    whole = t("broadcast", V, 4, 4, hw)
    panel = t("broadcast", V, 4, 4, hw, scale=8.0)
    assert panel == pytest.approx(3 * LF + V / 8 / BF, rel=1e-14)
    assert 8 * panel > whole  # latency paid per panel


def test_more_bandwidth_never_slower(nersc_hw):
    import dataclasses
    rng = np.random.default_rng(0)
    hw = nersc_hw("H200", 8)
    faster = dataclasses.replace(hw, nvlink_bytes_per_s=2 * hw.nvlink_bytes_per_s,
                                 scaleout_bytes_per_s=1.5 * hw.scaleout_bytes_per_s)
    n = 2 ** rng.integers(0, 10, 500)
    per = np.minimum(n, 2 ** rng.integers(0, 4, 500))
    vol = rng.uniform(0, 1e9, 500)
    for kind in ("allgather", "reducescatter", "allreduce", "broadcast", "reduce", "p2p"):
        nn = np.full_like(n, 2) if kind == "p2p" else n
        c = Collective(kind, vol, nn, per)
        assert (nersc_collective_s(c, faster) <= nersc_collective_s(c, hw)).all()

"""The pipeline schedule of the calibrated profile against Megatron-Core's interleaved 1F1B
order (megatron/core/pipeline_parallel/schedules.py get_pp_rank_microbatches,
get_schedule_table): the micro-batches a rank holds at its peak, and a micro-batch's
steady-state time when the chunks of the ranks differ (the LM head and the MTP depths in
the last rank's last chunk)."""

from __future__ import annotations

import numpy as np
import pytest

from sweep.model.cost.calibrated import _boxes_max_sum, _chunked_s, _in_flight


def _order(p: int, v: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """Rank ``rank``'s passes in Megatron-Core's order: (F or B, chunk, micro-batch). The
    chunks in groups of p micro-batches (get_schedule_table); warm-up forwards 2 (p - r - 1)
    + (v - 1) p interleaved, p - r - 1 otherwise (get_pp_rank_microbatches), then one
    forward and one backward in turn; backward passes take the chunks in reverse."""
    table = [(mb, c) for g in range(0, m, p) for c in range(v) for mb in range(g, min(g + p, m))]
    total = m * v
    warm = min(total, (p - rank - 1) * 2 + (v - 1) * p if v > 1 else p - rank - 1)
    fwd = [("F", c, mb) for mb, c in table]
    bwd = [("B", v - 1 - c, mb) for mb, c in table]
    ops = fwd[:warm]
    for k in range(total - warm):
        ops += [fwd[warm + k], bwd[k]]
    return ops + bwd[total - warm:]


def _peak_held(p: int, v: int, m: int, rank: int) -> float:
    """The most chunk passes whose forward is done and backward not, over a stage (v of
    them make a micro-batch's activations)."""
    held = peak = 0
    for kind, _, _ in _order(p, v, m, rank):
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak / v


@pytest.mark.parametrize("p, v, m", [(2, 1, 8), (4, 1, 16), (4, 1, 2), (4, 2, 8), (4, 4, 16),
                                     (8, 2, 16), (8, 3, 24), (16, 4, 64)])
def test_micro_batches_held_follow_megatron_order(p, v, m):
    for rank in range(p):
        assert _in_flight(np.float64(p), np.float64(v), np.float64(m), np.float64(rank)) \
            == pytest.approx(_peak_held(p, v, m, rank)), rank


def test_micro_batches_held_by_hand():
    # 1F1B on 4 stages: the first holds 4, the second 3, the last 1; interleaved with 2
    # chunks: p + (p-1)/v = 5.5 (Korthikanti et al. 2022 section 4.2.3), the second
    # p + (p-3)/v = 4.5, the last p - (p-1)/v = 2.5
    f = np.float64
    assert [_in_flight(f(4), f(1), f(16), f(k)) for k in (0, 1, 3)] == [4.0, 3.0, 1.0]
    assert [_in_flight(f(4), f(2), f(16), f(k)) for k in (0, 1, 3)] == [5.5, 4.5, 2.5]
    assert _in_flight(f(4), f(1), f(2), f(0)) == 2.0  # (at most the micro-batches there are)
    assert _in_flight(f(1), f(1), f(16), f(0)) == 1.0


def test_boxes_max_sum_by_hand():
    # heights 3, 2, 1 over 1, 4, 6 positions: 3 + 2 + 2 + 2 + 1 + 1 = 11
    boxes = [(np.float64(3), np.float64(1)), (np.float64(2), np.float64(4)),
             (np.float64(1), np.float64(6))]
    assert _boxes_max_sum(boxes) == pytest.approx(11.0)
    assert _boxes_max_sum(boxes + [(np.float64(5), np.float64(0))]) == pytest.approx(11.0)


def _chunks(n_f, n_m, n_l, p, v, per, edge_f, edge_l) -> np.ndarray:
    """(p, v) chunk times by the layout _chunked_s describes, built position by position."""
    t = np.zeros((p, v))

    def spread(n):
        q, r = divmod(n, v)
        return np.array([q + (c < r) for c in range(v)], float)

    t[0] = spread(n_f) * per[0]
    t[0, 0] += edge_f
    for r in range(1, p - 1):
        t[r] = spread(n_m) * per[1]
    size = -(-max(n_f, n_m if p > 2 else 0) // v)
    left, chunks = n_l, []
    for _ in range(v - 1):
        chunks.append(min(size, left))
        left -= chunks[-1]
    t[p - 1] = np.array(chunks + [left], float) * per[2]
    t[p - 1, v - 1] += edge_l
    return t


def _chunked(n_f, n_m, n_l, p, v, per, edge_f, edge_l) -> float:
    f = np.float64
    return float(_chunked_s(f(v), f(p), (f(n_f), f(n_f * per[0]), f(edge_f)),
                            (f(n_m), f(n_m * per[1])), (f(n_l), f(n_l * per[2]), f(edge_l))))


def test_chunked_step_by_hand():
    # 14 layers on 4 ranks x 2 chunks, 1 s a layer: ranks of 4, 4, 4 and 2 layers; the
    # embedding 0.5 s, the LM head 3 s. Chunks: [2.5, 2], [2, 2], [2, 2], [2, 0 + 3]; the
    # slowest per position: 2.5 + 3 = 5.5 s, where the slowest rank takes 5 s
    assert _chunked(4, 4, 2, 4, 2, (1, 1, 1), 0.5, 3.0) == pytest.approx(5.5)
    # even chunks and no edges: the slowest rank's sum
    assert _chunked(8, 8, 8, 4, 4, (1, 1, 1), 0.0, 0.0) == pytest.approx(8.0)
    # DeepSeek-V3's 61 layers on 16 x 4 (a middle rank 4 MoE blocks of 19.44 ms, the last
    # one and the LM head and MTP depth, 68.1 ms): 3 x 19.44 + 68.1
    assert _chunked(4, 4, 1, 16, 4, (15.0, 19.44, 19.44), 0.06, 68.1) == pytest.approx(126.42)


def test_chunked_step_is_the_slowest_chunk_per_position():
    """The closed form equals the sum over positions of the slowest rank's chunk, on random
    layouts (interleaved: 1F1B, v = 1, takes the slowest rank's sum), and is never below
    the slowest rank's sum."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        p, v = int(rng.choice([2, 3, 4, 8])), int(rng.choice([2, 3, 4, 8]))
        layers = int(rng.integers(p * v // 2 + 1, 6 * p * v))
        n_m = -(-layers // p)
        n_f = n_m - int(rng.integers(0, 2))
        n_l = max(layers - (p - 1) * n_m, 0)
        per = tuple(rng.uniform(0.7, 1.2, 3))
        edge_f, edge_l = rng.uniform(0, 0.3), rng.uniform(0, 5)
        t = _chunks(n_f, n_m, n_l, p, v, per, edge_f, edge_l)
        got = _chunked(n_f, n_m, n_l, p, v, per, edge_f, edge_l)
        assert got == pytest.approx(t.max(axis=0).sum(), rel=1e-12)
        assert got >= t.sum(axis=1).max() * (1 - 1e-12)


def test_two_stages_with_embedding_slots_have_no_middle_stage():
    """96 layers and two slots on 2 stages are 48 + the embedding and 48 + the LM head, as
    without slots: a middle stage of 49 layers that does not exist bounded the step and the
    memory (505.2 -> 514.7 s, 86.88 -> 87.96 GB; an outside review)."""
    import dataclasses

    from sweep.analysis.predict import predict
    from sweep.engine.catalog import load_hardware, load_job

    job, hw = load_job("gpt3_175b"), load_hardware("H100-SXM")
    config = {"tp": 8, "pp": 2, "vpp": 1, "mbs": 1, "zero": 1, "recompute": 2}
    plain, slots = (predict("calibrated", dataclasses.replace(job, embedding_slots=e), hw,
                            "1d", 128, config).row for e in (False, True))
    # (the same stages; the gradient reduce and the optimizer step take the embedding's
    # share a little differently: 16 ms of 211 s with TP overlap, the placement predict
    # now answers with for a layout that never fits; the phantom stage cost 2 %)
    assert slots["step_time_s"] == pytest.approx(plain["step_time_s"], rel=1e-4)
    assert slots["mem_bytes"] == pytest.approx(plain["mem_bytes"], rel=1e-6)

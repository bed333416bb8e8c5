"""Cases that differ only in hardware searched in one block (search_cases) give exactly what
each case searched alone gives: the same top-N rows bit for bit, the same counts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sweep.engine.catalog import load_hardware, load_job
from sweep.model.candidates import enumerate_space
from sweep.model.rows import HardwareRows
from sweep.model.search import (
    BLOCK_ROW_BYTES,
    BlockCache,
    _best_positions_by_variant,
    search_cases,
    search_range,
)
from sweep.model.topn import best_positions


def _variants(names, scales):
    """Variants of each base, all with the first base's NVLink domain (one candidate space):
    HBM bandwidth, capacity and NIC count scaled (a small capacity makes some candidates run
    out of memory, so reasons differ by variant)."""
    out = []
    domain = load_hardware(names[0]).nvlink_domain
    for name in names:
        hw = dataclasses.replace(load_hardware(name), nvlink_domain=domain)
        for bw, cap, nics in scales:
            out.append(dataclasses.replace(
                hw, hbm_bytes_per_s=hw.hbm_bytes_per_s * bw,
                hbm_capacity_bytes=hw.hbm_capacity_bytes * cap,
                nics_per_gpu=hw.nics_per_gpu * nics, name=f"{name}x{bw},{cap},{nics}"))
    return out


SCALES = [(1.0, 1.0, 1.0), (0.5, 1.0, 2.0), (2.0, 0.25, 1.0), (1.0, 0.1, 0.5), (3.0, 2.0, 4.0)]


@pytest.mark.parametrize("profile, job, bases, n_gpus, strategy", [
    ("nersc2024", "gpt3_1T", ["nersc-B200", "nersc-H200"], 8192, "1d"),
    ("nersc2024", "vit_era5", ["nersc-A100"], 1024, "2d-seqp"),
    ("calibrated", "bert_large", ["H100-SXM", "B200"], 2, "1d"),
    ("calibrated", "bert_large", ["A100-80GB"], 8, "2d"),
])
def test_batched_equals_one_by_one(profile, job, bases, n_gpus, strategy):
    job = load_job(job)
    hws = _variants(bases, SCALES)
    space = enumerate_space(profile, job, n_gpus, strategy, hws[0].nvlink_domain)
    assert 4 * space.size <= 65536  # small enough to be batched
    alone = [search_range(profile, job, hw, strategy, n_gpus, space, 0, space.size, 5)
             for hw in hws]
    together = search_cases(profile, job, hws, strategy, n_gpus, space, 5, block_size=65536)
    assert len(together) == len(hws)
    for a, b in zip(alone, together):
        assert a.top.tobytes() == b.top.tobytes()
        assert (a.evaluated, a.feasible, a.reasons, a.stop) == (b.evaluated, b.feasible,
                                                                b.reasons, b.stop)
    # the variants do differ (else the test proves little)
    assert len({r.top["samples_per_s"][0] for r in alone if len(r.top)}) > 1
    assert len({tuple(sorted(r.reasons.items())) for r in alone}) > 1


def test_small_blocks_split_the_variants():
    job = load_job("gpt3_1T")
    hws = _variants(["nersc-B200"], SCALES)
    space = enumerate_space("nersc2024", job, 8192, "1d", 8)
    whole = search_cases("nersc2024", job, hws, "1d", 8192, space, 3, block_size=65536)
    # four variants per block: blocks of 4 and 1
    split = search_cases("nersc2024", job, hws, "1d", 8192, space, 3,
                         block_size=4 * space.size)
    assert [r.top.tobytes() for r in whole] == [r.top.tobytes() for r in split]


def test_top_n_per_run_matches_best_positions():
    rng = np.random.default_rng(5)
    k, size = 7, 500
    score = rng.integers(0, 20, k * size).astype(float)  # many exact ties
    feasible = rng.random(k * size) < 0.6
    feasible[3 * size:4 * size] = False  # a run with nothing feasible
    index = np.tile(rng.permutation(size), k)
    for n in (1, 5, 200, 600):
        got = _best_positions_by_variant(score, feasible, index, k, size, n)
        want = np.concatenate([
            r * size + best_positions(score[r * size:(r + 1) * size],
                                      feasible[r * size:(r + 1) * size],
                                      index[r * size:(r + 1) * size], n)
            for r in range(k)])
        assert np.array_equal(got, want)


def test_hardware_rows_one_value_where_variants_agree():
    a = load_hardware("B200")
    b = dataclasses.replace(a, hbm_bytes_per_s=2 * a.hbm_bytes_per_s)
    rows = HardwareRows([a, b], np.array([0, 1, 1, 0]))
    assert rows.nvlink_bytes_per_s == a.nvlink_bytes_per_s  # shared: a plain number
    assert np.array_equal(rows.hbm_bytes_per_s, [a.hbm_bytes_per_s, b.hbm_bytes_per_s,
                                                 b.hbm_bytes_per_s, a.hbm_bytes_per_s])
    assert rows.take(np.array([1, 2])).hbm_bytes_per_s.tolist() == [b.hbm_bytes_per_s] * 2
    assert rows.matrix_peak("bf16") == a.matrix_peak("bf16")
    with pytest.raises(AttributeError):
        rows.calibration  # noqa: B018  (not a per-row number)


# ------------------------------------------------------------------ kept blocks (BlockCache)

def _read_only(blocks: BlockCache) -> None:
    """Every array a cache keeps, and every result kept in the blocks' memos, made
    read-only: a search that wrote into a kept block would raise."""
    for block in blocks._blocks.values():
        for a in block.values():
            a.flags.writeable = False
        for found in block.memo.values():
            for part in found:
                for a in (part.values() if isinstance(part, dict) else (part,)):
                    a.flags.writeable = False


@pytest.mark.parametrize("profile, job, base, n_gpus, strategy, block", [
    ("nersc2024", "gpt3_1T", "nersc-B200", 8192, "2d", 65536),  # 58,380: one block and a bit
    ("nersc2024", "vit_era5", "nersc-A100", 1024, "2d-seqp", 8192),  # several blocks
    ("calibrated", "llama3_8b", "H100-SXM", 8, "1d", 16384),  # 30,492
])
def test_kept_blocks_give_what_fresh_ones_give(profile, job, base, n_gpus, strategy, block):
    """Cases of one space searched with their blocks kept (a hardware grid's variants, one
    after another, each over two ranges as a rank's units split a case) give bit for bit
    what each gives with fresh blocks; nothing writes into a kept block or its memo."""
    job = load_job(job)
    hws = _variants([base], SCALES)
    space = enumerate_space(profile, job, n_gpus, strategy, hws[0].nvlink_domain)
    blocks = BlockCache(block, max_bytes=2**40)
    assert blocks.keeps(space), space.size
    cut = space.size // 3
    for i, hw in enumerate(hws):
        fresh = search_range(profile, job, hw, strategy, n_gpus, space, 0, space.size, 5,
                             block_size=block)
        kept = search_range(profile, job, hw, strategy, n_gpus, space, 0, cut, 5,
                            block_size=block, blocks=blocks).merge(
            search_range(profile, job, hw, strategy, n_gpus, space, cut, space.size, 5,
                         block_size=block, blocks=blocks), 5)
        assert fresh.top.tobytes() == kept.top.tobytes()
        assert (fresh.evaluated, fresh.feasible, fresh.reasons) == (kept.evaluated,
                                                                   kept.feasible, kept.reasons)
        if i == 0:
            held = len(blocks)
            assert held >= 2
            _read_only(blocks)
        else:  # the first variant's blocks served every other one
            assert len(blocks) == held
    if profile == "nersc2024":  # (its per-layer dedup reads the block itself)
        assert any(b.memo for b in blocks._blocks.values())


def test_block_cache_keeps_mid_sized_spaces_within_its_bytes():
    job = load_job("gpt3_1T")
    small = enumerate_space("nersc2024", job, 8192, "1d", 8)  # 2,324: searched in batches
    mid = enumerate_space("nersc2024", job, 8192, "2d", 8)  # 58,380
    seqp = enumerate_space("nersc2024", job, 8192, "2d-seqp", 8)  # 23,302
    blocks = BlockCache(65536, max_bytes=BLOCK_ROW_BYTES * (mid.size + 10_000))
    assert not blocks.keeps(small) and blocks.keeps(mid) and blocks.keeps(seqp)
    assert not BlockCache(8192).keeps(mid)  # more than two blocks of 8,192
    first = blocks.columns(mid, 0, 65536)
    assert blocks.columns(mid, 0, 65536) is first
    assert blocks.bytes == BLOCK_ROW_BYTES * mid.size == 28 * 8 * 58_380
    # the 2d-seqp block does not fit beside it: the least recently used block goes
    other = blocks.columns(seqp, 0, 65536)
    assert len(blocks) == 1 and blocks.bytes == BLOCK_ROW_BYTES * seqp.size
    assert blocks.columns(seqp, 0, 65536) is other
    assert blocks.columns(mid, 0, 65536) is not first
    # a small space is written fresh each time, and kept nowhere
    assert blocks.columns(small, 0, 100) is not blocks.columns(small, 0, 100)
    np.testing.assert_array_equal(first["tp"], mid.columns(0, 65536)["tp"])

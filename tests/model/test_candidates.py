"""Candidate enumeration: exact spaces, stable indices, bounded blocks."""

from __future__ import annotations

import numpy as np
import pytest

from sweep.engine.catalog import load_job
from sweep.model import candidates
from sweep.model.candidates import (
    divisors,
    enumerate_nersc,
    enumerate_space,
    ordered_factorizations,
    summa_nb_options,
)
from sweep.model.cost import fuse
from sweep.model.schema import CANDIDATE_DTYPE, empty_candidates

# unique candidates per space, from the reference's own generators (nersc2024_model.md
# section 8 table): (model, strategy, nvs) -> {n: count}, plus the sum over n = 4..16384
TABLE = {
    ("gpt3_1T", "1d", 4): ({1024: 1818, 4096: 1712, 16384: 1310}, 15098),
    ("gpt3_1T", "2d", 64): ({1024: 64960, 4096: 101572, 16384: 115938}, 570844),
    ("gpt3_1T", "2d-seqp", 8): ({1024: 18114, 4096: 22712, 16384: 22696}, 148922),
    ("vit_era5", "1d", 64): ({1024: 2289, 4096: 2469, 16384: 1984}, 16250),
    ("vit_era5", "2d", 4): ({1024: 20049, 4096: 21431, 16384: 19991}, 175434),
    ("vit_era5", "2d-seqp", 64): ({1024: 22422, 4096: 37934, 16384: 45355}, 207680),
}


@pytest.mark.parametrize("key", TABLE, ids=["-".join(map(str, k)) for k in TABLE])
def test_space_sizes_match_reference(key, job):
    model, strategy, nvs = key
    counts, total = TABLE[key]
    j = job(model)
    for n, count in counts.items():
        assert enumerate_nersc(j, n, strategy, nvs).size == count
    assert sum(enumerate_nersc(j, 2**k, strategy, nvs).size for k in range(2, 15)) == total


def test_factorizations_and_divisors():
    assert divisors(12).tolist() == [1, 2, 3, 4, 6, 12]
    f = ordered_factorizations(8, 3)
    assert len(f) == 10 and (f.prod(axis=1) == 8).all()
    assert len({tuple(r) for r in f}) == len(f)
    assert len(ordered_factorizations(64, 4)) == 84  # C(6 + 3, 3)


def test_summa_panels():
    assert summa_nb_options(1, 1, 25600) == [1, 2, 4, 8, 16, 32]
    assert summa_nb_options(4, 1, 25600) == [4, 8, 16, 32]
    assert summa_nb_options(32, 1, 12288) == [32]  # e / start < 512: only nb = start


def test_every_candidate_is_valid_and_unique(job):
    j = job("gpt3_1T")
    for strategy in ("1d", "2d", "2d-seqp"):
        space = enumerate_nersc(j, 2048, strategy, 8)
        c = space.columns(0, space.size)
        assert (c["dp"] * c["tp"] * c["tp2"] * c["cp"] * c["pp"] == 2048).all()
        assert (j.n_layers % c["pp"] == 0).all() and (j.global_batch % c["dp"] == 0).all()
        assert ((j.global_batch // c["dp"]) % c["mbs"] == 0).all()
        placed = c["nv_tp"] * c["nv_tp2"] * c["nv_cp"] * c["nv_dp"] * c["nv_pp"]
        total = c["tp"] * c["tp2"] * c["cp"] * c["dp"] * c["pp"]
        assert ((placed == 8) | ((total <= 8) & (placed == total))).all()
        for g in ("tp", "tp2", "cp", "dp", "pp"):
            assert (c[g] % c["nv_" + g] == 0).all()
        keys = np.stack([c[k] for k in ("dp", "tp", "tp2", "cp", "pp", "mbs", "nb", "nv_tp",
                                        "nv_tp2", "nv_cp", "nv_dp", "nv_pp")], axis=1)
        assert len(np.unique(keys, axis=0)) == space.size
        assert (c["index"] == np.arange(space.size)).all()


def test_blocks_concatenate_to_the_space(job):
    space = enumerate_nersc(job("vit_era5"), 1024, "2d", 64)
    whole = space.block(0, space.size)
    for size in (7, 1000, 65536):
        parts = [space.block(s, s + size) for s in range(0, space.size, size)]
        assert (np.concatenate(parts) == whole).all()
    # one row at a time: the first and last few thousand rows (the whole space is 38,227
    # calls of numpy's own path)
    for lo, hi in ((0, 3000), (space.size - 3000, space.size)):
        assert (np.concatenate([space.block(s, s + 1) for s in range(lo, hi)])
                == whole[lo:hi]).all()
    assert len(space.block(space.size, space.size + 5)) == 0


@pytest.mark.parametrize("space_of", [
    lambda job: enumerate_nersc(job("vit_era5"), 1024, "2d", 64),
    lambda job: enumerate_nersc(job("gpt3_1T"), 4096, "1d", 8),
    lambda job: enumerate_space("calibrated", load_job("llama3_8b"), 64, "1d", 8, True),
    lambda job: enumerate_space("calibrated", load_job("qwen3_30b_a3b"), 32, "1d", 8)],
    ids=["nersc-2d", "nersc-1d", "calibrated-offload", "calibrated-moe"])
@pytest.mark.parametrize("runs", [True, False], ids=["runs", "rows"])
def test_compiled_columns_equal_numpy(job, space_of, runs, monkeypatch):
    """Both compiled loops (runs of equal values filled; an odometer over the inner axes'
    options row by row) write the rows numpy writes, whatever the block's start: mid base
    row, on a row boundary, across empty rows; and an MoE space's EP ranks per domain, the
    loop after them."""
    if not fuse.available():
        pytest.skip("numba is not installed")
    space = space_of(job)
    monkeypatch.setattr(candidates, "COMPILED_COLUMNS_MIN_ROWS", 1)
    monkeypatch.setattr(candidates, "RUNS_MIN_ROWS_PER_BASE", 0 if runs else 10**12)
    rng = np.random.default_rng(0)
    starts = [0, 1, int(space.offsets[1]), int(space.offsets[-2])] + \
        rng.integers(0, space.size, 6).tolist()
    for start in starts:
        for size in (1, 5, 1024, 70000):
            monkeypatch.setenv("SWEEP_FUSE", "0")
            want = space.columns(start, start + size)
            monkeypatch.setenv("SWEEP_FUSE", "1")
            got = space.columns(start, start + size)
            for name in want:
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # (compiled, not numpy after a failure; an MoE space's nv_ep too)
    assert candidates._COMPILED.get("columns" if runs else "columns-rows") is not None
    if space._expert_parallel:
        assert candidates._COMPILED.get("expert-ranks") is not None


@pytest.mark.parametrize("nvs", [1, 4, 8, 36, 72, 144])
@pytest.mark.parametrize("rows, groups", [(400, ("tp", "cp", "dp", "pp")),
                                          (3000, ("tp", "dp", "pp"))],
                         ids=["mask-per-row", "shared-masks"])
def test_compiled_nvlink_masks_equal_numpy(nvs, rows, groups, monkeypatch):
    """The compiled NVLink placement masks (one loop) are numpy's: which placements fit and
    which factorisations divide the group degrees, for domains of powers of two and of 3s
    (72 = 8 x 9), degrees from 1 to 4096, some dividing no factor; a mask per base row and
    masks shared by the rows of equal degrees (bases from BY_KEY_MIN_ROWS rows)."""
    pytest.importorskip("numba")  # (the compiled loop is used once numba is loaded)
    rng = np.random.default_rng(nvs)
    base = empty_candidates(rows)
    for g, values in (("tp", [1, 2, 3, 4, 6, 8, 9, 12, 36, 72]), ("cp", [1, 2, 3, 5, 16]),
                      ("dp", [1, 2, 4, 9, 18, 27, 64, 4096]), ("pp", [1, 2, 3, 7, 8, 144])):
        base[g] = rng.choice(values, len(base))
    monkeypatch.setenv("SWEEP_FUSE", "0")
    want = candidates._nv_axis(base, nvs, groups)
    monkeypatch.setenv("SWEEP_FUSE", "1")
    got = candidates._nv_axis(base, nvs, groups)
    assert (want.pattern is None) == (rows < candidates.BY_KEY_MIN_ROWS)
    np.testing.assert_array_equal(got.valid[got.rows], want.valid[want.rows])
    assert want.valid[:, 0].any() and want.valid[:, 1:].any()  # (both kinds of rows)
    assert candidates._COMPILED.get("nv-masks") is not None  # (compiled, not numpy)


@pytest.mark.parametrize("shape", [(1, 1), (7, 1), (300, 11), (50, 40)])
def test_compiled_mask_order_equals_numpy(shape, monkeypatch):
    """The compiled order of an inner axis's options (one pass over the masks) is numpy's
    argsort: each mask's valid options first, then the others, each in option order; and
    the same counts. Masks all True, all False and mixed."""
    pytest.importorskip("numba")  # (the compiled loop is used once numba is loaded)
    valid = np.random.default_rng(shape[0]).random(shape) < 0.4
    valid[0], valid[-1] = True, False
    axis = candidates.InnerAxis(np.zeros(shape[1], dtype=[("mbs", "i4")]), valid)
    monkeypatch.setenv("SWEEP_FUSE", "0")
    want = axis.order_and_counts()
    monkeypatch.setenv("SWEEP_FUSE", "1")
    got = axis.order_and_counts()
    assert candidates._COMPILED.get("mask-order") is not None  # (compiled, not numpy)
    for w, g in zip(want, got):
        assert g.dtype == np.int64
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got[1], valid.sum(axis=1))


def test_space_from_matrix_equals_space_from_records():
    """A space built from its base rows' int64 matrix (what enumerate_nersc builds) is the
    space built from the same rows as records, and gives them back as records; a matrix
    of another shape or dtype is refused."""
    space = enumerate_nersc(load_job("gpt3_1T"), 4096, "2d-seqp", 8)
    records = space.base
    assert records.dtype == CANDIDATE_DTYPE and len(records) == space.n_base
    again = candidates.CandidateSpace(records, space.axes)
    assert again.size == space.size
    np.testing.assert_array_equal(again.offsets, space.offsets)
    want, got = space.columns(0, space.size), again.columns(0, space.size)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    for bad in (np.zeros((3, 4), np.int64), space._base_matrix.astype(np.int32)):
        with pytest.raises(TypeError):
            candidates.CandidateSpace(bad, space.axes)


@pytest.mark.parametrize("runs", [True, False], ids=["runs", "rows"])
def test_compiled_columns_skip_base_rows_without_options(runs, monkeypatch):
    """Base rows none of whose options are valid hold no candidates (sizes 0)."""
    if not fuse.available():
        pytest.skip("numba is not installed")
    base = empty_candidates(6)
    base["tp"] = np.arange(1, 7)
    options = np.zeros(3, dtype=[("mbs", "i4"), ("sp", "i1")])
    options["mbs"], options["sp"] = [1, 2, 4], [0, 1, 1]
    valid = np.array([[1, 0, 1], [0, 0, 0], [0, 0, 0], [1, 1, 1], [0, 0, 0], [0, 1, 0]], bool)
    second = np.zeros(2, dtype=[("zero", "i1")])
    second["zero"] = [0, 3]
    space = candidates.CandidateSpace(base, [candidates.InnerAxis(options, valid),
                                             candidates.InnerAxis(second, np.ones((6, 2), bool))])
    assert space.size == 12
    monkeypatch.setattr(candidates, "COMPILED_COLUMNS_MIN_ROWS", 1)
    monkeypatch.setattr(candidates, "RUNS_MIN_ROWS_PER_BASE", 0 if runs else 10**12)
    for start in range(space.size):
        for stop in range(start + 1, space.size + 1):
            monkeypatch.setenv("SWEEP_FUSE", "0")
            want = space.columns(start, stop)
            monkeypatch.setenv("SWEEP_FUSE", "1")
            got = space.columns(start, stop)
            for name in want:
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize("space_of", [
    lambda: enumerate_nersc(load_job("vit_era5"), 1024, "2d", 64),
    lambda: enumerate_nersc(load_job("gpt3_1T"), 4096, "2d-seqp", 8),
    lambda: enumerate_space("calibrated", load_job("llama3_8b"), 64, "1d", 8, True),
    lambda: enumerate_space("calibrated", load_job("qwen3_30b_a3b"), 32, "1d", 8)],
    ids=["nersc-2d", "nersc-2d-seqp", "calibrated-offload", "calibrated-moe"])
def test_shared_masks_equal_each_rows_own(space_of, monkeypatch):
    """Inner axes whose masks are found once per distinct key (InnerAxis.by_key) give the
    space that each base row's own mask gives: the same rows in the same order."""
    monkeypatch.setattr(candidates, "BY_KEY_MIN_ROWS", 1)
    shared = space_of()
    assert any(a.pattern is not None and len(a.valid) < shared.n_base for a in shared.axes)
    monkeypatch.setattr(candidates, "BY_KEY_MIN_ROWS", 10**12)
    own = space_of()
    assert all(a.pattern is None for a in own.axes)
    assert own.size == shared.size
    for a, b in zip(own.axes, shared.axes):  # each base row's options, in order
        np.testing.assert_array_equal(a.valid, b.valid[b.rows])
        np.testing.assert_array_equal(a.counts, b.counts)
        taken = np.arange(a.valid.shape[1])[None, :] < a.counts[:, None]
        np.testing.assert_array_equal(np.where(taken, a.order, -1),
                                      np.where(taken, b.order[b.rows], -1))
    for start in np.random.default_rng(0).integers(0, own.size, 3).tolist():
        want, got = own.columns(start, start + 5000), shared.columns(start, start + 5000)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize("strategy", ["1d", "2d", "2d-seqp"])
def test_a_nersc_space_sets_only_its_fields(strategy):
    """The fields outside NERSC_FIELDS (what sweep predict says nersc2024 does not search)
    keep their neutral values in every candidate of a NERSC space."""
    space = enumerate_nersc(load_job("gpt3_1T"), 4096, strategy, 8)
    cols = space.columns(0, space.size)
    neutral = empty_candidates(1)[0]
    for name in CANDIDATE_DTYPE.names:
        if name not in candidates.NERSC_FIELDS and name != "index":
            assert (cols[name] == neutral[name]).all(), name
    assert (cols["pp"] > 1).any() and (cols["mbs"] > 1).any()


@pytest.mark.parametrize("space", [
    lambda: enumerate_space("calibrated", load_job("qwen3_30b_a3b"), 8, "1d", 8),
    lambda: enumerate_space("calibrated", load_job("llama3_8b"), 16, "1d", 8, True),
    lambda: enumerate_space("nersc2024", load_job("gpt3_1T"), 512, "2d", 4)])
def test_ranges_where_holds_every_candidate_a_configuration_matches(space):
    """predict reads only CandidateSpace.ranges_where(config): the candidates of those ranges
    that match the configuration are exactly those of the whole space that do, for
    configurations that fix degrees, inner-axis fields, NVLink placements or nothing."""
    space = space()
    whole = space.columns(0, space.size)
    rng = np.random.default_rng(7)
    names = [n for n in CANDIDATE_DTYPE.names if n != "index"]
    configs = [{}]
    for i in rng.integers(0, space.size, 12):
        fields = rng.choice(names, size=int(rng.integers(1, 6)), replace=False)
        configs.append({str(f): int(whole[f][i]) for f in fields})
    for config in configs:
        want = np.ones(space.size, dtype=bool)
        for k, v in config.items():
            want &= whole[k] == v
        got = []
        for lo, hi in space.ranges_where(config):
            cols = space.columns(lo, hi)
            keep = np.ones(hi - lo, dtype=bool)
            for k, v in config.items():
                keep &= cols[k] == v
            got.append(cols["index"][keep])
        got = np.concatenate(got) if got else np.zeros(0, np.int64)
        assert np.array_equal(np.sort(got), np.flatnonzero(want)), config

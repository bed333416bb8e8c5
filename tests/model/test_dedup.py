"""unique_rows (sweep.model.cost.dedup): the distinct rows of some key columns, their inverse
map and first occurrences, exactly as np.unique over the stacked keys gives them - whether
the packed keys fit one table, need the prefix re-ranked as they outgrow it (an MoE block's
16 keys), or one key alone spans more than a table (the sort); with numpy and with the
compiled loop (blocks from COMPILED_MIN_ROWS rows when fused evaluation is on)."""

from __future__ import annotations

import numpy as np
import pytest

from sweep.model.cost import dedup, fuse
from sweep.model.cost.dedup import unique_rows


@pytest.fixture(autouse=True, params=["numpy", "compiled"])
def _path(request, monkeypatch):
    """Every test twice: numpy, then the compiled loop from 2 rows (needs numba)."""
    if request.param == "compiled":
        if not fuse.available():
            pytest.skip("numba is not installed")
        monkeypatch.setenv("SWEEP_FUSE", "1")
        monkeypatch.setattr(dedup, "COMPILED_MIN_ROWS", 2)
    else:
        monkeypatch.setenv("SWEEP_FUSE", "0")
    yield request.param
    if request.param == "compiled":  # (it ran compiled, not numpy after a failure)
        assert dedup._COMPILED.get("unique") is not None


def _reference(cols, keys):
    stacked = np.stack([np.asarray(cols[k], np.int64) for k in keys], axis=1)
    _, first, inverse = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
    return first, inverse.ravel()


def _check(cols, keys):
    uniq, inverse, first = unique_rows(cols, keys, return_first=True)
    want_first, want_inverse = _reference(cols, keys)
    np.testing.assert_array_equal(first, want_first)
    np.testing.assert_array_equal(inverse, want_inverse)
    for k in keys:
        np.testing.assert_array_equal(uniq[k], np.asarray(cols[k], np.int64)[want_first])
        np.testing.assert_array_equal(uniq[k][inverse], cols[k])


@pytest.mark.parametrize("seed", range(8))
def test_many_wide_keys_equal_np_unique(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 20000))
    # spans from 1 to 4096 and negative values: the packed range is far beyond one table
    cols = {f"k{i}": rng.integers(-int(rng.integers(0, 50)), int(rng.integers(1, 4096)), n)
            for i in range(int(rng.integers(1, 18)))}
    _check(cols, tuple(cols))


def test_few_distinct_values_in_wide_ranges_equal_np_unique():
    rng = np.random.default_rng(0)
    n = 65536
    cols = {f"k{i}": rng.choice([1, 2, 8, 64, 512, 1000], n) for i in range(17)}
    _check(cols, tuple(cols))


def test_one_key_wider_than_a_table_and_the_empty_block():
    rng = np.random.default_rng(3)
    cols = {"big": rng.integers(0, 1 << 40, 5000), "small": rng.integers(0, 3, 5000),
            "mid": rng.integers(0, 1000, 5000)}
    _check(cols, ("small", "big"))
    # a wide key first or between others: ranked by a sort, not a table over its range
    # (which would need terabytes)
    _check(cols, ("big", "small"))
    _check(cols, ("small", "big", "mid"))
    _check(cols, ("mid", "small", "big", "mid"))
    # a ranked prefix times a key of more distinct values than a table holds: a second sort
    cols = {"a": rng.integers(0, 5000, 5000), "b": rng.integers(0, 1 << 40, 5000),
            "c": rng.integers(0, 1 << 40, 5000)}
    _check(cols, ("a", "b", "c"))
    # int64's extremes in one key (its span does not fit int64)
    ext = np.array([np.iinfo(np.int64).min, 0, np.iinfo(np.int64).max])
    _check({"e": rng.choice(ext, 3000), "s": rng.integers(0, 2, 3000)}, ("s", "e"))
    uniq, inverse = unique_rows({"a": np.zeros(0, np.int64)}, ("a",))
    assert len(uniq["a"]) == 0 and len(inverse) == 0


def test_small_spans_dense_sparse_and_the_word_edge():
    """Keys whose values fill their range (ranked without a table), keys with gaps in a
    range of at most 64 (their values found as the bits of one word, bit 63 included) and
    a key one past that range."""
    rng = np.random.default_rng(5)
    n = 4096
    cols = {"dense": rng.integers(0, 5, n), "bits": rng.choice([1, 2, 4, 8, 16, 32, 64], n),
            "edge": rng.choice([-7, 56], n), "past": rng.choice([0, 64], n),
            "neg": rng.integers(-3, 3, n)}
    _check(cols, tuple(cols))
    _check(cols, ("edge", "dense"))
    _check(cols, ("past", "bits", "neg"))

"""Top-N selection: deterministic order, and the same result over any split of the rows."""

from __future__ import annotations

import numpy as np

from sweep.model.schema import RESULT_DTYPE
from sweep.model.topn import merge_top_n, select_top_n


def rows(n, seed=0):
    rng = np.random.default_rng(seed)
    r = np.zeros(n, RESULT_DTYPE)
    r["index"] = rng.permutation(n)
    r["samples_per_s"] = rng.integers(0, 50, n).astype(float)  # many exact ties
    r["feasible"] = rng.random(n) < 0.7
    return r


def test_order_and_ties():
    r = rows(2000)
    top = select_top_n(r, 25)
    assert top["feasible"].all() and len(top) == 25
    key = list(zip(-top["samples_per_s"], top["index"]))
    assert key == sorted(key)
    best_feasible = r[r["feasible"]]
    assert top["samples_per_s"][0] == best_feasible["samples_per_s"].max()


def test_any_split_gives_the_same_table():
    r = rows(5000, seed=3)
    whole = select_top_n(r, 10)
    rng = np.random.default_rng(7)
    for parts in (2, 3, 17):
        cuts = np.sort(rng.choice(len(r), parts - 1, replace=False))
        shuffled = r[rng.permutation(len(r))]
        tables = [select_top_n(p, 10) for p in np.split(shuffled, cuts)]
        assert (merge_top_n(tables, 10) == whole).all()


def test_fewer_feasible_than_n_and_none():
    r = rows(50)
    r["feasible"] = False
    r["feasible"][:3] = True
    assert len(select_top_n(r, 10)) == 3
    r["feasible"] = False
    assert len(select_top_n(r, 10)) == 0
    assert len(merge_top_n([], 10)) == 0


def test_merge_tops_equals_a_per_case_reference_with_duplicates():
    """The reduction's merge: drop copies of a candidate found by two parts, keep each
    case's best top_n (speed desc, index asc), renumber places, sort by (case, place)."""
    from sweep.engine.reduce import merge_tops
    from sweep.engine.store import TOP_DTYPE

    rng = np.random.default_rng(3)
    n = 4000
    rows = np.zeros(n, TOP_DTYPE)
    rows["case_id"] = rng.integers(0, 50, n)
    rows["index"] = rng.integers(0, 200, n)
    # a candidate's speed is a function of (case, index), with ties between candidates
    rows["samples_per_s"] = ((rows["case_id"] * 7 + rows["index"] * 13) % 97).astype(float)
    rows["place"] = rng.integers(0, 10, n)  # whatever the parts said
    rows = rows[rng.permutation(n)]
    for top_n in (1, 5, 1000):
        got = merge_tops(rows, top_n)
        expected = []
        for case in sorted(set(rows["case_id"].tolist())):
            mine = {int(r["index"]): float(r["samples_per_s"]) for r in rows
                    if r["case_id"] == case}
            best = sorted(mine.items(), key=lambda kv: (-kv[1], kv[0]))[:top_n]
            expected += [(case, place, idx, speed) for place, (idx, speed) in enumerate(best)]
        assert [(int(r["case_id"]), int(r["place"]), int(r["index"]), float(r["samples_per_s"]))
                for r in got] == expected


def test_a_kept_top_n_shares_the_result_dtype():
    """np.concatenate gives its result a private copy of a structured dtype (4.6 KB of
    field tables); a top-N kept per case must use RESULT_DTYPE itself, or a run of many
    cases holds that copy once per case (issue 19)."""
    import numpy as np

    from sweep.model.schema import RESULT_DTYPE
    from sweep.model.topn import merge_top_n

    a = np.zeros(30, RESULT_DTYPE)
    a["feasible"], a["samples_per_s"], a["index"] = True, np.arange(30.0), np.arange(30)
    kept = merge_top_n([a[:10], a[10:]], 5)
    assert kept.dtype is RESULT_DTYPE
    assert list(kept["index"]) == [29, 28, 27, 26, 25]


def test_concat_records_is_np_concatenate_in_the_dtype_itself():
    from sweep.model.schema import concat_records

    rng = np.random.default_rng(3)
    tables = [np.zeros(int(rng.integers(0, 7)), RESULT_DTYPE) for _ in range(40)]
    for t in tables:
        for name in RESULT_DTYPE.names:
            t[name] = rng.integers(0, 1000, len(t)).astype(t[name].dtype)
    tables.append(np.zeros(12, RESULT_DTYPE)[::3])  # a strided view
    joined, plain = concat_records(tables, RESULT_DTYPE), np.concatenate(tables)
    assert joined.dtype is RESULT_DTYPE
    assert joined.tobytes() == plain.astype(RESULT_DTYPE).tobytes()
    assert len(concat_records([], RESULT_DTYPE)) == 0
    # a table of another dtype: numpy's own concatenation
    other = np.zeros(2, [("index", "i8"), ("samples_per_s", "f8")])
    assert concat_records([other, other], RESULT_DTYPE).dtype == other.dtype

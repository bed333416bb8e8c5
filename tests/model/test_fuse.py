"""Fused evaluation (sweep.model.cost.fuse): the compiled loop gives numpy's results.

Small hand-made functions exercise what the tracer must get right (numpy's dtypes, NaN in
maximum, where / select, guards on scalar inputs, a fallback for what it cannot follow);
then the calibrated and nersc2024 models, fused against numpy on whole blocks of real search spaces, bit
for bit, and a search ranked on scores alone against one with every column.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from sweep.engine.catalog import load_hardware, load_job
from sweep.model.candidates import enumerate_space
from sweep.model.cost import calibrated, evaluate_columns, fuse
from sweep.model.rows import HardwareRows
from sweep.model.search import search_cases, search_range

needs_numba = pytest.mark.skipif(not fuse.available(), reason="numba is not installed")


@pytest.fixture(autouse=True)
def _fused_on(monkeypatch):
    """(tests/conftest.py turns fused evaluation off for the rest of the suite)"""
    monkeypatch.setenv("SWEEP_FUSE", "1")


def _same(a, b) -> None:
    """Bit for bit: values, NaN positions, signs of zeros and dtype."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype
    assert a.shape == b.shape
    if a.dtype.kind == "f":
        assert np.array_equal(a.view(np.uint64), b.view(np.uint64))
    else:
        assert np.array_equal(a, b)


def _flatten(tree, path=()) -> list:
    """[(path, leaf)] of a nest of dicts / lists / tuples, dicts in sorted key order."""
    if isinstance(tree, dict):
        return [x for k in sorted(tree, key=str) for x in _flatten(tree[k], path + (k,))]
    if isinstance(tree, (list, tuple)):
        return [x for i, v in enumerate(tree) for x in _flatten(v, path + (i,))]
    return [(path, tree)]


def _same_tree(ref, got) -> None:
    ref_leaves, got_leaves = _flatten(ref), _flatten(got)
    assert [p for p, _ in ref_leaves] == [p for p, _ in got_leaves]
    for (path, a), (_, b) in zip(ref_leaves, got_leaves):
        if np.ndim(a) or np.ndim(b):
            _same(np.broadcast_to(a, np.shape(b)) if np.ndim(b) else a, b)
        else:
            assert float(a) == float(b) or (np.isnan(a) and np.isnan(b)), path


def _toy(x, c):
    """A bit of everything the cost model does."""
    a = fuse.as_array(c["a"], dtype=np.float64)
    k = fuse.as_array(c["k"])  # int8
    both = np.maximum(a, x["floor"])  # NaN propagates
    low = np.minimum(a, -0.0) + np.maximum(-0.0, np.minimum(a, 0.0))  # signed zeros on ties
    picked = np.select([k == 0, k == 1], [a * 2.0, a / x["d"]], default=np.sqrt(np.abs(a)))
    bits = (k & 4) > 0
    flag = ~bits | (a > 1.0)
    scale = x["s"] * 3.0 if x["mode"] > 0 else x["s"] - 1.0  # a decision on a scalar input
    return {"both": both, "low": low, "picked": picked, "flag": flag,
            "k2": k * 2, "ceil": np.ceil(a / 3.0), "clip": np.clip(a, 0.5, 2.0),
            "scaled": a * scale, "rem": np.remainder(a, 0.7),
            "where": np.where(flag, k, 1.5), "const": 7.0, "scalar": x["s"] * x["d"],
            "list": [a + 1.0, np.ones_like(a)]}


def _toy_inputs(n=4096, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(0.0, 2.0, n)
    a[::97] = np.nan
    a[1::89] = 0.0
    a[2::83] = -0.0
    a[3::79] = np.inf
    return {"a": a, "k": rng.integers(0, 8, n).astype(np.int8)}


@needs_numba
def test_toy_function_fused_equals_numpy_bit_for_bit():
    f = fuse.fused(_toy, min_rows=1)
    c = _toy_inputs()
    for x in ({"floor": 0.25, "d": 3.0, "s": 1.5, "mode": 1},
              {"floor": np.nan, "d": 0.0, "s": -2.0, "mode": 0}):
        with np.errstate(all="ignore"):
            ref = _toy(x, c)
            got = f(x, c)
        _same_tree(ref, got)
    assert f.traces == 2  # the two modes take different paths: two graphs
    assert len(f._cache) == 1 and len(next(iter(f._cache.values()))) == 2


@needs_numba
def test_graph_reused_for_other_values_of_inputs_no_decision_reads():
    f = fuse.fused(_toy, min_rows=1)
    c = _toy_inputs()
    for floor in (0.1, 0.2, 0.3):
        got = f({"floor": floor, "d": 2.0, "s": 1.0, "mode": 1}, c)
        with np.errstate(all="ignore"):
            _same_tree(_toy({"floor": floor, "d": 2.0, "s": 1.0, "mode": 1}, c), got)
    assert f.traces == 1


@needs_numba
def test_tracing_and_first_calls_count_as_start_up_later_calls_do_not(monkeypatch):
    """startup_seconds: the CPU time of tracing a new graph and of its loop's first call
    (compiled, or loaded from the cache), which sweep plan keeps apart from the search's
    rate; a call that reuses a graph adds nothing."""
    added = []
    monkeypatch.setattr(fuse, "_add_startup", added.append)
    f = fuse.fused(_toy, min_rows=1)
    c = _toy_inputs()
    f({"floor": 0.1, "d": 2.0, "s": 1.0, "mode": 1}, c)
    assert len(added) == 1 and added[0] >= 0
    f({"floor": 0.2, "d": 2.0, "s": 1.0, "mode": 1}, c)  # (the same graph)
    assert len(added) == 1
    f({"floor": 0.2, "d": 2.0, "s": 1.0, "mode": 0}, c)  # (another graph)
    assert len(added) == 2
    loop = fuse.compile_loop(_plain_loop)  # compile_loop's loops: each new signature
    x = np.arange(5.0)
    loop(x)
    loop(x)
    assert len(added) == 3
    loop(np.arange(5))  # (integers: another signature)
    assert len(added) == 4 and np.array_equal(x, np.arange(5.0) * 4)  # (run twice)


def _plain_loop(x):
    for i in range(len(x)):
        x[i] = x[i] * 2


def _nested_sum(xs):
    return sum(v[0] if isinstance(v, list) else 2.0 * v for v in xs)


def _ordered(d):
    return {"first": d[next(iter(d))]}


@needs_numba
def test_inputs_of_another_structure_get_their_own_graph():
    """Nests with the same containers and leaves in other places, and dicts with the same
    keys in another order, are other inputs: each is traced, none reuses another's loop."""
    x, y = np.arange(3.0), np.arange(3.0) + 10.0
    f = fuse.fused(_nested_sum, min_rows=1)
    _same(f([[x], y]), x + 2.0 * y)
    _same(f([x, [y]]), 2.0 * x + y)
    g = fuse.fused(_ordered, min_rows=1)
    _same(g({"a": x, "b": y})["first"], x)
    _same(g({"b": y, "a": x})["first"], y)
    assert f.traces == 2 and g.traces == 2


@needs_numba
def test_gathered_terms_are_read_through_their_index():
    """A per-layer term given as its distinct rows and an index (fuse.Gathered) gives what
    the taken array gives, fused or not."""
    def combine(c, lay):
        return {"t": c["a"] * lay["w"] + np.maximum(lay["w"], 1.0), "w": lay["w"] * 2.0}

    rng = np.random.default_rng(3)
    c = {"a": rng.random(5000)}
    lay = {"w": fuse.Gathered(rng.random(40), rng.integers(0, 40, 5000))}
    want = combine(c, {"w": lay["w"].array()})
    for env in ("1", "0"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SWEEP_FUSE", env)
            _same_tree(want, fuse.fused(combine, min_rows=1)(c, lay))


@needs_numba
@pytest.mark.parametrize("n", [1, 7, 100, 4096])
def test_chunked_loop_equals_numpy_bit_for_bit(monkeypatch, n):
    """The chunked loop (inputs copied chunk by chunk into a float and an integer buffer,
    fuse._generate) on chunks of 7 rows - a last one partial, or the only one - with
    float64, int64, int8 (read in place) and gathered inputs: numpy's results."""
    monkeypatch.setattr(fuse, "CHUNK_ROWS", 7)
    monkeypatch.setattr(fuse, "CHUNK_MIN_STATEMENTS", 0)

    def combine(x, c, lay):
        out = _toy(x, c)
        out["mixed"] = c["i"] * lay["w"] + np.where(c["i"] > 3, lay["w"], c["a"])
        out["ints"] = c["i"] * 3 + (c["i"] & 1)
        return out

    rng = np.random.default_rng(5)
    c = dict(_toy_inputs(n), i=rng.integers(-5, 9, n).astype(np.int64))
    lay = {"w": fuse.Gathered(rng.random(13), rng.integers(0, 13, n))}
    x = {"floor": 0.25, "d": 3.0, "s": 1.5, "mode": 1}
    f = fuse.fused(combine, min_rows=1, chunked=True)
    with np.errstate(all="ignore"):
        want = combine(x, c, {"w": lay["w"].array()})
        _same_tree(want, f(x, c, lay))
    source = next(iter(f._cache.values()))[0].kernel.py_func.__code__.co_filename
    with open(source) as fh:
        assert "for start in range(0, n, 7):" in fh.read()  # (it ran chunked)


@needs_numba
def test_decision_on_array_values_falls_back_to_numpy():
    def branchy(c):
        return c["a"] * 2.0 if np.any(c["a"] > 0) else c["a"]

    f = fuse.fused(branchy, min_rows=1)
    c = {"a": np.arange(5000.0)}
    _same(f(c), branchy(c))
    assert f._untraceable


@needs_numba
def test_an_unwritable_cache_directory_means_numpy(monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(blocked))
    f = fuse.fused(_toy, min_rows=1)
    c = _toy_inputs(seed=1)
    x = {"floor": 0.5, "d": 1.0, "s": 2.0, "mode": 1}
    with np.errstate(all="ignore"):
        _same_tree(_toy(x, c), f(x, c))
    assert f._untraceable


def _fresh_nersc2024_loops(monkeypatch):
    """The nersc2024 model's fused functions with no graph in memory, as a new process has
    them: (layer terms, totals)."""
    from sweep.model.cost import nersc2024

    loops = (fuse.fused(nersc2024._layer_terms, min_rows=1),
             fuse.fused(nersc2024._totals, min_rows=1))
    monkeypatch.setattr(nersc2024, "_fused_layer", loops[0])
    monkeypatch.setattr(nersc2024, "_fused_totals", loops[1])
    return loops


@needs_numba
@pytest.mark.slow  # (compiles two kernels afresh, ~11 s; CI runs -m slow)
def test_a_kept_trace_spares_a_new_process_the_tracing(monkeypatch, tmp_path):
    """A graph traced for the model is kept in the cache directory: a fused function with
    no graph in memory (a new process's) loads it and its kernel instead of tracing, and
    gives numpy's results bit for bit; inputs that disagree with the kept guard (a defect
    flag a decision reads) get a graph of their own; damaged records are traced again."""
    from sweep.model.cost import nersc2024

    monkeypatch.setenv("SWEEP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SWEEP_TRACE_DIR", str(tmp_path / "traces"))
    job = load_job("gpt3_1T")
    hw = dataclasses.replace(load_hardware("nersc-B200"), nvlink_domain=8)
    space = enumerate_space("nersc2024", job, 1024, "1d", 8)
    cand = space.columns(0, space.size)

    def run(defects=nersc2024.DEFECTS):
        return nersc2024.evaluate(job, hw, "1d", cand, defects)

    monkeypatch.setenv("SWEEP_FUSE", "0")
    ref = run()
    other = nersc2024.NerscDefects(pp_slow_links_free=False)
    ref_other = run(other)
    monkeypatch.setenv("SWEEP_FUSE", "1")
    assert any(not np.array_equal(ref[k], ref_other[k]) for k in ref)  # (the flag matters)

    first = _fresh_nersc2024_loops(monkeypatch)
    got = run()
    assert [f.traces for f in first] == [1, 1]
    assert len(list((tmp_path / "traces").glob("*/*.json"))) == 2
    again = _fresh_nersc2024_loops(monkeypatch)
    got_again = run()
    assert [f.traces for f in again] == [0, 0]
    for k in ref:
        _same(ref[k], got[k])
        _same(ref[k], got_again[k])
    got_other = run(other)  # the totals' kept guard reads the flag: traced for it
    assert [f.traces for f in again] == [0, 1]
    for k in ref:
        _same(ref_other[k], got_other[k])

    for record, damage in zip(sorted((tmp_path / "traces").glob("*/*.json")),
                              (b"\x80\x05not json", b'[{"tuple": [1, 2, 3, 4, 5, 6, 7]}]')):
        record.write_bytes(damage)  # (unreadable; of the right layout, wrong contents)
    damaged = _fresh_nersc2024_loops(monkeypatch)
    got_damaged = run()
    assert [f.traces for f in damaged] == [1, 1]
    for k in ref:
        _same(ref[k], got_damaged[k])


@needs_numba
def test_a_kept_layout_comes_back_with_its_types():
    """What a kept trace holds (tuples, numpy scalars and dtypes, NaN, dicts with other
    keys) comes back as it was; anything else is not kept."""
    layout = [((0, 3), (np.float64(0.5), 2, True, np.int64(-3), np.bool_(False), "1d",
                       float("nan"), float("-inf"))),
              [("array", np.dtype(np.float64)), ("static", None), ("scalar", np.dtype("i8"))],
              {"a": [None, (None,)], 1: {"b": None}}, np.asarray(np.float32(1.5))]
    back = fuse._decode(fuse.json.loads(fuse.json.dumps(fuse._encode(layout))))
    assert repr(back) == repr(layout)
    assert [type(v) for v in back[0][1]] == [type(v) for v in layout[0][1]]
    assert type(back[3]) is np.ndarray and back[3].dtype == np.float32
    with pytest.raises(TypeError):
        fuse._encode([object()])


@needs_numba
def test_traces_of_functions_outside_the_model_are_not_kept(monkeypatch, tmp_path):
    """Only sweep.model's source is in the fingerprint, so only its functions' traces are
    kept."""
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SWEEP_TRACE_DIR", str(tmp_path / "traces"))
    f = fuse.fused(_toy, min_rows=1)
    with np.errstate(all="ignore"):
        f({"floor": 0.5, "d": 1.0, "s": 2.0, "mode": 1}, _toy_inputs())
    assert f.traces == 1 and not (tmp_path / "traces").exists()
    # nor a closure's of the model's package: its state is not in its name
    scale = 3.0

    def closure(c):
        return {"x": c["a"] * scale}

    closure.__module__ = "sweep.model.cost.example"
    g = fuse.fused(closure, min_rows=1)
    g({"a": np.arange(4.0)})
    assert g.traces == 1 and not (tmp_path / "traces").exists()


def test_the_fingerprint_of_kept_traces_covers_every_model_source(tmp_path):
    """An edited, added or renamed module of the model changes the folder kept traces are
    read from (a new process then traces again)."""
    import shutil
    from pathlib import Path

    root = tmp_path / "model"
    shutil.copytree(Path(fuse.__file__).resolve().parents[1], root,
                    ignore=shutil.ignore_patterns("__pycache__"))
    seen = {fuse._fingerprint(root)}
    assert fuse._fingerprint(root) in seen  # (the same files: the same fingerprint)
    calibrated_py = root / "cost" / "calibrated.py"
    calibrated_py.write_text(calibrated_py.read_text().replace("0.", "0.0", 1))
    seen.add(fuse._fingerprint(root))
    (root / "cost" / "new.py").write_text("")
    seen.add(fuse._fingerprint(root))
    (root / "cost" / "new.py").rename(root / "cost" / "other.py")
    seen.add(fuse._fingerprint(root))
    assert len(seen) == 4
    # an editor's lock file (a dangling symlink) is no module: left out, not an error
    (root / "cost" / ".#calibrated.py").symlink_to(root / "nowhere")
    assert fuse._fingerprint(root) in seen
    # taken as the model is imported, not at the first trace: a source edited in between
    # would file the old code's traces under the new code's name
    import subprocess
    import sys

    code = ("import sweep.model.cost\nfrom sweep.model.cost import fuse\n"
            "print(fuse._model_fingerprint.cache_info().currsize)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "1"


def test_off_without_numba_or_when_disabled(monkeypatch):
    monkeypatch.setenv("SWEEP_FUSE", "0")
    assert not fuse.enabled()
    f = fuse.fused(_toy, min_rows=1)
    c = _toy_inputs()
    x = {"floor": 0.25, "d": 3.0, "s": 1.5, "mode": 1}
    with np.errstate(all="ignore"):
        _same_tree(_toy(x, c), f(x, c))
    assert f.traces == 0


def test_tracer_refuses_what_it_cannot_follow():
    g = fuse._Graph(8)
    t = g.add("input", (0,), np.float64, True)
    with pytest.raises(fuse.TraceError):
        bool(t > 0)
    with pytest.raises(fuse.TraceError):
        np.cumsum(t)
    with pytest.raises(fuse.TraceError):
        t + np.arange(8.0)  # an array that is not an input


# ---------------------------------------------------------------- the calibrated model

def _block(job_name, hw_name, nvs, n_gpus, size=20000, offload=False):
    job = load_job(job_name)
    hw = dataclasses.replace(load_hardware(hw_name), nvlink_domain=nvs)
    space = enumerate_space("calibrated", job, n_gpus, "1d", nvs, offload)
    return job, hw, space, space.columns(0, min(space.size, size))


def _both(monkeypatch, fn):
    monkeypatch.setenv("SWEEP_FUSE", "0")
    ref = fn()
    monkeypatch.setenv("SWEEP_FUSE", "1")
    return ref, fn()


@needs_numba
@pytest.mark.parametrize("case", [
    ("llama3_8b", "H100-SXM", 8, 64),
    # (the MoE graphs take 5 - 12 s to compile on a fresh machine: with -m slow)
    pytest.param(("deepseek_v3", "GB200-NVL72", 72, 64), marks=pytest.mark.slow),
    pytest.param(("qwen3_30b_a3b", "B200", 8, 32), marks=pytest.mark.slow)])
def test_calibrated_fused_equals_numpy(monkeypatch, case):
    job, hw, _, cand = _block(*case)
    ref, got = _both(monkeypatch, lambda: evaluate_columns("calibrated", job, hw, "1d",
                                                           case[3], cand))
    for k in ref:
        _same(ref[k], got[k])


@needs_numba
def test_calibrated_fused_equals_numpy_on_a_batch_of_variants(monkeypatch):
    job, hw, space, _ = _block("llama3_8b", "H100-SXM", 8, 16)
    hws = [dataclasses.replace(hw, hbm_bytes_per_s=bw, hbm_capacity_bytes=cap)
           for bw in (2e12, 3.35e12, 5e12) for cap in (40e9, 80e9)]
    ref, got = _both(monkeypatch, lambda: search_cases("calibrated", job, hws, "1d", 16,
                                                       space, 25))
    for a, b in zip(ref, got):
        _same(a.top, b.top)
        assert (a.evaluated, a.feasible, a.reasons) == (b.evaluated, b.feasible, b.reasons)


@needs_numba
@pytest.mark.parametrize("strategy", ["1d", "2d", "2d-seqp"])
def test_nersc2024_fused_equals_numpy(monkeypatch, strategy):
    """The published model's per-layer terms (on a block's distinct layers) and totals as
    compiled loops (they did run: traced, none left to numpy): every column bit for bit
    numpy's, for one GPU type and for a block of hardware variants (HBM bandwidth and
    NVLink efficiency per row), in full and on scores alone."""
    from sweep.model.cost import nersc2024

    job = load_job("gpt3_1T")
    hw = dataclasses.replace(load_hardware("nersc-B200"), nvlink_domain=8)
    space = enumerate_space("nersc2024", job, 1024, strategy, 8)
    cand = space.columns(0, space.size)
    ref, got = _both(monkeypatch, lambda: evaluate_columns("nersc2024", job, hw, strategy,
                                                           1024, cand))
    for k in ref:
        _same(ref[k], got[k])
    for loop in (nersc2024._fused_layer, nersc2024._fused_totals):
        assert loop._cache and not loop._untraceable
    hws = [dataclasses.replace(hw, hbm_bytes_per_s=bw, nvlink_efficiency=eff)
           for bw in (4e12, 8e12) for eff in (0.6, 0.9)]
    rows = HardwareRows(hws, np.repeat(np.arange(4), space.size))
    block = {k: np.tile(v, 4) for k, v in cand.items()}
    for scores_only in (False, True):
        ref, got = _both(monkeypatch, lambda s=scores_only: evaluate_columns(
            "nersc2024", job, rows, strategy, 1024, block, scores_only=s))
        # (numpy computes every column anyway; fused scores of a large block are step time
        # and feasibility alone, the rest left to the rows a search keeps)
        assert got["complete"] == (not scores_only or len(block["index"]) < 16384)
        for k in got:
            if k != "complete":
                _same(ref[k], got[k])


@needs_numba
def test_nersc2024_search_on_scores_alone_keeps_the_rows_full_evaluation_ranks_first():
    """A large nersc2024 block is ranked on step time and memory alone, its kept rows then
    evaluated in full: the same rows, with the same numbers, as ranking every column."""
    from sweep.model.cost import NERSC_SCORES_MIN_ROWS, pack_results
    from sweep.model.topn import best_positions

    job = load_job("gpt3_1T")
    hw = dataclasses.replace(load_hardware("nersc-B200"), nvlink_domain=8)
    space = enumerate_space("nersc2024", job, 4096, "2d", 8)
    assert space.size >= NERSC_SCORES_MIN_ROWS
    got = search_range("nersc2024", job, hw, "2d", 4096, space, 0, space.size, 10,
                       block_size=space.size)
    cand = space.columns(0, space.size)
    full = evaluate_columns("nersc2024", job, hw, "2d", 4096, cand)
    pos = best_positions(full["samples_per_s"], full["feasible"], cand["index"], 10)
    _same(got.top, pack_results(cand, full, pos))


@needs_numba
@pytest.mark.parametrize("space", [("nersc2024", "gpt3_1T", 4096, "2d", 8),
                                   ("nersc2024", "gpt3_1T", 4096, "2d-seqp", 64),
                                   ("calibrated", "llama3_8b", 64, "1d", 8),
                                   ("calibrated", "qwen3_30b_a3b", 32, "1d", 8)])
def test_compiled_columns_equal_numpy_columns(monkeypatch, space):
    """CandidateSpace.columns written by its compiled loop: the same rows, whole blocks and
    blocks that start and end inside a base row's options."""
    profile, job, n, strategy, nvs = space
    sp = enumerate_space(profile, load_job(job), n, strategy, nvs)
    for start, stop in ((0, min(sp.size, 65536)), (sp.size // 2 - 999, sp.size // 2 + 4321),
                        (max(sp.size - 5000, 0), sp.size)):
        ref, got = _both(monkeypatch, lambda a=start, b=stop: sp.columns(a, b))
        assert list(ref) == list(got)
        for k in ref:
            _same(ref[k], got[k])


@needs_numba
def test_search_on_scores_alone_equals_search_with_every_column(monkeypatch):
    """Ranked on step time and feasibility alone, then the kept rows evaluated in full: the
    same top rows, bit for bit, as evaluating every column of every candidate."""
    job, hw, space, _ = _block("llama3_8b", "H100-SXM", 8, 64)
    ref, got = _both(monkeypatch, lambda: search_range("calibrated", job, hw, "1d", 64, space,
                                                       0, 30000, 50, block_size=7000))
    _same(ref.top, got.top)
    assert (ref.evaluated, ref.feasible, ref.reasons) == (got.evaluated, got.feasible,
                                                          got.reasons)
    assert np.all(got.top["mem_bytes"] > 0) and np.all(got.top["t_compute_s"] > 0)


@needs_numba
@pytest.mark.parametrize("screen", [True, False, None])
def test_screened_scores_are_the_scores_of_the_rows_that_fit(monkeypatch, screen):
    """Screened (the reasons of every row first, step times for the rows that fit only),
    a block's reasons are those of the whole evaluation and so are, bit for bit, the step
    times of its rows that fit; the others are inf (never ranked). Llama 3 70B on 32 H100:
    most rows do not fit; a sample decides alone (None) to screen such a block."""
    monkeypatch.setattr(calibrated, "SCREEN_MIN_ROWS", 1)
    job, hw, space, _ = _block("llama3_70b", "H100-SXM", 8, 32, size=0)
    cand = space.columns(space.size - 20000, space.size)  # (about a fifth of its rows fit)
    x = calibrated.make_context(job, hw, hw.calibration, "1d")
    whole = calibrated.evaluate(x, cand)
    fits = whole["reason"] == 0
    assert 0 < np.count_nonzero(fits) < 0.25 * len(fits)  # (a block worth screening)
    got = calibrated.evaluate(x, cand, scores_only=True, screen=screen)
    _same(np.broadcast_to(got["reason"], fits.shape), whole["reason"])
    step = np.broadcast_to(got["step_time_s"], fits.shape)
    _same(step[fits], whole["step_time_s"][fits])
    assert np.all(np.isinf(step[~fits])) == (screen is not False)


@needs_numba
def test_a_block_where_most_rows_fit_is_not_screened(monkeypatch):
    """A sample of a block where most rows fit says the reasons' own pass would not pay:
    every row's step time, as without screening; told to screen it all the same (the block
    before fitted worse), the reasons show it and every row gets its step time too."""
    monkeypatch.setattr(calibrated, "SCREEN_MIN_ROWS", 1)
    job, hw, _, cand = _block("llama3_8b", "H100-SXM", 8, 64)
    x = calibrated.make_context(job, hw, hw.calibration, "1d")
    calls, real = [], calibrated._fused_reasons

    def spy(*args, **kwargs):
        calls.append(len(args[1]["tp"]))  # (the rows of its candidate columns)
        return real(*args, **kwargs)

    monkeypatch.setattr(calibrated, "_fused_reasons", spy)
    whole = calibrated.evaluate(x, cand, scores_only=True, screen=False)
    assert calls == []
    n = len(cand["tp"])
    for screen, reasons in ((None, [-(-n // calibrated.SCREEN_STRIDE)]), (True, [n])):
        calls.clear()
        got = calibrated.evaluate(x, cand, scores_only=True, screen=screen)
        assert calls == reasons  # (the sample only; the whole block, then every step time)
        _same(got["step_time_s"], whole["step_time_s"])
        _same(got["reason"], whole["reason"])


@needs_numba
def test_screened_search_equals_search_without_screening(monkeypatch):
    """Whole searches screened and not: one case block by block (the block before decides)
    and several hardware variants a block (each block's sample decides; each row its own
    variant's numbers, some variants with too little memory for most rows), dense and MoE:
    the same top rows, counts and reasons - and screening did run."""
    screened, real = [], calibrated._screened_scores

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        screened.append(out is not None and np.isinf(out["step_time_s"]).any())
        return out

    monkeypatch.setattr(calibrated, "_screened_scores", spy)
    job, hw, space, _ = _block("llama3_70b", "H100-SXM", 8, 16)
    small_job, small_hw, small, _ = _block("llama3_8b", "H100-SXM", 4, 4)
    moe_job, moe_hw, moe_space, _ = _block("qwen3_30b_a3b", "B200", 8, 8)
    variants = [dataclasses.replace(small_hw, hbm_capacity_bytes=cap, hbm_bytes_per_s=bw)
                for cap in (24e9, 40e9, 80e9) for bw in (2e12, 3.35e12)]
    assert 65536 // small.size >= 4  # (variants share blocks: per-row contexts)

    def searches():
        return [search_range("calibrated", job, hw, "1d", 16, space, 0, space.size, 20,
                             block_size=20000),
                search_range("calibrated", moe_job, moe_hw, "1d", 8, moe_space, 0,
                             moe_space.size, 20, block_size=20000),
                *search_cases("calibrated", small_job, variants, "1d", 4, small, 20)]
    monkeypatch.setattr(calibrated, "SCREEN_MIN_ROWS", 10**12)
    ref = searches()
    assert not any(screened)
    monkeypatch.setattr(calibrated, "SCREEN_MIN_ROWS", 1)
    got = searches()
    assert ref[0].feasible and len(ref[0].top) == 20  # (rows that fit, among many that do not)
    assert any(screened)
    for a, b in zip(ref, got):
        _same(a.top, b.top)
        assert (a.evaluated, a.feasible, a.reasons) == (b.evaluated, b.feasible, b.reasons)


def test_scalar_context_equals_stacked_context_for_mla():
    """MLA with query compression: one context per run (validation) and one context for the
    block (a search) cost the same projections (a Python bool negated with ~ once made the
    scalar context count both query projections)."""
    job, hw, _, cand = _block("deepseek_v3", "GB200-NVL72", 72, 64, size=300)
    x = calibrated.make_context(job, hw, hw.calibration, "1d")
    one = calibrated.evaluate(x, cand)
    stacked = calibrated.evaluate(calibrated.stack_contexts([x] * 300), cand)
    for k in ("step_time_s", "hardware_flops", "mem_bytes"):
        np.testing.assert_allclose(one[k], stacked[k], rtol=1e-12)


def test_rows_keep_their_results_outside_their_block():
    """Evaluation is elementwise: a row's results do not depend on the block it is in (what
    the scores-only search relies on when it evaluates the kept rows again)."""
    job, hw, _, cand = _block("deepseek_v3", "GB200-NVL72", 72, 64, size=5000)
    full = evaluate_columns("calibrated", job, hw, "1d", 64, cand)
    pick = np.array([0, 17, 999, 4321, 4999])
    sub = {k: np.asarray(v)[pick] for k, v in cand.items()}
    few = evaluate_columns("calibrated", job, hw, "1d", 64, sub)
    for k in ("step_time_s", "mem_bytes", "t_ep_comm_s", "hardware_flops", "reason"):
        _same(np.asarray(full[k])[pick], few[k])


def test_hardware_rows_are_taken_with_their_candidates():
    hw = load_hardware("H100-SXM")
    rows = HardwareRows([hw, dataclasses.replace(hw, hbm_bytes_per_s=1e12)],
                        np.array([0, 1, 1, 0]))
    assert rows.take(np.array([1, 3])).row.tolist() == [1, 0]


def test_deduplicated_terms_equal_every_row_evaluated(monkeypatch):
    """The per-layer and routed-expert terms found once per distinct row (the routed rows
    by the columns they read, an ETP group's span only where etp > 1,
    calibrated._deduplicated) and gathered back are, bit for bit, the terms evaluated on
    every row (numpy)."""
    monkeypatch.setenv("SWEEP_FUSE", "0")
    job, hw, _, cols = _block("deepseek_v3", "GB200-NVL72", 72, 64, size=6000)
    x = calibrated.make_context(job, hw, hw.calibration)
    lay, routed = calibrated._layer_terms_dedup(x, cols, lazy=True)
    # (deduplicated: gathered terms, on fewer distinct rows than candidates)
    assert isinstance(lay["fwd"], fuse.Gathered) and isinstance(routed["gemm_f"], fuse.Gathered)
    assert len(routed["gemm_f"].values) < len(cols["tp"]) / 2
    _same_tree(calibrated._layer_terms(x, cols), fuse._materialized(lay))
    _same_tree(calibrated._routed_terms(x, cols), fuse._materialized(routed))


def test_deduplicated_terms_of_hardware_variants_equal_every_row_evaluated(monkeypatch):
    """As above with three hardware variants in one block (make_row_context: the context
    per row, the variant a key of both the layer and the routed rows)."""
    monkeypatch.setenv("SWEEP_FUSE", "0")
    job, hw, _, cols = _block("deepseek_v3", "GB200-NVL72", 72, 64, size=3000)
    hws = [hw, dataclasses.replace(hw, hbm_bytes_per_s=4e12),
           dataclasses.replace(hw, nvlink_bytes_per_s=4e11, hbm_capacity_bytes=1.4e11)]
    n = len(cols["tp"])
    rows = np.repeat(np.arange(3), n)
    block = {k: np.tile(v, 3) for k, v in cols.items()}
    x = calibrated.make_row_context(job, HardwareRows(hws, rows))
    block["variant"] = rows
    lay, routed = calibrated._layer_terms_dedup(x, block, lazy=True)
    assert isinstance(routed["gemm_f"], fuse.Gathered)
    _same_tree(calibrated._layer_terms(x, block), fuse._materialized(lay))
    _same_tree(calibrated._routed_terms(x, block), fuse._materialized(routed))


@needs_numba
@pytest.mark.parametrize("rest", [0.5, 0.0], ids=["two-pass", "one-pass"])
def test_moe_reasons_from_the_first_stage_first_equal_every_rows(monkeypatch, rest):
    """An MoE block's reasons in two passes (calibrated._block_reasons: the rows over HBM on
    the first pipeline stage, then the whole reason of the rest only) are every row's
    reasons - rows over HBM on a middle or last stage only among them - and the rows that
    fit get their step times bit for bit; with too many rows left (FIRST_STAGE_MAX_REST 0)
    one pass over the block instead. DeepSeek-V3 on 64 GB200: most rows are over HBM on
    their first stage already."""
    monkeypatch.setattr(calibrated, "SCREEN_MIN_ROWS", 1)
    monkeypatch.setattr(calibrated, "FIRST_STAGE_MAX_REST", rest)
    job, hw, space, _ = _block("deepseek_v3", "GB200-NVL72", 72, 64, size=0)
    cand = space.columns(3_450_000, 3_480_000)  # (rows that fit, and later stages over HBM)
    x = calibrated.make_context(job, hw, hw.calibration, "1d")
    whole = calibrated.evaluate(x, cand)
    calls, real = [], calibrated._fused_reasons

    def spy(*args, **kwargs):
        calls.append(len(args[1]["tp"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(calibrated, "_fused_reasons", spy)
    got = calibrated.evaluate(x, cand, scores_only=True, screen=True)
    n = len(cand["tp"])
    _same(np.broadcast_to(got["reason"], (n,)).astype(np.int64),
          whole["reason"].astype(np.int64))
    fits = whole["reason"] == 0
    _same(np.broadcast_to(got["step_time_s"], (n,))[fits], whole["step_time_s"][fits])
    # (the block has rows over HBM on a later stage only, that the first pass let through)
    first = calibrated._fused_first_stage_over(
        x, cand, *calibrated._layer_terms_dedup(x, cand, lazy=True))["over"] > 0
    assert 0.5 * n < np.count_nonzero(first) < np.count_nonzero(~fits)
    assert calls == ([np.count_nonzero(~first)] if rest else [n])


@needs_numba
def test_loading_the_loops_does_not_import_scipy():
    """numba's BLAS check would import scipy.linalg (20 MB a rank, unused by these loops):
    loading a compiled loop in a fresh process leaves scipy out, and scipy imports as usual
    after it."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from sweep.model.cost import dedup\n"
            "import numpy as np\n"
            "dedup.COMPILED_MIN_ROWS = 1\n"
            "dedup.unique_rows({'a': np.arange(5)}, ('a',))\n"
            "assert dedup._COMPILED.get('unique') is not None\n"
            "assert 'scipy' not in sys.modules, 'scipy imported'\n"
            "import scipy.linalg\n"
            "print('ok')\n")
    env = dict(os.environ, SWEEP_FUSE="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr

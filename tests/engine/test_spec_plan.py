"""Spec expansion: grid forms, stable variant ids, resolved specs, plans and partitions."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from sweep.engine.partition import UNIT_OVERHEAD, assign_units, imbalance, share_units
from sweep.engine.plan import make_plan
from sweep.engine.spec import load_spec, parse_spec, resolved_yaml, spec_hash
from sweep.engine.variants import expand_variants
from sweep.errors import SpecError
from tests.conftest import DATA, REPO

SMALL = DATA / "specs" / "small.yaml"


def spec_of(**kw):
    raw = {"name": "t", "jobs": ["gpt3_1T"], "gpus": 4096, "hardware": {"base": "nersc-B200"}}
    raw.update(kw)
    return parse_spec(raw, "t.yaml")


def test_gpu_forms():
    assert spec_of(gpus={"from": 128, "to": 1024, "factor": 2}).gpus == (128, 256, 512, 1024)
    assert spec_of(gpus={"from": 8, "to": 32, "step": 8}).gpus == (8, 16, 24, 32)
    assert spec_of(gpus=[1024, 256]).gpus == (256, 1024)
    with pytest.raises(SpecError, match=r"gpus\[2\]: 1024 is listed twice"):
        spec_of(gpus=[1024, 256, 1024])  # (every case of it twice, as a grid value)
    with pytest.raises(SpecError, match="description: expected text"):
        spec_of(description=[1, 2])


def test_a_hardware_variant_two_groups_make_is_refused():
    """Two groups of one base whose grids share a point, or a grid point equal to the
    base's own value beside the base alone, would run each of its cases twice (an outside
    review: two cases labelled H100-SXM[nvlink_domain=16]); grids that only overlap in
    other bases, or not at all, are fine."""
    with pytest.raises(SpecError, match=r"hardware\[1\]: H100-SXM\[nvlink_domain=16\] is "
                                        r"also a variant of hardware\[0\]"):
        spec_of(hardware=[{"base": "H100-SXM", "grid": {"nvlink_domain": [8, 16]}},
                          {"base": "H100-SXM", "grid": {"nvlink_domain": [16, 32]}}])
    with pytest.raises(SpecError, match=r"H100-SXM\[nvlink_domain=8\] is also a variant"):
        spec_of(hardware=[{"base": "H100-SXM"},
                          {"base": "H100-SXM", "grid": {"nvlink_domain": [8]}}])
    ok = spec_of(hardware=[{"base": ["H100-SXM", "B200"], "grid": {"nvlink_domain": [8, 16]}},
                           {"base": "H100-SXM", "grid": {"nvlink_domain": [32]}},
                           {"base": "B200", "grid": {"hbm_GBps": [4000]}}])
    assert len(expand_variants(ok)) == 6
    # default profile: calibrated, with its one strategy; otherwise all of the profile's
    assert spec_of().cost_model == "calibrated" and spec_of().strategies == ("1d", "2d")
    assert spec_of(cost_model="nersc2024").strategies == ("1d", "2d", "2d-seqp")


def test_grid_forms_and_variant_order():
    s = spec_of(hardware={"base": ["nersc-A100", "nersc-B200"], "grid": {
        "nvlink_domain": [4, 8], "hbm_GBps": {"from": 1000, "to": 2000, "points": 3}}})
    v = expand_variants(s)
    assert len(v) == 2 * 2 * 3 and [x.variant_id for x in v] == list(range(12))
    assert v[0].label == "nersc-A100[nvlink_domain=4,hbm_GBps=1000]"
    assert v[1].label == "nersc-A100[nvlink_domain=4,hbm_GBps=1500]"
    assert v[3].hardware.nvlink_domain == 8 and v[6].base == "nersc-B200"
    assert v[2].hardware.hbm_bytes_per_s == 2000e9
    assert v[5].swept == (("nvlink_domain", 8.0), ("hbm_GBps", 2000.0))
    zipped = spec_of(hardware={"base": "nersc-B200", "grid": {
        "mem": {"zip": {"hbm_GB": [80, 141], "hbm_GBps": [2000, 4800]}}}})
    z = expand_variants(zipped)
    assert [(x.hardware.hbm_capacity_bytes, x.hardware.hbm_bytes_per_s) for x in z] == \
        [(80e9, 2000e9), (141e9, 4800e9)]
    # values given as strings with units under a canonical key: labelled and recorded as
    # swept by their values in SI, not by their positions (which two groups would share)
    units = expand_variants(spec_of(hardware=[
        {"base": "H100-SXM", "grid": {"hbm_bandwidth": ["3.35 TB/s", "4.8 TB/s"]}},
        {"base": "H100-SXM", "grid": {"hbm_bandwidth": ["8 TB/s"]}}]))
    assert [x.label for x in units] == ["H100-SXM[hbm_bandwidth=3.35e+12]",
                                        "H100-SXM[hbm_bandwidth=4.8e+12]",
                                        "H100-SXM[hbm_bandwidth=8e+12]"]
    assert [x.swept for x in units] == [(("hbm_bandwidth", 3.35e12),),
                                        (("hbm_bandwidth", 4.8e12),), (("hbm_bandwidth", 8e12),)]
    assert [x.hardware.hbm_bytes_per_s for x in units] == [3.35e12, 4.8e12, 8e12]


def test_nersc_grids_reproduce_the_study():
    hbm = expand_variants(load_spec(REPO / "specs" / "nersc-b200-hbm-grid.yaml"))
    assert len(hbm) == 32 * 28
    caps = sorted({x.hardware.hbm_capacity_bytes for x in hbm})
    bws = sorted({x.hardware.hbm_bytes_per_s for x in hbm})
    np.testing.assert_allclose(caps, np.linspace(80, 1000, 32) * 1e9, rtol=1e-15)
    np.testing.assert_allclose(bws, np.linspace(500, 16000, 28) * 1e9, rtol=1e-15)
    flops = expand_variants(load_spec(REPO / "specs" / "nersc-flops-capacity.yaml"))
    assert len(flops) == 10 * 22
    caps = sorted({x.hardware.hbm_capacity_bytes / 1e9 for x in flops})
    ref = np.concatenate([np.linspace(80, 141, 4)[:-1], np.linspace(141, 192, 4)[:-1],
                          np.linspace(192, 384, 4)])
    np.testing.assert_allclose(caps, ref, rtol=1e-15)
    peaks = sorted({x.hardware.matrix_peak("fp16") / 1e12 for x in flops})
    ref = np.concatenate([np.linspace(312, 989.4, 8)[:-1], np.linspace(989.4, 2500, 8)[:-1],
                          np.linspace(2500, 3750, 8)])
    np.testing.assert_allclose(peaks, ref, rtol=1e-14)


def test_job_overrides_get_distinct_names():
    s = spec_of(jobs=["gpt3_1T", {"name": "gpt3_1T", "global_batch": 2048}])
    assert [j.name for j in s.jobs] == ["gpt3_1T", "gpt3_1T[global_batch=2048]"]
    assert s.jobs[1].global_batch == 2048


def test_resolved_spec_round_trips_and_is_self_contained(tmp_path, monkeypatch):
    spec = load_spec(SMALL)
    text = resolved_yaml(spec)
    again = parse_spec(yaml.safe_load(text), "stored.yaml")
    assert resolved_yaml(again) == text and spec_hash(again) == spec_hash(spec)
    # the stored text does not need the catalogs any more
    monkeypatch.setattr("sweep.engine.catalog.REPO_ROOT", tmp_path)
    monkeypatch.chdir(tmp_path)
    alone = parse_spec(yaml.safe_load(text), "stored.yaml")
    assert [v.hardware for v in expand_variants(alone)] == \
        [v.hardware for v in expand_variants(spec)]


def test_plan_units_cover_every_case_exactly():
    plan = make_plan(load_spec(SMALL))
    assert len(plan.cases) == 1 * 4 * 2 * 2
    for case in plan.cases:
        u = plan.units[plan.units["case_id"] == case.case_id]
        assert u["start"][0] == 0 and u["stop"][-1] == case.candidates
        assert (u["start"][1:] == u["stop"][:-1]).all()
        assert ((u["stop"] - u["start"]) <= 4096).all()
    assert (plan.units["unit_id"] == np.arange(len(plan.units))).all()


def test_useless_gpu_count_is_refused():
    with pytest.raises(SpecError, match="t.yaml: gpus: 131 GPUs has no valid configuration"):
        make_plan(spec_of(gpus=[131, 4096]))


def test_partition_is_dealt_in_balanced_runs_and_deterministic():
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 65536, 3000)
    for ranks in (1, 2, 3, 7, 64):
        owner = assign_units(sizes, ranks)
        assert set(owner) == set(range(ranks))
        # 8 contiguous runs per rank, dealt in turn
        runs = 1 + np.count_nonzero(np.diff(owner))
        assert runs <= 8 * ranks and (ranks == 1 or runs >= min(8 * ranks, len(sizes)) // 2)
        loads = np.bincount(owner, weights=sizes + UNIT_OVERHEAD, minlength=ranks)
        assert loads.max() - loads.mean() <= 8 * (65536 + UNIT_OVERHEAD)
        assert (assign_units(sizes, ranks) == owner).all()
    # one run per rank: contiguous, non-decreasing
    owner = assign_units(sizes, 3, chunks=1)
    assert (np.diff(owner) >= 0).all()
    # a cost the estimate misses (the second half of the plan costs 1.5x per candidate)
    # evens out when runs are dealt, not when each rank gets one block
    true_cost = np.where(np.arange(3000) < 1500, 1.0, 1.5) * (sizes + UNIT_OVERHEAD)
    dealt = np.bincount(assign_units(sizes, 2), weights=true_cost)
    block = np.bincount(assign_units(sizes, 2, chunks=1), weights=true_cost)
    assert imbalance(dealt) < 0.05 < imbalance(block)
    assert imbalance(np.array([1.0, 1.0])) == 0.0
    assert imbalance(np.array([3.0, 1.0])) == pytest.approx(0.5)


def test_shared_tail_is_the_plans_end_in_ordered_pieces_of_equal_cost():
    rng = np.random.default_rng(1)
    sizes = rng.integers(1, 65536, 3000)
    cost = sizes + UNIT_OVERHEAD
    for ranks in (2, 3, 64):
        owner, piece = share_units(sizes, ranks, shared=0.3, shared_chunks=16)
        tail = owner < 0
        assert ((piece >= 0) == tail).all()  # every unit dealt or in the tail, not both
        # the tail is the plan's end, about 30 % of the cost
        assert tail[np.argmax(tail):].all() and not tail[0]
        assert abs(cost[tail].sum() / cost.sum() - 0.3) < 65536 / cost.sum() + 1e-9
        # the head is dealt as assign_units deals it
        assert (owner[~tail] == assign_units(sizes[~tail], ranks)).all()
        # pieces: numbered 0, 1, ... in plan order, without gaps, near-equal in cost
        assert (np.diff(piece[tail]) >= 0).all() and set(piece[tail]) == set(
            range(piece.max() + 1))
        loads = np.bincount(piece[tail], weights=cost[tail])
        # (64 ranks: 1,024 cuts, ~900 units in the tail: some cuts hold none)
        assert piece.max() + 1 == 16 * ranks if ranks < 64 else piece.max() + 1 <= 16 * ranks
        assert loads.max() - loads.min() <= 2 * (65536 + UNIT_OVERHEAD)
        again = share_units(sizes, ranks)  # deterministic
        assert (again[0] == owner).all() and (again[1] == piece).all()
    # one rank shares nothing; nor does shared=0
    for owner, piece in (share_units(sizes, 1), share_units(sizes, 4, shared=0.0)):
        assert (piece == -1).all() and (owner >= 0).all()
    assert (share_units(sizes, 4, shared=0.0)[0] == assign_units(sizes, 4)).all()
    # fewer units than pieces: one unit a piece at most
    owner, piece = share_units(np.full(10, 1000), 2)
    assert (np.diff(piece[owner < 0]) == 1).all()
    with pytest.raises(ValueError):
        share_units(sizes, 2, shared=1.0)
    # many ranks: fewer pieces each (rank 0 answers every request), never fewer than 2
    from sweep.engine.partition import shared_pieces_per_rank

    assert [shared_pieces_per_rank(r) for r in (1, 2, 64, 128, 512, 4096)] == \
        [16, 16, 16, 8, 2, 2]
    owner, piece = share_units(rng.integers(1, 65536, 30000), 256)
    assert piece.max() + 1 == 4 * 256


def test_pps_sample_draws_each_unit_in_proportion_to_its_candidates():
    from sweep.analysis.bench import pps_sample

    rng = np.random.default_rng(1)
    sizes = rng.integers(1, 65536, 500).astype(float)
    sizes[7] = 40 * 65536  # one unit holding about a quarter of the plan
    for samples in (1, 24, 1000):
        picked = pps_sample(sizes, samples)
        counts = np.bincount(picked, minlength=len(sizes))
        expected = samples * sizes / sizes.sum()
        assert len(picked) == samples and (counts >= np.floor(expected) - 1e-9).all()
        assert (counts <= np.ceil(expected) + 1e-9).all()
    assert not (np.diff(pps_sample(sizes, 24)) >= 0).all()  # shuffled, so a budget cut spreads
    assert (pps_sample(sizes, 24) == pps_sample(sizes, 24)).all()


def test_plan_estimates_from_sampled_units(capsys):
    import json

    from sweep.cli import main

    assert main(["plan", str(SMALL), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["candidates"] == sum(c["candidates"] for c in report["cases"]) == 126202
    assert 1 <= report["units_timed"] <= 24 and report["estimated_core_seconds"] > 0
    assert report["candidates_per_core_second"] == pytest.approx(
        report["candidates"] / report["estimated_core_seconds"])
    assert main(["plan", str(SMALL)]) == 0
    assert "sampled work units searched here at" in capsys.readouterr().out


def test_plan_json_streams_what_the_plan_objects_say(capsys, monkeypatch):
    """sweep plan --json writes variants and cases a slice at a time from labels alone: the
    same records as the Variant and Case objects of the plan (several groups, zipped axes,
    slices of 7)."""
    import json

    from sweep.cli import main
    from sweep.cli import run as cli_run
    from sweep.engine.plan import make_plan

    monkeypatch.setattr(cli_run, "_JSON_SLICE", 7)
    spec = REPO / "specs" / "nersc-generations-gpt3_1T.yaml"
    assert main(["plan", str(spec), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    from sweep.engine.spec import load_spec

    plan = make_plan(load_spec(str(spec)))
    assert report["variants"] == [{"variant_id": v.variant_id, "label": v.label,
                                   "swept": dict(v.swept)} for v in plan.variants]
    assert report["cases"] == [{"case_id": c.case_id, "job": c.job.name,
                                "hardware": c.variant.label, "strategy": c.strategy,
                                "n_gpus": c.n_gpus, "candidates": c.candidates}
                               for c in plan.cases]
    assert list(report)[:7] == ["name", "cost_model", "jobs", "variants", "strategies",
                                "gpus", "cases"]


def test_each_variant_equals_its_axes_applied_from_the_base():
    """Variants reuse the hardware of a grid prefix; each must equal applying its points to
    the base one by one, in grid order, also where two axes touch the same peak."""
    import dataclasses

    from sweep.model.hardware import apply_overrides

    s = spec_of(hardware={"base": ["nersc-A100", "nersc-B200"], "grid": {
        "matrix_tflops": [300, 900], "nvlink_domain": [4, 8, 72],
        "peaks": {"zip": {"matrix_tflops": [500, 700], "hbm_GBps": [1000, 3000]}},
        "nics_per_gpu": [1, 4]}})
    variants = expand_variants(s)
    assert len(variants) == 2 * 2 * 3 * 2 * 2
    axes = s.hardware[0].axes
    per_base = len(variants) // 2
    for v in variants:
        k, points = v.variant_id % per_base, []
        for ax in reversed(axes):  # the last axis varies fastest
            points.insert(0, ax.points[k % len(ax.points)])
            k //= len(ax.points)
        hw = s.bases[v.base]
        for point in points:
            hw = apply_overrides(hw, point, s.source)
        assert v.hardware == dataclasses.replace(hw, name=v.label)


def test_set_replaces_spec_keys_before_validation(tmp_path, capsys):
    from sweep.cli import main

    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\njobs: [llama3_8b]\ngpus: [64, 128]\n"
                    "hardware: {base: [H100-SXM], grid: {nvlink_domain: [8, 72]}}\n")
    s = load_spec(spec, overrides=["gpus=16", "hardware.grid.nvlink_domain=[8]",
                                   "jobs=[{name: llama3_8b, seq_len: 4096}]"])
    assert tuple(s.gpus) == (16,) and s.jobs[0].seq_len == 4096
    assert len(make_plan(s).cases) == 2  # one variant, 1d and 2d
    # the file itself is untouched, and the run records what it resolved to
    assert "gpus: [64, 128]" in spec.read_text()
    for bad, message in (("gpus", f"{spec}: --set: 'gpus' is not KEY=VALUE"),
                         ("gpus=-3", f"{spec}: gpus[0]: expected a positive integer"),
                         ("name.x=3", f"{spec}: --set name.x: name is not a mapping"),
                         # (errors name list items jobs[0].x; --set takes whole lists)
                         ("jobs[0]=llama3_70b",
                          f"{spec}: --set jobs[0]: a list item cannot be set alone"),
                         ("gpus=[1", f"{spec}: --set gpus: '[1' is not a YAML value"),
                         # read as the files are: their limits, duplicate keys, bad dates
                         ("jobs=[{name: llama3_8b, hidden: 2, hidden: 4}]",
                          "is not a YAML value (duplicate key"),
                         ("top_n=2024-13-45", "is not a YAML value (cannot read '2024-13-45'"),
                         ("gpus=" + "9" * 5000, "is not a YAML value (an integer of 5000"),
                         ("description=" + _ALIAS_BOMB,
                          "is not a YAML value (more than 1,000,000 YAML nodes")):
        assert main(["plan", str(spec), "--set", bad]) == 2, bad
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (bad, err)


#: a YAML value of 10^7 nodes once its aliases are expanded, in 7 short lines
_ALIAS_BOMB = "[&a [x,x,x,x,x,x,x,x,x,x], " + ", ".join(
    f"&{b} [{', '.join([f'*{a}'] * 10)}]" for a, b in zip("abcdef", "bcdefg")) + "]"


def test_set_takes_numbers_in_exponent_form(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\njobs: [llama3_8b]\ngpus: [64]\n"
                    "hardware: {base: [H100-SXM], grid: {hbm_GBps: [3.35e3, 5e3]}}\n")
    s = load_spec(spec, overrides=["hardware.grid.hbm_GBps=[4e3]"])
    assert s.hardware[0].axes[0].labels == (4000.0,)
    assert load_spec(spec).hardware[0].axes[0].labels == (3350.0, 5000.0)


def test_resolved_definitions_are_checked_where_they_are(tmp_path, capsys):
    """A spec's ``resolved:`` section (written by sweep, editable by hand): a wrong shape
    or a bad definition is one line naming its place there, never a traceback."""
    from sweep.cli import main

    spec = tmp_path / "r.yaml"
    for resolved, message in (
            ("{jobs: [llama3_8b]}", "resolved.jobs: expected a mapping of names"),
            ("{hardware: H100-SXM}", "resolved.hardware: expected a mapping of names"),
            ("{jobs: {llama3_8b: {n_layers: 2}}}", "resolved.jobs.llama3_8b.hidden: missing"),
            ("{jobs: {llama3_8b: 5}}", "resolved.jobs.llama3_8b: expected a mapping of job")):
        spec.write_text("name: r\njobs: [llama3_8b]\ngpus: [8]\nhardware: {base: H100-SXM}\n"
                        f"resolved: {resolved}\n")
        assert main(["plan", str(spec)]) == 2, resolved
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{spec}: {message}" in err[0], (resolved, err)


def test_memory_estimate_by_hand(monkeypatch):
    """estimate_memory: the plan and the compiled loops on every rank, each rank's share of
    the results it holds (its dealt share and at most the whole shared tail of top-N rows
    and work units, at most SEAL_ROWS), and on rank 0 also the reduction
    (every work unit, a few numbers per case, one slice, the in-memory results file), in
    bytes."""
    from sweep.engine import plan as plan_module
    from sweep.engine.plan import (
        MPI_BYTES,
        REDUCE_BYTES_PER_CASE,
        REDUCE_BYTES_PER_UNIT,
        REDUCE_SLICE_BYTES,
        RUN_BYTES_PER_ROW,
        estimate_memory,
    )
    from sweep.engine.store import COMPRESSED_FRACTION
    from sweep.model.search import BLOCK_CACHE_BYTES, BLOCK_ROW_BYTES

    plan = make_plan(load_spec(str(SMALL)))
    with_rows = sum(1 for c in plan.cases if c.candidates > 0)
    rows = with_rows * plan.spec.top_n
    units, cases = len(plan.units), len(plan.cases)
    m = estimate_memory(plan, 4, base_bytes=50e6, plan_bytes=10e6, working_bytes=5e6)
    # the column blocks kept of its mid-sized spaces (16,385 - 131,072 candidates), at most
    # BLOCK_CACHE_BYTES (search.BlockCache)
    counts = np.array([c.candidates for c in plan.cases])
    kept = counts[(counts > 65536 // 4) & (counts <= 2 * 65536)].sum()
    assert kept > 0  # (else this proves little)
    assert m["blocks"] == min(BLOCK_CACHE_BYTES, BLOCK_ROW_BYTES * kept)
    fixed = 65e6 + MPI_BYTES + m["blocks"]
    assert m["rows"] == rows
    # a rank's dealt quarter of 70 %, and at most all of the shared 30 %
    held = RUN_BYTES_PER_ROW * (rows + units) * (0.7 / 4 + 0.3)
    assert m["rank"] == pytest.approx(fixed + held)
    image = rows * 281.0 + cases * 740.0 + units * 72.0  # small: built in memory
    reduce = (REDUCE_BYTES_PER_UNIT * units + REDUCE_BYTES_PER_CASE * cases
              + REDUCE_SLICE_BYTES + COMPRESSED_FRACTION * image)
    assert m["rank0"] == pytest.approx(fixed + held + reduce)
    assert m["serial"] == pytest.approx(65e6 + m["blocks"] + RUN_BYTES_PER_ROW * (rows + units)
                                        + reduce)
    # the compiled loops' memory (numba, LLVM: measured by the warm-up) on every rank
    loaded = estimate_memory(plan, 4, base_bytes=50e6, plan_bytes=10e6, working_bytes=5e6,
                             startup_bytes=120e6)
    assert all(loaded[k] == pytest.approx(m[k] + 120e6) for k in ("rank", "rank0", "serial"))
    # more ranks never need more memory per rank
    per = [estimate_memory(plan, r, 50e6, 10e6, 5e6)["rank"] for r in (2, 4, 8, 64)]
    assert per == sorted(per, reverse=True)
    # a rank seals what it holds past SEAL_ROWS: its share stops growing there, plus the
    # case that crossed it, the one searched and a search's top-N merged into it
    monkeypatch.setattr(plan_module, "SEAL_ROWS", 10)
    sealed = estimate_memory(plan, 1, 50e6, 10e6, 5e6)
    assert sealed["rank"] == pytest.approx(65e6 + m["blocks"] + RUN_BYTES_PER_ROW
                                           * (10 + 3 * plan.spec.top_n))


def test_max_memory_refuses_before_anything_is_written(tmp_path, capsys):
    import json

    from sweep.cli import main

    assert main(["plan", str(SMALL), "--json", "--ranks", "3"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory_bytes"]
    assert memory["ranks"] == 3 and memory["rank0_with_reduction"] >= memory["per_rank"] > 0
    assert memory["working_bytes"] > 0 and memory["startup_bytes"] >= 0
    assert main(["plan", str(SMALL), "--max-memory", "1MiB"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-memory" in err and "more than 0.00105 GB" in err
    assert main(["run", str(SMALL), "--serial", "--out", str(tmp_path / "r"),
                 "--max-memory", "1MiB"]) == 2
    assert "--max-memory" in capsys.readouterr().err and not (tmp_path / "r").exists()
    with pytest.raises(SystemExit) as exc:  # a bare number: no unit (argparse, exit 2)
        main(["plan", str(SMALL), "--max-memory", "5"])
    assert exc.value.code == 2 and "in bytes" in capsys.readouterr().err
    for command in ("plan", "run"):  # a negative size names itself (argparse took it for an
        with pytest.raises(SystemExit) as exc:  # option: "expected one argument")
            main([command, str(SMALL), "--max-memory", "-1GB"])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "expected a positive size, got '-1GB'" in err, err
    assert main(["run", str(SMALL), "--serial", "--out", str(tmp_path / "ok"), "--quiet",
                 "--max-memory", "8GiB"]) == 0


MIXED_GRID = """
name: mixed
cost_model: calibrated
jobs: [bert_large]
gpus: [8]
strategies: [1d]
hardware:
  - base: [H100-SXM, B200]
    grid:
      hbm_GBps: [2000, 4000, 8000]
      pair: {zip: {nvlink_domain: [4, 8], host_memory_GiB: [0.5, 512]}}
      nics_per_gpu: [1, 2]
  - base: A100-80GB
    grid:
      gen: {interpolate: [A100-80GB, H100-SXM], points_per_segment: 3,
            keys: [hbm_bandwidth, matrix_flops]}
      nvlink_domain: [2, 8]
"""


@pytest.mark.parametrize("source", ["specs/nersc-flops-capacity.yaml",
                                    "specs/nersc-generations-gpt3_1T.yaml",
                                    "specs/nersc-b200-hbm-grid.yaml", "mixed"])
def test_lazy_variants_equal_the_expanded_list(source, tmp_path):
    """Variants built by id (in any order) are those of expand_variants; the per-variant
    space fields, label widths and record keys computed without building every variant
    agree with building them all."""
    from sweep.engine.variants import Variants

    if source == "mixed":
        path = tmp_path / "mixed.yaml"
        path.write_text(MIXED_GRID)
    else:
        path = REPO / source
    spec = load_spec(str(path))
    expected = expand_variants(spec)
    lazy = Variants(spec)
    assert len(lazy) == len(expected) and list(lazy) == expected
    order = np.random.default_rng(1).permutation(len(expected))
    assert all(lazy[int(i)] == expected[int(i)] for i in order)
    assert lazy[-1] == expected[-1] and lazy[1:3] == expected[1:3]
    which, values = lazy.per_variant(frozenset({"nvlink_domain", "host_memory_bytes"}),
                                     lambda h: (h.nvlink_domain, h.host_memory_bytes > 0))
    assert [values[i] for i in which] == [(v.hardware.nvlink_domain,
                                           v.hardware.host_memory_bytes > 0) for v in expected]
    widths = lazy.widths()
    assert widths["hardware"] == max(len(v.label.encode()) for v in expected)
    assert widths["swept"] == max(len(json.dumps(dict(v.swept)).encode()) for v in expected)
    assert lazy.record_keys() == sorted({k for v in expected for k in v.hardware.record()})
    plan = make_plan(spec)  # the cases' candidate counts: as each case's own space says
    from sweep.engine.plan import SpaceCache
    cache = SpaceCache(spec.cost_model, offload=spec.offload)
    assert all(plan.cases[i].candidates == cache.of(plan.cases[i]).size
               for i in range(len(plan.cases)))


def test_estimate_warms_up_each_job_and_strategy_untimed(monkeypatch):
    """sweep plan's estimate searches a job and strategy's first sampled unit once, untimed
    (its first rows; or, for a small case a rank searches in one block with the others of
    its space, that block: per-row hardware, other compiled loops), before timing any of
    its units, so that loading the compiled loops (about a second on a cold process) is not
    charged to the candidates of the unit timed first; such a charge put the quickstart at
    131 s on 2 ranks against a 3 s run."""
    from sweep.analysis import bench
    from sweep.engine import plan as plan_module
    from sweep.engine.plan import SpaceCache

    spec = load_spec(SMALL)
    cache = SpaceCache(spec.cost_model)
    plan = make_plan(spec, cache)
    calls = []
    clock = [0.0]

    def search_range(profile, job, hw, strategy, n, space, start, stop, top_n, blocks=None):
        calls.append(((job.name, strategy, "alone"), start, stop))
        clock[0] += 1.0  # (every search "costs" a second of CPU time)

    def search_cases(profile, job, hws, strategy, n, space, top_n):
        calls.append(((job.name, strategy, "batched"), 0, space.size))
        clock[0] += 1.0

    monkeypatch.setattr("sweep.model.search.search_range", search_range)
    monkeypatch.setattr("sweep.model.search.search_cases", search_cases)
    monkeypatch.setattr(plan_module.time, "process_time", lambda: clock[0])
    out = bench.estimate_search_seconds(plan, cache, samples=24, budget_s=1e9)
    keys = {k for k, _, _ in calls}
    assert len(keys) >= 2  # (the small spec has several jobs or strategies)
    if any(plan_module.batched(plan, plan.units[u]) for u in bench.pps_sample(
            (plan.units["stop"] - plan.units["start"]).astype(float), 24)):
        assert any(k[2] == "batched" for k in keys)  # (small cases, warmed as batched)
    first = {}
    for i, (key, start, stop) in enumerate(calls):
        first.setdefault(key, i)
    for key, i in first.items():
        _, start, stop = calls[i]
        assert stop - start <= plan_module.WARM_UP_ROWS  # a prefix or a small block, untimed
        assert i + 1 < len(calls) and calls[i + 1][0] == key  # then that key's timed unit
    # each timed unit cost one "second": the warm-ups were not counted
    assert out["cpu_seconds"] == out["units_timed"] == len(calls) - len(keys)
    assert out["startup_seconds"] == len(keys)

def test_plan_says_why_an_moe_job_has_no_2d_candidate(tmp_path, capsys):
    from sweep.cli import main

    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\njobs: [qwen3_30b_a3b, llama3_8b]\ngpus: [64]\n"
                    "hardware: {base: [H100-SXM]}\n")
    assert main(["plan", str(spec)]) == 0
    assert "1 case(s) have no candidate (2d (SUMMA) models dense multi-head blocks only, " \
           "not an MoE, MLA or hybrid job's: 1)" in capsys.readouterr().out


@pytest.mark.parametrize("variants", [1, 3])
def test_working_set_batches_no_more_variants_than_the_plan_has(variants, monkeypatch):
    """The memory estimate searches a small space in a block of its variants as a run
    would: as many as the plan has (one: the case alone), not DEFAULT_BLOCK // candidates
    copies of one (936 copies of a 70-candidate case ran compiled loops a run never loads:
    a first `sweep plan` of 95 s)."""
    from sweep.engine.plan import SpaceCache, measure_working_set
    from sweep.model import search

    grid = {"hbm_GB": [80, 96, 120][:variants]} if variants > 1 else None
    raw = {"name": "t", "jobs": ["llama3_8b"], "gpus": [3], "strategies": ["1d"],
           "hardware": {"base": "H100-SXM", **({"grid": grid} if grid else {})}}
    spec = parse_spec(raw, "t.yaml")
    cache = SpaceCache(spec.cost_model)
    plan = make_plan(spec, cache)
    assert 4 * plan.cases.candidates.max() <= search.DEFAULT_BLOCK  # (a small space)
    seen = []
    real = search.search_cases

    def counted(profile, job, hws, *args, **kw):
        seen.append(len(hws))
        return real(profile, job, hws, *args, **kw)

    monkeypatch.setattr(search, "search_cases", counted)
    assert measure_working_set(plan, cache) > 0
    assert seen == [variants]


def test_the_reference_spec_in_the_docs_is_a_valid_spec(tmp_path):
    """docs/specs.md's every-key example parses as it stands (it set HBM bandwidth on three
    axes, which a spec refuses: a user copying it got exit 2; an outside test's finding)."""
    import re

    text = (REPO / "docs" / "specs.md").read_text()
    example = tmp_path / "every-key.yaml"
    example.write_text(re.search(r"```yaml\n(.*?)```", text, re.DOTALL).group(1))
    spec = load_spec(str(example))
    assert spec.name == "gpt3-1T-generations" and len(spec.gpus) == 8


def test_integers_in_exponent_form_are_integers(tmp_path):
    """docs/specs.md: numbers may be written in exponent form, in files and --set values
    alike; YAML reads 1.6e1 as 16.0, which integer keys took for a non-integer."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    text = (REPO / "jobs" / "llama3_8b.yaml").read_text()
    (jobs / "own.yaml").write_text(text.replace("seq_len: 8192", "seq_len: 8.192e3")
                                   .replace("name: llama3_8b", "name: own"))
    assert "8.192e3" in (jobs / "own.yaml").read_text()
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\njobs: [own]\ngpus: [6.4e1]\ntop_n: 1.6e1\n"
                    "hardware: {base: H100-SXM}\n")
    parsed = load_spec(str(spec))
    assert parsed.top_n == 16 and type(parsed.top_n) is int and parsed.gpus == (64,)
    assert parsed.jobs[0].seq_len == 8192 and type(parsed.jobs[0].seq_len) is int
    # a fraction is still refused
    spec.write_text("name: s\njobs: [own]\ngpus: [64]\ntop_n: 1.5\nhardware: {base: H100-SXM}\n")
    with pytest.raises(SpecError, match="top_n: expected a positive integer, got 1.5"):
        load_spec(str(spec))

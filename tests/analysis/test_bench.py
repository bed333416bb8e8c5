"""`sweep bench`'s measurements: how they are scheduled."""

from __future__ import annotations

import pytest

from sweep.analysis import bench


def test_measurements_take_turns_so_that_each_workload_spans_the_bench(monkeypatch):
    log = []

    class Stub:
        def __init__(self, w, wanted):
            self.name, self.wanted, self.times, self.count = w, wanted, [], 7
            log.append(("warm", w))

        def measure(self):
            if len(self.times) < self.wanted:
                self.times.append(len(log) / 100)
                log.append(("measure", self.name))

    monkeypatch.setattr(bench, "_Timer", Stub)
    out = bench._time_workloads(["a", "b", "c"], [3, 1, 2])
    # every workload warmed up first, then one measurement of each per round
    assert log == [("warm", "a"), ("warm", "b"), ("warm", "c"),
                   ("measure", "a"), ("measure", "b"), ("measure", "c"),
                   ("measure", "a"), ("measure", "c"),
                   ("measure", "a")]
    # each workload's best (least) time, with its candidate count
    assert out == [(7, 0.03), (7, 0.04), (7, 0.05)]


class _Space:
    size = 3


def _timer(monkeypatch, first_run_s: float, wanted: int):
    """A _Timer of one case whose runs take ``first_run_s`` CPU seconds each (the search
    and the clock stubbed): (timer, runs made)."""
    clock, runs = [0.0], []

    def search(*args):
        runs.append(args)
        clock[0] += first_run_s

    monkeypatch.setattr(bench, "enumerate_space", lambda *args: _Space())
    monkeypatch.setattr(bench, "search_cases", search)
    monkeypatch.setattr(bench.time, "process_time", lambda: clock[0])
    w = bench.Workload("w", "nersc2024", (("gpt3_1T", "nersc-B200", 8, "1d", 64),))
    return bench._Timer(w, wanted), runs


def test_a_long_warm_up_run_counts_as_the_first_measurement(monkeypatch):
    timer, runs = _timer(monkeypatch, 0.5, 2)  # (>= MIN_MEASURED_S, < 1 s: run twice)
    assert len(runs) == 2 and timer.times == [0.5] and timer.loops == 1 and timer.count == 3
    timer.measure()
    timer.measure()  # (a third measurement is not wanted)
    assert len(runs) == 3 and timer.times == [0.5, 0.5]


def test_a_short_workload_is_repeated_until_it_has_run_long_enough(monkeypatch):
    timer, runs = _timer(monkeypatch, 0.03, 3)
    # (a warm-up run, a loop of 1 run: 0.03 s; then ceil(1.05 * 0.2 / 0.03) = 8 runs, 0.24 s)
    assert timer.times == pytest.approx([0.03]) and timer.loops == 8
    for _ in range(4):
        timer.measure()
    assert len(runs) == 1 + 1 + 3 * 8 and timer.times == pytest.approx([0.03] * 3)


def test_a_loop_too_short_is_timed_again_with_more_runs(monkeypatch):
    """A second run that still loads compiled loops would set too few runs a loop: the
    loop that lasts under MIN_MEASURED_S is run again with more, until one lasts that
    long (and counts as the first measurement)."""
    clock, runs = [0.0], []

    def search(*args):  # (a first run of 0.5 s, a second of 1/8 s, then 1/1024 s each)
        runs.append(args)
        clock[0] += (0.5, 0.125)[len(runs) - 1] if len(runs) <= 2 else 2.0**-10

    monkeypatch.setattr(bench, "enumerate_space", lambda *args: _Space())
    monkeypatch.setattr(bench, "search_cases", search)
    monkeypatch.setattr(bench.time, "process_time", lambda: clock[0])
    w = bench.Workload("w", "nersc2024", (("gpt3_1T", "nersc-B200", 8, "1d", 64),))
    timer = bench._Timer(w, 2)
    # (a loop of 1 run: 1/8 s, so ceil(1.05 * 1.6) = 2 runs; 2 runs: 2/1024 s, which asks
    # for ceil(1.05 * 204.8) = 216 but a step grows 10x at most: 20 runs, then 200 (0.195
    # s), then 216: 0.211 s)
    assert timer.loops == 216 and timer.times == [2.0**-10]
    assert len(runs) == 1 + 1 + 2 + 20 + 200 + 216


def test_a_clock_that_reads_zero_does_not_explode_the_loop_count(monkeypatch):
    """A process clock too coarse for a loop (it reads 0 s) grows the loop 10x a step, not
    to 2e8 runs at once."""
    clock, runs = [0.0], []

    def search(*args):  # (a first run of 0.5 s, 110 runs the clock cannot see, then 10 ms)
        runs.append(args)
        clock[0] += 0.5 if len(runs) == 1 else (0.0 if len(runs) < 1 + 1 + 10 + 100 else 0.01)

    monkeypatch.setattr(bench, "enumerate_space", lambda *args: _Space())
    monkeypatch.setattr(bench, "search_cases", search)
    monkeypatch.setattr(bench.time, "process_time", lambda: clock[0])
    w = bench.Workload("w", "nersc2024", (("gpt3_1T", "nersc-B200", 8, "1d", 64),))
    timer = bench._Timer(w, 1)
    # (loops of 1, 10 and 100 runs read 0 s, the last 100 s 10 ms: then 1,000 runs, 10 s)
    assert timer.loops == 1000 and len(runs) == 1 + 1 + 10 + 100 + 1000
    assert timer.times == [pytest.approx(0.01)]


def test_plan_estimate_keeps_compiling_out_of_the_search_rate(monkeypatch):
    """A sampled unit whose search met a graph the warm-up did not (compiled there: seconds
    to minutes on a machine's first run) counts that time as start-up, not search: a cold
    cache made sweep plan's first estimate 40 times the next one (from an outside tester)."""
    from sweep.engine.plan import SpaceCache, make_plan
    from sweep.engine.spec import parse_spec
    from sweep.model.cost import fuse

    spec = parse_spec({"name": "t", "jobs": ["llama3_8b"], "gpus": [8],
                       "hardware": {"base": "H100-SXM"}}, "t.yaml")
    cache = SpaceCache(spec.cost_model)
    plan = make_plan(spec, cache)
    clock = [0.0]
    monkeypatch.setattr(bench.time, "process_time", lambda: clock[0])
    monkeypatch.setattr(bench, "warm_up", lambda *a: (0.0, 0.0))

    def search(plan, cache, unit, stop=None, compile_s=0.0):
        clock[0] += 0.01 + compile_s  # 10 ms of search per unit, and what compiling took
        fuse._add_startup(compile_s)
        return 1

    monkeypatch.setattr(bench, "search_unit", search)
    warm = bench.estimate_search_seconds(plan, cache, samples=4, budget_s=10.0)
    monkeypatch.setattr(bench, "search_unit", lambda *a: search(*a, compile_s=5.0))
    cold = bench.estimate_search_seconds(plan, cache, samples=4, budget_s=10.0)
    assert cold["core_seconds"] == pytest.approx(warm["core_seconds"])
    assert cold["startup_seconds"] == pytest.approx(warm["startup_seconds"] + 5.0 * cold[
        "units_timed"])

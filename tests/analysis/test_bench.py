"""`sweep bench`'s measurements: how they are scheduled."""

from __future__ import annotations

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


"""sweep.analysis.results, sweep plot and sweep report: the plotted numbers are the HDF5 numbers.

The expected values are read from sweep.h5 with plain h5py, independently of
sweep.analysis.results.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import h5py
import numpy as np
import pytest

from sweep.analysis.plot import (
    KINDS,
    PlotOptions,
    axis_label,
    draw,
    kinds_that_fit,
    save,
    why_not,
)
from sweep.analysis.report import MARKER, write_report
from sweep.analysis.results import MEMORY_PARTS, TIME_PARTS, open_results
from sweep.analysis.show import format_rows, load_rows
from sweep.cli import main
from sweep.cli.run import _Progress
from sweep.engine.parallel import SerialComm
from sweep.engine.reduce import reduce_run
from sweep.engine.runner import RunOptions, run_sweep
from sweep.engine.store import Table, read_columns, read_results, write_results
from sweep.errors import SweepError
from tests.analysis.conftest import GRID_SPEC
from tests.conftest import DATA


@pytest.fixture(scope="module")
def nersc(tmp_path_factory):
    """nersc2024: 2 systems x 2 NVLink sizes x 2 strategies (1d, 2d-seqp) x 2 GPU counts."""
    out = tmp_path_factory.mktemp("nersc") / "small"
    run_sweep(str(DATA / "specs" / "small.yaml"), SerialComm(), RunOptions(out_dir=out))
    return out / "sweep.h5"


def raw(path):
    """(cases, top) straight from the file."""
    with h5py.File(path, "r") as f:
        return f["cases"][:], f["top"][:]


def best_of(path):
    """{case_id: place-0 row} from the file."""
    _, top = raw(path)
    return {int(r["case_id"]): r for r in top[top["place"] == 0]}


# ------------------------------------------------------------------------------ results

def test_results_tables_and_helpers(nersc):
    cases, top = raw(nersc)
    res = open_results(nersc)
    assert res.complete and res.note == "" and res.cost_model == "nersc2024"
    assert len(res.cases) == len(cases) and len(res.top) == len(top)
    assert set(res.cases["strategy"]) == {"1d", "2d-seqp"}  # text decoded
    best = res.best()
    expected = best_of(nersc)
    assert sorted(best["case_id"]) == sorted(expected)
    for _, r in best.iterrows():
        assert r["samples_per_s"] == expected[r["case_id"]]["samples_per_s"]
        assert r["n_gpus"] == cases[cases["case_id"] == r["case_id"]]["n_gpus"][0]
    per = res.best_per_system()
    for (job, variant, n), group in best.groupby(["job", "variant_id", "n_gpus"]):
        row = per[(per["job"] == job) & (per["variant_id"] == variant) & (per["n_gpus"] == n)]
        assert len(row) == 1 and row["samples_per_s"].iloc[0] == group["samples_per_s"].max()


def test_grid_over_two_swept_axes(grid):
    res = open_results(grid)
    assert set(res.swept_axes) == {"hbm_GBps", "hbm_GiB"}
    table = res.grid("samples_per_s", "hbm_GBps", "hbm_GiB", n_gpus=32)
    cases, top = raw(grid)
    best = best_of(grid)
    for c in cases[cases["n_gpus"] == 32]:
        value = max(best[int(k["case_id"])]["samples_per_s"]
                    for k in cases[(cases["n_gpus"] == 32)
                                   & (cases["variant_id"] == c["variant_id"])]
                    if int(k["case_id"]) in best)
        assert table.loc[c["swept_hbm_GiB"], c["swept_hbm_GBps"]] == value
    with pytest.raises(SweepError, match="'nvlink_domain' is not a swept axis"):
        res.grid("samples_per_s", "nvlink_domain", "hbm_GiB")


def test_grid_keeps_a_swept_value_without_any_result(tmp_path):
    """1 GiB of HBM fits no configuration: its row is blank (NaN), not left out, so the
    heatmap's rows stay one per swept value."""
    spec = tmp_path / "tiny-hbm.yaml"
    spec.write_text(GRID_SPEC.replace("gpus: [16, 32]", "gpus: [16]")
                    .replace("hbm_GiB: [40, 80]", "hbm_GiB: [1, 80]").replace("name: grid",
                                                                              "name: tiny"))
    run_sweep(str(spec), SerialComm(), RunOptions(out_dir=tmp_path / "t"))
    res = open_results(tmp_path / "t" / "sweep.h5")
    table = res.grid("samples_per_s", "hbm_GBps", "hbm_GiB", n_gpus=16)
    assert list(table.index) == [1.0, 80.0] and list(table.columns) == [2000.0, 3350.0]
    assert table.loc[1.0].isna().all() and table.loc[80.0].notna().all()
    fig, heat = draw(res, "heatmap", PlotOptions(n_gpus=16))
    assert len(heat) == 4 and heat["baseline"].sum() == 1
    assert heat[heat["baseline"]]["hbm_GiB"].iloc[0] == 80.0
    assert "no feasible configuration" in fig.axes[0].get_xlabel()


def test_hardware_groups_that_sweep_other_axes_get_a_label_each(tmp_path):
    """A spec's hardware list may sweep an axis in one group and not in another: every
    figure labels each variant apart, in either order of the groups (a KeyError before)."""
    groups = ("  - {base: nersc-B200, grid: {nvlink_domain: [8, 64]}}\n",
              "  - {base: nersc-H200}\n")
    for order in (groups, groups[::-1]):
        spec = tmp_path / "groups.yaml"
        spec.write_text("name: groups\ncost_model: nersc2024\njobs: [gpt3_1T]\n"
                        "gpus: [1024, 4096]\nstrategies: [1d]\nhardware:\n" + "".join(order)
                        + "top_n: 1\n")
        out = tmp_path / f"g{order is groups}"
        run_sweep(str(spec), SerialComm(), RunOptions(out_dir=out))
        res = open_results(out / "sweep.h5")
        fig, _ = draw(res, "scaling", PlotOptions())
        labels = sorted(t.get_text() for t in fig.axes[0].texts)  # (at the lines' ends)
        assert labels == ["nersc-B200 nvlink_domain=64", "nersc-B200 nvlink_domain=8",
                          "nersc-H200"], labels
        for kind in ("pareto", "breakdown", "memory"):
            draw(res, kind, PlotOptions(n_gpus=1024))


def test_heatmap_says_it_takes_the_best_over_a_third_axis(tmp_path, grid):
    spec = tmp_path / "three.yaml"
    spec.write_text("name: three\ncost_model: nersc2024\njobs: [gpt3_1T]\ngpus: [512]\n"
                    "strategies: [1d]\nhardware:\n  base: nersc-A100\n  grid:\n"
                    "    nvlink_domain: [4, 8]\n    hbm_GBps: [1500, 3000]\n"
                    "    hbm_GiB: [40, 80]\ntop_n: 1\n")
    run_sweep(str(spec), SerialComm(), RunOptions(out_dir=tmp_path / "t"))
    res = open_results(tmp_path / "t" / "sweep.h5")
    fig, heat = draw(res, "heatmap", PlotOptions(x="hbm_GBps", y="hbm_GiB"))
    title = fig._suptitle.get_text().replace("\n", " ")
    assert "each cell the best over GPUs per NVLink domain" in title, title
    # a cell is the best of the two domains
    best = res.best_per_system()
    for _, r in heat.iterrows():
        at = best[(best["swept_hbm_GBps"] == r["hbm_GBps"])
                  & (best["swept_hbm_GiB"] == r["hbm_GiB"])]
        if np.isnan(r["samples_per_s"]):  # no configuration fits either domain
            assert at.empty
        else:
            assert r["samples_per_s"] == at["samples_per_s"].max()
    assert heat["samples_per_s"].notna().sum() >= 2
    fig, _ = draw(open_results(grid), "heatmap", PlotOptions(n_gpus=16))
    assert "each cell" not in fig._suptitle.get_text()
    # --hardware selects variants: one NVLink domain's cells, no best over the other
    eight = [h for h in res.cases["hardware"].unique() if "nvlink_domain=8," in h]
    fig, heat8 = draw(res, "heatmap", PlotOptions(x="hbm_GBps", y="hbm_GiB",
                                                 hardware=tuple(eight)))
    assert "each cell" not in fig._suptitle.get_text()
    for _, r in heat8.dropna(subset=["samples_per_s"]).iterrows():
        at = best[(best["swept_hbm_GBps"] == r["hbm_GBps"])
                  & (best["swept_hbm_GiB"] == r["hbm_GiB"]) & (best["swept_nvlink_domain"] == 8)]
        assert r["samples_per_s"] == at["samples_per_s"].iloc[0]
    with pytest.raises(SweepError, match="this sweep selection has .* varying"):
        draw(res, "heatmap", PlotOptions(hardware=(eight[0],)))
    # by default x and y are the spec's first two axes (the columns are sorted by name)
    _, default = draw(res, "heatmap")
    assert {"nvlink_domain", "hbm_GBps"} <= set(default.columns)
    assert "hbm_GiB" not in default.columns
    with pytest.raises(SweepError, match=r"--gpus 256: not a GPU count of the results "
                                          r"\(they hold 512\)"):
        draw(res, "heatmap", PlotOptions(n_gpus=256))


def test_partial_results_say_so(tmp_path):
    spec = DATA / "specs" / "small.yaml"
    out = tmp_path / "part"
    calls = []

    def stop_early(p):
        calls.append(1)
        if len(calls) == 3:
            import os
            import signal
            os.kill(os.getpid(), signal.SIGTERM)

    from sweep.engine.runner import Interrupted

    with pytest.raises(Interrupted):
        run_sweep(str(spec), SerialComm(), RunOptions(out_dir=out, progress=stop_early))
    assert main(["reduce", str(out), "--partial"]) == 0
    res = open_results(out / "sweep.h5")
    assert not res.complete and res.note.startswith("partial results:")
    assert (~res.cases["complete"]).any()
    save(res, "breakdown", tmp_path / "b.png")  # plots work, titled as partial


def test_open_results_errors(tmp_path):
    with pytest.raises(SweepError, match="no such results file"):
        open_results(tmp_path / "nope.h5")
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = 1
    with pytest.raises(SweepError, match="not a sweep results file"):
        open_results(tmp_path / "other.h5")


# ------------------------------------------------------------------------------ plots

def test_scaling_plots_best_throughput_and_ideal(nersc):
    res = open_results(nersc)
    fig, data = draw(res, "scaling")
    best = best_of(nersc)
    for _, r in data.iterrows():
        assert r["value"] == best[r["case_id"]]["samples_per_s"]
    # one ideal line per panel, from the best throughput per GPU anywhere in it: no point
    # lies above it and the best point lies on it (issue 18: no super-linear-looking curve)
    per_gpu = (data["value"] / data["n_gpus"]).max()
    assert np.allclose(data["ideal"], per_gpu * data["n_gpus"], rtol=1e-12)
    assert (data["value"] <= data["ideal"] * (1 + 1e-12)).all()
    assert np.isclose(data["value"], data["ideal"], rtol=1e-12).any()
    ax = fig.axes[0]
    ideal = ax.lines[0]
    assert np.allclose(ideal.get_ydata(), per_gpu * ideal.get_xdata(), rtol=1e-12)
    # each variant's curve is drawn: colour by base hardware, line style by NVLink domain
    styles = {}
    for line in ax.lines[1:]:
        rows = data[np.isin(data["value"], line.get_ydata())]
        variant = int(rows["variant_id"].iloc[0])
        mine = data[data["variant_id"] == variant].sort_values("n_gpus")
        assert np.array_equal(line.get_ydata(), mine["value"].to_numpy())
        row = res.best_per_system().set_index("variant_id").loc[variant].iloc[0]
        styles.setdefault(("base", row["base"]), set()).add(line.get_color())
        styles.setdefault(("nvl", int(row["nvlink_domain"])), set()).add(line.get_linestyle())
    assert all(len(v) == 1 for v in styles.values())  # one colour per base, one style per domain
    assert len({next(iter(v)) for k, v in styles.items() if k[0] == "base"}) == \
        len([k for k in styles if k[0] == "base"])
    # every line is labelled at its end (direct labels)
    assert {a.get_text() for a in ax.texts} >= {"nersc-A100 nvlink_domain=4"} or len(ax.texts) \
        == len(ax.lines) - 1
    # one label per curve, each at its curve's last point, in the curve's colour
    assert len(ax.texts) == len(ax.lines) - 1
    ends = {(line.get_xdata()[-1], line.get_ydata()[-1]): line.get_color()
            for line in ax.lines[1:]}
    assert {(a.xy, a.get_color()) for a in ax.texts} == set(ends.items())
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlabel() == "GPUs" and "samples/s" in ax.get_ylabel()
    fig, days = draw(res, "scaling", PlotOptions(metric="days", tokens=1e12))
    for _, r in days.iterrows():
        assert r["value"] == pytest.approx(1e12 / best[r["case_id"]]["tokens_per_s"] / 86400)
    # time metrics: the ideal is the least GPU-days anywhere, divided by the GPU count
    assert (days["value"] >= days["ideal"] * (1 - 1e-12)).all()
    # a selection the results do not hold is named, not reported as nothing feasible
    for opts, text in ((PlotOptions(jobs=("nojob",)), "--job 'nojob': not in the results"),
                       (PlotOptions(hardware=("X1",)), "--hardware 'X1': not in the results"),
                       (PlotOptions(strategy="3d"), "--strategy '3d': not in the results")):
        with pytest.raises(SweepError, match=text):
            draw(res, "scaling", opts)


def test_breakdown_and_memory_are_the_best_configs_parts(nersc):
    res = open_results(nersc)
    best = best_of(nersc)
    fig, data = draw(res, "breakdown")  # seconds per iteration, stacked (the study's form)
    for _, r in data.iterrows():
        b = best[r["case_id"]]
        total = sum(float(b[c]) for c in TIME_PARTS)
        assert total == pytest.approx(float(b["step_time_s"]), rel=1e-9)
        for c in TIME_PARTS:
            assert r[c] == pytest.approx(float(b[c]), rel=1e-12)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "time per iteration [s]"
    first = data[(data["job"] == data["job"].iloc[0])
                 & (data["variant_id"] == data["variant_id"].iloc[0])]
    tops = [p.get_y() + p.get_height() for p in ax.patches]
    assert max(tops) == pytest.approx(max(sum(row[c] for c in TIME_PARTS)
                                          for _, row in first.iterrows()), rel=1e-9)
    # every panel has the same GPU counts on its x axis; each bar says its layout
    ticks = {tuple(t.get_text() for t in a.get_xticklabels()) for a in fig.axes if a.patches}
    assert len(ticks) == 1
    assert any(" s  " in t.get_text() and "tp" in t.get_text() for t in ax.texts)
    _, shares = draw(res, "breakdown", PlotOptions(fractions=True))
    for _, r in shares.iterrows():  # (named t_*_share: shares, not seconds)
        b = best[r["case_id"]]
        total = sum(float(b[c]) for c in TIME_PARTS)
        for c in TIME_PARTS:
            share = c.removesuffix("_s") + "_share"
            assert r[share] == pytest.approx(float(b[c]) / total, rel=1e-12)
    fig, mem = draw(res, "memory")
    for _, r in mem.iterrows():  # (named mem_*_GB: GB, not bytes)
        for c in MEMORY_PARTS:
            gb = c.removesuffix("_bytes") + "_GB"
            assert r[gb] == pytest.approx(float(best[r["case_id"]][c]) / 1e9, rel=1e-12)
    # stacked bars: the top of the last bar of the first panel is the total memory
    ax = fig.axes[0]
    first = mem[(mem["job"] == mem["job"].iloc[0]) & (mem["variant_id"] == mem["variant_id"]
                                                      .iloc[0])]
    tops = [p.get_y() + p.get_height() for p in ax.patches]
    assert max(tops) == pytest.approx(max(sum(row[c.removesuffix("_bytes") + "_GB"]
                                              for c in MEMORY_PARTS)
                                          for _, row in first.iterrows()), rel=1e-9)
    assert ax.get_ylabel() == "memory per GPU [GB]"


def test_strategies_are_fractions_of_the_best_strategy(nersc):
    res = open_results(nersc)
    cases, _ = raw(nersc)
    best = best_of(nersc)
    fig, data = draw(res, "strategies")

    def throughput(strategy, variant, n):
        c = cases[(cases["strategy"] == strategy.encode()) & (cases["variant_id"] == variant)
                  & (cases["n_gpus"] == n)]
        return best[int(c["case_id"][0])]["samples_per_s"] if int(c["case_id"][0]) in best \
            else float("nan")

    assert set(data["strategy"]) == {"1d", "2d-seqp"}
    for (v, n), group in data.groupby(["variant_id", "n_gpus"]):
        top = max(throughput(s, v, n) for s in ("1d", "2d-seqp"))
        for _, r in group.iterrows():
            assert r["speedup"] == pytest.approx(throughput(r["strategy"], v, n) / top)
        assert group["speedup"].max() == 1.0
        assert group.loc[group["speedup"].idxmax(), "strategy"] == group["best_strategy"].iloc[0]
    # one y range on every panel
    assert len({a.get_ylim() for a in fig.axes if a.lines}) == 1


def test_layout_and_heatmap(nersc, grid):
    res = open_results(nersc)
    per = res.best_per_system().set_index("case_id")
    _, data = draw(res, "layout")
    for _, r in data.iterrows():
        assert all(r[d] == per.loc[r["case_id"], d] for d in ("tp", "cp", "pp", "dp"))
    g = open_results(grid)
    fig, heat = draw(g, "heatmap", PlotOptions(n_gpus=16))
    table = g.grid("samples_per_s", "hbm_GBps", "hbm_GiB", n_gpus=16)
    base = heat[heat["baseline"]]
    assert len(base) == 1 and base["speedup"].iloc[0] == 1.0  # the baseline cell reads 1.0
    # the lowest HBM bandwidth and capacity (that cell is feasible here)
    assert base["hbm_GBps"].iloc[0] == table.columns.min()
    assert base["hbm_GiB"].iloc[0] == table.index.min()
    for _, r in heat.iterrows():
        assert r["samples_per_s"] == table.loc[r["hbm_GiB"], r["hbm_GBps"]]
        assert r["speedup"] == pytest.approx(r["samples_per_s"] / base["samples_per_s"].iloc[0],
                                             rel=1e-12)
    image = fig.axes[0].get_images()[0].get_array()
    assert np.allclose(np.asarray(image), table.to_numpy() / base["samples_per_s"].iloc[0],
                       rtol=1e-12)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "HBM bandwidth [GB/s]" and ax.get_ylabel() == "HBM capacity [GiB]"
    from sweep.analysis.plot import _tick_text, axis_label
    assert axis_label("matrix_tflops") == "16-bit tensor peak [TFLOP/s]"
    assert axis_label("nvlink_domain") == "GPUs per NVLink domain"
    assert _tick_text([9111, 16000]) == ["9,111", "16,000"]  # not 9111 next to 1.6e+04
    assert _tick_text([0.5, 2.25]) == ["0.5", "2.25"]
    # a canonical quantity swept as strings with units: its values in SI
    assert axis_label("hbm_bandwidth") == "HBM bandwidth [B/s]"
    assert axis_label("nvlink_latency") == "NVLink latency [s]"
    assert _tick_text([3.35e12, 4.8e12]) == ["3.35 T", "4.8 T"]


def test_kinds_that_fit_and_why_not(nersc, grid):
    assert kinds_that_fit(open_results(nersc)) == ["scaling", "breakdown", "memory",
                                                   "strategies", "layout", "pareto"]
    assert "nvlink_domain" in why_not(open_results(nersc))["heatmap"]
    assert kinds_that_fit(open_results(grid)) == list(KINDS)


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml"),
                                           (".pdf", b"%PDF")])
def test_file_formats(nersc, tmp_path, suffix, magic):
    save(open_results(nersc), "scaling", tmp_path / f"s{suffix}")
    assert (tmp_path / f"s{suffix}").read_bytes().startswith(magic)
    assert not list(tmp_path.glob(".*tmp*"))


def test_plot_command(nersc, tmp_path, capsys):
    out = tmp_path / "m.png"
    assert main(["plot", str(nersc), "--kind", "memory", "-o", str(out),
                 "--data", str(tmp_path / "m.csv")]) == 0
    assert out.stat().st_size > 10_000 and "wrote" in capsys.readouterr().out
    header = (tmp_path / "m.csv").read_text().splitlines()[0].split(",")
    assert header[:4] == ["job", "variant_id", "n_gpus", "case_id"]
    # named for what they hold: GB here (the values were GB under the _bytes names)
    assert "mem_weights_GB" in header and not any(h.endswith("_bytes") for h in header)
    assert main(["plot", str(nersc), "--kind", "breakdown", "--fractions", "-o",
                 str(tmp_path / "b.png"), "--data", str(tmp_path / "b.csv")]) == 0
    header = (tmp_path / "b.csv").read_text().splitlines()[0].split(",")
    assert "t_compute_share" in header and not any(h.endswith("_s") for h in header)
    assert main(["plot", str(nersc), "--kind", "heatmap", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs two swept hardware axes" in err
    # the same kind asked of sweep report: refused alike, an earlier report left as it was
    assert main(["report", str(nersc), "-o", str(tmp_path / "rep"), "--kind", "memory"]) == 0
    before = sorted(p.name for p in (tmp_path / "rep").iterdir())
    capsys.readouterr()
    assert main(["report", str(nersc), "-o", str(tmp_path / "rep"), "--kind", "heatmap"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--kind heatmap" in err and "needs two swept" in err
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == before
    assert main(["plot", str(nersc), "--kind", "scaling", "-o", str(tmp_path / "x.jpg")]) == 2
    assert "must end in .png, .svg, .pdf" in capsys.readouterr().err
    # --data naming a folder: refused before the figure is written
    assert main(["plot", str(nersc), "--kind", "scaling", "-o", str(tmp_path / "d.png"),
                 "--data", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err and not (tmp_path / "d.png").exists()
    with pytest.raises(SystemExit) as exc:
        main(["plot", str(nersc), "--kind", "pie", "-o", str(out)])
    assert exc.value.code == 2


def test_plot_refuses_a_flag_its_kind_does_not_read(nersc, tmp_path, capsys):
    """A flag the kind would ignore is an error naming it and what the kind takes (a user
    who asks memory for --fractions, or scaling for one GPU count, would get a figure that
    silently is not what was asked); nothing is written."""
    out = tmp_path / "f.png"
    for kind, flags, named in (("memory", ["--fractions"], "--fractions"),
                               ("scaling", ["--gpus", "64"], "--gpus"),
                               ("strategies", ["--strategy", "1d"], "--strategy"),
                               ("layout", ["--metric", "days", "--tokens", "1e12"],
                                "--metric, --tokens"),
                               ("pareto", ["--x", "hbm_GBps"], "--x")):
        assert main(["plot", str(nersc), "--kind", kind, "-o", str(out), *flags]) == 2, kind
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{named}: not read by --kind {kind}" in err, err
        assert "(it takes --" in err
    assert not list(tmp_path.iterdir())
    # the flags a kind does read still work
    assert main(["plot", str(nersc), "--kind", "breakdown", "-o", str(out), "--fractions",
                 "--job", "gpt3_1T"]) == 0 and out.is_file()


def test_plot_refuses_an_axis_the_sweep_does_not_have(nersc, tmp_path, capsys):
    """--x / --y naming no swept axis is an error for every kind that reads them (breakdown
    and memory drew their default axes and said nothing); nothing is written."""
    out = tmp_path / "f.png"
    for kind, flag in (("breakdown", "--x"), ("memory", "--y"), ("strategies", "--x"),
                       ("heatmap", "--y")):
        assert main(["plot", str(nersc), "--kind", kind, "-o", str(out), flag,
                     "nosuch"]) == 2, kind
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{flag}: 'nosuch' is not a swept axis" in err, err
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # (the report's figures take ~20 s to draw; CI runs -m slow)
def test_report_folder(grid, grid_report, tmp_path, capsys):
    target = tmp_path / "report"
    target.mkdir()
    (target / "stale.txt").write_text("old")  # not written by sweep report: refused
    assert main(["report", str(grid), "-o", str(target)]) == 2
    assert "not empty and was not written by sweep report" in capsys.readouterr().err
    assert [p.name for p in target.iterdir()] == ["stale.txt"]
    target = grid_report  # sweep report GRID -o NEW (the conftest's)
    files = {p.name for p in target.iterdir()}
    assert files == {"index.html", "best.csv", MARKER} | {f"{k}.png" for k in KINDS}
    page = (target / "index.html").read_text()
    import base64
    import re
    for kind in KINDS:  # embedded, the very bytes of the PNG written next to it
        m = re.search(f'<img src="data:image/png;base64,([^"]+)" alt="{kind}"', page)
        assert m and base64.b64decode(m.group(1)) == (target / f"{kind}.png").read_bytes()
        assert f'<a href="#fig-{kind}">' in page and f'<h2 id="fig-{kind}">' in page
    assert "Best configuration per case" in page and "llama3_8b" in page
    # figures first, then the cases, then the spec
    assert page.index('id="fig-') < page.index('id="cases"') < page.index('id="spec"')
    best = (target / "best.csv").read_text().splitlines()
    assert len(best) == 1 + len(best_of(grid))
    # every field of a configuration (an MoE one's too), then its metrics
    from sweep.model.schema import CANDIDATE_DTYPE
    header = best[0].split(",")
    assert set(CANDIDATE_DTYPE.names) - {"index"} <= set(header) and "mfu" in header
    out = write_report(open_results(grid), tmp_path / "two", ["scaling"])
    assert set(out["figures"]) == {"scaling"} and out["skipped"]["memory"] == "not asked for"


def test_report_lists_the_first_cases_and_points_to_best_csv(grid, tmp_path, monkeypatch):
    import os

    import sweep.analysis.report

    res = open_results(grid)
    umask = os.umask(0o022)
    try:
        full = write_report(res, tmp_path / "all", ["scaling"])
    finally:
        os.umask(umask)
    page = (Path(full["dir"]) / "index.html").read_text()
    n_cases = len(res.cases)
    assert page.count("<tr><td>") == n_cases and "best.csv lists every case" not in page
    assert Path(full["dir"]).stat().st_mode & 0o755 == 0o755  # not private (umask 022)
    monkeypatch.setattr(sweep.analysis.report, "SUMMARY_ROWS", 3)
    capped = write_report(res, tmp_path / "capped", ["scaling"])
    page = (Path(capped["dir"]) / "index.html").read_text()
    assert page.count("<tr><td>") == 3
    assert f"The first 3 of {n_cases:,} cases; best.csv lists every case." in page


# ------------------------------------------------------------------------------ partial data

def derive(src, dst, done_cases, evaluated_cases=()):
    """A copy of ``src`` as if only ``done_cases`` were finished (their rows kept) and
    ``evaluated_cases`` had been started (counts kept, no rows); every other case pending."""
    attrs, data = read_results(src)
    columns = {k: (v["unit"], v["description"]) for k, v in read_columns(src).items()}
    cases, top, units = data["cases"].copy(), data["top"], data["units"]
    done = np.isin(cases["case_id"], list(done_cases))
    started = done | np.isin(cases["case_id"], list(evaluated_cases))
    cases["complete"] = done
    for k in ("evaluated", "feasible", "out_of_memory", "other_infeasible"):
        cases[k] = np.where(started, cases[k], 0)
    cases["best_samples_per_s"] = np.where(done, cases["best_samples_per_s"], np.nan)
    units = units[np.isin(units["case_id"], list(done_cases))]
    attrs = {**attrs, "complete": bool(done.all()), "n_units_done": len(units),
             "candidates_evaluated": int(cases["evaluated"].sum())}
    write_results(dst, attrs, Table(cases, {k: columns.get(k, ("", ""))
                                            for k in cases.dtype.names}),
                  top[np.isin(top["case_id"], list(done_cases))], units)
    return dst


@pytest.fixture(scope="module")
def partial_files(nersc, grid, tmp_path_factory):
    """Partial, single-point and empty results of both sweeps, and a real shard's share."""
    d = tmp_path_factory.mktemp("partial")
    shard = d / "shard"
    run_sweep(str(DATA / "specs" / "small.yaml"), SerialComm(),
              RunOptions(out_dir=shard, shard=(0, 3)))
    files = {"shard 0/3": reduce_run(shard, partial=True).path}
    for name, src in (("nersc", nersc), ("grid", grid)):
        files[f"{name} half"] = derive(src, d / f"{name}-half.h5", range(0, 16, 2), [1])
        files[f"{name} two"] = derive(src, d / f"{name}-two.h5", [0, 2])
        files[f"{name} one case"] = derive(src, d / f"{name}-one.h5", [3])
        files[f"{name} empty"] = derive(src, d / f"{name}-empty.h5", [], [1])
    return files


def test_partial_heatmap_marks_cells_whose_cases_are_pending(grid, tmp_path):
    """Half the strategies' cases done: every cell has a value, the best so far of the
    strategies searched, and is marked as such (an outside tester saw them unmarked)."""
    cases = read_results(grid)[1]["cases"]
    strategies = sorted(set(cases["strategy"]))
    first = cases["case_id"][cases["strategy"] == strategies[0]]
    res = open_results(derive(grid, tmp_path / "half.h5", first))
    fig, heat = draw(res, "heatmap", PlotOptions(n_gpus=16))
    label = fig.axes[0].get_xlabel()
    assert heat["samples_per_s"].notna().all()
    assert f"*: {len(heat)} cells the best so far, cases pending" in label, label
    fig, _ = draw(open_results(grid), "heatmap", PlotOptions(n_gpus=16))
    assert "*:" not in fig.axes[0].get_xlabel()


@pytest.mark.slow  # (about 30 s of figures: CI's slow run)
def test_every_kind_on_partial_single_point_and_empty_results(partial_files, tmp_path):
    """No kind crashes: it draws what exists or says (SweepError) why there is nothing;
    the kinds that fit always draw, and the report draws exactly those."""
    options = [PlotOptions(metric="days", tokens=1e12), PlotOptions(strategy="1d"),
               PlotOptions(n_gpus=16), PlotOptions(jobs=["x"])]
    for name, path in partial_files.items():
        res = open_results(path)
        assert not res.complete
        fits = kinds_that_fit(res)
        out = write_report(res, tmp_path / name.replace(" ", "-").replace("/", "-"))
        assert list(out["figures"]) == fits, name  # every kind that fits is drawn
        assert "partial results" in (tmp_path / out["dir"] / "index.html").read_text()
        for kind in KINDS:
            for opts in (options if name in ("shard 0/3", "grid half", "grid one case")
                         else []) + ([PlotOptions()] if kind not in fits else []):
                try:
                    save(res, kind, tmp_path / "k.png", opts)
                except SweepError:
                    pass
    assert "strategies" in kinds_that_fit(open_results(partial_files["shard 0/3"]))
    assert kinds_that_fit(open_results(partial_files["nersc empty"])) == []
    assert why_not(open_results(partial_files["nersc one case"]))["scaling"] == \
        "the results have one GPU count so far"


def test_show_tells_pending_from_infeasible(nersc, tmp_path):
    path = derive(nersc, tmp_path / "s.h5", [0, 1, 5], [3])
    # case 1: complete without any feasible configuration
    attrs, data = read_results(path)
    top = data["top"][data["top"]["case_id"] != 1]
    cases = data["cases"].copy()
    cases["best_samples_per_s"][1] = np.nan
    columns = {k: (v["unit"], v["description"]) for k, v in read_columns(path).items()}
    write_results(path, attrs, Table(cases, {k: columns.get(k, ("", ""))
                                             for k in cases.dtype.names}), top, data["units"])
    attrs, rows = load_rows(path)
    table = format_rows(attrs, rows, "table").splitlines()
    by_case = {int(line.split()[0]): line for line in table[2:] if line.split()[0].isdigit()}
    assert "no feasible configuration" in by_case[1]
    assert "pending (no feasible configuration yet)" in by_case[3]
    assert "pending (not yet evaluated)" in by_case[7]
    assert "dp=" in by_case[0] and "pending" not in by_case[0]
    assert table[-1] == "(partial results: the run is not complete; 13 case(s) pending)"

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    doc = json.loads(format_rows(attrs, rows, "json"), parse_constant=refuse)
    status = {r["case_id"]: r["status"] for r in doc["rows"]}
    assert status[0] == status[5] == "ok" and status[1] == "infeasible"
    assert status[3] == status[7] == "pending"
    assert doc["rows"][1]["best_samples_per_s"] is None  # NaN -> null
    lines = format_rows(attrs, rows, "csv").splitlines()
    assert lines[0].endswith(",status") and lines[2].endswith(",infeasible")
    assert lines[4].endswith(",pending")
    # a configuration's feasible beside its case's count of feasible candidates; the header
    # the same whatever the run found (a case without a configuration first: 73 columns
    # against 123 before)
    ok = next(r for r in doc["rows"] if r["status"] == "ok")
    assert ok["feasible"] is True and ok["feasible_case"] == cases["feasible"][0] > 1
    caseless = [r for r in rows if r["place"] is None]
    assert format_rows(attrs, caseless, "csv").splitlines()[0] == lines[0]
    assert len(doc["rows"][1]) == len(ok)


def test_show_json_is_strict_on_a_complete_file(nersc):
    """Columns of absent calibration parameters are NaN in the file: null in JSON."""
    attrs, rows = load_rows(nersc, top=2)
    text = format_rows(attrs, rows, "json")
    assert "NaN" not in text and "Infinity" not in text
    assert {r["status"] for r in json.loads(text)["rows"]} == {"ok"}


# ------------------------------------------------------------------------------ progress

def test_progress_log_lines_off_a_terminal():
    stream = io.StringIO()
    progress = _Progress(every_s=3600, stream=stream)
    progress({"candidates_done": 0, "candidates": 1000, "ranks": 2, "ranks_done": 0,
              "elapsed_s": 0.1})
    progress({"candidates_done": 500, "candidates": 1000, "ranks": 2, "ranks_done": 1,
              "elapsed_s": 1.0})  # throttled
    progress({"candidates_done": 1000, "candidates": 1000, "ranks": 2, "ranks_done": 2,
              "elapsed_s": 2.0})  # the last one always prints
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("0.0% of 1,000 candidates, 0/2 ranks done, ETA not yet known")
    assert lines[-1] == "[    2.0 s] 100.0% of 1,000 candidates, 2/2 ranks done, ETA 0 s"


# ------------------------------------------------------------------------------ extras

BLOCKED = """
import sys
sys.modules["pandas"] = None
sys.modules["matplotlib"] = None
from sweep.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_core_runs_without_pandas_and_matplotlib(tmp_path, nersc):
    spec = tmp_path / "s.yaml"
    spec.write_text(GRID_SPEC.replace("gpus: [16, 32]", "gpus: [8]"))
    run = subprocess.run([sys.executable, "-c", BLOCKED, "run", str(spec), "--serial",
                          "--out", str(tmp_path / "o"), "--quiet"], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    show = subprocess.run([sys.executable, "-c", BLOCKED, "show", str(tmp_path / "o" / "sweep.h5"),
                           "--format", "json"], capture_output=True, text=True, timeout=120)
    assert show.returncode == 0 and json.loads(show.stdout)["rows"]
    plot = subprocess.run([sys.executable, "-c", BLOCKED, "plot", str(nersc), "--kind",
                           "scaling", "-o", str(tmp_path / "x.png")], capture_output=True,
                          text=True, timeout=120)
    assert plot.returncode == 2 and "pip install -e '.[plot]'" in plot.stderr


def test_show_marks_the_best_so_far_of_partly_searched_cases(tmp_path, capsys):
    """An outside tester saw a partly searched case's best-so-far printed as final."""
    from sweep.analysis.show import format_rows, load_rows
    from sweep.cli import main
    from sweep.engine.runner import Interrupted, RunOptions, run_sweep
    from tests.engine.test_run_faults import StopAfter

    run = tmp_path / "p"
    spec = str(DATA / "specs" / "small.yaml")
    with pytest.raises(Interrupted):
        run_sweep(spec, StopAfter(polls=17), RunOptions(out_dir=run, block_size=1000))
    assert main(["reduce", str(run), "--partial"]) == 0
    attrs, rows = load_rows(run / "sweep.h5", top=1)
    statuses = {r["case_id"]: format_rows(attrs, [r], "csv").splitlines()[1].rsplit(",", 1)[1]
                for r in rows}
    partial = [r for r in rows if not r["complete"] and r["place"] is not None]
    assert partial and all(statuses[r["case_id"]] == "partial" for r in partial)
    table = format_rows(attrs, rows)
    assert "* = best so far of" in table
    # the Pareto plot marks such a point too (an outside tester found it unmarked)
    res = open_results(run / "sweep.h5")
    fig, data = draw(res, "pareto")
    assert not data["complete"].all()
    assert any("best so far" in t.get_text() for ax in fig.axes
               for t in ax.get_legend().get_texts())
    capsys.readouterr()
    assert main(["show", str(run / "sweep.h5"), "--case", "999"]) == 2
    assert "no case 999 (case ids 0 to" in capsys.readouterr().err


def test_report_lists_cases_without_a_configuration_apart(partial_files, tmp_path):
    # "grid two": cases 0 and 2 done, every other case pending (not yet evaluated)
    res = open_results(partial_files["grid two"])
    out = write_report(res, tmp_path / "two", ["memory"])
    page = (Path(out["dir"]) / "index.html").read_text()
    with_config = len(res.best())
    assert page.count("<tr><td>") == with_config
    pending = len(res.cases) - with_config
    assert f"<b>{pending:,} cases: pending (not yet evaluated)</b>" in page


def test_report_helpers_print_ranges_and_tidy_floats():
    from sweep.analysis.report import _id_ranges, _spec_text

    assert _id_ranges([0, 1, 2, 3, 7, 9, 10]) == "0-3, 7, 9-10"
    assert _id_ranges([5]) == "5"
    text = _spec_text("a: 2.4999999999999998e-06\nb: [0.30000000000000004, 3]\nc: x\n")
    assert text == "a: 2.5e-06\nb:\n- 0.3\n- 3\nc: x\n"
    assert _spec_text("a: [unclosed") == "a: [unclosed"


def test_pareto_front_is_the_non_dominated_points(nersc):
    res = open_results(nersc)
    fig, data = draw(res, "pareto")
    assert len(data) == len(res.best_per_system())
    for _job, sub in data.groupby("job"):
        for _, r in sub.iterrows():
            beaten = ((sub["x"] <= r["x"]) & (sub["samples_per_s"] > r["samples_per_s"])).any()
            tie_first = ((sub["x"] < r["x"]) & (sub["samples_per_s"] == r["samples_per_s"])).any()
            assert r["on_front"] == (not beaten and not tie_first)
    front = data[data["on_front"]].sort_values("x")
    assert front["samples_per_s"].is_monotonic_increasing
    line = [ln for ln in fig.axes[0].lines if ln.get_label() == "Pareto front"][0]
    assert np.array_equal(line.get_ydata(), front["samples_per_s"].to_numpy())


INTERPOLATED_SPEC = """
name: interp
cost_model: nersc2024
jobs: [gpt3]
gpus: [64]
strategies: [1d]
hardware:
  base: nersc-B200
  grid:
    memory: {interpolate: [nersc-A100, nersc-H200], points_per_segment: 3,
             keys: [hbm_bandwidth, hbm_capacity]}
    compute: {interpolate: [nersc-A100, nersc-H200], points_per_segment: 2,
              keys: [matrix_flops, vector_flops]}
top_n: 1
"""


def test_heatmap_names_the_generations_of_interpolated_axes(tmp_path):
    (tmp_path / "interp.yaml").write_text(INTERPOLATED_SPEC)
    run_sweep(str(tmp_path / "interp.yaml"), SerialComm(), RunOptions(out_dir=tmp_path / "o"))
    res = open_results(tmp_path / "o" / "sweep.h5")
    fig, data = draw(res, "heatmap")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["A100", "H200"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["A100", "H200"]
    assert ax.get_xlabel().startswith("memory (hbm bandwidth, hbm capacity)") or \
        ax.get_xlabel().startswith("compute (matrix flops, vector flops)")
    assert "baseline A100 x A100" in ax.get_title()
    assert data["baseline"].sum() == 1
    # the Pareto front along the first interpolated axis names its systems too
    fig, _ = draw(res, "pareto")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["A100", "H200"]
    assert ax.get_xlabel().endswith("), A100 to H200")
    # point labels: a catalog point by its name, not its position (memory=1 was H200)
    import re

    assert ax.texts and not any(re.search(r"=\d+(\s|$)", t.get_text()) for t in ax.texts)
    assert any("=A100" in t.get_text() or "=H200" in t.get_text() for t in ax.texts)


def test_bar_labels_end_inside_their_panels(grid, monkeypatch):
    """The rotated layout label above each bar ends below its panel's top edge (labels as
    long as a mixture-of-experts layout's ran into the panel title), as saved."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    import sweep.analysis.plot as plot

    monkeypatch.setattr(plot, "_layout_text", lambda r: "1d tp1 pp4 dp64 ep8 etp1 vpp24 cp1")
    res = open_results(grid)
    for options in (PlotOptions(n_gpus=16), PlotOptions(), PlotOptions(fractions=True)):
        fig, _ = draw(res, "breakdown", options)
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
        labelled = [ax for ax in fig.axes if ax.patches and ax.texts]
        assert labelled
        for ax in labelled:
            top = ax.get_window_extent(renderer).y1
            for text in ax.texts:
                assert text.get_window_extent(renderer).y1 <= top + 0.5, text.get_text()


def test_hardware_variant_labels_do_not_run_into_each_other(grid):
    """The x tick labels of a breakdown by hardware variant do not overlap, as saved (four
    variants of two swept axes, "hbm_GBps=2000 hbm_GiB=40": drawn level they ran into each
    other; a study's "nvlink_domain=8 scaleout_Gbps=400" more so)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig, _ = draw(open_results(grid), "breakdown", PlotOptions(n_gpus=16))
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    for ax in (a for a in fig.axes if a.patches):
        boxes = sorted((t.get_window_extent(renderer) for t in ax.get_xticklabels()
                        if t.get_text()), key=lambda b: b.x0)
        assert len(boxes) >= 4
        for left, right in pairwise(boxes):
            assert left.x1 <= right.x0 + 0.5 or left.y0 >= right.y1 or right.y0 >= left.y1


def test_a_small_heatmap_writes_each_cells_speed_up(grid):
    """A grid of a few cells carries each cell's speed-up over the baseline, the numbers of
    the HDF5 file; no contour lines interpolated between two values of an axis."""
    fig, heat = draw(open_results(grid), "heatmap", PlotOptions(n_gpus=16))
    ax = next(a for a in fig.axes if a.images)
    texts = sorted(float(t.get_text()[:-1]) for t in ax.texts if t.get_text().endswith("x"))
    values = heat["samples_per_s"].dropna().to_numpy(float)
    base = heat.sort_values(["hbm_GiB", "hbm_GBps"]).dropna()["samples_per_s"].iloc[0]
    assert texts == pytest.approx(sorted(np.round(values / base, 2)), abs=1e-9)
    assert not any(type(c).__name__.endswith("ContourSet") for c in ax.collections)


def test_large_grids_become_small_multiples_along_the_swept_axes(grid, monkeypatch):
    """A grid with more variants than bars fit: x = the first swept axis, one panel per
    value of the second, the bars still the HDF5 numbers (issue 18: no 3432 px strips)."""
    import sweep.analysis.plot as plot

    monkeypatch.setattr(plot, "MAX_BARS", 2)
    res = open_results(grid)
    best = {int(r["case_id"]): r for r in res.best_per_system().to_dict("records")}
    fig, data = draw(res, "breakdown", PlotOptions(n_gpus=16))
    panels = [ax for ax in fig.axes if ax.patches]
    axes_swept = res.swept_axes
    assert len(panels) == 2  # two values of the second swept axis
    for ax in panels:
        assert ax.get_xlabel().startswith(axis_label(axes_swept[0]))
        assert len(ax.get_xticklabels()) == 2
    assert len({ax.get_ylim() for ax in panels}) == 1  # one y range for the job
    for _, r in data.iterrows():
        for c in TIME_PARTS:
            assert r[c] == pytest.approx(float(best[r["case_id"]][c]), rel=1e-12)
    assert len(data) == 4


def test_strategies_at_one_gpu_count_run_along_the_swept_axes(grid):
    res = open_results(grid)
    fig, data = draw(res, "strategies", PlotOptions(n_gpus=16))
    panels = [ax for ax in fig.axes if ax.lines]
    assert len(panels) == 2 and all(ax.get_xlabel() == axis_label(res.swept_axes[0])
                                    for ax in panels)
    cases = res.cases[res.cases["n_gpus"] == 16]
    for (v, _n), group in data.groupby(["variant_id", "n_gpus"]):
        mine = cases[cases["variant_id"] == v].set_index("strategy")["best_samples_per_s"]
        for _, r in group.iterrows():
            assert r["speedup"] == pytest.approx(mine[r["strategy"]] / mine.max(), rel=1e-12)
    assert set(data["n_gpus"]) == {16}


def test_every_figure_kind_has_a_function_and_a_caption():
    from sweep.analysis.plot import _KIND
    from sweep.analysis.report import CAPTIONS

    assert set(KINDS) == set(_KIND) == set(CAPTIONS)


def test_a_one_panel_figure_keeps_its_whole_title(grid):
    """Every kind's title is wrapped to its figure's width: on a one-panel figure (a
    heatmap of one job) it fits inside the figure, as drawn (it was clipped at both
    sides)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig, _ = draw(open_results(grid), "heatmap", PlotOptions(n_gpus=16))
    assert len([a for a in fig.axes if a.get_images()]) == 1
    renderer = FigureCanvasAgg(fig).get_renderer()
    box = fig._suptitle.get_window_extent(renderer)
    assert 0 <= box.x0 and box.x1 <= fig.bbox.x1
    assert "\n" in fig._suptitle.get_text()


def test_a_heatmap_of_one_axis_against_itself_is_refused(grid):
    """--x and --y naming one axis: a one-line error (it was a pandas traceback); --x alone
    naming the second swept axis takes the first as y (it took the same axis)."""
    from sweep.errors import SweepError

    res = open_results(grid)
    with pytest.raises(SweepError, match="--x and --y both name hbm_GBps"):
        draw(res, "heatmap", PlotOptions(n_gpus=16, x="hbm_GBps", y="hbm_GBps"))
    fig, data = draw(res, "heatmap", PlotOptions(n_gpus=16, x="hbm_GiB"))
    ax = fig.axes[0]
    assert ax.get_xlabel().startswith("HBM capacity")
    assert ax.get_ylabel().startswith("HBM bandwidth")


def test_a_case_without_candidates_is_empty_not_infeasible(tmp_path):
    """An MoE job under 2d has no candidate (SUMMA models dense blocks only; sweep plan says
    so): show calls its case empty, not infeasible, and the strategies comparison leaves it
    out rather than marking 2d infeasible (an outside tester's finding)."""
    spec = tmp_path / "moe2d.yaml"
    spec.write_text("name: moe2d\njobs: [qwen3_30b_a3b, llama3_8b]\ngpus: [8]\n"
                    "strategies: [1d, 2d]\nhardware: {base: H100-SXM}\ntop_n: 2\n")
    run_sweep(str(spec), SerialComm(), RunOptions(out_dir=tmp_path / "run"))
    path = tmp_path / "run" / "sweep.h5"
    _, rows = load_rows(path)
    moe_2d = [r for r in rows if r["job"] == "qwen3_30b_a3b" and r["strategy"] == "2d"]
    assert len(moe_2d) == 1 and moe_2d[0]["candidates"] == 0
    shown = json.loads(format_rows(*load_rows(path), "json"))["rows"]
    status = {(r["job"], r["strategy"]): r["status"] for r in shown}
    assert status == {("qwen3_30b_a3b", "1d"): "ok", ("qwen3_30b_a3b", "2d"): "empty",
                      ("llama3_8b", "1d"): "ok", ("llama3_8b", "2d"): "ok"}
    table = format_rows(*load_rows(path), "table")
    assert "no candidate configuration (sweep plan says why)" in table
    assert "no feasible configuration" not in table
    _, data = draw(open_results(path), "strategies")
    assert set(data["job"]) == {"llama3_8b"} and data["feasible"].all()


def test_long_panel_titles_wrap_inside_their_panel():
    """A hardware variant's long label (an outside tester's MoE grid) wraps in lines of at
    most PANEL_TITLE_CHARS instead of running into the next panel's title."""
    from matplotlib.figure import Figure

    from sweep.analysis import plot

    _, axes = plot._grid(Figure, 3)
    title = "qwen3_30b_a3b[dtype=mxfp8], " + ", ".join(
        f"GB200-NVL72[nvlink_domain={d},scaleout_Gbps=800]" for d in (4, 8, 16))
    plot._panel_title(axes[0], title)
    lines = axes[0].get_title().split("\n")
    assert len(lines) > 1 and all(len(line) <= plot.PANEL_TITLE_CHARS for line in lines)
    assert " ".join(lines) == title
    plot._panel_title(axes[1], "llama3_8b")
    assert axes[1].get_title() == "llama3_8b"


def test_line_labels_of_a_quantity_axis_keep_its_unit():
    """A quantity swept in SI (hbm_bandwidth: ['3.35 TB/s', ...]) labels its lines with its
    unit: '4.8 T' lost the B/s (an outside test's finding); a key with the unit in its name
    keeps its bare number."""
    pd = pytest.importorskip("pandas")
    from sweep.analysis import plot

    best = pd.DataFrame({"swept": ['{"hbm_bandwidth": 3.35e12, "hbm_GBps": 3350}',
                                   '{"hbm_bandwidth": 4.8e12, "hbm_GBps": 4800}'],
                         "base": ["H100", "H100"], "hardware": ["a", "b"]})
    assert plot._short_labels(best, best) == ["hbm_bandwidth=3.35 TB/s hbm_GBps=3350",
                                              "hbm_bandwidth=4.8 TB/s hbm_GBps=4800"]

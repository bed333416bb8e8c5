"""The ``sweep`` command line: argument parsing and printing only, no math.

Every :class:`~sweep.errors.SweepError` (bad spec, unknown name, bad value, bad results
folder) becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence

from . import __version__, fmt
from ._alloc import keep_heap
from .catalog import load_hardware, load_job
from .cost import PROFILES
from .errors import SweepError, install_hint

__all__ = ["main", "build_parser"]

DEFAULT_PROFILE = "calibrated"


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _gpu_count(text: str) -> int:
    from .spec import MAX_GPUS

    v = _positive_int(text)
    if v > MAX_GPUS:
        raise argparse.ArgumentTypeError(f"at most {MAX_GPUS:,} GPUs, got {text!r}")
    return v


def _shard(text: str) -> tuple[int, int]:
    """``I/K``: shard I (from 0) of K."""
    index, sep, count = text.partition("/")
    try:
        i, k = int(index), int(count)
    except ValueError:
        i = k = -1
    if not sep or k < 1 or not 0 <= i < k:
        raise argparse.ArgumentTypeError(f"expected I/K with 0 <= I < K (shard I of K), "
                                         f"got {text!r}")
    return i, k


# --------------------------------------------------------------------------- predict

def _cmd_predict(args: argparse.Namespace) -> int:
    from .predict import parse_config, predict

    if args.profile not in PROFILES:
        raise SweepError(f"--profile: unknown profile {args.profile!r}; "
                         f"valid: {', '.join(PROFILES)}")
    if args.strategy not in PROFILES[args.profile]:
        raise SweepError(f"--strategy: {args.strategy!r} is not a strategy of {args.profile}; "
                         f"valid: {', '.join(PROFILES[args.profile])}")
    job = load_job(args.job, key="--job")
    hw = load_hardware(args.hardware, key="--hardware")
    if args.nvlink_domain:
        hw = dataclasses.replace(hw, nvlink_domain=args.nvlink_domain)
    config = parse_config(args.config)
    pred = predict(args.profile, job, hw, args.strategy, args.gpus, config)
    if args.json:
        print(json.dumps(pred.as_dict(), indent=2))
        return 0
    print(_format_prediction(pred))
    return 0


def _format_prediction(p) -> str:
    r = p.row
    calibrated = p.profile == "calibrated"
    degrees = ["dp", "tp"] + (["tp2", "nb"] if p.strategy == "2d" else []) + (
        ["cp"] if p.strategy == "2d-seqp" or calibrated else []) + ["pp"] + (
        ["vpp"] if calibrated else []) + ["mbs"]
    placement = ["nv_tp"] + (["nv_tp2"] if p.strategy == "2d" else []) + (
        ["nv_cp"] if p.strategy == "2d-seqp" or calibrated else []) + ["nv_dp", "nv_pp"]
    moe = calibrated and p.job.is_moe
    if moe:  # expert parallelism folded over the same GPUs
        degrees += ["ep", "etp"]
        placement += ["nv_ep"]
    knobs = ""
    if calibrated:
        from .show import RECOMPUTE_NAMES

        rec = int(r["recompute"])
        knobs = (f"   sp={int(r['sp'])} tp_overlap={int(r['tp_overlap'])} recompute="
                 f"{RECOMPUTE_NAMES[rec]}" + (f" ({int(r['recompute_layers'])} layers)"
                                              if rec == 3 else "")
                 + f" zero={int(r['zero'])}" + (f" shard_group={int(r['shard_group'])}"
                                                 if r["shard_group"] else "")
                 + (f" offload={int(r['offload'])}" if r["offload"] else "")
                 + (f" a2a_overlap={int(r['a2a_overlap'])}" if moe else ""))
    step = float(r["step_time_s"])
    lines = [
        f"{p.job.name} on {p.n_gpus} x {p.hardware.name} (NVLink domain "
        f"{p.hardware.nvlink_domain}), profile {p.profile}, strategy {p.strategy}",
        "config:    " + " ".join(f"{k}={int(r[k])}" for k in degrees) + knobs,
        "NVLink:    " + " ".join(f"{k[3:]} {int(r[k])}" for k in placement)
        + f"   (GPUs of each group inside one domain; best of {p.matches} matching candidates)",
        f"step time: {fmt.seconds(step)}   throughput {float(r['samples_per_s']):.6g} samples/s, "
        f"{fmt.si(float(r['tokens_per_s']), 'tokens/s')}   MFU {fmt.percent(float(r['mfu']))}"
        f"   HFU {fmt.percent(float(r['hfu']))}",
        f"memory:    {fmt.gigabytes(float(r['mem_bytes']))} of "
        f"{fmt.gigabytes(p.hardware.hbm_capacity_bytes)} per GPU "
        f"(weights {fmt.gigabytes(float(r['mem_weights_bytes']))}, grads "
        f"{fmt.gigabytes(float(r['mem_grads_bytes']))}, optimizer "
        f"{fmt.gigabytes(float(r['mem_optimizer_bytes']))}, activations "
        f"{fmt.gigabytes(float(r['mem_activations_bytes']))}, other "
        f"{fmt.gigabytes(float(r['mem_other_bytes']))})   "
        + ("feasible" if r["feasible"] else "INFEASIBLE: out of memory"),
        "",
        "time per iteration by op (each op summed over its micro-batches and the stage's layers)",
    ]
    cols = ("compute_s", "memory_s", "tp_comm_s", "cp_comm_s") + (
        ("ep_comm_s",) if moe else ()) + ("other_s",)
    rows, total = [], {k: 0.0 for k in ("time_s",) + cols}
    for op in p.ops:
        if op["time_s"] == 0 and calibrated:
            continue  # a knob this configuration does not use
        rows.append([op["name"], f"{op['time_s']:.6g}", fmt.percent(op["time_s"] / step)]
                    + [f"{op[c]:.4g}" if op[c] else "-" for c in cols])
        for k in total:
            total[k] += op[k]
    rows.append(["total", f"{total['time_s']:.6g}", fmt.percent(total["time_s"] / step)]
                + [f"{total[c]:.4g}" for c in cols])
    lines.append(fmt.table(["op", "time [s]", "share", "compute", "exposed HBM", "TP comm",
                            "CP comm"] + (["EP comm"] if moe else []) + ["pipeline/DP"], rows))
    return "\n".join(lines)


# --------------------------------------------------------------------------- bench

def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run_bench

    report = run_bench(repeat=args.repeat, full=args.full)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"sweep {report['sweep_version']} bench: one core, CPU time, best of "
          f"{report['repeat']} (numpy {report['numpy']}, {report['processor']})")
    rows = [[w["workload"], w["cases"], f"{w['candidates']:,}", f"{w['cpu_seconds']:.4f}",
             f"{w['candidates_per_core_second']:,.0f}"] for w in report["workloads"]]
    print(fmt.table(["workload", "cases", "candidates", "cpu [s]", "candidates/core-s"], rows))
    print(f"standard workloads together: "
          f"{report['standard_candidates_per_core_second']:,.0f} candidates per core-second; "
          f"mixture of experts: {report['moe_candidates_per_core_second']:,.0f}")
    return 0


# --------------------------------------------------------------------------- plot, report

def _plot_options(args: argparse.Namespace):
    from .plot import PlotOptions

    return PlotOptions(metric=args.metric, tokens=args.tokens, strategy=args.strategy,
                       jobs=args.job or (), hardware=args.hardware or (), n_gpus=args.gpus,
                       x=args.x, y=args.y)


def _cmd_plot(args: argparse.Namespace) -> int:
    from .plot import save
    from .results import open_results

    res = open_results(args.results)
    data = save(res, args.kind, args.output, _plot_options(args))
    if args.data:
        data.to_csv(args.data, index=False)
    note = f" ({res.note})" if res.note else ""
    print(f"wrote {args.output}: {args.kind}, {len(data)} points{note}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import write_report
    from .results import open_results

    res = open_results(args.results)
    out = write_report(res, args.output, args.kind or None)
    print(f"wrote {out['dir']}/index.html with {len(out['figures'])} figure(s): "
          f"{', '.join(out['figures']) or 'none'}" + (f" ({res.note})" if res.note else ""))
    for kind, why in out["skipped"].items():
        print(f"  no {kind}: {why}")
    return 0


# --------------------------------------------------------------------------- validate

def _calibration_params(cases) -> dict:
    """The parameters the hardware catalog holds for the generations of ``cases``."""
    from .cost.calibrated import MEMORY_PARAMETERS

    params: dict[str, dict[str, float]] = {}
    for c in cases:
        cal = dict(c.hw.calibration)
        params.setdefault(c.hw.generation, {k: v for k, v in cal.items()
                                            if k not in MEMORY_PARAMETERS})
        params.setdefault("memory", {k: v for k, v in cal.items() if k in MEMORY_PARAMETERS})
    return params


def _cmd_validate(args: argparse.Namespace) -> int:
    from .measured import data_paths, read_data
    from .validate import available_cpus, express_all, render, report

    import importlib.util

    paths = data_paths(args.data)
    data = ", ".join(map(str, paths))
    rows = read_data(paths)
    cases, _ = express_all(rows)
    loso = not args.no_loso
    if loso and importlib.util.find_spec("scipy") is None:
        loso = False
        print("sweep validate: leave-one-source-out skipped: re-fitting needs scipy "
              f"({install_hint('validate')})", file=sys.stderr)
    rep = report(rows, _calibration_params(cases), loso=loso,
                 workers=args.workers or available_cpus())
    rep["data"] = str(data)
    if args.markdown:
        from .validate import markdown

        print(markdown(rep, [p.name for p in paths]), end="")
        return 0
    if args.json:
        print(json.dumps(rep, indent=1))
        return 0
    print(f"sweep validate: {data} with the calibrated profile's parameters "
          f"(hardware/calibration.yaml){'; LOSO re-fits per source' if loso else ''}")
    print(render(rep, rows=not args.summary))
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from .calibration import (GENERATIONS, fill_generations, fit, load_ranges, outside_ranges,
                              write_calibration)
    from .catalog import CALIBRATION_FILE, REPO_ROOT
    from .measured import data_paths, read_data
    from .validate import express_all, render, report

    paths = data_paths(args.data)
    data = ", ".join(map(str, paths))
    rows = read_data(paths)
    cases, _ = express_all(rows)
    if not cases:
        raise SweepError(f"{data}: no row can be expressed; nothing to calibrate on")
    # from the prior centres: the result depends on code and data only
    result = fit(cases, within_ranges=args.within_ranges)
    params, borrowed = fill_generations(result.parameters)
    outside = outside_ranges(params, load_ranges())
    if args.json:
        print(json.dumps({"parameters": params, "rows": result.rows, "borrowed": borrowed,
                          "outside_range": outside}, indent=1))
    else:
        names = sorted({k for g, v in params.items() if g != "memory" for k in v})
        gens = [g for g in GENERATIONS if g in params]
        print(f"sweep calibrate: fitted on {data} ({len(cases)} rows expressed)"
              f"{', within the cited ranges' if args.within_ranges else ''}")
        print(fmt.table(["parameter"] + gens, [[n] + [
            (f"{params[g][n]:g}" + ("*" if n in outside.get(g, ()) else ""))
            if n in params[g] else "-" for g in gens] for n in names]))
        if any(outside.values()):
            print("* outside its cited physical range (hardware/parameter_ranges.yaml): the "
                  "fit absorbs a mechanism the model lacks (docs/model.md)")
        for g, d in borrowed.items():
            print(f"{g}: no measured runs; {d} values used")
        print("memory: " + ", ".join(f"{k} = {v:g}" for k, v in params["memory"].items()))
        print(render(report(rows, params, loso=False), rows=False))
    if args.write:
        target = args.output or REPO_ROOT / "hardware" / CALIBRATION_FILE
        write_calibration(target, result, paths)
        print(f"wrote {target}")
    return 0


# --------------------------------------------------------------------------- plan

def _plan_and_estimate(spec, budget_s: float):
    """(plan, estimate of its search, CPU seconds of planning) on this machine."""
    import time

    from .bench import estimate_search_seconds
    from .plan import SpaceCache, make_plan

    cache = SpaceCache(spec.cost_model, offload=spec.offload)
    start = time.process_time()
    plan = make_plan(spec, cache)  # SpecError for a spec that cannot run
    plan_s = time.process_time() - start  # every rank of a run builds the plan first
    return plan, estimate_search_seconds(plan, cache, budget_s=budget_s), plan_s


def _cmd_plan(args: argparse.Namespace) -> int:
    from .spec import load_spec

    spec = load_spec(args.spec, max_variants=args.max_variants, overrides=args.overrides)
    plan, estimate, plan_s = _plan_and_estimate(spec, budget_s=1.0)
    cases = plan.cases
    core_s = estimate["core_seconds"]
    rate = plan.total_candidates / core_s if core_s else 0.0
    if args.json:
        print(json.dumps({
            "name": spec.name, "cost_model": spec.cost_model, "jobs": [j.name for j in spec.jobs],
            "variants": [{"variant_id": v.variant_id, "label": v.label, "swept": dict(v.swept)}
                         for v in plan.variants],
            "strategies": list(spec.strategies), "gpus": list(spec.gpus),
            "cases": [{"case_id": c.case_id, "job": c.job.name, "hardware": c.variant.label,
                       "strategy": c.strategy, "n_gpus": c.n_gpus, "candidates": c.candidates}
                      for c in cases],
            "work_units": len(plan.units), "candidates": plan.total_candidates,
            "candidates_per_core_second": rate, "estimated_core_seconds": core_s,
            "units_timed": estimate["units_timed"], "plan_seconds": plan_s}, indent=1))
        return 0
    print(f"sweep {spec.name}: cost model {spec.cost_model}, top {spec.top_n} per case")
    print(f"  {len(spec.jobs)} job(s) x {len(plan.variants)} hardware variant(s) x "
          f"{len(spec.strategies)} strateg{'y' if len(spec.strategies) == 1 else 'ies'} x "
          f"{len(spec.gpus)} GPU count(s) = {len(cases)} cases, {len(plan.units)} work units")
    print(f"  {plan.total_candidates:,} candidates; {estimate['units_timed']} sampled work "
          f"units searched here at {rate:,.0f} per core-second: about {core_s:.3g} "
          f"core-seconds ({core_s / 2:.3g} s on 2 ranks, {core_s / 64:.3g} s on 64), after "
          f"{plan_s:.2g} s of planning on every rank")
    empty = sum(1 for c in cases if c.candidates == 0)
    if empty:
        print(f"  {empty} case(s) have no candidate (nothing divides evenly); they are skipped")
    shown = cases if args.all else cases[:args.limit]
    rows = [[c.case_id, c.job.name, c.variant.label, c.strategy, c.n_gpus, f"{c.candidates:,}"]
            for c in shown]
    print(fmt.table(["case", "job", "hardware", "strategy", "GPUs", "candidates"], rows,
                    align="rlllrr"))
    if len(shown) < len(cases):
        print(f"... {len(cases) - len(shown)} more cases (--all lists every case)")
    return 0


# --------------------------------------------------------------------------- run / reduce / show

def _reaches_terminal(stream) -> bool:
    """Whether text written to ``stream`` ends on a terminal: the stream is one, or (under
    mpiexec / srun, which forward the ranks' output through pipes) the launcher's stderr
    is. Linux /proc walk of the parent processes; False where that is not available."""
    import os

    if hasattr(stream, "isatty") and stream.isatty():
        return True
    if stream is not sys.stderr:
        return False
    pid = os.getpid()
    for _ in range(4):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])  # the parent's pid
            if pid <= 1:
                return False
            target = os.readlink(f"/proc/{pid}/fd/2")
        except (OSError, ValueError, IndexError):
            return False
        if target.startswith(("/dev/pts/", "/dev/tty")):
            return True
    return False


class _Progress:
    """Progress of the whole run (all ranks) on rank 0's stderr: a tqdm bar with ETA on a
    terminal, plain log lines at most every ``every_s`` seconds otherwise (batch jobs)."""

    def __init__(self, every_s: float = 10.0, stream=None) -> None:
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self.last: float | None = None  # the first line always prints
        self.bar = None
        self.tty = _reaches_terminal(self.stream)

    def __call__(self, p: dict) -> None:
        import time

        total, done = p["candidates"], p["candidates_done"]
        if self.tty:
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="cand", unit_scale=True, file=self.stream,
                                desc=f"sweep ({p['ranks']} rank{'s' if p['ranks'] > 1 else ''})",
                                smoothing=0.1, mininterval=0.5, leave=False)
            self.bar.update(done - self.bar.n)
            if p["ranks_done"] == p["ranks"]:
                self.bar.close()
            return
        now = time.monotonic()
        last = p["ranks_done"] == p["ranks"]
        if self.last is not None and now - self.last < self.every_s and not last:
            return
        self.last = now
        frac = done / total if total else 1.0
        eta = p["elapsed_s"] * (1 - frac) / frac if frac > 0 else float("nan")
        print(f"[{p['elapsed_s']:7.1f} s] {100 * frac:5.1f}% of {total:,} candidates, "
              f"{p['ranks_done']}/{p['ranks']} ranks done, ETA {eta:.0f} s",
              file=self.stream, flush=True)


def _os_error_text(exc: OSError) -> str:
    """One line for an OSError: the file and what the system said."""
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"


def _abort_one_rank(comm, message: str) -> None:
    """An error on this rank alone (the others are computing or waiting for it): print it
    here, since only rank 0's stderr would otherwise speak, and abort the whole job (exit
    code 2) instead of leaving the others hanging. Saved progress stays resumable."""
    print(f"sweep run: error on rank {comm.rank}: {message}; aborting all ranks (saved "
          f"progress is kept: continue with --resume)", file=sys.stderr, flush=True)
    comm.abort(2)


def _print_run_summary(s) -> None:
    busy = s.busy_s or [0.0]
    shard = f" (shard {s.shard[0]}/{s.shard[1]})" if s.shard else ""
    print(f"sweep {s.plan.spec.name}{shard}: {s.evaluated:,} candidates evaluated on {s.ranks} "
          f"rank(s) in {s.wall_s:.2f} s wall "
          f"({s.evaluated / max(sum(busy), 1e-9):,.0f} per busy core-second)")
    if s.resumed_units:
        print(f"  resumed: {s.resumed_units} work unit(s) were done by an earlier attempt")
    print(f"  load imbalance (max/mean - 1): {100 * s.imbalance_time:.1f}% by busy time, "
          f"{100 * s.imbalance_candidates:.1f}% by candidates")


def _cmd_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .parallel import get_comm
    from .runner import RunOptions, run_sweep
    from .show import format_rows, load_rows

    comm = get_comm(use_mpi=not args.serial)
    options = RunOptions(out_dir=Path(args.out) if args.out else None, resume=args.resume,
                         force=args.force, checkpoint_s=args.checkpoint,
                         reduce=not args.no_reduce, shard=args.shard,
                         max_variants=args.max_variants, overrides=tuple(args.overrides),
                         progress=_Progress() if not args.quiet else None,
                         warn=lambda w: print(f"sweep run: warning: {' '.join(w.split())}",
                                              file=sys.stderr, flush=True))
    args._rank = comm.rank
    try:
        summary = run_sweep(args.spec, comm, options)
    except (SweepError, OSError) as exc:
        if comm.size == 1:
            raise  # main prints it
        if getattr(exc, "collective", False):  # every rank has it; rank 0 prints it
            code = _print_error(args, exc)
            comm.finalize()
            return code
        # this rank's own failure (a part file it cannot write: disk full, permissions)
        _abort_one_rank(comm, str(exc) if isinstance(exc, SweepError) else _os_error_text(exc))
    except BaseException as exc:  # one rank failed: abort all ranks instead of hanging
        if comm.size > 1 and not isinstance(exc, (SystemExit, KeyboardInterrupt)):
            import traceback

            traceback.print_exc()
            print(f"sweep run: rank {comm.rank} failed; aborting all ranks", file=sys.stderr,
                  flush=True)
            comm.abort(1)
        raise
    if comm.rank != 0:
        return 0
    if not args.quiet:
        _print_run_summary(summary)
    if summary.shard is not None:
        print(f"shard {summary.shard[0]}/{summary.shard[1]} done; once every shard is: "
              f"sweep reduce {summary.out_dir}")
    if summary.reduced is not None:
        if not args.quiet:
            attrs, rows = load_rows(summary.reduced.path, top=1, limit=args.limit)
            print(format_rows(attrs, rows))
            if summary.reduced.cases > args.limit:
                print(f"... {summary.reduced.cases - args.limit} more cases: sweep show "
                      f"{summary.reduced.path}")
        print(f"results: {summary.reduced.path}")
    return 0


def _cmd_reduce(args: argparse.Namespace) -> int:
    from .reduce import reduce_run

    s = reduce_run(args.dir, partial=args.partial)
    state = "complete" if s.complete else f"PARTIAL ({s.units - s.units_done} units missing)"
    print(f"{s.path}: {s.cases} cases, {s.evaluated:,} of {s.candidates:,} candidates from "
          f"{s.parts} part file(s), {state}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from .status import run_status

    st = run_status(args.dir)
    complete = st["units_done"] == st["units"]
    if args.json:
        print(json.dumps(st, indent=1))
        return 0 if complete else 1
    d = st["dir"]
    print(f"{d}: sweep {st['name']} ({st['cost_model']}), {st['cases']:,} cases")
    pct = 100 * st["units_done"] / max(st["units"], 1)
    print(f"done: {st['units_done']:,} of {st['units']:,} work units ({pct:.1f}%), "
          f"{st['candidates_done']:,} of {st['candidates']:,} candidates")
    if st["parts"]:
        rows = [[p["file"], f"{p['worker']}/{p['workers']}", p["shard"] or "-",
                 f"{p['units']:,}", "yes" if p["complete"] else "no", p["written_utc"]]
                + ([] if p["this_spec"] else ["another spec: remove it"])
                for p in st["parts"]]
        print(fmt.table(["part file", "worker", "shard", "units", "finished", "written (UTC)"],
                        rows, align="lllrll"))
    else:
        print("no part files yet")
    if st["shards"]:
        left = st["unfinished_shards"]
        print(f"job array of {st['shards']} shards: " + (
            f"{len(left)} unfinished ({', '.join(map(str, left[:20]))}"
            f"{', ...' if len(left) > 20 else ''})" if left else "every shard finished"))
    res = st["results"]
    if res is None:
        state = "none"
    elif not res["current"]:
        state = "of another spec"
    else:
        state = "complete" if res["complete"] else f"partial ({res['units_done']:,} units)"
    print(f"sweep.h5: {state}")
    foreign = [p["file"] for p in st["parts"] if not p["this_spec"]]
    if foreign:  # a resume would refuse them: say so instead of suggesting it
        print(f"next: {', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''} "
              f"{'was' if len(foreign) == 1 else 'were'} written for another spec than "
              f"{d}/spec.yaml (was it edited?): put the spec back, or move those parts away "
              f"(or start over: sweep run SPEC --out {d} --force)")
        return 1
    if complete:
        print(f"next: sweep show {d}/sweep.h5" if state == "complete"
              else f"next: every unit is done; sweep reduce {d}")
    else:
        again = (f"submit the array again (sweep slurm ... --array {st['shards']} --submit), or "
                 if st["unfinished_shards"] else "")
        print(f"next: {again}sweep run {d}/spec.yaml --out {d} --resume (any number of ranks); "
              f"a look at what is there: sweep reduce {d} --partial")
    return 0 if complete else 1


def _cmd_show(args: argparse.Namespace) -> int:
    from .show import format_rows, load_rows

    attrs, rows = load_rows(args.results, top=args.top, case=args.case)
    print(format_rows(attrs, rows, args.format))
    return 0


# --------------------------------------------------------------------------- slurm

def _cmd_slurm(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from .slurm import SbatchOptions, render_scripts, time_limit_s
    from .spec import load_spec

    spec = load_spec(args.spec, max_variants=args.max_variants)
    limit_s = time_limit_s(args.time)
    out = Path(args.out or Path("results") / spec.name).resolve()
    extra = []
    for item in args.sbatch:
        key, sep, value = item.partition("=")
        if not sep:
            raise SweepError(f"--sbatch: {item!r} is not key=value (e.g. qos=debug)")
        extra.append((key.strip().lstrip("-"), value.strip()))
    options = SbatchOptions(
        spec=str(Path(args.spec).resolve()), out=str(out), job_name=args.job_name or spec.name,
        python=args.python or sys.executable, workdir=os.getcwd(), version=__version__,
        nodes=args.nodes, ntasks_per_node=args.ntasks_per_node, time=args.time,
        launcher=args.launcher, mpi=args.mpi, partition=args.partition, account=args.account,
        setup=tuple(args.setup), extra=tuple(extra), shards=args.array,
        max_running=args.max_running)
    scripts = render_scripts(options)  # bad options refused before the estimate is printed
    # refuses a spec that cannot run before anything is written or submitted
    plan, estimate, _ = _plan_and_estimate(spec, budget_s=0.5)
    workers = args.nodes * args.ntasks_per_node * max(args.array, 1)
    if workers > len(plan.units):
        print(f"sweep slurm: note: {spec.name} has {len(plan.units)} work units for {workers} "
              f"ranks, so {workers - len(plan.units)} would have nothing to do; use fewer "
              f"(--nodes, --ntasks-per-node, --array) or a smaller unit_size in the spec",
              file=sys.stderr)
    core_s = estimate["core_seconds"]
    per_rank_s = core_s / min(workers, max(len(plan.units), 1))
    print(f"sweep slurm: about {core_s:.3g} core-seconds of search at this machine's speed, "
          f"~{per_rank_s:.3g} s on each of {workers} rank(s)", file=sys.stderr)
    if limit_s is not None and per_rank_s > 0.8 * limit_s:
        print(f"sweep slurm: note: that is {per_rank_s / limit_s:.0%} of --time {args.time}; "
              f"the job may stop at its limit (submitting again continues it): raise --time "
              f"or use more ranks", file=sys.stderr)
    if not options.shards:
        return _one_job(args, out, scripts["sweep.sbatch"])
    return _job_array(args, out, options, scripts)


def _one_job(args: argparse.Namespace, out, text: str) -> int:
    from pathlib import Path

    from .slurm import submit

    if not args.submit:
        if args.script:
            Path(args.script).write_text(text)
            print(f"wrote {args.script}")
        else:
            print(text, end="")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    script = Path(args.script) if args.script else out / "sweep.sbatch"
    script.write_text(text)
    job_id = submit(script)
    print(f"submitted {script} as job {job_id}; log {out}/slurm-{job_id}.out")
    return _wait_for_results(args, job_id, "", out)


def _wait_for_results(args: argparse.Namespace, job_id: str, label: str, out,
                      if_failed: str = "") -> int:
    """With --wait: wait for the job that writes sweep.h5; 0 if it completed."""
    from .slurm import wait_for_job

    if not args.wait:
        return 0
    state = wait_for_job(job_id, timeout_s=args.wait_timeout)
    print(f"job {job_id}{label}: {state}")
    if state == "COMPLETED":
        print(f"results: {out / 'sweep.h5'}")
        return 0
    if if_failed:
        print(if_failed, file=sys.stderr)
    return 1


def _job_array(args: argparse.Namespace, out, options, scripts: dict[str, str]) -> int:
    """Write the array and reduce scripts; with --submit, chain them (afterok) and submit."""
    import shlex
    from pathlib import Path

    from .slurm import submit

    array = Path(args.script) if args.script else out / "sweep-array.sbatch"
    reduce = array.with_name("reduce.sbatch")
    array.parent.mkdir(parents=True, exist_ok=True)
    array.write_text(scripts["sweep-array.sbatch"])
    reduce.write_text(scripts["reduce.sbatch"])
    after = ["--kill-on-invalid-dep=yes"]  # a failed array cancels the reduce job
    if not args.submit:
        print(f"wrote {array} ({options.shards} array tasks) and {reduce}; submit both with\n"
              f"  jid=$(sbatch --parsable {shlex.quote(str(array))}) && sbatch "
              f"--dependency=afterok:$jid {' '.join(after)} {shlex.quote(str(reduce))}")
        return 0
    array_id = submit(array)
    reduce_id = submit(reduce, [f"--dependency=afterok:{array_id}", *after])
    print(f"submitted {array} as job array {array_id} ({options.shards} tasks, logs "
          f"{out}/slurm-{array_id}_<task>.out) and {reduce} as job {reduce_id}, which runs "
          f"once every task has succeeded")
    return _wait_for_results(args, reduce_id, " (reduce)", out,
                             f"the array did not complete (see {out}/slurm-{array_id}_*.out; "
                             f"sweep status {out} lists the unfinished shards); submitting "
                             f"again continues them")


# --------------------------------------------------------------------------- parser

def _max_variants_flag(parser: argparse.ArgumentParser) -> None:
    from .spec import DEFAULT_MAX_VARIANTS

    parser.add_argument("--max-variants", type=_positive_int, default=DEFAULT_MAX_VARIANTS,
                        metavar="N", help="refuse a spec whose hardware grid expands to more "
                        f"than N variants (default {DEFAULT_MAX_VARIANTS:,}), before expanding it")


def _set_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        dest="overrides",
                        help="replace a key of the spec, VALUE in YAML, a dotted KEY for a "
                             "nested one: --set gpus=256 --set hardware.grid.nvlink_domain=[8]"
                             " (repeatable; the run records the spec as resolved)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sweep", description="MPI-parallel design-space sweeps for distributed "
                                  "transformer training.")
    parser.add_argument("--version", action="version", version=f"sweep {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    pl = sub.add_parser("plan", help="expand a spec and count its cases and candidates")
    pl.add_argument("spec", help="sweep spec (YAML)")
    pl.add_argument("--limit", type=_positive_int, default=30, help="cases to list (default 30)")
    pl.add_argument("--all", action="store_true", help="list every case")
    pl.add_argument("--json", action="store_true", help="print JSON")
    _max_variants_flag(pl)
    _set_flag(pl)
    pl.set_defaults(func=_cmd_plan)

    r = sub.add_parser("run", help="run a sweep (serially, or under mpiexec / srun)")
    r.add_argument("spec", help="sweep spec (YAML)")
    r.add_argument("--out", help="run folder (default results/<spec name>)")
    r.add_argument("--resume", action="store_true", help="continue an earlier run in the folder")
    r.add_argument("--force", action="store_true", help="discard an earlier run in the folder")
    r.add_argument("--checkpoint", type=float, default=60.0, metavar="SECONDS",
                   help="rewrite part files at least this often (default 60)")
    r.add_argument("--no-reduce", action="store_true", help="leave the merge to sweep reduce")
    r.add_argument("--shard", type=_shard, metavar="I/K",
                   help="run only shard I (0..K-1) of K, e.g. a Slurm array task; shards "
                        "start in any order, resume, and leave the merge to sweep reduce")
    r.add_argument("--serial", action="store_true", help="do not load MPI")
    r.add_argument("--limit", type=_positive_int, default=20, help="cases to print (default 20)")
    r.add_argument("--quiet", action="store_true", help="print only the results path")
    _max_variants_flag(r)
    _set_flag(r)
    r.set_defaults(func=_cmd_run)

    rd = sub.add_parser("reduce", help="merge a run folder's part files into sweep.h5")
    rd.add_argument("dir", help="run folder")
    rd.add_argument("--partial", action="store_true", help="reduce an unfinished run")
    rd.set_defaults(func=_cmd_reduce)

    st = sub.add_parser("status", help="progress of a run folder (exit 0 when every unit is "
                                       "done, 1 otherwise)")
    st.add_argument("dir", help="run folder")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.set_defaults(func=_cmd_status)

    sh = sub.add_parser("show", help="best configurations per case of a sweep.h5")
    sh.add_argument("results", help="sweep.h5")
    sh.add_argument("--format", choices=("table", "csv", "json"), default="table")
    sh.add_argument("--top", type=_positive_int, default=1, help="configs per case (default 1)")
    sh.add_argument("--case", type=int, help="only this case id")
    sh.set_defaults(func=_cmd_show)

    sl = sub.add_parser("slurm", help="render (and submit) an sbatch script for a sweep")
    sl.add_argument("spec", help="sweep spec (YAML)")
    sl.add_argument("--nodes", type=_positive_int, default=1)
    sl.add_argument("--ntasks-per-node", type=_positive_int, default=1, help="ranks per node")
    sl.add_argument("--time", default="01:00:00", help="time limit (default 01:00:00)")
    sl.add_argument("--partition")
    sl.add_argument("--account")
    sl.add_argument("--job-name", help="default: the spec name")
    sl.add_argument("--out", help="run folder (default results/<spec name>)")
    sl.add_argument("--python", help="interpreter with sweep installed (default: this one)")
    sl.add_argument("--launcher", default="srun", choices=("srun", "mpiexec"),
                    help="srun (default) or mpiexec inside the allocation")
    sl.add_argument("--mpi", metavar="PLUGIN",
                    help="srun's MPI plugin, e.g. pmi2 (MPICH), pmix (Open MPI), cray_shasta; "
                         "default: the site's (slurm.conf MpiDefault; see srun --mpi=list)")
    sl.add_argument("--setup", action="append", default=[], metavar="LINE",
                    help="shell line run first, e.g. 'module load cray-mpich' (repeatable)")
    sl.add_argument("--sbatch", action="append", default=[], metavar="KEY=VALUE",
                    help="extra #SBATCH option, e.g. qos=debug (repeatable)")
    sl.add_argument("--array", type=_positive_int, default=0, metavar="K",
                    help="a job array of K tasks, each running one shard of the sweep with "
                         "--nodes x --ntasks-per-node ranks, plus a reduce job after it")
    sl.add_argument("--max-running", type=_positive_int, default=0, metavar="M",
                    help="with --array: at most M tasks at once (sbatch --array=...%%M)")
    sl.add_argument("--script", help="write the script here (default: print it, or "
                    "<out>/sweep.sbatch with --submit; with --array <out>/sweep-array.sbatch, "
                    "and reduce.sbatch beside it)")
    sl.add_argument("--submit", action="store_true", help="submit it with sbatch")
    sl.add_argument("--wait", action="store_true", help="with --submit: wait for the job")
    sl.add_argument("--wait-timeout", type=float, default=3600.0, metavar="SECONDS")
    _max_variants_flag(sl)
    sl.set_defaults(func=_cmd_slurm)

    p = sub.add_parser("predict", help="one configuration: time, throughput, memory, per-op table")
    p.add_argument("--job", required=True, help="job name (jobs/<name>.yaml) or YAML path")
    p.add_argument("--hardware", required=True, help="hardware name or YAML path")
    p.add_argument("--gpus", required=True, type=_gpu_count, help="GPU count")
    p.add_argument("--config", default="", help="comma-separated key=value, e.g. "
                   "tp=8,pp=4,mbs=1 (dp defaults to what is left; unspecified NVLink "
                   "placement and panels take the best matching candidate)")
    p.add_argument("--strategy", default="1d", help="1d | 2d | 2d-seqp (default 1d)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help="cost profile "
                   f"(default {DEFAULT_PROFILE})")
    p.add_argument("--nvlink-domain", type=_positive_int, help="override the NVLink domain size")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=_cmd_predict)

    from .plot import KINDS

    pt = sub.add_parser("plot", help="draw one kind of figure from a sweep.h5")
    pt.add_argument("results", help="sweep.h5 (complete or partial)")
    pt.add_argument("--kind", required=True, choices=KINDS)
    pt.add_argument("-o", "--output", required=True, help="FILE.png, .svg or .pdf")
    pt.add_argument("--metric", default="samples_per_s",
                    help="scaling: samples_per_s | tokens_per_s | step_time_s | days")
    pt.add_argument("--tokens", type=float, default=0.0,
                    help="scaling --metric days: tokens to train on (e.g. 1e12)")
    pt.add_argument("--strategy", help="only this strategy (default: best over strategies)")
    pt.add_argument("--job", action="append", help="only this job (repeatable)")
    pt.add_argument("--hardware", action="append",
                    help="only this hardware variant label or base (repeatable)")
    pt.add_argument("--gpus", type=_positive_int, help="heatmap: GPU count (default largest)")
    pt.add_argument("--x", help="heatmap: swept axis across (default: the first)")
    pt.add_argument("--y", help="heatmap: swept axis up (default: the second)")
    pt.add_argument("--data", help="also write the plotted numbers to this CSV")
    pt.set_defaults(func=_cmd_plot)

    rp = sub.add_parser("report", help="every figure that fits and an index.html")
    rp.add_argument("results", help="sweep.h5 (complete or partial)")
    rp.add_argument("-o", "--output", required=True, help="report folder: a new one, or one "
                    "an earlier sweep report wrote (its own files are replaced; nothing else "
                    "is touched)")
    rp.add_argument("--kind", action="append", choices=KINDS,
                    help="only these kinds (repeatable; default: every kind that fits)")
    rp.set_defaults(func=_cmd_report)

    v = sub.add_parser("validate", help="predict measured training runs; error per row and "
                       "source, memory, OOM, leave-one-source-out")
    v.add_argument("--data", help="a CSV of measured runs (the columns of sweep/measured.py; "
                   "either shipped layout), a shipped file's name (measured_moe_blackwell), "
                   "or 'all' for both shipped files (the default)")
    v.add_argument("--no-loso", action="store_true",
                   help="skip leave-one-source-out (re-fits; needs scipy)")
    v.add_argument("--workers", type=_positive_int,
                   help="processes for the leave-one-source-out re-fits, one source each "
                   "(default: every available core)")
    v.add_argument("--summary", action="store_true", help="omit the per-row table")
    v.add_argument("--json", action="store_true", help="print JSON")
    v.add_argument("--markdown", action="store_true",
                   help="print the accuracy tables (per source, GPU generation, precision, "
                        "model kind; memory; parameters and their ranges) as markdown: "
                        "docs/validation.md is this output")
    v.set_defaults(func=_cmd_validate)

    ca = sub.add_parser("calibrate", help="fit the calibrated profile's parameters per GPU "
                        "generation on measured runs (needs scipy)")
    ca.add_argument("--data", help="CSV of measured runs, a shipped file's name, or 'all' "
                    "(default: both shipped files)")
    ca.add_argument("--write", action="store_true", help="write hardware/calibration.yaml")
    ca.add_argument("--within-ranges", action="store_true",
                    help="keep every parameter inside its cited physical range "
                         "(hardware/parameter_ranges.yaml) instead of generic bounds")
    ca.add_argument("--output", help="with --write: write this file instead")
    ca.add_argument("--json", action="store_true", help="print JSON")
    ca.set_defaults(func=_cmd_calibrate)

    b = sub.add_parser("bench", help="candidates per core-second on fixed workloads")
    b.add_argument("--repeat", type=_positive_int, default=5, help="runs per workload (best)")
    b.add_argument("--full", action="store_true", help="also time the whole NERSC reproduction")
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=_cmd_bench)
    return parser


def _print_error(args: argparse.Namespace, exc: SweepError) -> int:
    """One line on stderr (from rank 0 only: every rank has the same error); the exit code."""
    from .runner import Interrupted

    stopped = isinstance(exc, Interrupted)
    if getattr(args, "_rank", 0) == 0:
        print(f"sweep {args.command}: {'stopped' if stopped else 'error'}: "
              f"{' '.join(str(exc).split())}", file=sys.stderr, flush=True)
    return 143 if stopped else 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    keep_heap()  # no page-fault churn between blocks (sweep/_alloc.py)
    try:
        return int(args.func(args) or 0)
    except SweepError as exc:
        return _print_error(args, exc)
    except BrokenPipeError:  # e.g. `sweep show ... | head`
        return 0
    except OSError as exc:  # permissions, disk full, a vanished file: one line, exit 2
        print(f"sweep {args.command}: error: {_os_error_text(exc)}", file=sys.stderr,
              flush=True)
        return 2

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
from .catalog import load_hardware, load_job
from .cost import PROFILES
from .errors import SweepError

__all__ = ["main", "build_parser"]

DEFAULT_PROFILE = "nersc2024"


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


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
    degrees = ["dp", "tp"] + (["tp2", "nb"] if p.strategy == "2d" else []) + (
        ["cp"] if p.strategy == "2d-seqp" else []) + ["pp", "mbs"]
    placement = ["nv_tp"] + (["nv_tp2"] if p.strategy == "2d" else []) + (
        ["nv_cp"] if p.strategy == "2d-seqp" else []) + ["nv_dp", "nv_pp"]
    step = float(r["step_time_s"])
    lines = [
        f"{p.job.name} on {p.n_gpus} x {p.hardware.name} (NVLink domain "
        f"{p.hardware.nvlink_domain}), profile {p.profile}, strategy {p.strategy}",
        "config:    " + " ".join(f"{k}={int(r[k])}" for k in degrees),
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
    cols = ("compute_s", "memory_s", "tp_comm_s", "cp_comm_s", "other_s")
    rows, total = [], {k: 0.0 for k in ("time_s",) + cols}
    for op in p.ops:
        rows.append([op["name"], f"{op['time_s']:.6g}", fmt.percent(op["time_s"] / step)]
                    + [f"{op[c]:.4g}" if op[c] else "-" for c in cols])
        for k in total:
            total[k] += op[k]
    rows.append(["total", f"{total['time_s']:.6g}", fmt.percent(total["time_s"] / step)]
                + [f"{total[c]:.4g}" for c in cols])
    lines.append(fmt.table(["op", "time [s]", "share", "compute", "exposed HBM", "TP comm",
                            "CP comm", "pipeline/DP"], rows))
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
          f"{report['standard_candidates_per_core_second']:,.0f} candidates per core-second")
    return 0


# --------------------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sweep", description="MPI-parallel design-space sweeps for distributed "
                                  "transformer training.")
    parser.add_argument("--version", action="version", version=f"sweep {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("predict", help="one configuration: time, throughput, memory, per-op table")
    p.add_argument("--job", required=True, help="job name (jobs/<name>.yaml) or YAML path")
    p.add_argument("--hardware", required=True, help="hardware name or YAML path")
    p.add_argument("--gpus", required=True, type=_positive_int, help="GPU count")
    p.add_argument("--config", default="", help="comma-separated key=value, e.g. "
                   "tp=8,pp=4,mbs=1 (dp defaults to what is left; unspecified NVLink "
                   "placement and panels take the best matching candidate)")
    p.add_argument("--strategy", default="1d", help="1d | 2d | 2d-seqp (default 1d)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help="cost profile "
                   f"(default {DEFAULT_PROFILE})")
    p.add_argument("--nvlink-domain", type=_positive_int, help="override the NVLink domain size")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=_cmd_predict)

    b = sub.add_parser("bench", help="candidates per core-second on fixed workloads")
    b.add_argument("--repeat", type=_positive_int, default=5, help="runs per workload (best)")
    b.add_argument("--full", action="store_true", help="also time the whole NERSC reproduction")
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SweepError as exc:
        print(f"sweep {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `sweep show ... | head`
        return 0

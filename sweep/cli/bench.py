"""``sweep bench``: candidates per core-second on fixed workloads."""

from __future__ import annotations

import argparse

from ..analysis import fmt
from ._common import positive_int, strict_json


def _cmd_bench(args: argparse.Namespace) -> int:
    from ..analysis.bench import run_bench

    report = run_bench(repeat=args.repeat, full=args.full, only=args.only or ())
    if args.json:
        print(strict_json(report, indent=2))
        return 0
    print(f"sweep {report['sweep_version']} bench: one core, CPU time, best of "
          f"{report['repeat']} (numpy {report['numpy']}, {report['processor']}; fused "
          f"evaluation {report['fused']})")
    rows = [[w["workload"], w["cases"], f"{w['candidates']:,}", f"{w['cpu_seconds']:.4f}",
             f"{w['candidates_per_core_second']:,.0f}"] for w in report["workloads"]]
    print(fmt.table(["workload", "cases", "candidates", "cpu [s]", "candidates/core-s"], rows))
    parts = []
    if report["standard_candidates_per_core_second"] is not None:
        parts.append(f"standard workloads together: "
                     f"{report['standard_candidates_per_core_second']:,.0f} candidates per "
                     f"core-second")
    if report["moe_candidates_per_core_second"] is not None:
        parts.append(f"mixture of experts: {report['moe_candidates_per_core_second']:,.0f}")
    if report["hybrid_candidates_per_core_second"] is not None:
        parts.append(f"hybrid latent MoE: {report['hybrid_candidates_per_core_second']:,.0f}")
    if report["many_case_candidates_per_core_second"] is not None:
        parts.append(f"many cases: {report['many_case_candidates_per_core_second']:,.0f} "
                     f"({report['many_case_us_per_case']:,.0f} us per case)")
    if parts:
        print("; ".join(parts))
    return 0


def add_parsers(sub) -> None:
    """Add this group's commands to the ``sweep`` subparsers ``sub``."""
    b = sub.add_parser("bench", help="candidates per core-second on fixed workloads")
    b.add_argument("--repeat", type=positive_int, default=5, help="runs per workload (best)")
    b.add_argument("--full", action="store_true", help="also time the whole NERSC reproduction")
    b.add_argument("--only", nargs="+", metavar="TEXT",
                   help="only the workloads whose name contains one of these (any of them, "
                        "--full's included; case-insensitive)")
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=_cmd_bench)

"""``sweep plot`` and ``sweep report``: figures and the HTML report of a sweep.h5."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import SweepError
from ._common import positive_int, positive_number


def _plot_options(args: argparse.Namespace):
    from ..analysis.plot import PlotOptions

    return PlotOptions(metric=args.metric, tokens=args.tokens, strategy=args.strategy,
                       jobs=args.job or (), hardware=args.hardware or (), n_gpus=args.gpus,
                       x=args.x, y=args.y, fractions=args.fractions)


def _cmd_plot(args: argparse.Namespace) -> int:
    from ..analysis.plot import save
    from ..analysis.results import open_results

    if args.data and not Path(args.data).resolve().parent.is_dir():  # (before the figure)
        parent = Path(args.data).parent
        raise SweepError(f"--data: {parent} " + ("is not a directory" if parent.exists()
                                                 else "does not exist"))
    if args.data and Path(args.data).is_dir():
        raise SweepError(f"--data: {args.data} is a directory; give a CSV file name")
    res = open_results(args.results)
    data = save(res, args.kind, args.output, _plot_options(args))
    if args.data:
        data.to_csv(args.data, index=False)
    note = f" ({res.note})" if res.note else ""
    print(f"wrote {args.output}: {args.kind}, {len(data)} points{note}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from ..analysis.report import write_report
    from ..analysis.results import open_results

    res = open_results(args.results)
    out = write_report(res, args.output, args.kind or None)
    print(f"wrote {out['dir']}/index.html with {len(out['figures'])} figure(s): "
          f"{', '.join(out['figures']) or 'none'}" + (f" ({res.note})" if res.note else ""))
    for kind, why in out["skipped"].items():
        print(f"  no {kind}: {why}")
    return 0


def add_parsers(sub) -> None:
    """Add this group's commands to the ``sweep`` subparsers ``sub``."""
    from ..analysis.plot import KINDS

    pt = sub.add_parser("plot", help="draw one kind of figure from a sweep.h5")
    pt.add_argument("results", help="sweep.h5 (complete or partial)")
    pt.add_argument("--kind", required=True, choices=KINDS)
    pt.add_argument("-o", "--output", required=True, help="FILE.png, .svg or .pdf")
    pt.add_argument("--metric", default="samples_per_s",
                    help="scaling: samples_per_s | tokens_per_s | step_time_s | days")
    pt.add_argument("--tokens", type=positive_number, default=0.0,
                    help="scaling --metric days: tokens to train on (e.g. 1e12)")
    pt.add_argument("--strategy", help="only this strategy (default: best over strategies)")
    pt.add_argument("--job", action="append", help="only this job (repeatable)")
    pt.add_argument("--hardware", action="append",
                    help="only this hardware variant label or base (repeatable)")
    pt.add_argument("--gpus", type=positive_int,
                    help="heatmap: GPU count (default largest); breakdown, memory: only this "
                         "count, the hardware variants along x")
    pt.add_argument("--x", help="heatmap, and breakdown / memory of a large grid: swept "
                    "axis across "
                    "(default: the first)")
    pt.add_argument("--y", help="heatmap: swept axis up; breakdown / memory of a large grid: one "
                    "panel per value (default: the second)")
    pt.add_argument("--fractions", action="store_true",
                    help="breakdown: shares of the step time instead of seconds")
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

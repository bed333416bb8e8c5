"""``sweep plot`` and ``sweep report``: figures and the HTML report of a sweep.h5."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import SweepError
from ._common import positive_int, positive_number

#: sweep plot's flags: (flag, argparse dest, PlotOptions field)
_FLAGS = (("--metric", "metric", "metric"), ("--tokens", "tokens", "tokens"),
          ("--strategy", "strategy", "strategy"), ("--job", "job", "jobs"),
          ("--hardware", "hardware", "hardware"), ("--gpus", "gpus", "n_gpus"),
          ("--x", "x", "x"), ("--y", "y", "y"), ("--fractions", "fractions", "fractions"))


def _plot_options(args: argparse.Namespace):
    """The PlotOptions of the flags given; SweepError for a flag the kind does not read."""
    from ..analysis.plot import OPTIONS_OF, PlotOptions

    given = {field: getattr(args, dest) for _, dest, field in _FLAGS
             if getattr(args, dest) not in (None, False)}
    takes = OPTIONS_OF[args.kind]
    unused = [flag for flag, _, field in _FLAGS if field in given and field not in takes]
    if unused:
        flags = [flag for flag, _, field in _FLAGS if field in takes]
        raise SweepError(f"{', '.join(unused)}: not read by --kind {args.kind} (it takes "
                         f"{', '.join(flags)})")
    return PlotOptions(**given)


def _cmd_plot(args: argparse.Namespace) -> int:
    from ..analysis.plot import save
    from ..analysis.results import open_results

    if args.data and not Path(args.data).resolve().parent.is_dir():  # (before the figure)
        parent = Path(args.data).parent
        raise SweepError(f"--data: {parent} " + ("is not a directory" if parent.exists()
                                                 else "does not exist"))
    if args.data and Path(args.data).is_dir():
        raise SweepError(f"--data: {args.data} is a directory; give a CSV file name")
    opts = _plot_options(args)
    res = open_results(args.results)
    for flag, axis in (("--x", opts.x), ("--y", opts.y)):  # (not one a kind would pass over)
        if axis is not None and axis not in res.swept_axes:
            raise SweepError(f"{flag}: {axis!r} is not a swept axis of {res.path}; swept: "
                             f"{', '.join(res.swept_axes) or 'none'}")
    data = save(res, args.kind, args.output, opts)
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
    pt.add_argument("--metric", help="scaling: samples_per_s (default) | tokens_per_s | "
                    "step_time_s | days")
    pt.add_argument("--tokens", type=positive_number,
                    help="scaling --metric days: tokens to train on (e.g. 1e12)")
    pt.add_argument("--strategy", help="only this strategy (default: best over strategies; "
                    "not for --kind strategies)")
    pt.add_argument("--job", action="append", help="only this job (repeatable)")
    pt.add_argument("--hardware", action="append",
                    help="only this hardware variant label or base (repeatable)")
    pt.add_argument("--gpus", type=positive_int,
                    help="heatmap: GPU count (default largest); breakdown, memory, "
                         "strategies: only this count, the hardware variants along x")
    pt.add_argument("--x", help="heatmap, and breakdown / memory / strategies of a large "
                    "grid: swept axis across (default: the first)")
    pt.add_argument("--y", help="heatmap: swept axis up; breakdown / memory / strategies of a "
                    "large grid: one panel per value (default: the second)")
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

"""``sweep validate`` and ``sweep calibrate``: the calibrated profile against measured runs."""

from __future__ import annotations

import argparse
import sys

from ..analysis import fmt
from ..errors import SweepError, install_hint
from ._common import positive_int, strict_json


def _cmd_validate(args: argparse.Namespace) -> int:
    import importlib.util

    from ..analysis.express import express_all
    from ..analysis.measured import data_paths, read_data
    from ..analysis.validate import available_cpus, catalog_parameters, render, report

    paths = data_paths(args.data)
    data = ", ".join(map(str, paths))
    rows = read_data(paths)
    if args.explain:
        for flag in ("markdown", "summary"):
            if getattr(args, flag):
                raise SweepError(f"--{flag}: not with --explain (which prints the rows it "
                                 f"names, or --json)")
        return _explain(rows, args.explain, data, args.json)
    cases, _ = express_all(rows)
    loso = not args.no_loso
    if loso and importlib.util.find_spec("scipy") is None:
        loso = False
        print("sweep validate: leave-one-source-out skipped: re-fitting needs scipy "
              f"({install_hint('validate')})", file=sys.stderr)
    rep = report(rows, catalog_parameters(cases), loso=loso,
                 workers=args.workers or available_cpus())
    rep["data"] = str(data)
    if args.markdown:
        from ..analysis.validate import markdown

        print(markdown(rep, [p.name for p in paths]), end="")
        return 0
    if args.json:
        print(strict_json(rep, indent=1))
        return 0
    print(f"sweep validate: {data} with the calibrated profile's parameters "
          f"(hardware/calibration.yaml){'; LOSO re-fits per source' if loso else ''}")
    print(render(rep, rows=not args.summary))
    return 0


def _explain(rows, ids, data: str, as_json: bool) -> int:
    """``sweep validate --explain ID...``: each row's chosen configuration, per-op table."""
    from ..analysis.validate import explain
    from .predict import _format_prediction

    found = explain(rows, ids, data)
    if as_json:
        print(strict_json([{"id": e["case"].row.get("id", ""),
                            "source": e["case"].source, "metric": e["case"].metric,
                            "measured": e["measured"], "predicted": e["predicted"],
                            "error": e["error"], "assumptions": e["case"].assumptions,
                            "mem_definition": e["case"].mem_definition,
                            "mem_measured_bytes": e["mem_measured_bytes"],
                            "mem_compared_bytes": e["mem_compared_bytes"],
                            "fits": e["feasible"], "predict_command": e["predict_command"],
                            **e["prediction"].as_dict()} for e in found], indent=1))
        return 0
    gib = 2.0**30
    for i, e in enumerate(found):
        case, job = e["case"], e["case"].job
        if i:
            print()
        print(f"{case.row.get('id', '')}: {case.group}")
        print(f"model {case.row.get('model', '')}: {job.n_layers} layers, hidden {job.hidden}, "
              f"sequence {job.seq_len}, global batch {job.global_batch}, {job.dtype}; "
              f"{case.n_gpus} x {case.hw.name}")
        if e["predicted"] is None:
            print("measured: out of memory (no time published)")
        else:
            print(f"measured {case.metric} {e['measured']:.6g}, predicted "
                  f"{e['predicted']:.6g} ({e['error']:+.1%})"
                  + ("; TFLOP/s by the source's FLOP count, the MFU below by the model's"
                     if case.metric == "tflops_per_gpu" else ""))
        measured_mem = (f"measured {e['mem_measured_bytes'] / gib:.1f} GiB, "
                        if e["mem_measured_bytes"] else "")
        print(f"memory as the source counts it ({case.mem_definition}): {measured_mem}"
              f"predicted {e['mem_compared_bytes'] / gib:.1f} GiB; "
              + ("fits" if e["feasible"] else "predicted out of memory"))
        print("expressed with:" + ("" if case.assumptions else " the row's columns alone"))
        for note in case.assumptions:
            print(f"  - {note}")
        n = len(case.options)
        choice = ("the row's stated configuration" if n == 1 else
                  f"the fastest that fits of the {n} configurations the row leaves open")
        print(_format_prediction(e["prediction"], choice))
        print(f"the same with sweep predict (the job and system as the row ran them):\n"
              f"  {e['predict_command']}")  # (or "(none: why)")
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from ..analysis.calibration import (
        GENERATIONS,
        fill_generations,
        fit,
        load_ranges,
        outside_ranges,
        write_calibration,
    )
    from ..analysis.express import express_all
    from ..analysis.measured import data_paths, read_data
    from ..analysis.validate import render, report
    from ..engine.catalog import CALIBRATION_FILE, REPO_ROOT

    if args.output and not args.write:  # (refused before a fit of a minute or more)
        raise SweepError("--output: only with --write (it names the file --write writes)")

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
        print(strict_json({"parameters": params, "rows": result.rows, "borrowed": borrowed,
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


def add_parsers(sub) -> None:
    """Add this group's commands to the ``sweep`` subparsers ``sub``."""
    v = sub.add_parser("validate", help="predict measured training runs; error per row and "
                       "source, memory, OOM, leave-one-source-out")
    v.add_argument("--data", help="a CSV of measured runs (the columns of "
                   "sweep/analysis/measured.py; either shipped layout), a shipped file's name "
                   "(measured_moe_blackwell), or 'all' for both shipped files (the default)")
    v.add_argument("--no-loso", action="store_true",
                   help="skip leave-one-source-out (re-fits; needs scipy)")
    v.add_argument("--workers", type=positive_int,
                   help="processes for the leave-one-source-out re-fits, one source each "
                   "(default: every available core)")
    v.add_argument("--summary", action="store_true", help="omit the per-row table")
    v.add_argument("--explain", nargs="+", metavar="ID",
                   help="for these rows only: the configuration validation chose, its "
                        "assumptions and its per-op table (as sweep predict prints it)")
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

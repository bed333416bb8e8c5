"""``sweep plan``, ``run``, ``reduce``, ``status`` and ``show``: a sweep from spec to results."""

from __future__ import annotations

import argparse
import json
import sys

from ..analysis import fmt
from ..errors import SweepError
from ._common import (
    max_memory_flag,
    max_variants_flag,
    os_error_text,
    plan_and_estimate,
    positive_int,
    positive_number,
    print_error,
    rank_count,
    set_flag,
    shard,
    strict_json,
)

# --------------------------------------------------------------------------- plan

def _cmd_plan(args: argparse.Namespace) -> int:
    from ..engine.plan import estimate_memory, refuse_over
    from ..engine.spec import load_spec

    spec = load_spec(args.spec, max_variants=args.max_variants, overrides=args.overrides)
    plan, estimate, plan_s = plan_and_estimate(spec, budget_s=1.0)
    cases = plan.cases
    core_s = estimate["core_seconds"]
    rate = plan.total_candidates / core_s if core_s else 0.0
    memory = estimate_memory(plan, args.ranks, **estimate["memory"])
    serial = estimate_memory(plan, 1, **estimate["memory"])["serial"]
    refuse_over(memory, args.max_memory)
    if args.json:
        _write_plan_json(sys.stdout, spec, plan, {
            "work_units": len(plan.units), "candidates": plan.total_candidates,
            "candidates_per_core_second": rate, "estimated_core_seconds": core_s,
            "units_timed": estimate["units_timed"], "plan_seconds": plan_s,
            "startup_seconds": estimate["startup_seconds"],
            "memory_bytes": {"ranks": args.ranks, "per_rank": memory["rank"],
                             "rank0_with_reduction": memory["rank0"], "serial": serial,
                             **estimate["memory"]}})
        return 0
    print(f"sweep {spec.name}: cost model {spec.cost_model}, top {spec.top_n} per case")
    print(f"  {len(spec.jobs)} job(s) x {len(plan.variants)} hardware variant(s) x "
          f"{len(spec.strategies)} strateg{'y' if len(spec.strategies) == 1 else 'ies'} x "
          f"{len(spec.gpus)} GPU count(s) = {len(cases)} cases, {len(plan.units)} work units")
    first = plan_s + estimate["startup_seconds"]  # (every rank, before it searches)
    on = ", ".join(f"{first + core_s / r:.3g} s on {r} rank{'s' if r > 1 else ''}"
                   for r in sorted({2, args.ranks, 64}))
    from ..model.cost import fuse

    startup = ("the compiled loops: compiled on a machine's first run, loaded from its cache "
               "after" if fuse.enabled() else "numpy: fused evaluation off" + (
                   "" if fuse.available() else ", numba not installed"))
    print(f"  {plan.total_candidates:,} candidates; {estimate['units_timed']} sampled work "
          f"units searched here at {rate:,.0f} per core-second: about {core_s:.3g} "
          f"core-seconds of search ({on}), after {plan_s:.2g} s of planning and "
          f"{estimate['startup_seconds']:.2g} s of start-up on every rank ({startup})")
    gb = [fmt.gigabytes(x, ".3g") for x in (serial, memory["rank"], memory["rank0"])]
    print(f"  memory: about {gb[0]} on one rank (with the reduction); on {args.ranks} "
          f"rank{'s' if args.ranks > 1 else ''} "
          f"{gb[1]} per rank, rank 0 {gb[2]} with the reduction (every case with candidates "
          f"counted with its full top {spec.top_n})")
    empty = int((cases.candidates == 0).sum())
    if empty:
        import numpy as np

        from ..model.candidates import summa_models

        summa = sum(1 for i in np.flatnonzero(cases.candidates == 0)[:100_000].tolist()
                    if cases[i].strategy == "2d" and spec.cost_model == "calibrated"
                    and not summa_models(cases[i].job))
        why = "nothing divides evenly" if not summa else (
            f"2d (SUMMA) models dense multi-head blocks only, not an MoE, MLA or hybrid "
            f"job's: "
            f"{summa}" + (f"; nothing divides evenly: {empty - summa}" if empty > summa else ""))
        print(f"  {empty} case(s) have no candidate ({why}); they are skipped")
    shown = cases if args.all else cases[:args.limit]
    rows = [[c.case_id, c.job.name, c.variant.label, c.strategy, c.n_gpus, f"{c.candidates:,}"]
            for c in shown]
    print(fmt.table(["case", "job", "hardware", "strategy", "GPUs", "candidates"], rows,
                    align="rlllrr"))
    if len(shown) < len(cases):
        print(f"... {len(cases) - len(shown)} more cases (--all lists every case)")
    return 0


#: variants or cases written at a time by sweep plan --json (a million-variant plan streams)
_JSON_SLICE = 10_000


def _write_plan_json(out, spec, plan, tail: dict) -> None:
    """The plan as one JSON object - name, cost model, jobs, variants, strategies, GPU counts,
    cases, then ``tail`` - written a slice of variants and cases at a time (the labels come
    from Variants.labels, without building each variant's hardware)."""
    import numpy as np

    def field(key, value, last=False):
        out.write(f" {json.dumps(key)}: {json.dumps(value)}" + ("\n" if last else ",\n"))

    def array(key, items):
        out.write(f" {json.dumps(key)}: [")
        first = True
        for text in items:
            out.write(("\n  " if first else ",\n  ") + text)
            first = False
        out.write("\n ],\n" if not first else "],\n")

    def variant_rows():
        for lo in range(0, len(plan.variants), _JSON_SLICE):
            ids = np.arange(lo, min(lo + _JSON_SLICE, len(plan.variants)))
            names = plan.variants.labels(ids)
            for i, label, swept in zip(ids.tolist(), names["hardware"], names["swept"]):
                yield f'{{"variant_id": {i}, "label": {json.dumps(label)}, "swept": {swept}}}'

    def case_rows():
        cases = plan.cases
        for lo in range(0, len(cases), _JSON_SLICE):
            hi = min(lo + _JSON_SLICE, len(cases))
            ids = np.arange(lo, hi)
            job, _, strategy, gpus = np.unravel_index(ids, cases.shape)
            labels = plan.variants.labels(cases.variant_ids(lo, hi))["hardware"]
            for k, i in enumerate(ids.tolist()):
                yield json.dumps({"case_id": i, "job": spec.jobs[job[k]].name,
                                  "hardware": labels[k],
                                  "strategy": spec.strategies[strategy[k]],
                                  "n_gpus": spec.gpus[gpus[k]],
                                  "candidates": int(cases.candidates[i])})

    out.write("{\n")
    field("name", spec.name)
    field("cost_model", spec.cost_model)
    field("jobs", [j.name for j in spec.jobs])
    array("variants", variant_rows())
    field("strategies", list(spec.strategies))
    field("gpus", list(spec.gpus))
    array("cases", case_rows())
    items = list(tail.items())
    for k, (key, value) in enumerate(items):
        field(key, value, last=k == len(items) - 1)
    out.write("}\n")


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
        if total == 0:  # (nothing left to compute: an earlier run did it all)
            return
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
        # no ETA from the first sliver of work: the start-up (planning, enumeration) would
        # be extrapolated over the whole run (a 2 s run showed ETA 29,657 s)
        eta = (f"ETA {p['elapsed_s'] * (1 - frac) / frac:.0f} s" if frac >= 0.02
               else "ETA not yet known")
        ranks = f"{p['ranks_done']}/{p['ranks']} ranks done, {eta}"
        if p.get("ranks_stopped"):  # (ended on a signal: not done, and no ETA)
            ranks = f"{p['ranks_stopped']}/{p['ranks']} ranks stopped, progress saved"
        print(f"[{p['elapsed_s']:7.1f} s] {100 * frac:5.1f}% of {total:,} candidates, {ranks}",
              file=self.stream, flush=True)


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
    if s.evaluated == 0 and s.resumed_units:
        print(f"sweep {s.plan.spec.name}{shard}: nothing left to compute: its "
              f"{s.resumed_units} work unit(s) were done by an earlier attempt")
        return
    print(f"sweep {s.plan.spec.name}{shard}: {s.evaluated:,} candidates evaluated on {s.ranks} "
          f"rank(s) in {s.wall_s:.2f} s wall "
          f"({s.evaluated / max(sum(busy), 1e-9):,.0f} per busy core-second)")
    if s.resumed_units:
        print(f"  resumed: {s.resumed_units} work unit(s) were done by an earlier attempt")
    print(f"  load imbalance (max/mean - 1): {100 * s.imbalance_time:.1f}% by busy time, "
          f"{100 * s.imbalance_candidates:.1f}% by candidates")


def _cmd_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..analysis.show import format_rows, load_rows
    from ..engine.parallel import get_comm
    from ..engine.runner import RunOptions, run_sweep

    comm = get_comm(use_mpi=not args.serial)
    options = RunOptions(out_dir=Path(args.out) if args.out else None, resume=args.resume,
                         force=args.force, checkpoint_s=args.checkpoint,
                         reduce=not args.no_reduce, shard=args.shard,
                         max_variants=args.max_variants, overrides=tuple(args.overrides),
                         max_memory=args.max_memory,
                         progress=_Progress() if not args.quiet else None,
                         warn=lambda w: print(f"sweep run: warning: {' '.join(w.split())}",
                                              file=sys.stderr, flush=True),
                         notice=(lambda n: print(f"sweep run: {n}", file=sys.stderr,
                                                 flush=True)) if not args.quiet else None)
    args._rank = comm.rank
    if args.force and args.resume:  # (every rank the same; force won, silently)
        raise SweepError("--force and --resume: choose one (--force discards the earlier run, "
                         "--resume continues it)")
    try:
        summary = run_sweep(args.spec, comm, options)
    except (SweepError, OSError) as exc:
        if comm.size == 1:
            raise  # main prints it
        if getattr(exc, "collective", False):  # every rank has it; rank 0 prints it
            code = print_error(args, exc)
            comm.finalize()
            return code
        # this rank's own failure (a part file it cannot write: disk full, permissions)
        _abort_one_rank(comm, str(exc) if isinstance(exc, SweepError) else os_error_text(exc))
    except BaseException as exc:  # one rank failed: abort all ranks instead of hanging
        if comm.size > 1 and not isinstance(exc, (SystemExit, KeyboardInterrupt)):
            import traceback

            traceback.print_exc()
            print(f"sweep run: rank {comm.rank} failed; aborting all ranks", file=sys.stderr,
                  flush=True)
            comm.abort(1)
        raise
    if comm.rank != 0:
        # finished and saved; what is left is MPI's end, which waits for rank 0's merge: a
        # SIGTERM now (a time limit) must not kill this rank, or the launcher kills rank 0
        # before it can say how the merge stopped
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        return 0
    if not args.quiet:
        _print_run_summary(summary)
    if summary.shard is not None:  # (with --quiet too: what a shard has in place of a path)
        print(f"shard {summary.shard[0]}/{summary.shard[1]} done; once every shard is: "
              f"sweep reduce {summary.out_dir}")
    elif summary.reduced is None and args.no_reduce and not args.quiet:
        print(f"part files written, not merged (--no-reduce): sweep reduce {summary.out_dir}")
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
    from ..engine.reduce import reduce_run

    s = reduce_run(args.dir, partial=args.partial)
    state = "complete" if s.complete else f"PARTIAL ({s.units - s.units_done} units missing)"
    print(f"{s.path}: {s.cases} cases, {s.evaluated:,} of {s.candidates:,} candidates from "
          f"{s.parts} part file(s), {state}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from ..engine.status import run_status

    st = run_status(args.dir, verify=args.verify)
    complete = st["units_done"] == st["units"] and not st["corrupt_parts"]
    if args.json:
        print(strict_json(st, indent=1))
        return 0 if complete else 1
    d = st["dir"]
    print(f"{d}: sweep {st['name']} ({st['cost_model']}), {st['cases']:,} cases")
    pct = 100 * st["units_done"] / max(st["units"], 1)
    print(f"done: {st['units_done']:,} of {st['units']:,} work units ({pct:.1f}%), "
          f"{st['candidates_done']:,} of {st['candidates']:,} candidates"
          + (" (as sweep.h5 records: the part files are gone)" if st["done_from_results"]
             else ""))
    if st["parts"]:
        rows = [[p["file"], "-", "-", "-", "CORRUPT", "-"] if p["corrupt"] else
                [p["file"], _worker_text(p), p["shard"] or "-",
                 f"{p['units']:,}",
                 "sealed" if p["sealed"] else "yes" if p["complete"] else "no", p["written_utc"]]
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
    elif res["corrupt"]:
        state = f"CORRUPT ({res['corrupt']})"
    elif not res["current"]:
        state = "of another spec"
    else:
        state = "complete" if res["complete"] else f"partial ({res['units_done']:,} units)"
    print(f"sweep.h5: {state}")
    for p in st["parts"]:
        if p["corrupt"]:
            print(p["corrupt"])
    foreign = [p["file"] for p in st["parts"] if not p["corrupt"] and not p["this_spec"]]
    if foreign:  # a resume would refuse them: say so instead of suggesting it
        print(f"next: {', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''} "
              f"{'was' if len(foreign) == 1 else 'were'} written for another spec than "
              f"{d}/spec.yaml (was it edited?): put the spec back, or move those parts away "
              f"(or start over: sweep run SPEC --out {d} --force)")
        return 1
    if st["running"]:  # a run, reduction or shard works here now: nothing to continue
        print(f"in progress: {'; '.join(st['running'])}")
        print(f"next: wait for it (sweep status {d} again shows how far it has got; part "
              f"files are rewritten at each checkpoint)")
        return 0 if complete else 1
    if st["verified"] and not st["corrupt_parts"] and not (res and res["corrupt"]):
        print("checked: every table's checksum matches")
    if st["corrupt_parts"]:
        print(f"next: sweep run {d}/spec.yaml --out {d} --resume sets the damaged part "
              f"file(s) aside and searches their units again")
    elif complete and res is not None and res["corrupt"]:
        print(f"next: sweep reduce {d} writes sweep.h5 again from the part files"
              if not st["done_from_results"] else
              f"next: the part files are gone: compute it again with sweep run "
              f"{d}/spec.yaml --out {d} --force")
        return 1
    elif complete:
        checked = ("" if st["verified"]
                   else f" (sweep status {d} --verify checks every table first)")
        print(f"next: sweep show {d}/sweep.h5" if state == "complete"
              else f"next: every unit is done; sweep reduce {d}{checked}")
    else:
        again = (f"submit the array again (sweep slurm ... --array {st['shards']} --submit), or "
                 if st["unfinished_shards"] else "")
        print(f"next: {again}sweep run {d}/spec.yaml --out {d} --resume (any number of ranks); "
              f"a look at what is there: sweep reduce {d} --partial")
    return 0 if complete else 1


def _worker_text(part: dict) -> str:
    """rank / ranks of the worker that wrote a part file: of its shard, for a shard's."""
    return f"{part['rank']}/{part['ranks']}"


def _cmd_show(args: argparse.Namespace) -> int:
    from ..analysis.show import format_rows, iter_rows, load_rows, write_rows
    from ..engine.store import read_results_attrs

    try:
        kept = int(read_results_attrs(args.results).get("top_n", 0) or 0) if args.top > 1 else 0
    except SweepError:  # (the reading below names what is wrong with the file)
        kept = 0
    if kept and args.top > kept:
        print(f"sweep show: note: the run kept the top {kept} of each case (the spec's "
              f"top_n); --top {args.top} shows those", file=sys.stderr)
    if args.case is not None:
        attrs, rows = load_rows(args.results, top=args.top, case=args.case)
        print(format_rows(attrs, rows, args.format))
        return 0
    # a slice of cases at a time: a million-case file prints in bounded memory
    write_rows(sys.stdout, iter_rows(args.results, top=args.top), args.format)
    return 0


def add_parsers(sub) -> None:
    """Add this group's commands to the ``sweep`` subparsers ``sub``."""
    pl = sub.add_parser("plan", help="expand a spec and count its cases and candidates")
    pl.add_argument("spec", help="sweep spec (YAML)")
    pl.add_argument("--limit", type=positive_int, default=30, help="cases to list (default 30)")
    pl.add_argument("--all", action="store_true", help="list every case")
    pl.add_argument("--json", action="store_true", help="print JSON")
    pl.add_argument("--ranks", type=rank_count, default=2,
                    help="ranks the time and memory estimates are for (default 2; the time "
                         "is printed for 2 and 64 too)")
    max_memory_flag(pl, "on --ranks ranks")
    max_variants_flag(pl)
    set_flag(pl)
    pl.set_defaults(func=_cmd_plan)

    r = sub.add_parser("run", help="run a sweep (serially, or under mpiexec / srun)")
    r.add_argument("spec", help="sweep spec (YAML)")
    r.add_argument("--out", help="run folder (default results/<spec name>)")
    r.add_argument("--resume", action="store_true", help="continue an earlier run in the folder")
    r.add_argument("--force", action="store_true", help="discard an earlier run in the folder")
    r.add_argument("--checkpoint", type=positive_number, default=60.0, metavar="SECONDS",
                   help="rewrite part files at least this often (default 60)")
    r.add_argument("--no-reduce", action="store_true", help="leave the merge to sweep reduce")
    r.add_argument("--shard", type=shard, metavar="I/K",
                   help="run only shard I (0..K-1) of K, e.g. a Slurm array task; shards "
                        "start in any order, resume, and leave the merge to sweep reduce")
    r.add_argument("--serial", action="store_true", help="do not load MPI")
    r.add_argument("--limit", type=positive_int, default=20, help="cases to print (default 20)")
    r.add_argument("--quiet", action="store_true",
                   help="print only the results path (a shard: that it is done)")
    max_memory_flag(r, "on this run's ranks; nothing is written")
    max_variants_flag(r)
    set_flag(r)
    r.set_defaults(func=_cmd_run)

    rd = sub.add_parser("reduce", help="merge a run folder's part files into sweep.h5")
    rd.add_argument("dir", help="run folder")
    rd.add_argument("--partial", action="store_true", help="reduce an unfinished run")
    rd.set_defaults(func=_cmd_reduce)

    st = sub.add_parser("status", help="progress of a run folder (exit 0 when every unit is "
                                       "done, 1 otherwise)")
    st.add_argument("dir", help="run folder")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.add_argument("--verify", action="store_true",
                    help="also read every part file's top-N table and check its checksums, "
                         "as sweep reduce does (slower on a large run)")
    st.set_defaults(func=_cmd_status)

    sh = sub.add_parser("show", help="best configurations per case of a sweep.h5")
    sh.add_argument("results", help="sweep.h5")
    sh.add_argument("--format", choices=("table", "csv", "json"), default="table")
    sh.add_argument("--top", type=positive_int, default=1, help="configs per case (default 1)")
    sh.add_argument("--case", type=int, help="only this case id")
    sh.set_defaults(func=_cmd_show)

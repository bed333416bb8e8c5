"""``sweep slurm``: render, submit and wait for sbatch scripts and job arrays."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..errors import SweepError
from ._common import (
    max_variants_flag,
    plan_and_estimate,
    positive_int,
    positive_number,
    set_flag,
)


def _cmd_slurm(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from ..engine.reduce import SPEC_NAME
    from ..engine.runner import resolved_yaml
    from ..engine.slurm import SbatchOptions, render_scripts, time_limit_s
    from ..engine.spec import load_spec

    if args.wait and not args.submit:
        raise SweepError("--wait: only with --submit (it waits for the job submitted)")
    spec = load_spec(args.spec, max_variants=args.max_variants,
                     overrides=tuple(args.overrides))
    limit_s = time_limit_s(args.time)
    out = Path(args.out or Path("results") / spec.name).resolve()
    stored = out / SPEC_NAME
    if stored.is_file() and stored.read_text() != resolved_yaml(spec):
        # (the job would stop on it once it starts: say so before anything is submitted)
        raise SweepError(f"{out} holds a run of another spec (or of this one before --set, a "
                         f"job or a hardware file changed it); the job would stop on it: give "
                         f"another --out, or remove that run")
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
        max_running=args.max_running, overrides=tuple(args.overrides))
    scripts = render_scripts(options)  # bad options refused before the estimate is printed
    # refuses a spec that cannot run before anything is written or submitted
    plan, estimate, _ = plan_and_estimate(spec, budget_s=0.5)
    workers = args.nodes * args.ntasks_per_node * max(args.array, 1)
    if workers > len(plan.units):
        print(f"sweep slurm: note: {spec.name} has {len(plan.units)} work units for {workers} "
              f"ranks, so {workers - len(plan.units)} would have nothing to do; use fewer "
              f"(--nodes, --ntasks-per-node, --array) or a smaller unit_size in the spec",
              file=sys.stderr)
    core_s = estimate["core_seconds"]
    per_rank_s = core_s / min(workers, max(len(plan.units), 1)) + estimate["startup_seconds"]
    print(f"sweep slurm: about {core_s:.3g} core-seconds of search at this machine's speed, "
          f"~{per_rank_s:.3g} s on each of {workers} rank(s) with its start-up", file=sys.stderr)
    if limit_s is not None and per_rank_s > 0.8 * limit_s:
        print(f"sweep slurm: note: that is {per_rank_s / limit_s:.0%} of --time {args.time}; "
              f"the job may stop at its limit (submitting again continues it): raise --time "
              f"or use more ranks", file=sys.stderr)
    # the job writes its log there from its first moment: Slurm does not create the folder
    # of --output, so a script submitted by hand later would fail with no log at all
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SweepError(f"{out}: cannot create the run folder ({exc.strerror})") from None
    if not options.shards:
        return _one_job(args, out, scripts["sweep.sbatch"])
    return _job_array(args, out, options, scripts)


def _one_job(args: argparse.Namespace, out, text: str) -> int:
    from pathlib import Path

    from ..engine.slurm import submit

    if not args.submit:
        if args.script:
            Path(args.script).write_text(text)
            print(f"wrote {args.script}")
        else:
            print(text, end="")
        return 0
    script = Path(args.script) if args.script else out / "sweep.sbatch"
    script.write_text(text)
    job_id = submit(script)
    print(f"submitted {script} as job {job_id}; log {out}/slurm-{job_id}.out")
    return _wait_for_results(args, job_id, "", out)


def _wait_for_results(args: argparse.Namespace, job_id: str, label: str, out,
                      if_failed: str = "") -> int:
    """With --wait: wait for the job that writes sweep.h5; 0 if it completed."""
    from ..engine.slurm import wait_for_job

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

    from ..engine.slurm import submit

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


def add_parsers(sub) -> None:
    """Add this group's commands to the ``sweep`` subparsers ``sub``."""
    sl = sub.add_parser("slurm", help="render (and submit) an sbatch script for a sweep")
    sl.add_argument("spec", help="sweep spec (YAML)")
    sl.add_argument("--nodes", type=positive_int, default=1)
    sl.add_argument("--ntasks-per-node", type=positive_int, default=1, help="ranks per node")
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
    sl.add_argument("--array", type=positive_int, default=0, metavar="K",
                    help="a job array of K tasks, each running one shard of the sweep with "
                         "--nodes x --ntasks-per-node ranks, plus a reduce job after it")
    sl.add_argument("--max-running", type=positive_int, default=0, metavar="M",
                    help="with --array: at most M tasks at once (sbatch --array=...%%M)")
    sl.add_argument("--script", help="write the script here (default: print it, or "
                    "<out>/sweep.sbatch with --submit; with --array <out>/sweep-array.sbatch, "
                    "and reduce.sbatch beside it)")
    sl.add_argument("--submit", action="store_true", help="submit it with sbatch")
    sl.add_argument("--wait", action="store_true", help="with --submit: wait for the job")
    sl.add_argument("--wait-timeout", type=positive_number, default=3600.0, metavar="SECONDS")
    max_variants_flag(sl)
    set_flag(sl)
    sl.set_defaults(func=_cmd_slurm)

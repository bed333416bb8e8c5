"""``sweep slurm``: render (and submit) an sbatch script that runs a sweep and its reduction.

One job (``slurm/sweep.sbatch``): all ranks run the sweep in one allocation, then one merges
the parts. A job array (``--array K``, ``slurm/sweep-array.sbatch``): task I runs shard I of K
in its own allocation, so the sweep fits in small, short jobs that the scheduler can backfill,
and a reduce job (``slurm/reduce.sbatch``) merges the parts once the whole array has
succeeded (``--dependency=afterok``).

:func:`render_sbatch` is a pure function of a template and :class:`SbatchOptions`; it is
checked against golden files. Values are shell-quoted.
"""

from __future__ import annotations

import re
import shlex
import string
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import SweepError
from .catalog import REPO_ROOT
from .partition import MAX_SHARDS

__all__ = ["SbatchOptions", "render_sbatch", "render_scripts", "time_limit_s", "TEMPLATE",
           "ARRAY_TEMPLATE", "REDUCE_TEMPLATE", "submit", "wait_for_job", "LAUNCHERS"]

TEMPLATE = REPO_ROOT / "slurm" / "sweep.sbatch"
ARRAY_TEMPLATE = REPO_ROOT / "slurm" / "sweep-array.sbatch"
REDUCE_TEMPLATE = REPO_ROOT / "slurm" / "reduce.sbatch"
#: how the ranks are started inside the allocation; srun gets ``--mpi=<plugin>`` when one is
#: named (``--mpi``), else the site's default (slurm.conf MpiDefault)
LAUNCHERS = {
    "srun": "srun{mpi} --kill-on-bad-exit=1",
    "mpiexec": 'mpiexec -n "$SLURM_NTASKS"',
}
#: sbatch --time forms (sbatch(1)): minutes, minutes:seconds, hours:minutes:seconds,
#: days-hours, days-hours:minutes, days-hours:minutes:seconds
_TIME = re.compile(r"^(?:(\d+)-(\d+)(?::(\d+))?(?::(\d+))?|(\d+)(?::(\d+))?(?::(\d+))?)$")
_UNLIMITED = ("unlimited", "infinite")
_FLAG = re.compile(r"[a-z][a-z0-9-]*")
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_MPI_PLUGIN = re.compile(r"[a-z][a-z0-9_]*")  # srun --mpi=list: pmi2, pmix, pmix_v4, cray_shasta


@dataclass(frozen=True)
class SbatchOptions:
    """Everything the script needs (paths absolute, so it runs from any directory)."""

    spec: str  # spec file
    out: str  # run folder
    job_name: str
    python: str  # interpreter with sweep installed (e.g. a venv on a shared file system)
    workdir: str  # directory the job starts in
    version: str  # sweep version, recorded in the script
    nodes: int = 1
    ntasks_per_node: int = 1
    time: str = "01:00:00"  # Slurm time: minutes, MM:SS, HH:MM:SS or D-HH:MM:SS
    launcher: str = "srun"  # srun | mpiexec
    mpi: str | None = None  # srun --mpi plugin (pmi2, pmix, cray_shasta, ...); None: the site's
    partition: str | None = None
    account: str | None = None
    setup: tuple[str, ...] = ()  # shell lines before the run (module load ..., source ...)
    extra: tuple[tuple[str, str], ...] = ()  # more #SBATCH --key=value lines
    shards: int = 0  # job array of this many tasks, one shard each (0: one job)
    max_running: int = 0  # array tasks running at once (0: no limit)
    overrides: tuple[str, ...] = ()  # the run's --set KEY=VALUE items


def time_limit_s(text: str) -> float | None:
    """Seconds of an sbatch ``--time`` value; None for no limit (UNLIMITED, INFINITE, or 0,
    which sbatch(1) reads as "no time limit").

    Raises:
        SweepError: not a Slurm time.
    """
    if text.strip().lower() in _UNLIMITED:
        return None
    m = _TIME.match(text.strip())
    if not m:
        raise SweepError(f"--time: {text!r} is not a Slurm time (minutes, MM:SS, HH:MM:SS, "
                         f"D-HH, D-HH:MM or D-HH:MM:SS)")
    d, dh, dm, ds, a, b, c = (int(g) if g else 0 for g in m.groups())
    if m.group(1) is not None:  # days-hours[:minutes[:seconds]]
        seconds = ((d * 24 + dh) * 60 + dm) * 60 + ds
    elif m.group(7) is not None:  # hours:minutes:seconds
        seconds = (a * 60 + b) * 60 + c
    else:  # minutes[:seconds]
        seconds = a * 60 + b
    return float(seconds) if seconds else None


def _check(o: SbatchOptions) -> None:
    if o.nodes < 1 or o.ntasks_per_node < 1:
        raise SweepError("--nodes and --ntasks-per-node must be positive")
    if o.shards < 0 or o.max_running < 0:
        raise SweepError("--array and --max-running must not be negative")
    if o.shards > MAX_SHARDS:
        raise SweepError(f"--array {o.shards}: at most {MAX_SHARDS:,} shards")
    if o.max_running and not o.shards:
        raise SweepError("--max-running limits a job array: give --array K too")
    time_limit_s(o.time)
    if o.launcher not in LAUNCHERS:
        raise SweepError(f"--launcher: {o.launcher!r}; valid: {', '.join(LAUNCHERS)}")
    for key, _ in o.extra:
        if not _FLAG.fullmatch(key):
            raise SweepError(f"--sbatch: {key!r} is not an sbatch option name (e.g. qos=debug)")
        if key in SCRIPT_SETS:  # (a second #SBATCH line would contradict the script's own)
            raise SweepError(f"--sbatch {key}: the script sets it; use {SCRIPT_SETS[key]}")
    if not _JOB_NAME.fullmatch(o.job_name):
        raise SweepError(f"--job-name: {o.job_name!r}: expected letters, digits, '.', '_', "
                         f"'+', '-'")
    if o.mpi is not None and not _MPI_PLUGIN.fullmatch(o.mpi):
        raise SweepError(f"--mpi: {o.mpi!r} is not an srun MPI plugin name (see srun --mpi=list; "
                         f"e.g. pmi2, pmix)")
    if o.mpi is not None and o.launcher != "srun":
        raise SweepError("--mpi chooses srun's MPI plugin: use it with --launcher srun")
    # a line break in any value would end the #SBATCH or shell line it is written on
    values = [("--partition", o.partition), ("--account", o.account), ("--python", o.python),
              ("--out", o.out), ("SPEC", o.spec), ("--time", o.time), ("workdir", o.workdir)]
    values += [(f"--sbatch {k}", v) for k, v in o.extra] + [("--setup", x) for x in o.setup]
    values += [("--set", x) for x in o.overrides]
    for name, value in values:
        if value is not None and any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise SweepError(f"{name}: {value!r} contains a control character (line break, "
                             f"tab, ...)")


#: the sbatch options the scripts (slurm/*.sbatch) set themselves, and the flag that sets each
#: (long names and sbatch's lower-case short ones; _FLAG refuses the upper-case ones)
SCRIPT_SETS = {"nodes": "--nodes", "ntasks-per-node": "--ntasks-per-node",
               "ntasks": "--nodes and --ntasks-per-node", "n": "--nodes and --ntasks-per-node",
               "time": "--time", "t": "--time", "job-name": "--job-name",
               "output": "--out (the logs go in the run folder)", "o": "--out",
               "array": "--array K", "a": "--array K", "partition": "--partition",
               "p": "--partition", "account": "--account"}


def render_sbatch(template: str, o: SbatchOptions) -> str:
    """The sbatch script text for ``o`` (pure).

    Raises:
        SweepError: an option is invalid.
    """
    _check(o)
    extra = list(o.extra)
    if o.partition:
        extra.insert(0, ("partition", o.partition))
    if o.account:
        extra.insert(0, ("account", o.account))
    lines = [f"#SBATCH --{k}={shlex.quote(str(v))}" for k, v in extra]
    q = shlex.quote
    text = string.Template(template).substitute(
        job_name=q(o.job_name), reduce_job_name=q(f"{o.job_name}-reduce"), nodes=o.nodes,
        ntasks_per_node=o.ntasks_per_node,
        time=o.time, log=q(str(Path(o.out) / "slurm-%j.out")),
        log_array=q(str(Path(o.out) / "slurm-%A_%a.out")), shards=o.shards,
        last_shard=o.shards - 1, throttle=f"%{o.max_running}" if o.max_running else "",
        sbatch_extra="".join("\n" + x for x in lines), version=o.version, out=q(o.out),
        setup="".join("\n" + x for x in o.setup), workdir=q(o.workdir),
        launcher=LAUNCHERS[o.launcher].replace("{mpi}", f" --mpi={o.mpi}" if o.mpi else ""),
        python=q(o.python),
        spec=q(o.spec) + "".join(f" --set {q(item)}" for item in o.overrides),
        recorded=q(str(Path(o.out) / "spec.yaml")))
    return text


def render_scripts(o: SbatchOptions) -> dict[str, str]:
    """File name -> script text: ``sweep.sbatch`` for one job, or ``sweep-array.sbatch`` and
    ``reduce.sbatch`` for a job array (``o.shards > 0``).

    Raises:
        SweepError: an option is invalid.
    """
    if not o.shards:
        return {TEMPLATE.name: render_sbatch(TEMPLATE.read_text(), o)}
    return {t.name: render_sbatch(t.read_text(), o) for t in (ARRAY_TEMPLATE, REDUCE_TEMPLATE)}


def submit(script: Path, args: Sequence[str] = ()) -> str:
    """``sbatch --parsable script``; returns the job id.

    Raises:
        SweepError: sbatch is missing or refused the script.
    """
    try:
        out = subprocess.run(["sbatch", "--parsable", *args, str(script)], capture_output=True,
                             text=True, timeout=60)
    except FileNotFoundError:
        raise SweepError("sbatch not found: is this a Slurm login node?") from None
    if out.returncode != 0:
        raise SweepError(f"sbatch refused {script}: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip().split(";")[0]


_DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
         "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def wait_for_job(job_id: str, timeout_s: float = 3600.0, poll_s: float = 0.5) -> str:
    """Poll ``scontrol show job`` until the job ends; returns its final state.

    Raises:
        SweepError: the job did not end within ``timeout_s``.
    """
    start = time.monotonic()
    state = "UNKNOWN"
    while time.monotonic() - start < timeout_s:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                             text=True, timeout=60)
        m = re.search(r"JobState=(\S+)", out.stdout)
        if m:
            state = m.group(1)
            if state in _DONE:
                return state
        time.sleep(poll_s)
    raise SweepError(f"job {job_id} still {state} after {timeout_s:.0f} s")

"""The one module that touches MPI (mpi4py, imported lazily).

Everything else takes a ``comm`` with the small interface below; :class:`SerialComm` runs
the same code without MPI. Waits are *polite* (test + sleep) because MPICH's blocking calls
spin at 100 % CPU, which on an oversubscribed node steals time from ranks still computing.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import WorldError

__all__ = ["SerialComm", "MpiComm", "get_comm", "check_world", "launched_tasks", "launcher_rank",
           "STOP_GRACE_S"]

#: after a stop (a signal on any rank), how long a rank waits for the others to reach the
#: end of the run before it aborts the whole job (its own progress is already saved)
STOP_GRACE_S = 10.0


class SerialComm:
    """A communicator of one rank (the serial path and the unit-test path)."""

    rank = 0
    size = 1
    is_mpi = False

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return obj

    def gather(self, obj: Any, root: int = 0) -> list[Any]:
        return [obj]

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def barrier(self, timeout_s: float | None = None) -> bool:
        return True

    def abort(self, code: int = 1) -> None:
        raise SystemExit(code)

    def finalize(self) -> None:
        """Nothing to end without MPI."""

    def post(self, obj: Any) -> None:
        """Progress to rank 0 (nothing to do with one rank)."""

    def collect(self) -> list[Any]:
        """Progress posted by the other ranks (none)."""
        return []

    def settle(self, timeout_s: float | None = None) -> bool:
        """Wait for this rank's posts to be delivered (none)."""
        return True

    def send_stop(self, signum: int) -> None:
        """Tell the other ranks to stop (there are none)."""

    def poll_stop(self) -> int:
        """A stop request from another rank: its signal number, or 0 (never, serially)."""
        return 0

    def agree_stop(self, signum: int, waiting: Any = None) -> int:
        """The largest signal number any rank stopped on (0: none); see MpiComm."""
        return signum

    def ask_work(self) -> None:
        """Ask rank 0 for a piece of shared work (one rank shares none)."""
        raise RuntimeError("a communicator of one rank has no one to ask for work")

    def poll_work(self) -> tuple[bool, int]:
        """Whether the answer to ``ask_work`` has come, and the piece (-1: none left)."""
        raise RuntimeError("a communicator of one rank has no one to ask for work")

    def serve_work(self, deal: Callable[[], int]) -> None:
        """Rank 0: answer the requests for work that have arrived (none)."""

    def settle_work(self, timeout_s: float) -> None:
        """Wait for this rank's requests and answers to be delivered (none)."""

    def abort_stuck(self, why: str) -> None:
        """Abort the job: another rank is stuck (never, serially)."""


class MpiComm:
    """Wraps an mpi4py communicator (a duplicate of COMM_WORLD, so our traffic is ours)."""

    is_mpi = True

    #: message tags of progress posts and stop requests (on our duplicate communicator)
    PROGRESS_TAG = 77
    STOP_TAG = 78
    #: a rank's request for a piece of the shared work, and rank 0's answer
    WORK_TAG = 79
    WORK_ANSWER_TAG = 80

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._posts: list[Any] = []
        self._stops: list[Any] = []
        self._stop_seen = 0
        self._asks: list[Any] = []  # sends of this rank's requests for work
        self._answer: Any = None  # the receive of rank 0's answer to the last one
        self._answers: list[Any] = []  # rank 0: sends of its answers

    def _wait(self, request: Any, timeout_s: float | None) -> bool:
        start = time.monotonic()
        delay = 1e-4
        while not request.Test():
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        return True

    def bcast(self, obj: Any, root: int = 0) -> Any:
        self.barrier()
        return self._comm.bcast(obj, root=root)

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        self.barrier()
        return self._comm.gather(obj, root=root)

    def allgather(self, obj: Any) -> list[Any]:
        self.barrier()
        return self._comm.allgather(obj)

    def barrier(self, timeout_s: float | None = None) -> bool:
        """Polite barrier; with a timeout, returns False if not everyone arrived in time."""
        return self._wait(self._comm.Ibarrier(), timeout_s)

    def abort(self, code: int = 1) -> None:
        self._comm.Abort(code)

    def finalize(self) -> None:
        """End MPI on this rank now. Every rank calls it before a *collective* non-zero exit
        (all agreed to stop, or all have the same bad input): under ``python -m mpi4py`` a
        non-zero exit of a rank with MPI still up becomes MPI_Abort, which Open MPI reports
        as a failure of that rank with a page of text."""
        from mpi4py import MPI

        self._comm.Free()
        if not MPI.Is_finalized():
            MPI.Finalize()

    def post(self, obj: Any) -> None:
        """Send a progress record to rank 0 without waiting for it to be received."""
        self._posts = [r for r in self._posts if not r.Test()]
        self._posts.append(self._comm.isend(obj, dest=0, tag=self.PROGRESS_TAG))

    def collect(self) -> list[Any]:
        """On rank 0: every progress record that has arrived, oldest first."""
        from mpi4py import MPI

        out = []
        while self._comm.iprobe(source=MPI.ANY_SOURCE, tag=self.PROGRESS_TAG):
            out.append(self._comm.recv(source=MPI.ANY_SOURCE, tag=self.PROGRESS_TAG))
        return out

    def settle(self, timeout_s: float | None = None) -> bool:
        """Wait (politely) until rank 0 has received this rank's posts."""
        ok = all(self._wait(r, timeout_s) for r in self._posts)
        self._posts = []
        return ok

    def send_stop(self, signum: int) -> None:
        """Ask every other rank to stop (non-blocking): a signal that reached one rank only
        (``kill`` of one process, a launcher that signals one task) stops the whole job."""
        for dest in range(self.size):
            if dest != self.rank:
                self._stops.append(self._comm.isend(int(signum), dest=dest, tag=self.STOP_TAG))

    def poll_stop(self) -> int:
        """A stop request another rank has sent: its signal number, or 0. Cheap (a probe)."""
        while self._comm.iprobe(tag=self.STOP_TAG):
            from mpi4py import MPI

            self._stop_seen = max(self._stop_seen,
                                  int(self._comm.recv(source=MPI.ANY_SOURCE, tag=self.STOP_TAG)))
        return self._stop_seen

    def agree_stop(self, signum: int, waiting: Any = None) -> int:
        """Every rank calls this once, at the end of its work: returns the largest signal
        number any rank stopped on (0: nobody stopped), so that all ranks take the same way
        out. A rank that has finished waits here for the ones still computing, for as long
        as they compute; ``waiting()`` is called while it waits (progress) and returns this
        rank's own late signal, if any. Once any rank has stopped, the others come within
        a block of work; if they have not after ``STOP_GRACE_S``, this rank aborts the job
        (every rank's progress is saved by then) instead of hanging until the allocation
        ends."""
        from mpi4py import MPI

        mine = np.array([signum], dtype=np.int64)
        out = np.zeros(1, dtype=np.int64)
        request = self._comm.Iallreduce(mine, out, op=MPI.MAX)
        stop_at = time.monotonic() if signum else None
        delay = 1e-4
        while not request.Test():
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
            late = waiting() if waiting is not None else 0
            if stop_at is None and (late or self.poll_stop()):
                stop_at = time.monotonic()
            if stop_at is not None and time.monotonic() - stop_at > STOP_GRACE_S:
                print(f"sweep run: rank {self.rank}: the other ranks did not reach the end of "
                      f"the run within {STOP_GRACE_S:.0f} s of a stop request; aborting the "
                      f"job (saved progress is kept; continue with --resume)",
                      file=sys.stderr, flush=True)
                self.abort(143)
        self.poll_stop()  # drain requests that crossed the agreement
        return int(out[0])

    def ask_work(self) -> None:
        """Ask rank 0 for the next piece of shared work, without waiting: the answer comes
        through ``poll_work`` (one request at a time)."""
        if self._answer is not None:
            raise RuntimeError("a request for work is already waiting for its answer")
        self._asks = [r for r in self._asks if not r.Test()]
        self._asks.append(self._comm.isend(self.rank, dest=0, tag=self.WORK_TAG))
        self._answer = self._comm.irecv(source=0, tag=self.WORK_ANSWER_TAG)

    def poll_work(self) -> tuple[bool, int]:
        """Whether rank 0 has answered the last ``ask_work``, and its answer: the piece to
        search (-1: none left)."""
        if self._answer is None:
            raise RuntimeError("no request for work is waiting for an answer")
        arrived, piece = self._answer.test()
        if not arrived:
            return False, -1
        self._answer = None
        return True, int(piece)

    def serve_work(self, deal: Callable[[], int]) -> None:
        """Rank 0: answer each request for work that has arrived with ``deal()``, without
        waiting for the answers to be received. Cheap when none has (a probe)."""
        from mpi4py import MPI

        status = MPI.Status()
        while self._comm.iprobe(source=MPI.ANY_SOURCE, tag=self.WORK_TAG, status=status):
            source = status.Get_source()
            self._comm.recv(source=source, tag=self.WORK_TAG)
            self._answers = [r for r in self._answers if not r.Test()]
            self._answers.append(self._comm.isend(int(deal()), dest=source,
                                                  tag=self.WORK_ANSWER_TAG))

    def settle_work(self, timeout_s: float) -> None:
        """Wait (politely) until this rank's requests for work, or rank 0's answers, have
        been received: at the end of a run every one has (each request was answered and
        each answer taken in), so this returns at once unless something is stuck, and then
        aborts the job."""
        for request in self._asks + self._answers:
            if not self._wait(request, timeout_s):
                self.abort_stuck("a request for work or its answer was never received")
        self._asks, self._answers = [], []

    def abort_stuck(self, why: str) -> None:
        """Abort the whole job (exit 143, as after a stop nobody completes): ``why``."""
        print(f"sweep run: rank {self.rank}: {why}; aborting the job (saved progress is "
              f"kept; continue with --resume)", file=sys.stderr, flush=True)
        self.abort(143)


def launcher_rank() -> int | None:
    """This process's rank as its MPI launcher or Slurm set it, read before MPI is loaded
    (None: not started as one of several tasks)."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return None


def launched_tasks() -> int:
    """Tasks the launcher started for this step, from its environment (1 if unknown)."""
    for var in ("SLURM_STEP_NUM_TASKS", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 1


def check_world(size: int) -> None:
    """Refuse N independent 1-rank worlds (``srun`` without an MPI plugin).

    Raises:
        WorldError: the launcher started several tasks but each sees a world of one.
    """
    tasks = launched_tasks()
    if size == 1 and tasks > 1:
        raise WorldError(
            f"started as {tasks} tasks but MPI sees a world of 1 rank: each task would run "
            f"the whole sweep and overwrite the others' files. Under Slurm give srun the plugin "
            f"of the MPI that mpi4py loads ('srun --mpi=pmi2' for MPICH, 'srun --mpi=pmix' for "
            f"Open MPI; 'srun --mpi=list'; sweep slurm --mpi), or use mpiexec inside the "
            f"allocation")


def check_library() -> None:
    """Refuse to start MPICH's library under Open MPI's launcher, before MPI_Init fails.

    With the ``mpich`` extra installed, mpi4py loads the venv's MPICH first, even when the
    site's Open MPI ``mpirun`` started the ranks; MPICH cannot talk to it (PMIx) and every
    rank dies in MPI_Init with a cryptic message. Uses mpi4py's own library probe (it opens
    the library, does not initialise it); anything unexpected there skips the check.

    Raises:
        WorldError: launched by Open MPI while mpi4py would load MPICH.
    """
    if "OMPI_COMM_WORLD_SIZE" not in os.environ:
        return
    try:
        from mpi4py import _mpiabi

        abi = _mpiabi._get_mpiabi()
    except Exception:  # a private probe of mpi4py 4.1; other versions: no check
        return
    if abi == "mpich":
        raise WorldError(
            "started by Open MPI's mpirun, but mpi4py would load an MPICH library (the "
            "'mpich' extra in this environment?). Use the site MPI: 'pip uninstall mpich', or "
            "point mpi4py at Open MPI with MPI4PY_LIBMPI=libmpi.so.40 (e.g. mpirun -x "
            "MPI4PY_LIBMPI=libmpi.so.40 ...)")


def get_comm(use_mpi: bool = True) -> SerialComm | MpiComm:
    """COMM_WORLD (duplicated) if MPI can be loaded, else a serial communicator.

    Raises:
        WorldError: launched as several tasks that MPI does not connect, or launched by an
            MPI launcher while the MPI library cannot be loaded.
    """
    if not use_mpi or os.environ.get("SWEEP_NO_MPI"):
        tasks = launched_tasks()
        if tasks > 1:  # (--serial or SWEEP_NO_MPI under a launcher)
            why = "--serial" if not use_mpi else "SWEEP_NO_MPI"
            raise WorldError(f"{why} under a launcher that started {tasks} tasks: "
                             f"each would run the whole sweep and overwrite the others' files "
                             f"(run {why} as one process, or drop it to run under MPI)")
        return SerialComm()
    check_library()
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        if launched_tasks() > 1:
            raise WorldError(f"launched as {launched_tasks()} tasks but MPI cannot be loaded "
                             f"({exc}); install the 'mpich' extra or load the site MPI") from None
        return SerialComm()
    world = MPI.COMM_WORLD
    check_world(world.Get_size())
    if world.Get_size() == 1:
        return SerialComm()
    return MpiComm(world.Dup())

"""The one module that touches MPI (mpi4py, imported lazily).

Everything else takes a ``comm`` with the small interface below; :class:`SerialComm` runs
the same code without MPI. Waits are *polite* (test + sleep) because MPICH's blocking calls
spin at 100 % CPU, which on an oversubscribed node steals time from ranks still computing.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .errors import WorldError

__all__ = ["SerialComm", "MpiComm", "get_comm", "check_world", "launched_tasks"]


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

    def post(self, obj: Any) -> None:
        """Progress to rank 0 (nothing to do with one rank)."""

    def collect(self) -> list[Any]:
        """Progress posted by the other ranks (none)."""
        return []

    def settle(self, timeout_s: float | None = None) -> bool:
        """Wait for this rank's posts to be delivered (none)."""
        return True


class MpiComm:
    """Wraps an mpi4py communicator (a duplicate of COMM_WORLD, so our traffic is ours)."""

    is_mpi = True

    #: message tag of progress posts (on our duplicate communicator, so no clash)
    PROGRESS_TAG = 77

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._posts: list[Any] = []

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
            f"the whole sweep and overwrite the others' files. Under Slurm use "
            f"'srun --mpi=pmi2 ...' (or mpiexec inside the allocation); check 'srun --mpi=list'")


def get_comm(use_mpi: bool = True) -> SerialComm | MpiComm:
    """COMM_WORLD (duplicated) if MPI can be loaded, else a serial communicator.

    Raises:
        WorldError: launched as several tasks that MPI does not connect, or launched by an
            MPI launcher while the MPI library cannot be loaded.
    """
    if not use_mpi or os.environ.get("SWEEP_NO_MPI"):
        check_world(1)
        return SerialComm()
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

"""Exceptions of the sweep package.

Every error caused by user input derives from :class:`SweepError`; the command line turns
any of them into one line on stderr and exit code 2. Bad *candidates* are never exceptions:
they are rows with ``feasible = False`` and a reason code (``schema.Reason``).
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["SweepError", "SpecError", "StoreError", "WorldError", "install_hint",
           "DISTRIBUTION", "EarlySignal", "interrupted"]

#: the distribution's name (the import name and the command stay ``sweep``; the PyPI
#: project called ``sweep`` is an unrelated one, SWeeP)
DISTRIBUTION = "sweep-hpc"


def install_hint(extra: str) -> str:
    """How to install an optional extra: from the checkout, never ``pip install sweep``."""
    return (f"pip install -e '.[{extra}]' in the sweep checkout (distribution {DISTRIBUTION}; "
            f"the PyPI package named 'sweep' is unrelated)")


class SweepError(Exception):
    """Base class of every error the user can fix by changing the input."""


class SpecError(SweepError):
    """A spec, hardware or job file is malformed, or refers to something unknown.

    The message reads ``<file>: <key path>: <what is wrong>``.
    """

    def __init__(self, source: str, key: str, message: str) -> None:
        self.source = source
        self.key = key
        where = f"{source}: {key}: " if key else f"{source}: "
        super().__init__(_one_line(where + message))


def _one_line(text: str) -> str:
    """Control characters (a newline in a YAML key, say) escaped: an error stays one line."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


class StoreError(SweepError):
    """A result folder or HDF5 file is missing, corrupt or does not match the run."""


class WorldError(SweepError):
    """The MPI world does not match how the job was launched (e.g. srun without PMI)."""


class EarlySignal(KeyboardInterrupt):
    """SIGTERM before a run's own stop handling (sweep._entry): handled as Ctrl-C is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def interrupted(command: str, exc: KeyboardInterrupt) -> int:
    """Ctrl-C or an EarlySignal outside a run's handlers: one line, then death by the signal
    itself (exit 128 + signal to a shell): an MPI launcher then tears the job down, where a
    plain exit could leave another rank waiting in MPI_Init for this one (mpiexec hung)."""
    signum = exc.signum if isinstance(exc, EarlySignal) else signal.SIGINT
    print(f"{command}: interrupted"
          + (f" (signal {int(signum)})" if signum != signal.SIGINT else ""),
          file=sys.stderr, flush=True)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return 128 + int(signum)  # (not reached where the signal kills)

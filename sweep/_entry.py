"""The ``sweep`` command's entry point: the command line, loaded with SIGTERM acting as
Ctrl-C until a run installs its own stop handling (sweep.engine.runner), so that a signal in
the first second - while Python imports numpy and the subcommands, or while a run plans -
ends the process with one line and not a traceback or a silent kill."""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["EarlySignal", "interrupted", "main"]


class EarlySignal(KeyboardInterrupt):
    """SIGTERM before a run's own handlers: handled as Ctrl-C is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise(signum, frame) -> None:
    raise EarlySignal(signum)


def interrupted(command: str, exc: KeyboardInterrupt) -> int:
    """One line, then death by the signal itself (exit 128 + signal to a shell): an MPI
    launcher then tears the job down, where a plain exit could leave another rank waiting in
    MPI_Init for this one (mpiexec hung)."""
    signum = exc.signum if isinstance(exc, EarlySignal) else signal.SIGINT
    print(f"{command}: interrupted"
          + (f" (signal {int(signum)})" if signum != signal.SIGINT else ""),
          file=sys.stderr, flush=True)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return 128 + int(signum)  # (not reached where the signal kills)


def main() -> int:
    try:
        signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread: no signal handling
        pass
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt as exc:  # (Ctrl-C or SIGTERM while importing)
        return interrupted("sweep", exc)
    return cli_main()

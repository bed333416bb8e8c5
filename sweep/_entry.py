"""The ``sweep`` command's entry point (with ``sweep/__main__.py``, above every layer): the
command line, loaded with SIGTERM acting as Ctrl-C until a run installs its own stop
handling (sweep.engine.runner), so that a signal in the first second - while Python imports
numpy and the subcommands, or while a run plans - ends the process with one line, not a
traceback or a silent kill."""

from __future__ import annotations

import signal

from .errors import EarlySignal, interrupted

__all__ = ["main"]


def _raise(signum, frame) -> None:
    raise EarlySignal(signum)


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

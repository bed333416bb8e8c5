"""The ``sweep`` command line: argument parsing and printing only, no math.

Every :class:`~sweep.errors.SweepError` (bad spec, unknown name, bad value, bad results
folder) becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
from collections.abc import Sequence

from .. import __version__
from ..engine._alloc import keep_heap
from ..engine.parallel import launcher_rank
from ..errors import SweepError, interrupted
from . import bench, figures, predict, run, slurm, validate
from ._common import os_error_text, print_error

__all__ = ["main", "build_parser"]

#: command groups in the order ``sweep --help`` lists them
GROUPS = (run, slurm, predict, figures, validate, bench)


class _Parser(argparse.ArgumentParser):
    """An argument error is one line on stderr, exit code 2, as every other bad input is
    (argparse prints the whole usage block first); its subcommands' parsers are of this
    class too (add_subparsers takes the parent's)."""

    def error(self, message: str):
        # under a launcher every rank parses the same arguments: rank 0 says it once
        quiet = launcher_rank() not in (None, 0)
        self.exit(2, None if quiet else f"{self.prog}: error: {message} (see {self.prog} "
                                        f"--help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sweep", description="MPI-parallel design-space sweeps for distributed "
                                  "transformer training.")
    parser.add_argument("--version", action="version", version=f"sweep {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.add_parsers(sub)
    parser.commands = sub.choices  # name -> its parser
    return parser


def _negative_values_joined(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--opt -1GB`` as ``--opt=-1GB`` for an option that takes one value: argparse reads a
    value that starts with '-' and is not a plain number as the next option and says only
    "expected one argument"; joined, the option's own check names what is wrong with it."""
    command = next((a for a in argv if not a.startswith("-")), None)
    sub = getattr(parser, "commands", {}).get(command)
    if sub is None:
        return argv
    # (argparse lists a parser's options in _actions; there is no public accessor)
    takes_one = {o for a in sub._actions if a.nargs is None and a.option_strings
                 for o in a.option_strings}
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in takes_one and re.match(r"-[\d.]", arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = _negative_values_joined(parser, list(sys.argv[1:] if argv is None else argv))
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the subcommand's parser, which names its own --help
        parser.commands[args.command].error(
            f"unrecognized arguments: {' '.join(extra)}")
    keep_heap()  # no page-fault churn between blocks (sweep/engine/_alloc.py)
    if args.command != "run":
        # SIGTERM as Ctrl-C (sweep._entry) served while the command loaded; a run keeps it
        # until its own stop handling takes over, the others die by SIGTERM at once again
        # (a KeyboardInterrupt would wait for validate's re-fit workers to finish their task)
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:  # not the main thread
            pass
    try:
        return int(args.func(args) or 0)
    except SweepError as exc:
        return print_error(args, exc)
    except BrokenPipeError:  # e.g. `sweep show ... | head`
        return 0
    except KeyboardInterrupt as exc:  # Ctrl-C (or SIGTERM, sweep._entry) before a run's
        # own handlers (planning), or elsewhere: one line, then death by that signal
        return interrupted(f"sweep {args.command}", exc)
    except OSError as exc:  # permissions, disk full, a vanished file: one line, exit 2
        print(f"sweep {args.command}: error: {os_error_text(exc)}", file=sys.stderr,
              flush=True)
        return 2

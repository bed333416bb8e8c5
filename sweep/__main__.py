"""``python -m sweep`` (and ``python -m mpi4py -m sweep``) runs the command line."""

from .cli import main

raise SystemExit(main())

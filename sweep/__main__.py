"""``python -m sweep`` (and ``python -m mpi4py -m sweep``) runs the command line."""

from ._entry import main

raise SystemExit(main())

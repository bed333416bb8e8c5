"""The model layer: what a training job costs on a piece of hardware. Pure numpy, no I/O.

* ``job``, ``hardware``, ``units`` - the job and hardware records and their validation;
* ``schema`` - the candidate and result row layouts (numpy dtypes) and reason codes;
* ``candidates`` - the parallelization space of a case, enumerated as blocks of rows;
* ``cost/`` - the cost profiles (``nersc2024``, ``calibrated``): a block of candidates in,
  times, memory and a feasibility reason out, vectorised over rows;
* ``search`` and ``topn`` - a case's candidates through the cost core into its top-N.

Nothing here imports MPI, HDF5 or YAML, opens a file or prints (tests/model/test_purity.py);
it imports only ``sweep.errors`` outside itself. A new cost mechanism goes in ``cost/``.
"""

"""The engine layer: a sweep spec through MPI ranks into one results file.

``spec -> variants -> plan -> partition -> runner (parallel) -> store -> reduce``, plus
``catalog`` (the hardware/ and jobs/ YAML files), ``status``, ``lock`` and ``slurm``.
``parallel`` is the only module that imports mpi4py and ``store`` the only one that
writes HDF5. It depends on ``sweep.model`` and never on ``sweep.analysis`` or the CLI.
A new spec key goes in ``spec``.
"""

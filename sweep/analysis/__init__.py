"""The analysis layer: reading results and judging the model.

* ``results``, ``show``, ``plot``, ``report`` - a ``sweep.h5`` as DataFrames, tables,
  figures and an HTML report (a new figure kind goes in ``plot``);
* ``predict`` - one configuration's time, memory and per-op table;
* ``measured`` - the measured-data contract: columns, free-text labels, conventions;
* ``calibration`` and ``validate`` - fitting the calibrated profile on measured runs and
  its accuracy per source and category, leave-one-source-out;
* ``bench`` - candidates per core-second; ``fmt`` - number formatting for people.

It depends on ``sweep.engine`` (the results file format, the catalog) and ``sweep.model``,
never on the CLI.
"""

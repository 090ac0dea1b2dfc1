"""The benchmark behind ``benchmark.py``: measure gradient strategies on the model zoo.

Modules, one job each:

- :mod:`~benchmark_lib.cli`: the command line; checks arguments before TensorFlow loads.
- :mod:`~benchmark_lib.modes`: the modes (sweep, ``--max-batch``, ``--rewrite-timing``,
  ``--simulator-check``), a registry new modes join.
- :mod:`~benchmark_lib.config`: typed configuration and presets; :mod:`~benchmark_lib.catalog`:
  the models and strategies, known without TensorFlow.
- :mod:`~benchmark_lib.protocol`, :mod:`~benchmark_lib.worker`, :mod:`~benchmark_lib.pool`:
  what a worker process is told and says, the worker itself, and the parent's process pool.
- :mod:`~benchmark_lib.runner`: measuring runs and keeping the results folder current;
  :mod:`~benchmark_lib.resume`: what happens to rows already in the folder;
  :mod:`~benchmark_lib.storage`: rows and the files they are written to.
- :mod:`~benchmark_lib.report`, :mod:`~benchmark_lib.plots`: Markdown tables and PNG plots;
  :mod:`~benchmark_lib.progress`: what the user sees meanwhile.
- :mod:`~benchmark_lib.units`, :mod:`~benchmark_lib.environment`: small helpers (the
  largest-batch search is :mod:`ome.core.bisect`'s).

Only the worker imports TensorFlow (and the modes that need it, once arguments are checked);
the metrics themselves are defined in :mod:`ome.measure`.
"""

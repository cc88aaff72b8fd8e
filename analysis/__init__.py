"""gradstat analysis layer: everything that touches gradient dumps and people.

Rooms, from the ground up (each may import only the rooms below it; ``pyproject.toml``'s import-linter contract
checks the order):

- :mod:`~gradstat.analysis.measure`: intervals, verdicts, gradient-vector sources, tables, selections;
- :mod:`~gradstat.analysis.dumps`: the gradient dump format (reader, writer, import/export);
- :mod:`~gradstat.analysis.training`: built-in workloads, the recorder, simulated data parallelism;
- :mod:`~gradstat.analysis.plots`: figures drawn from tables (no computation of their own);
- :mod:`~gradstat.analysis.studies`: one module per study (fits, thresholds, replay, variance, feedback,
  variance vs gain), each with a ``run`` that computes its tables and writes them with their figures;
- :mod:`~gradstat.analysis.bench`: benchmarks;
- :mod:`~gradstat.analysis.validation`: the checks of the papers' claims, above the studies they reuse;
- :mod:`~gradstat.analysis.experiments`: the papers' experiments;
- :mod:`~gradstat.analysis.report`: the Markdown report rendered from measured rows;
- :mod:`~gradstat.analysis.cli`: the ``gradstat`` command (parse, call one function, print).

May import :mod:`gradstat.theory` and :mod:`gradstat.compressors`; nothing of theirs imports it back.
"""

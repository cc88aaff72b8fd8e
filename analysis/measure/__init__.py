"""The ground of the analysis layer: what every study, check, experiment and the report share.

- :mod:`~gradstat.analysis.measure.intervals`: Monte Carlo confidence intervals (99 % by default);
- :mod:`~gradstat.analysis.measure.verdicts`: claim directions and the verdict rule;
- :mod:`~gradstat.analysis.measure.sources`: the gradient vectors a measurement runs on (a dump or a synthetic law);
- :mod:`~gradstat.analysis.measure.tables`: CSV + Markdown tables, written atomically or row by row;
- :mod:`~gradstat.analysis.measure.selection`: parsing of ``--steps``, ``--layers``, ``--workers``, ``--device``.
"""

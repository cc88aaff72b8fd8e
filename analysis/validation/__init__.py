"""Validation of the papers' claims by Monte Carlo experiments; stands above the studies it reuses.

- :mod:`~gradstat.analysis.validation.engine`: :class:`Check`, :class:`Result`, running checks;
- :mod:`~gradstat.analysis.validation.checks`: the checks, one module per paper family;
- :mod:`~gradstat.analysis.validation.registry`: every check, in table order;
- :mod:`~gradstat.analysis.validation.outputs`: the validation table written as the checks finish;
- :mod:`~gradstat.analysis.validation.mutations`: planted bugs for every check (realistic and gross) and the
  kill-rate table (``python -m gradstat.analysis.validation.mutations --out reports/mutations.md``);
  :mod:`~gradstat.analysis.validation.bugs` plants them where the default configuration computes,
  :mod:`~gradstat.analysis.validation.planting` applies one and counts its patches' calls.

Intervals, verdicts and gradient sources are in :mod:`gradstat.analysis.measure`.
"""

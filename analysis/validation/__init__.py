"""Validation of the papers' claims by Monte Carlo experiments; stands above the studies it reuses.

- :mod:`~gradstat.analysis.validation.engine`: :class:`Check`, :class:`Result`, running checks;
- :mod:`~gradstat.analysis.validation.checks`: the checks, one module per paper family;
- :mod:`~gradstat.analysis.validation.registry`: every check, in table order;
- :mod:`~gradstat.analysis.validation.outputs`: the validation table written as the checks finish.

Intervals, verdicts and gradient sources are in :mod:`gradstat.analysis.measure`.
"""

"""Validation of the papers' claims by Monte Carlo experiments.

- :mod:`analysis.validation.intervals`: mean and proportion confidence intervals (99 % by default);
- :mod:`analysis.validation.engine`: :class:`Check`, verdicts (holds / tight / violated / not applicable);
- :mod:`analysis.validation.vectors`: the gradients checks run on (synthetic or from a dump);
- :mod:`analysis.validation.checks`: the checks, one module per paper family;
- :mod:`analysis.validation.registry`: every check, in table order.
"""

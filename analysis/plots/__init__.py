"""Figures (matplotlib, Agg backend): one module per figure family, every PNG written with the CSV behind it.

- :mod:`analysis.plots.fits`: PDF/CDF of |g| with fitted curves, QQ plot, tail check, parameter drift;
- :mod:`analysis.plots.thresholds`: k_hat/k per step for each threshold estimator;
- :mod:`analysis.plots.variance_gain`: min gamma over (k, Q) vs gain with QSGD and Wangni (QCS Fig. 3);
- :mod:`analysis.plots.feedback`: residual bound eta vs feedback weight beta.
"""
from analysis.plots.common import new_figure, save_figure

__all__ = ["new_figure", "save_figure"]

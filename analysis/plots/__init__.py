"""Figures (matplotlib, Agg backend): one module per figure family, every PNG written with the CSV behind it.

- :mod:`gradstat.analysis.plots.fits`: PDF/CDF of |g| with fitted curves, QQ plot, tail check, parameter drift;
- :mod:`gradstat.analysis.plots.thresholds`: k_hat/k per step for each threshold estimator;
- :mod:`gradstat.analysis.plots.variance_gain`: min gamma over (k, Q) vs gain with QSGD and Wangni (QCS Fig. 3);
- :mod:`gradstat.analysis.plots.feedback`: residual bound eta vs feedback weight beta.
"""

from gradstat.analysis.plots.common import new_figure, save_figure

__all__ = ["new_figure", "save_figure"]

"""Confidence intervals for Monte Carlo estimates: a mean (Student t) and a proportion (Clopper-Pearson).

Every estimate the analysis layer reports next to a theory value carries one of these intervals, at a stated
two-sided level (``DEFAULT_LEVEL`` unless the caller says otherwise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats

DEFAULT_LEVEL = 0.99
"""Two-sided confidence level of every interval the validation table prints (99 %)."""


@dataclass(frozen=True)
class Estimate:
    """A Monte Carlo estimate: ``mean`` with a two-sided interval ``[low, high]`` at ``level`` from ``trials`` draws."""

    mean: float
    low: float
    high: float
    trials: int
    level: float = DEFAULT_LEVEL

    def __str__(self) -> str:
        return f"{self.mean:.4g} [{self.low:.4g}, {self.high:.4g}]"


def _check_level(level: float) -> float:
    level = float(level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must lie in (0, 1), got {level}")
    return level


def mean_ci(samples: Sequence[float] | np.ndarray, level: float = DEFAULT_LEVEL) -> Estimate:
    """Mean of i.i.d. ``samples`` with a Student-t interval at ``level``.

    Parameters
    ----------
    samples : 1-D array of at least 2 finite values (one per independent trial).
    level : two-sided confidence level in (0, 1).

    Returns
    -------
    Estimate with ``trials = len(samples)``; a zero-variance sample gives a zero-width interval.
    """
    level = _check_level(level)
    x = np.asarray(samples, dtype=np.float64).reshape(-1)
    if x.size < 2:
        raise ValueError(f"mean_ci needs at least 2 samples, got {x.size}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"mean_ci: {int((~np.isfinite(x)).sum())} of {x.size} samples are NaN/Inf")
    m = float(x.mean())
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return Estimate(m, m - half, m + half, int(x.size), level)


def proportion_ci(successes: int, trials: int, level: float = DEFAULT_LEVEL) -> Estimate:
    """Proportion ``successes / trials`` with the exact (Clopper-Pearson) interval at ``level``."""
    level = _check_level(level)
    if trials < 1:
        raise ValueError(f"proportion_ci needs trials >= 1, got {trials}")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must lie in [0, trials={trials}], got {successes}")
    a = 1.0 - level
    low = 0.0 if successes == 0 else float(stats.beta.ppf(a / 2, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(stats.beta.ppf(1 - a / 2, successes + 1, trials - successes))
    return Estimate(successes / trials, low, high, int(trials), level)


def quantile_interval(samples: Sequence[float] | np.ndarray, coverage: float = 0.9) -> tuple[float, float]:
    """Central empirical interval holding ``coverage`` of the samples (e.g. SIDCo's 90 % interval of k_hat/k)."""
    coverage = _check_level(coverage)
    x = np.asarray(samples, dtype=np.float64).reshape(-1)
    if x.size == 0:
        raise ValueError("quantile_interval: no samples")
    lo, hi = np.quantile(x, [(1 - coverage) / 2, (1 + coverage) / 2])
    return float(lo), float(hi)

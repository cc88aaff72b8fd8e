"""Variance vs compression gain, QCS Fig. 3 (Abdi & Fekri, Quantized Compressive Sampling, discussion after
eq. (11)), with measured points.

Theory curves (computed by :mod:`theory`):

- QCS: the least gamma (10) over valid (k, Q) with gain (11) >= G (:func:`gradstat.theory.qcs.min_gamma_curve`);
- QSGD: Lemma 3.1's ``min(n/s^2, sqrt(n)/s)`` (:func:`gradstat.theory.qsgd.variance_bound`) at its gain
  ``32 / log2(2s + 1)`` (codes only, as (11) counts QCS; at most ~20 for s >= 1);
- unbiased random sparsification (Wangni et al.): keep probability ``p = k/n`` for all coordinates, variance
  ``(1/p - 1)`` (:func:`gradstat.theory.wangni.variance` at uniform p, the worst case of the optimal p), gain
  ``32 n / (k (32 + ceil(log2 n)))`` (each kept value sent with its index: the lower bound of the expected gain).

Measured points: the Monte Carlo relative error of the same compressors at the same settings (QCS at the optimal
pair, QSGD with bucket n, Wangni with the optimal p) on blocks of n coordinates of a dump's gradient or of
synthetic gradients, with the exact gain from the payload bits (mean over up to 20 seeds) next to the nominal one.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from gradstat import compressors
from gradstat.analysis.measure.intervals import DEFAULT_LEVEL, mean_ci
from gradstat.analysis.measure.sources import GradientSource
from gradstat.analysis.studies.variance import error_samples
from gradstat.compressors import Context

GAINS = tuple(float(x) for x in np.geomspace(2, 1000, 40))
POINT_GAINS = (4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
QSGD_LEVELS = (1, 2, 4, 8, 16)


def _wangni_k(n: int, gain: float) -> int:
    return max(1, min(n - 1, round(32 * n / (gain * (32 + math.ceil(math.log2(n)))))))


def theory_curves(n: int = 256, gains: Sequence[float] = GAINS) -> pd.DataFrame:
    """``method, gain, gamma, setting`` for the three curves (see the module docstring)."""
    from gradstat.theory.qcs import min_gamma_curve
    from gradstat.theory.qsgd import variance_bound
    from gradstat.theory.wangni import variance

    if n < 2:
        raise ValueError(f"block length n must be >= 2, got {n}")
    g = np.asarray(gains, dtype=np.float64)
    gam, k, q, achieved = min_gamma_curve(n, g)
    rows = [
        {"method": "QCS (min over k, Q)", "gain": float(a), "gamma": float(v), "setting": f"k={int(kk)},Q={int(qq)}"}
        for a, v, kk, qq in zip(achieved, gam, k, q, strict=True)
        if np.isfinite(v)
    ]
    rows += [
        {
            "method": "QSGD (Lemma 3.1)",
            "gain": 32 / math.log2(2 * s + 1),
            "gamma": variance_bound(n, s),
            "setting": f"s={s}",
        }
        for s in range(1, 65)
    ]
    ones = np.ones(n)
    for k_ in sorted({_wangni_k(n, x) for x in g}):
        rows.append(
            {
                "method": "Wangni (uniform p)",
                "gain": 32 * n / (k_ * (32 + math.ceil(math.log2(n)))),
                "gamma": variance(ones, np.full(n, k_ / n)) / n,
                "setting": f"k={k_}",
            }
        )
    return pd.DataFrame(rows)


def empirical_points(
    n: int = 256,
    source: GradientSource | None = None,
    trials: int = 50,
    seed: int = 0,
    gains: Sequence[float] = POINT_GAINS,
    device: torch.device | str = "cpu",
    level: float = DEFAULT_LEVEL,
) -> pd.DataFrame:
    """Measured ``E||C(g) - g||^2/||g||^2`` on one block of n coordinates for each compressor setting.

    Returns ``method, spec, gain (nominal), exact_gain (payload bits), empirical, ci_low, ci_high, trials``.
    """
    from gradstat.theory.qcs import optimal_pair

    source = source or GradientSource()
    g = source.vector(n, device)
    specs = []
    for x in gains:
        try:
            p = optimal_pair(n, x)
        except ValueError:
            continue
        specs.append(("QCS (min over k, Q)", f"qcs:block={n},k={p.k},Q={p.Q}", p.gain))
    specs += [("QSGD (Lemma 3.1)", f"qsgd:s={s},bucket={n}", 32 / math.log2(2 * s + 1)) for s in QSGD_LEVELS]
    for x in gains:
        k = _wangni_k(n, x)
        specs.append(("Wangni (uniform p)", f"wangni:ratio={k / n}", 32 * n / (k * (32 + math.ceil(math.log2(n))))))
    rows = []
    for method, spec, nominal in specs:
        comp = compressors.create(spec)
        est = mean_ci(error_samples(comp, g, trials, seed), level)
        bits = np.mean([comp.encode(g, Context(seed=seed, step=t)).bits for t in range(min(trials, 20))])
        rows.append(
            {
                "method": method,
                "spec": spec,
                "gain": nominal,
                "exact_gain": 32 * n / bits if bits > 0 else math.inf,
                "empirical": est.mean,
                "ci_low": est.low,
                "ci_high": est.high,
                "trials": trials,
            }
        )
    return pd.DataFrame(rows)


def run(out: Path, n: int, source: GradientSource, trials: int, device: torch.device) -> pd.DataFrame:
    """QCS Fig. 3 with measured points (``analysis.studies.variance_gain``)."""
    from gradstat.analysis.plots.variance_gain import variance_vs_gain

    curves = theory_curves(n)
    points = empirical_points(n, source, trials, device=device)
    variance_vs_gain(curves, points, out, "variance_vs_gain", n)
    return points

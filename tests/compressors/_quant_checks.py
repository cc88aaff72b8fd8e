"""Monte Carlo checks shared by the quantizer tests (each returns a list of problems, empty when it passes, so a
test can also show that the check fails on a deliberately broken implementation)."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Callable

import torch

from gradstat.compressors.base import Compressor
from gradstat.compressors.context import Context


def laplace(d: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(d, generator=gen, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).to(dtype)


def draws(c: Compressor, g: torch.Tensor, trials: int, seed0: int = 0) -> torch.Tensor:
    """(trials, d) float64 reconstructions of g over independent seeds."""
    return torch.stack([c(g, Context(seed=seed0 + t)).double().reshape(-1) for t in range(trials)])


def two_sided_z(tests: int, confidence: float) -> float:
    """Bonferroni critical value of ``tests`` two-sided z-tests at overall ``confidence``."""
    return NormalDist().inv_cdf(1 - (1 - confidence) / (2 * tests))


def check_unbiased(c: Compressor, g: torch.Tensor, trials: int, confidence: float = 0.999) -> list[str]:
    """z-test that the mean error projected on g and on 3 fixed random directions is 0, Bonferroni over the 4."""
    out = draws(c, g, trials)
    gen = torch.Generator().manual_seed(99)
    dirs = torch.cat(
        [g.double()[None] / g.double().norm(), torch.randn(3, g.numel(), generator=gen, dtype=torch.float64)]
    )
    proj = (out - g.double()) @ dirs.T  # (trials, 4)
    mean, se = proj.mean(0), proj.std(0) / math.sqrt(trials)
    crit = two_sided_z(4, confidence)
    return [
        f"mean error along direction {i}: {mean[i]:.4g} = {float(mean[i] / se[i]):.2f} standard errors "
        f"(limit {crit:.2f})"
        for i in range(4)
        if abs(float(mean[i] / se[i])) > crit
    ]


def check_mean_equals(samples: torch.Tensor, value: float, confidence: float = 0.999) -> list[str]:
    """Two-sided z-test that the mean of iid ``samples`` equals ``value``."""
    m, se = float(samples.mean()), float(samples.std()) / math.sqrt(samples.numel())
    if se == 0.0:  # constant samples: the mean is known exactly
        return [] if abs(m - value) <= 1e-12 * max(1.0, abs(value)) else [f"constant {m:.6g} != {value:.6g}"]
    z = (m - value) / se
    crit = two_sided_z(1, confidence)
    return (
        []
        if abs(z) <= crit
        else [f"mean {m:.6g} differs from {value:.6g} by {z:.2f} standard errors (limit {crit:.2f})"]
    )


def check_mean_at_most(samples: torch.Tensor, bound: float, confidence: float = 0.999) -> list[str]:
    """One-sided: the ``confidence`` lower confidence limit of the mean must not exceed ``bound``."""
    m, se = float(samples.mean()), float(samples.std()) / math.sqrt(samples.numel())
    low = m - NormalDist().inv_cdf(confidence) * se
    return [] if low <= bound else [f"mean {m:.6g} (lower limit {low:.6g}) exceeds the bound {bound:.6g}"]


def relative_errors(c: Compressor, g: torch.Tensor, trials: int) -> torch.Tensor:
    """``||C(g) - g||^2 / ||g||^2`` per draw (float64, shape (trials,))."""
    out = draws(c, g, trials)
    return ((out - g.double()) ** 2).sum(1) / (g.double() ** 2).sum()


Check = Callable[..., list[str]]

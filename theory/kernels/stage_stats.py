"""Fused one-pass statistics of magnitudes: what every fit and peak-over-threshold stage reads from |g|.

:func:`summary` gives min, max, the number of non-zeros and the sums of v and v^2 (the validation of
:func:`gradstat.theory.estimators.magnitudes.check_magnitudes`, and the first stage's statistics in the same read);
:func:`tail_moments` gives, over the used elements ``|x| > above``, their count and the sums of z, z^2 and
(optionally) log z with ``z = (|x| - shift) / unit``: the sufficient statistics of the closed-form and moment
estimators (exponential: mean; generalized Pareto: mean and variance, SIDCo (Abdelmoniem et al.), Lemma 2 (7)-(9)
and Cor. 2.1 (10)-(11); gamma: mean and mean log, Cor. 1.2 (16)). Every sum is accumulated in float64 from the
elements as read (float32 or float64), so no square, sum or logarithm over- or underflows at any scale of a finite
float32 vector, and the elements are never rewritten.

Compiled, each is one read of ``x`` (see :mod:`gradstat.theory.kernels.fused`); eagerly, the same functions are the
plain reference (several passes and float64 temporaries).
"""

from __future__ import annotations

import torch

from gradstat.theory.kernels.fused import fused


@fused
def summary(x: torch.Tensor, absolute: bool, extremes: bool = True, squares: bool = True) -> torch.Tensor:
    """``[min v, max v, #(v != 0), sum v, sum v^2, min of the nonzero v]`` of ``v = |x|`` (``absolute``) or ``v = x``,
    as a float64 tensor of 6 (NaN propagates into min and max; the last is +inf when all are zero). The sums are
    exact at every scale of float32 values (their squares stay within float64's range); for float64 values they
    may overflow and are not used. Without ``extremes`` (magnitudes only: ``absolute``) the two minima are not
    read (a fifth less work compiled) and stand at their bounds, 0 and +inf; NaN and Inf still reach the max.
    Without ``squares`` the sum of squares is not computed (a tenth less work compiled, for a reader that needs
    only means: the exponential fit) and stands at NaN."""
    v = x.abs() if absolute else x
    w = v.double()
    sum_sq = (w * w).sum() if squares else torch.full((), torch.nan, dtype=torch.float64, device=x.device)
    if not extremes:
        if not absolute:
            raise ValueError("summary without extremes needs magnitudes (absolute=True): the minimum checks signs")
        bounds = torch.tensor([0.0, torch.inf], dtype=torch.float64, device=x.device)
        return torch.stack((bounds[0], v.amax().double(), (v != 0).sum().double(), w.sum(), sum_sq, bounds[1]))
    smallest_nonzero = torch.where(v != 0, v, torch.inf).amin().double()
    return torch.stack(
        (v.amin().double(), v.amax().double(), (v != 0).sum().double(), w.sum(), sum_sq, smallest_nonzero)
    )


@fused
def tail_moments(
    x: torch.Tensor, above: torch.Tensor, shift: torch.Tensor, inv_unit: torch.Tensor, logs: bool, squares: bool = True
) -> torch.Tensor:
    """Over the elements with ``|x| > above``: ``[n, sum z, sum z^2]`` (and ``sum log z`` when ``logs``), with
    ``z = (|x| - shift) * inv_unit``, as float64; without ``squares`` the sum of squares is not computed and stands
    at NaN (for a mean-only fit). ``above``, ``shift``, ``inv_unit``: 0-d float64 tensors.
    ``logs`` requires ``shift = 0``; each logarithm is of |x| itself, taken in x's dtype (a float64 logarithm per
    element would cost several read passes; |x| never underflows where z = |x| / unit would, for a vector that
    spans more than the dtype's exponent range), plus log(inv_unit) in float64, accumulated in float64."""
    a = x.abs().double()
    used = a > above
    z = torch.where(used, (a - shift) * inv_unit, 0.0)
    sum_sq = (z * z).sum() if squares else torch.full((), torch.nan, dtype=torch.float64, device=x.device)
    parts = [used.sum().double(), z.sum(), sum_sq]
    if logs:  # shift 0: log z = log |x| + log inv_unit, the log of |x| in x's dtype (finite for every nonzero x)
        log_a = torch.log(torch.where(used, x.abs(), 1.0)).double()
        parts.append(torch.where(used, log_a + torch.log(inv_unit), 0.0).sum())
    return torch.stack(parts)

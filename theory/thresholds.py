"""Sparsification thresholds for a target ratio delta from a fitted distribution of |g|.

SIDCo (Abdelmoniem et al.), Lemma 1 (4)-(5): eta(delta) = F_|G|^{-1}(1 - delta), the (1 - delta) quantile of the
fitted magnitude distribution, so that on average delta d of the d elements exceed it. Closed forms: exponential
eta = beta log(1/delta) (6); gamma eta = beta P^{-1}(alpha, 1 - delta) (14), approximated in the paper by
-beta (log(delta) + log Gamma(alpha)) (15), an upper bound for alpha <= 1 and eta/beta >= 1 (24); generalized Pareto
eta = (beta/alpha)(exp(-alpha log delta) - 1) (28).

Zeros: a Fit describes the non-zero elements (see :mod:`gradstat.theory.estimators.magnitudes`); to select delta d of
all d elements, the threshold is the quantile at the conditional ratio delta d / n = delta / (1 - zero_fraction) among
the n non-zeros. When that is >= 1 every non-zero must be kept: the threshold is 0 (with a RuntimeWarning).
"""

from __future__ import annotations

import math
import warnings
from typing import overload

import numpy as np
import torch

from gradstat.theory import scalars as S
from gradstat.theory.distributions.genpareto import expm1_over
from gradstat.theory.distributions.incgamma import gammainccinv, host_inverse
from gradstat.theory.estimators.result import Fit

QUANTILES = ("exact", "approx")
_DISTS = ("exponential", "gamma", "genpareto")


def check_ratio(ratio: object, name: str = "ratio") -> float:
    """ratio as a float strictly inside (0, 1); TypeError/ValueError naming ``name`` otherwise."""
    if (
        isinstance(ratio, bool)
        or not isinstance(ratio, (int, float))
        and not (isinstance(ratio, torch.Tensor) and ratio.numel() == 1)
    ):
        raise TypeError(f"{name} must be a number in (0, 1), got {type(ratio).__name__}")
    value = float(ratio)
    if not (0.0 < value < 1.0):
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {value!r}")
    return value


def check_length(d: int, ratio: float, name: str = "ratio") -> None:
    """A target of ratio * d elements needs d >= 1/ratio (at least one element kept)."""
    if ratio * d < 1.0:
        raise ValueError(
            f"{name}={ratio!r} asks for {ratio * d:.3g} of {d} elements; the vector must have at least "
            f"1/{name} = {math.ceil(1.0 / ratio)} elements"
        )


def tail_quantile(
    dist: str,
    params: dict[str, S.Scalar],
    tail: float | torch.Tensor,
    quantile: str = "exact",
    *,
    validated: bool = False,
    tail_at_least: float = 0.0,
) -> S.Scalar:
    """eta with P(|G| > eta) = tail under ``dist`` with ``params`` (location 0), on the parameters' device.

    Parameters
    ----------
    dist : {'exponential', 'gamma', 'genpareto'}
    params : dict of 0-d tensors ('scale', and 'shape' for gamma / generalized Pareto), or of host numbers
        (:mod:`gradstat.theory.scalars`: the result is then a host number too)
    tail : float or one-element tensor, strictly inside (0, 1)
        Tail probability delta (validated: bool, strings, NaN, inf, 0, 1 and values outside raise; NaN
        parameters give NaN, never an exception).
    quantile : {'exact', 'approx'}
        'approx' changes only the gamma: SIDCo (15) -beta (log(delta) + lgamma(alpha)), clipped at 0; the
        exponential (6) and generalized Pareto (28) quantiles are already closed forms.
    validated : bool
        ``tail`` is a 0-d float64 tensor on the parameters' device whose range its caller answers for (it checks
        ``0 < tail < 1`` on the device and discards the result where that fails): used as it is, never read back
        (:func:`gradstat.theory.pot.deferred_threshold`, which must not synchronise).
    tail_at_least : float
        A bound below ``tail`` known on the host (SIDCo's first stage: its ratio delta_1, as ``tail`` is
        delta_1 d / n with n <= d): the gamma quantile on a device then takes one Halley step fewer
        (:data:`gradstat.theory.distributions.incgamma.MODERATE_STEPS`).

    Returns
    -------
    0-d float64 tensor (units of |g|), clipped at the dtype's largest finite value (a quantile beyond it keeps
    nothing either way). Sources: SIDCo (6), (14), (15), (28).
    """
    if quantile not in QUANTILES:
        raise ValueError(f"quantile must be one of {list(QUANTILES)}, got {quantile!r}")
    if dist not in _DISTS:
        raise ValueError(f"dist must be one of {list(_DISTS)}, got {dist!r}")
    scale = params["scale"]
    host = not isinstance(scale, torch.Tensor)
    q: S.Scalar
    if validated:
        if host or not isinstance(tail, torch.Tensor) or tail.dim() != 0 or tail.dtype != scale.dtype:
            raise TypeError("a validated tail is a 0-d tensor of the parameters' dtype, with tensor parameters")
        q = tail
    else:
        value = check_ratio(tail, "tail")
        # (a fill, not a copy from the host: no synchronisation on an accelerator)
        q = np.float64(value) if host else torch.full((), value, dtype=scale.dtype, device=scale.device)
    if dist == "exponential":
        eta = scale * -S.log(q)
    elif dist == "gamma":
        shape = params["shape"]
        if quantile == "approx":
            eta = S.clamp_min(-scale * (S.log(q) + S.lgamma(shape)), 0.0)
        elif host:
            eta = scale * np.float64(host_inverse("gammainccinv", shape, q))
        else:
            eta = scale * gammainccinv(shape, q, tail_at_least)
    else:
        eta = scale * expm1_over(params["shape"], -S.log(q))
    return S.clamp_max(eta, float(np.finfo(np.float64).max) if host else torch.finfo(eta.dtype).max)  # NaN stays


@overload
def conditional_ratio(ratio: float, d: int, n: int) -> float: ...
@overload
def conditional_ratio(ratio: float, d: int, n: torch.Tensor) -> torch.Tensor: ...
def conditional_ratio(ratio: float, d: int, n: int | torch.Tensor) -> float | torch.Tensor:
    """delta d / n: the tail probability among the n non-zeros that selects delta d of all d elements (a 0-d
    tensor for a count ``n`` held on the device, the same float64 division)."""
    if isinstance(n, torch.Tensor):  # (``number / tensor`` would multiply by the reciprocal: another rounding)
        return torch.full_like(n, ratio * d).div_(n)
    return ratio * d / n


def threshold(fit: Fit, ratio: float, quantile: str = "exact") -> torch.Tensor:
    """Threshold eta with P(|G| > eta) = ratio under the fitted distribution (SIDCo Lemma 1 (4)-(5)).

    Parameters
    ----------
    fit : Fit
        From :func:`gradstat.theory.estimators.fit` (describes the fit.n non-zeros of a vector of fit.d elements).
    ratio : float in (0, 1)
        Target density delta = k / d over all d elements.
    quantile : {'exact', 'approx'}
        'exact': the fitted distribution's inverse survival function (gamma: torch Newton solve of (14));
        'approx': SIDCo (15) for the gamma (biased: see the tests), the exact closed form for the others.

    Returns
    -------
    0-d float64 tensor on the fit's device: keep |g| > eta.

    Raises
    ------
    ValueError
        ratio outside (0, 1), fit.d < 1/ratio, unknown quantile.
    """
    ratio = check_ratio(ratio)
    check_length(fit.d, ratio)
    if quantile not in QUANTILES:
        raise ValueError(f"quantile must be one of {list(QUANTILES)}, got {quantile!r}")
    tail = conditional_ratio(ratio, fit.d, fit.n)
    if tail >= 1.0:
        warnings.warn(
            f"ratio {ratio} over {fit.d} elements needs {ratio * fit.d:.0f} elements but only {fit.n} are "
            "non-zero: threshold 0 keeps all of them",
            RuntimeWarning,
            stacklevel=2,
        )
        return torch.zeros((), dtype=fit.params["scale"].dtype, device=fit.params["scale"].device)
    return tail_quantile(fit.dist, fit.params, tail, quantile)

"""fit(): validate |g|, run one estimator, read its diagnostics back once, return a :class:`Fit`."""

from __future__ import annotations

import torch

from gradstat.theory import scalars as S
from gradstat.theory.estimators.estimate import Estimate
from gradstat.theory.estimators.exceedances import Exceedances, unit_for
from gradstat.theory.estimators.magnitudes import check_magnitudes
from gradstat.theory.estimators.registry import SHAPED, estimator
from gradstat.theory.estimators.result import Fit


def resolve(
    estimate: Estimate, dist: str, method: str, n: int, n_zeros: int, device: torch.device | None = None
) -> Fit:
    """Turn an on-device estimate into a Fit, reading converged and the warning flags in one synchronisation.

    ``device``: the data's device (default: that of the ``scale`` parameter). Every tensor of the estimate must be
    on it: a tensor made elsewhere (a flag built with ``torch.tensor(...)`` and no device lands on the CPU) is an
    estimator bug that CUDA reports only as "Expected all tensors to be on the same device"; here it is named.
    An estimate on host numbers (:mod:`gradstat.theory.scalars`) needs ``device``; its parameters become 0-d
    float64 tensors there, as every Fit holds.
    """
    scale = estimate.params["scale"]
    if not isinstance(scale, torch.Tensor):
        if device is None:
            raise ValueError("resolve: an estimate on host numbers needs the data's device")
        return _resolve_host(estimate, dist, method, n, n_zeros, torch.device(device))
    check_devices(estimate, dist, method, scale.device if device is None else device)
    values = S.read([estimate.converged] + [flag for flag, _ in estimate.flags])
    converged = bool(values.pop(0))
    warnings = [message for (_, message), on in zip(estimate.flags, values, strict=True) if on]
    return Fit(
        dist=dist,
        method=method,
        params=estimate.params,
        n=n,
        n_zeros=n_zeros,
        converged=converged,
        iterations=estimate.iterations,
        warnings=warnings,
    )


def _resolve_host(estimate: Estimate, dist: str, method: str, n: int, n_zeros: int, device: torch.device) -> Fit:
    """:func:`resolve` of an estimate on host numbers (:mod:`gradstat.theory.scalars`): nothing to read back."""
    return Fit(
        dist=dist,
        method=method,
        params={name: S.as_tensor(value, device) for name, value in estimate.params.items()},
        n=n,
        n_zeros=n_zeros,
        converged=bool(estimate.converged),
        iterations=estimate.iterations,
        warnings=[message for flag, message in estimate.flags if flag],
    )


def check_devices(estimate: Estimate, dist: str, method: str, device: torch.device) -> None:
    """RuntimeError naming every tensor of ``estimate`` (parameters, converged, degenerate, flags) that is not on
    ``device``, the data's device (device rule: a tensor made inside a computation lives on its input's device)."""
    named: list[tuple[str, object]] = [(f"parameter {k!r}", v) for k, v in estimate.params.items()]
    named += [("converged", estimate.converged), ("degenerate", estimate.degenerate)]
    named += [(f"flag {message!r}", flag) for flag, message in estimate.flags]
    wrong = [
        f"{name} on {value.device}"
        for name, value in named
        if isinstance(value, torch.Tensor) and value.device != torch.device(device)
    ]
    if wrong:
        raise RuntimeError(
            f"estimator ({dist!r}, {method!r}) made tensors off the data's device {device}: {'; '.join(wrong)}"
        )


def fit(x: object, dist: str, method: str = "closed_form") -> Fit:
    """Fit a sparsity-inducing distribution to gradient magnitudes |g| (location 0).

    Parameters
    ----------
    x : Tensor (any device, floating dtype) or numpy array, any shape
        Magnitudes |g| >= 0. Exact zeros are left out of the fit and counted (``Fit.n_zeros``).
    dist : {'exponential', 'gamma', 'genpareto'}
    method : {'closed_form', 'mle', 'minka_newton'}
        closed_form: the paper's estimators, SIDCo (Abdelmoniem et al.) (6) mean |g|; (16) Minka's gamma
        shape; (35) generalized Pareto moment matching. mle: exact maximum likelihood (exponential: the mean;
        gamma: Newton on (26) from Minka; generalized Pareto: Grimshaw's profile likelihood). minka_newton (gamma
        only): Minka's shape plus one Newton step on (26).

    Returns
    -------
    Fit
        0-d float64 parameters on x's device plus n, n_zeros, converged, iterations, warnings.

    Raises
    ------
    ValueError
        Unknown dist/method, empty, NaN/Inf, negative or all-zero input, constant non-zeros for gamma and
        generalized Pareto.

    A shaped fit of non-float64 data that is degenerate (constant within the rounding of its dtype's reductions)
    is computed again on the same values in float64: the result is the float64 input's, and stays flagged
    (``converged`` false, a warning) only where the values are constant within float64's rounding.
    """
    run = estimator(dist, method)
    mags = check_magnitudes(x, "x", spread=dist in SHAPED)
    data = Exceedances(mags.values, n_hint=mags.n_nonzero, unit=unit_for(mags.max), bottom=mags.min_nonzero)
    estimate = run(data)
    result = resolve(estimate, dist, method, mags.n_nonzero, mags.n_zeros, device=mags.values.device)
    if mags.values.dtype != torch.float64 and bool(estimate.degenerate):
        # constant within the rounding of reductions in the data's dtype (a float32 shape clipped at its noise
        # floor, ~1.3e5 for the gamma): the same values' statistics in float64 tell a near-constant vector from a
        # constant one, as a float64 input would (read after resolve's synchronisation: no extra wait)
        wide = Exceedances(mags.values.double(), n_hint=mags.n_nonzero, unit=data.unit, bottom=mags.min_nonzero)
        result = resolve(run(wide), dist, method, mags.n_nonzero, mags.n_zeros, device=mags.values.device)
    return result

"""Validation of a vector of gradient magnitudes |g| before fitting, in one pass and one host synchronisation.

Zeros policy (used by every estimator, threshold and peak-over-threshold stage): gradients often hold many exact
zeros (ReLU, unused embedding rows). The sparsity-inducing distributions of SIDCo (Abdelmoniem et al.),
Property 2) are continuous, and the gamma statistic s = log(mean) - mean(log) of (16) is -inf on a zero, so fits use
the non-zero elements only and report how many zeros they left out. A threshold for a ratio delta over all d
elements is then the conditional quantile at delta / (1 - zero_fraction) among the non-zeros
(:func:`gradstat.theory.thresholds.threshold`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from gradstat.theory.kernels.stage_stats import summary


@dataclass(frozen=True)
class Magnitudes:
    """A validated, flattened vector of |g| with the facts every fit needs.

    Attributes
    ----------
    values : Tensor, shape (d,)
        The magnitudes (same device and floating dtype as given; numpy input becomes a float64 CPU tensor).
    d : int
        Number of elements, zeros included.
    n_nonzero : int
        Number of elements > 0 (the ones a fit uses).
    max : float
        Largest magnitude.
    min_nonzero : float or None
        Smallest non-zero magnitude (computed when the spread is checked, else None).
    """

    values: torch.Tensor
    d: int
    n_nonzero: int
    max: float
    min_nonzero: float | None = None
    signed: bool = False
    """``values`` holds signed g and the magnitudes are ``|values|`` (read inside fused kernels, never formed)."""
    sums: torch.Tensor | None = None
    """``[sum |g|, sum |g|^2]`` (float64, on the device) from the validation pass, where it ran fused on float32
    values (exact at every scale there); None otherwise."""
    host_sums: tuple[float, float] | None = None
    """The same two sums as read back on the host (with the validation's other numbers), where ``sums`` is set."""
    log_sum: float | None = None
    """The sum of log |g| over the non-zeros, where the validation pass read it (``summary`` with ``logs``)."""

    def first_moments(self, unit: float, host: bool = False) -> torch.Tensor | list[np.float64] | None:
        """``[n, sum z, sum z^2]`` of the non-zeros with ``z = |g| / unit`` (``unit`` a power of two: exact), the
        statistics of a fit of all non-zeros, when the validation pass computed them; else None. ``host``: as
        host numbers (:mod:`gradstat.theory.scalars`)."""
        if self.sums is None:
            return None
        if host and self.host_sums is not None:
            total, sum_sq = self.host_sums
            moments = [np.float64(self.n_nonzero), np.float64(total) / unit, np.float64(sum_sq) / (unit * unit)]
            if self.log_sum is not None:  # sum log z = sum log |g| - n log unit (unit a power of two)
                moments.append(np.float64(self.log_sum) - self.n_nonzero * math.log(unit))
            return moments
        n = torch.full((), float(self.n_nonzero), dtype=torch.float64, device=self.sums.device)
        return _moments(n, self.sums, unit)

    @property
    def n_zeros(self) -> int:
        return self.d - self.n_nonzero

    @property
    def zero_fraction(self) -> float:
        return self.n_zeros / self.d


def _moments(n: torch.Tensor, sums: torch.Tensor, unit: float | torch.Tensor) -> torch.Tensor:
    """``[n, sum z, sum z^2]`` from ``[sum |g|, sum |g|^2]`` with ``z = |g| / unit`` (a power of two: exact)."""
    return torch.stack((n, sums[0] / unit, sums[1] / (unit * unit)))


@dataclass(frozen=True)
class DeviceFacts:
    """The facts of :class:`Magnitudes` as 0-d float64 tensors on the data's device, never read back
    (:func:`device_facts`), with the flag ``rare`` where :func:`check_magnitudes` would reject the data.

    Attributes
    ----------
    values : Tensor, shape (d,)
        The magnitudes, or the signed g when ``signed`` (as :attr:`Magnitudes.values`).
    d : int
        Number of elements (known from the shape).
    n_nonzero, max : Tensor
        Number of elements != 0 and the largest magnitude.
    min_nonzero : Tensor or None
        Smallest non-zero magnitude (+inf for none), where it was read: always with ``spread``.
    sums : Tensor or None
        ``[sum |g|, sum |g|^2]`` where the summary ran on float32 values (as :attr:`Magnitudes.sums`).
    rare : Tensor
        0-d bool: the data are empty of non-zeros, hold NaN, inf or negative magnitudes, or (with ``spread``) one
        non-zero or constant non-zeros, or the given summary lacks what the checks or the fit read: every case in
        which :func:`check_magnitudes` raises.
    """

    values: torch.Tensor
    d: int
    n_nonzero: torch.Tensor
    max: torch.Tensor
    min_nonzero: torch.Tensor | None
    sums: torch.Tensor | None
    rare: torch.Tensor

    def first_moments(self, unit: torch.Tensor) -> torch.Tensor | None:
        """:meth:`Magnitudes.first_moments` (its tensor form) with a unit held on the device."""
        return None if self.sums is None else _moments(self.n_nonzero, self.sums, unit)


def as_magnitudes_tensor(x: object, name: str = "x") -> torch.Tensor:
    """x as a flat floating tensor (torch kept on its device, float16/bfloat16 promoted to float32; numpy/lists
    become float64 CPU tensors)."""
    if isinstance(x, torch.Tensor):
        t = x if x.is_floating_point() else x.to(torch.get_default_dtype())
    elif isinstance(x, (np.ndarray, list, tuple)):
        try:
            t = torch.from_numpy(np.asarray(x, dtype=np.float64).copy())
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must hold numbers, got {type(x).__name__} that numpy cannot convert") from exc
    else:
        raise TypeError(f"{name} must be a torch tensor or a numpy array of |g|, got {type(x).__name__}")
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()  # half-precision reductions would round the statistics to 3 significant digits
    return t.reshape(-1)


class ConstantMagnitudes(ValueError):
    """The non-zero magnitudes are all ``value`` (``count`` of them): a shaped fit (gamma, generalized Pareto) has
    no shape. ``value`` is in the units of the data checked; a caller that normalised them (SIDCo's power-of-two
    normalisation) says the value in its own units (:attr:`name` names the argument)."""

    def __init__(self, name: str, value: float, count: int) -> None:
        self.name, self.value, self.count = name, value, count
        super().__init__(
            f"{name} is constant ({value} on all {count} non-zero elements): the shape of a gamma or generalized "
            "Pareto fit is undefined (zero variance)"
        )


def check_magnitudes(
    x: object,
    name: str = "x",
    *,
    spread: bool = False,
    signed: bool = False,
    stats: torch.Tensor | None = None,
    squares: bool | None = None,
    logs: bool = False,
) -> Magnitudes:
    """Validate |g| values and summarise them (one pass over the data, one host synchronisation).

    Parameters
    ----------
    x : Tensor or numpy array, any shape
        Gradient magnitudes |g| (>= 0).
    name : str
        Argument name used in error messages.
    spread : bool
        Also require at least two distinct non-zero values (shape parameters of gamma and generalized Pareto are
        undefined on constant data).
    signed : bool
        ``x`` holds signed values g and the magnitudes are |g|: checked and summarised by the fused kernel
        :func:`gradstat.theory.kernels.stage_stats.summary` without forming |g| (compiled where possible).
    stats : Tensor, optional
        That summary of exactly this ``x`` (same ``signed``; with its minima, ``extremes``, when ``spread`` is
        checked or ``x`` holds magnitudes) when the caller has already read it (its own finiteness check): used in
        place of another pass.
    squares : bool, optional
        Whether the fit reads the sum of squares (then ``stats`` must hold it); default ``spread`` (the gamma fit
        is shaped but reads the mean and the mean logarithm only).
    logs : bool
        Also read the sum of log |g| over the non-zeros in the validation pass of signed float32 values (a gamma
        fit's statistic): ``Magnitudes.log_sum``; ``stats`` may hold it already (a seventh entry).

    Raises
    ------
    ValueError
        Empty input, NaN or infinite values, negative values (pass |g|), no non-zero value, constant non-zeros
        (with ``spread``).
    """
    t = nonempty(x, name)
    sums, host_sums, fused_min_nonzero, log_sum = None, None, None, None
    if stats is not None or signed or summary.fast_for(t, signed):
        if stats is None:
            stats = _summary(t, spread, signed, logs)
        lo_f, hi_f, n_nonzero, total, sum_sq, fused_min_nonzero, *rest = stats.tolist()
        log_sum = rest[0] if rest else None
        if spread and math.isinf(fused_min_nonzero) and n_nonzero > 0:
            raise ValueError(f"{name}: the summary given was read without its minima; the spread check needs them")
        if (spread if squares is None else squares) and math.isnan(sum_sq) and not math.isnan(hi_f):
            raise ValueError(f"{name}: the summary given was read without its sum of squares; a shaped fit needs it")
        if t.dtype == torch.float32:
            sums, host_sums = stats[3:5], (total, sum_sq)
        else:
            log_sum = None  # (the moments it goes with are not kept either)
    else:
        lo, hi = torch.aminmax(t)
        nonzero = torch.count_nonzero(t)
        lo_f, hi_f, n_nonzero = torch.stack([lo.double(), hi.double(), nonzero.double()]).tolist()
    if math.isnan(lo_f) or math.isnan(hi_f) or math.isinf(lo_f) or math.isinf(hi_f):
        raise ValueError(f"{name} contains NaN or infinite values (min {lo_f}, max {hi_f}); pass finite |g|")
    if lo_f < 0:
        raise ValueError(f"{name} contains negative values (min {lo_f}); pass magnitudes |g|, e.g. g.abs()")
    n_nonzero = int(n_nonzero)
    if n_nonzero == 0:
        raise ValueError(f"{name} is all zeros ({t.numel()} elements); no distribution can be fitted")
    mags = Magnitudes(
        values=t,
        d=t.numel(),
        n_nonzero=n_nonzero,
        max=hi_f,
        signed=signed,
        sums=sums,
        host_sums=host_sums,
        log_sum=log_sum,
    )
    if spread:
        if n_nonzero == 1:
            raise ValueError(f"{name} has a single non-zero value; the shape of a distribution needs at least two")
        if n_nonzero == mags.d:
            min_nonzero = lo_f
        elif fused_min_nonzero is not None:
            min_nonzero = fused_min_nonzero
        else:
            v = t.abs() if signed else t
            min_nonzero = float(torch.where(v > 0, v, hi_f).min())
        if min_nonzero == hi_f:
            raise ConstantMagnitudes(name, hi_f, n_nonzero)
        mags = dataclasses.replace(mags, min_nonzero=min_nonzero)
    return mags


def nonempty(x: object, name: str) -> torch.Tensor:
    """``x`` as a flat magnitudes tensor (:func:`as_magnitudes_tensor`); a ValueError where it is empty."""
    t = as_magnitudes_tensor(x, name)
    if t.numel() == 0:
        raise ValueError(f"{name} is empty; need at least one |g| value")
    return t


def _summary(t: torch.Tensor, spread: bool, signed: bool, logs: bool) -> torch.Tensor:
    """The validation's one pass (C loop or compiled): the minima only where they are used, the logarithms only
    for the magnitudes of signed float32 values (where :attr:`Magnitudes.log_sum` is kept)."""
    with_logs = logs and signed and t.dtype == torch.float32
    return summary(t, signed, spread or not signed, True, with_logs)


def device_facts(
    x: object,
    name: str = "x",
    *,
    spread: bool = False,
    signed: bool = False,
    stats: torch.Tensor | None = None,
    squares: bool | None = None,
    logs: bool = False,
) -> DeviceFacts:
    """What :func:`check_magnitudes` reads (same arguments, same passes over ``x``), left on the device: nothing is
    read back, and where that function would raise, :attr:`DeviceFacts.rare` is set instead (a caller that must not
    synchronise takes its result only where the flag, read later, is clear).

    Raises
    ------
    ValueError, TypeError
        Only what is known without reading ``x``: an empty input, or one that is not a tensor or array.
    """
    t = nonempty(x, name)
    incomplete = None  # the given summary lacks what the checks or the fit read
    if stats is None and not (signed or summary.fast_for(t, signed)):
        lo, hi = torch.aminmax(t)
        lo, hi, n = lo.double(), hi.double(), torch.count_nonzero(t).double()
        sums = None
        # (the validation reads the same minimum over the non-zeros, on the host after its checks)
        smallest = torch.where(t > 0, t, math.inf).amin().double() if spread else None
    else:
        if stats is None:
            stats = _summary(t, spread, signed, logs)
        lo, hi, n, smallest = stats[0], stats[1], stats[2], stats[5]
        sums = stats[3:5] if t.dtype == torch.float32 else None
        if spread:  # read without its minima (they stand at their bounds)
            incomplete = torch.isinf(smallest) & (n > 0)
        if spread if squares is None else squares:  # read without its sum of squares
            no_squares = torch.isnan(stats[4]) & ~torch.isnan(hi)
            incomplete = no_squares if incomplete is None else incomplete | no_squares
    rare = ~(torch.isfinite(lo) & torch.isfinite(hi)) | (lo < 0) | (n == 0)
    if spread:  # one non-zero, or all equal (with the minima read, the smallest non-zero is the minimum when n = d)
        assert smallest is not None
        rare = rare | (n == 1) | (smallest == hi)
    if incomplete is not None:
        rare = rare | incomplete
    return DeviceFacts(values=t, d=t.numel(), n_nonzero=n, max=hi, min_nonzero=smallest, sums=sums, rare=rare)

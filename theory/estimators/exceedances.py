"""The values a fit sees, as masked reductions over the full |g| vector (no compaction unless unavoidable).

A single-stage fit uses y = |g| over the non-zero elements; a peak-over-threshold stage m >= 2 uses
y = |g| - a over the elements with |g| > eta_{m-1}, a being the anchor (SIDCo (Abdelmoniem et al.), Lemma 2
(7)-(9) and Cor. 2.1 (10)-(11): a = eta_{m-1}). Sums are taken over ``where``/``clamp`` views of the whole vector in
its own dtype (float32 reductions in torch are pairwise, accurate to ~1e-7 relative) and only the 0-d results are
promoted to float64; nothing is read back to the host here. Only the exact generalized Pareto MLE needs the
values themselves (:meth:`Exceedances.values`).

Scale: every statistic is of the normalised values z = y / unit, ``unit`` a power of two near the largest |g|
(:func:`unit_for`), so that squares, sums and logarithms neither overflow (float32 |g| up to 3.4e38, float64 up to
1.8e308) nor underflow (denormals), and the estimators' shapes are invariant and their scales equivariant (times
``unit``) under scaling by powers of two. Where squares and sums of y itself stay far from the dtype's limits the
reductions run on y directly (no copy) and are divided by unit afterwards, which is the same arithmetic scaled by a
power of two; otherwise z is materialised once.

On a large vector where the fused kernel :func:`gradstat.theory.kernels.stage_stats.tail_moments` runs compiled
(:mod:`gradstat.theory.kernels.fused`), every statistic of an object comes from one read of x instead: count, sum z and
sum z^2 (and sum log z for :meth:`Exceedances.mean_log`) accumulated in float64, with the bound and the shift
rounded to x's dtype exactly as the eager comparisons and subtractions round them. The two paths differ only by
the rounding of their sums (float32 pairwise against float64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from gradstat.theory import scalars as S
from gradstat.theory.kernels.stage_stats import tail_moments, tail_values

_RELATIVE_NOISE = 32.0


def unit_for(top: float) -> float:
    """The power of two 2^(e-1) with top / 2^(e-1) in [1, 2) (1.0 for top <= 0 or non-finite top).

    Representable in every floating dtype that can hold ``top`` (a float32 denormal unit for denormal data, at most
    2^127 for float32 data), so dividing by it is exact."""
    if not (top > 0.0 and math.isfinite(top)):
        return 1.0
    return math.ldexp(1.0, math.frexp(top)[1] - 1)


def device_unit(top: torch.Tensor) -> torch.Tensor:
    """:func:`unit_for` of a 0-d float64 tensor, on its device and without reading it: the same power of two,
    top / (2 m) with top = m 2^e (``torch.frexp``, m in [1/2, 1)), a quotient that is exactly 2^(e-1) and therefore
    exactly rounded (1.0 where top <= 0 or is not finite)."""
    mantissa, _ = torch.frexp(top)
    usable = (top > 0) & torch.isfinite(top)
    return torch.where(usable, top / (2.0 * mantissa), 1.0)


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""The floating dtypes a fit's data may have (each has its own noise floor)."""


def noise_floor(dtype: torch.dtype) -> float:
    """Relative size below which a difference of two reductions in ``dtype`` is rounding (32 ulps)."""
    return _RELATIVE_NOISE * torch.finfo(dtype).eps


def direct_ok(unit: float | torch.Tensor, dtype: torch.dtype) -> bool | torch.Tensor:
    """True when reductions of y (values <= 2 unit) and of y * y stay normal and finite in ``dtype``: unit within
    2^(+-max_exponent/4), so squares are within 2^(+-max_exponent/2) and sums of up to 2^(max_exponent/2) of them
    cannot overflow. A 0-d tensor ``unit`` gives a 0-d bool tensor (nothing read)."""
    limit = math.frexp(torch.finfo(dtype).max)[1] // 4
    if isinstance(unit, torch.Tensor):
        return (unit >= 2.0**-limit) & (unit <= 2.0**limit)
    return 2.0**-limit <= unit <= 2.0**limit


@dataclass
class Exceedances:
    """y = x - shift over {x > above}; ``above=None`` means x > 0 with shift 0 (zeros excluded).

    Attributes
    ----------
    x : Tensor, shape (d,)
        All magnitudes |g| (>= 0, validated by the caller), or the signed g when ``signed`` is set.
    above : 0-d Tensor or None
        Exclusive lower bound of the elements used (the previous stage's threshold).
    shift : 0-d Tensor or None
        Subtracted from the elements used (the anchor); must satisfy above <= shift <= min of the used elements
        (the previous threshold, or the smallest survivor). None means ``above``.
    n_hint : int, 0-d float64 tensor or None
        Number of used elements when the caller already knows it (saves a pass); a tensor where it is known on the
        device only (then the statistics are 0-d tensors).
    unit : float or 0-d float64 tensor
        Power of two the statistics are normalised by (:func:`unit_for` of the largest |g|, known on the host);
        estimators multiply their scale by it. A 0-d tensor (:func:`device_unit`, the device form of
        :func:`gradstat.theory.pot.deferred_threshold`) is never read: the statistics then come from the fused
        kernel, or from the reductions of y divided by the unit, which assume :func:`direct_ok` (its caller checks
        that on the device and takes the synchronous path where it fails).
    bottom : float or None
        Smallest used value when known on the host: if bottom / unit underflows in x's dtype (values spanning more
        than the dtype's exponent range), :meth:`mean_log` takes its logarithms in float64.
    workspace : Tensor or None
        A buffer like x to hold the shifted values (saves an allocation per peak-over-threshold stage); its
        content is only needed until this object's statistics have been computed.
    signed : bool
        x holds signed values and the magnitudes are |x|: every statistic then comes from the fused kernel
        (compiled, or its eager reference), which reads |x| without forming it.
    preset : Tensor or None
        ``[n, sum z, sum z^2]`` (and ``sum log z``) already computed for exactly these used values (the validation
        pass of :func:`gradstat.theory.estimators.magnitudes.check_magnitudes`), used in place of a fused pass.
    squares : bool
        Whether the sum of squares may be asked for (:meth:`var`); without, the fused pass skips it (a mean-only
        fit such as the exponential's), a ``preset`` may hold NaN in its place, and :meth:`var` raises.
    host : bool
        The statistics are host numbers (numpy float64) rather than 0-d tensors on x's device
        (:func:`gradstat.theory.scalars.on_host`); ``above``, ``shift`` and ``preset`` are then host numbers too.
    """

    x: torch.Tensor
    above: S.Scalar | None = None
    shift: S.Scalar | None = None
    n_hint: int | torch.Tensor | None = None
    unit: float | torch.Tensor = 1.0
    bottom: float | None = None
    workspace: torch.Tensor | None = None
    signed: bool = False
    preset: torch.Tensor | list[S.Scalar] | None = None
    squares: bool = True
    host: bool = False
    _cache: dict[object, Any] = field(default_factory=dict, repr=False)

    def _out(self, value: torch.Tensor) -> S.Scalar:
        """A 0-d statistic in this object's kind of number (read back on the host when :attr:`host`)."""
        return S.host_values([value])[0] if self.host else value

    def _bound(self, value: S.Scalar) -> torch.Tensor | float:
        """``value`` rounded to x's dtype, as the elements are compared with or shifted by it: a 0-d tensor of that
        dtype, or a host float (exactly that rounding, which float64 holds)."""
        return float(S.in_dtype(value, self.x.dtype)) if self.host else value.to(self.x.dtype)

    def _shifted(self) -> torch.Tensor:
        """max(x - shift, 0) restricted to the used elements (0 elsewhere)."""
        if "y" not in self._cache:
            if self.above is None:
                y = self.x
            else:
                # shift >= above, so every element with x <= above maps to 0 (x > a <=> x - a > 0 in IEEE floats)
                anchor = self._bound(self.above if self.shift is None else self.shift)
                y = torch.sub(self.x, anchor, out=self.workspace).clamp_min_(0)
            self._cache["y"] = y
        return self._cache["y"]

    def _fused(self, logs: bool = False) -> torch.Tensor | list[S.Scalar] | None:
        """``[n, sum z, sum z^2 (, sum log z)]`` from one pass where that kernel reads ``x`` once (its C loop or its
        compiled form, :meth:`gradstat.theory.kernels.fused.Fused.fast_for`), else None."""
        if "fused_log" in self._cache:
            return self._cache["fused_log"]
        key = "fused_log" if logs else "fused"
        if key in self._cache:
            return self._cache[key]
        fast = self._cache.get(("fast", logs))
        if fast is None:  # (decided once per object: the statistics ask several times)
            fast = self._cache[("fast", logs)] = self.signed or tail_moments.fast_for(self.x, None, None, None, logs)
        if not fast:
            return None
        if self.preset is not None and (key == "fused" or len(self.preset) > 3):
            return self.preset
        if key not in self._cache and self.host:
            self._cache[key] = self._host_moments(logs)
        if key not in self._cache:
            zero = torch.zeros((), dtype=torch.float64, device=self.x.device)
            above = zero if self.above is None else self.above.to(self.x.dtype).double()
            shift = zero if self.above is None else (self.above if self.shift is None else self.shift)
            shift = shift.to(self.x.dtype).double()
            if isinstance(self.unit, torch.Tensor):
                inv_unit = 1.0 / self.unit  # (a power of two: exact)
            else:  # (a fill, not a copy from the host: no synchronisation on an accelerator)
                inv_unit = torch.full((), 1.0 / self.unit, dtype=torch.float64, device=self.x.device)
            self._cache[key] = tail_moments(self.x, above, shift, inv_unit, logs, self.squares)
        return self._cache[key]

    def _host_moments(self, logs: bool) -> list[S.Scalar]:
        """The fused statistics as host numbers: the C loop's own numbers where it runs, else the kernel's."""
        dtype = self.x.dtype
        above, shift = 0.0, 0.0
        if self.above is not None:
            above = float(S.in_dtype(self.above, dtype))
            shift = float(S.in_dtype(self.above if self.shift is None else self.shift, dtype))
        squares = self.squares
        assert not isinstance(self.unit, torch.Tensor)  # (host numbers come with a host unit)
        inv_unit = 1.0 / self.unit
        if tail_moments.native_for(self.x, None, None, None, logs, squares):
            values = tail_values(self.x, above, shift, inv_unit, squares, logs)
            return S.host_values(values if logs else values[:3])
        as_0d = [torch.tensor(v, dtype=torch.float64, device=self.x.device) for v in (above, shift, inv_unit)]
        return S.host_values(tail_moments(self.x, *as_0d, logs, squares))

    def _direct(self) -> bool:
        if isinstance(self.unit, torch.Tensor):
            return True  # (see ``unit``: a device unit is checked by its caller)
        return bool(direct_ok(self.unit, self.x.dtype))

    def _normalised(self) -> torch.Tensor:
        """z = y / unit, materialised (in place when y is already a private buffer)."""
        if "z" not in self._cache:
            y = self._shifted()
            if self.unit == 1.0:
                z = y
            elif y is self.x:
                z = torch.div(y, self.unit)
            else:
                z = y.div_(self.unit)
                self._cache["y_is_z"] = z
            self._cache["z"] = z
        return self._cache["z"]

    def _sum(self, square: bool) -> S.Scalar:
        """sum z (or sum z^2) as a float64 scalar, from y when that is exact arithmetic (see module doc)."""
        moments = self._fused()
        if moments is not None:
            return moments[2 if square else 1]
        if self._direct() and "y_is_z" not in self._cache:
            y = self._shifted()
            total = torch.dot(y, y) if square else y.sum()
            return self._out(total.double()) / (self.unit * self.unit if square else self.unit)
        z = self._normalised()
        return self._out((torch.dot(z, z) if square else z.sum()).double())

    def count(self) -> S.Scalar:
        """Number of used elements (float64 scalar: 0-d tensor on x's device, or host number)."""
        if "n" not in self._cache:
            n: S.Scalar
            if isinstance(self.n_hint, torch.Tensor):
                n = self.n_hint
            elif self.n_hint is not None:
                n = S.constant(float(self.n_hint), self.x, self.host)
            elif (moments := self._fused()) is not None:
                n = moments[0]
            elif self.above is None:
                n = self._out(torch.count_nonzero(self.x).double())
            else:
                n = self._out(torch.count_nonzero(self.x > self._bound(self.above)).double())  # (bool .sum() casts)
            self._cache["n"] = n
        return self._cache["n"]

    def mean(self) -> S.Scalar:
        """Mean of z = y / unit (float64 scalar)."""
        if "mean" not in self._cache:
            self._cache["mean"] = self._sum(square=False) / self.count()
        return self._cache["mean"]

    def var(self) -> S.Scalar:
        """Sample variance of z = y / unit with the n - 1 divisor (0-d float64; NaN-free: 0 when n < 2).

        Exactly 0 when the spread is within the rounding of the reductions (coefficient of variation below about
        2e-3 in float32, 3e-8 in float64), so constant exceedances are recognised as degenerate."""
        if not self.squares:
            raise RuntimeError("Exceedances built with squares=False: its variance was declared unused")
        if "var" not in self._cache:
            n = self.count()
            m = self.mean()
            sum_sq = self._sum(square=True)
            spread = sum_sq - n * m * m
            # below the rounding of the reductions (a few ulps of sum_sq in y's dtype) the data are constant
            spread = S.where(spread > noise_floor(self.x.dtype) * sum_sq, spread, 0.0)
            self._cache["var"] = spread / S.clamp_min(n - 1, 1)
        return self._cache["var"]

    def mean_log(self) -> S.Scalar:
        """Mean of log z = log(y / unit) over the used elements (0-d float64); requires y > 0 on them (no shift)."""
        if "mean_log" not in self._cache and (moments := self._fused(logs=True)) is not None:
            self._cache["mean_log"] = moments[3] / self.count()
        if "mean_log" not in self._cache:
            y = self._shifted()
            z = self._cache.get("z")
            if self.bottom is not None and self.bottom / self.unit < torch.finfo(y.dtype).tiny:
                logs = torch.log(y.double() / self.unit)  # z would underflow in y's dtype: log(0) = -inf
            else:
                logs = torch.log(z) if z is not None else torch.div(y, self.unit).log_()
            if not (self.above is None and _known(self.n_hint) == y.numel()):  # else: no zero, nothing to exclude
                logs.nan_to_num_(neginf=0.0)  # log 0 = -inf -> 0 on the excluded elements
            self._cache["mean_log"] = self._out(logs.sum().double()) / self.count()
        return self._cache["mean_log"]

    def used(self) -> tuple[torch.Tensor, S.Scalar | None]:
        """The used values of x in x's dtype (x itself when every element is used, else compacted: one host
        synchronisation for the size) and the shift to subtract from them (None for none); y = values - shift."""
        x = self.x.abs() if self.signed else self.x
        if self.above is None:
            return (x if _known(self.n_hint) == x.numel() else x[x > 0]), None
        return x[x > self._bound(self.above)], self.above if self.shift is None else self.shift


def _known(n_hint: int | torch.Tensor | None) -> int | None:
    """A count known on the host (None for one on the device only, which is never read here)."""
    return n_hint if isinstance(n_hint, int) else None

"""The values a fit sees, as masked reductions over the full |g| vector (no compaction unless unavoidable).

A single-stage fit uses y = |g| over the non-zero elements; a peak-over-threshold stage m >= 2 uses
y = |g| - a over the elements with |g| > eta_{m-1}, a being the anchor (SIDCo 001_ac87256369ec7547.txt, Lemma 2
(7)-(9) and Cor. 2.1 (10)-(11): a = eta_{m-1}). Sums are taken over ``where``/``clamp`` views of the whole vector in
its own dtype (float32 reductions in torch are pairwise, accurate to ~1e-7 relative) and only the 0-d results are
promoted to float64; nothing is read back to the host here. Only the exact generalized Pareto MLE needs the
values themselves (:meth:`Exceedances.values`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

_RELATIVE_NOISE = 32.0


@dataclass
class Exceedances:
    """y = x - shift over {x > above}; ``above=None`` means x > 0 with shift 0 (zeros excluded).

    Attributes
    ----------
    x : Tensor, shape (d,)
        All magnitudes |g| (>= 0, validated by the caller).
    above : 0-d Tensor or None
        Exclusive lower bound of the elements used (the previous stage's threshold).
    shift : 0-d Tensor or None
        Subtracted from the elements used (the anchor); must satisfy above <= shift <= min of the used elements
        (the previous threshold, or the smallest survivor). None means ``above``.
    n_hint : int or None
        Number of used elements when the caller already knows it (saves a pass).
    workspace : Tensor or None
        A buffer like x to hold the shifted values (saves an allocation per peak-over-threshold stage); its
        content is only needed until this object's statistics have been computed.
    """

    x: torch.Tensor
    above: torch.Tensor | None = None
    shift: torch.Tensor | None = None
    n_hint: int | None = None
    workspace: torch.Tensor | None = None
    _cache: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    def _shifted(self) -> torch.Tensor:
        """max(x - shift, 0) restricted to the used elements (0 elsewhere)."""
        if "y" not in self._cache:
            if self.above is None:
                y = self.x
            else:
                # shift >= above, so every element with x <= above maps to 0 (x > a <=> x - a > 0 in IEEE floats)
                anchor = self.above if self.shift is None else self.shift
                y = torch.sub(self.x, anchor.to(self.x.dtype), out=self.workspace).clamp_min_(0)
            self._cache["y"] = y
        return self._cache["y"]

    def count(self) -> torch.Tensor:
        """Number of used elements (0-d float64 tensor on x's device)."""
        if "n" not in self._cache:
            if self.n_hint is not None:
                n = torch.tensor(float(self.n_hint), dtype=torch.float64, device=self.x.device)
            elif self.above is None:
                n = torch.count_nonzero(self.x).double()
            else:
                n = torch.count_nonzero(self.x > self.above.to(self.x.dtype)).double()  # (bool .sum() casts)
            self._cache["n"] = n
        return self._cache["n"]

    def mean(self) -> torch.Tensor:
        """Mean of y (0-d float64)."""
        if "mean" not in self._cache:
            self._cache["mean"] = self._shifted().sum().double() / self.count()
        return self._cache["mean"]

    def var(self) -> torch.Tensor:
        """Sample variance of y with the n - 1 divisor (0-d float64; NaN-free: 0 when n < 2).

        Exactly 0 when the spread is within the rounding of the reductions (coefficient of variation below about
        2e-3 in float32, 3e-8 in float64), so constant exceedances are recognised as degenerate."""
        if "var" not in self._cache:
            y = self._shifted()
            n = self.count()
            sum_sq = torch.dot(y, y).double()
            m = self.mean()
            spread = sum_sq - n * m * m
            # below the rounding of the reductions (a few ulps of sum_sq in y's dtype) the data are constant
            spread = torch.where(
                spread > _RELATIVE_NOISE * torch.finfo(y.dtype).eps * sum_sq, spread, torch.zeros_like(spread)
            )
            self._cache["var"] = spread / (n - 1).clamp_min(1)
        return self._cache["var"]

    def mean_log(self) -> torch.Tensor:
        """Mean of log y over the used elements (0-d float64); requires y > 0 on them (no shift)."""
        if "mean_log" not in self._cache:
            y = self._shifted()
            logs = torch.log(y)
            if not (self.above is None and self.n_hint == y.numel()):  # else: no zero, nothing to exclude
                logs.nan_to_num_(neginf=0.0)  # log 0 = -inf -> 0 on the excluded elements
            self._cache["mean_log"] = logs.sum().double() / self.count()
        return self._cache["mean_log"]

    def values(self) -> torch.Tensor:
        """The used y values compacted into a float64 tensor (one host synchronisation for the size)."""
        if self.above is None:
            v = self.x[self.x > 0]
        else:
            v = self.x[self.x > self.above.to(self.x.dtype)] - (self.above if self.shift is None else self.shift)
        return v.double().clamp_min(0)

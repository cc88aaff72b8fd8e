"""What an estimator returns before diagnostics are read back: parameters and deferred flags, all on device."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gradstat.theory import scalars as S


@dataclass
class Estimate:
    """Raw result of one estimator.

    Attributes
    ----------
    params : dict[str, Tensor or host float64]
        'scale' always, 'shape' for gamma and generalized Pareto; 0-d float64 tensors on the data's device, or host
        numbers where the data's statistics are (:mod:`gradstat.theory.scalars`).
    iterations : int
        Newton (or other) iterations performed; 0 for closed forms.
    converged : Tensor or bool
        0-d bool tensor (read back once with the flags) or a plain bool.
    flags : list of (Tensor, str)
        Diagnostics to report when the 0-d bool tensor is true (read back in one synchronisation by the caller).
    degenerate : Tensor or bool
        0-d bool (or plain bool): the data are constant within the rounding of the reductions, so the shape is not
        identifiable; the parameters are then a finite clipped value, ``converged`` is false and a flag says why.
        Peak-over-threshold stages treat a degenerate fit as invalid (they stop and keep the previous threshold).
    """

    params: dict[str, S.Scalar]
    iterations: int = 0
    converged: S.Flag = True
    flags: list[tuple[S.Flag, str]] = field(default_factory=list)
    degenerate: S.Flag = False

    def valid(self) -> S.Flag:
        """Every parameter finite, the scale > 0 and the fit not degenerate (a bool of the parameters' kind)."""
        ok = self.params["scale"] > 0
        for value in self.params.values():
            ok = ok & S.isfinite(value)
        if isinstance(ok, torch.Tensor):  # (a bool flag joins as a scalar: no copy from the host)
            degenerate = self.degenerate
            return ok & (~degenerate if isinstance(degenerate, torch.Tensor) else not degenerate)
        return ok & S.logical_not(self.degenerate)

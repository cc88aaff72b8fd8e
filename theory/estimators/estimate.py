"""What an estimator returns before diagnostics are read back: parameters and deferred flags, all on device."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Estimate:
    """Raw result of one estimator.

    Attributes
    ----------
    params : dict[str, Tensor]
        'scale' always, 'shape' for gamma and generalized Pareto; 0-d float64 tensors on the data's device.
    iterations : int
        Newton (or other) iterations performed; 0 for closed forms.
    converged : Tensor or bool
        0-d bool tensor (read back once with the flags) or a plain bool.
    flags : list of (Tensor, str)
        Diagnostics to report when the 0-d bool tensor is true (read back in one synchronisation by the caller).
    valid : Tensor or None
        0-d bool: the parameters are usable (finite, scale > 0); used by the peak-over-threshold stages to stop
        cleanly instead of producing NaN.
    """

    params: dict[str, torch.Tensor]
    iterations: int = 0
    converged: torch.Tensor | bool = True
    flags: list[tuple[torch.Tensor, str]] = field(default_factory=list)

    def valid(self) -> torch.Tensor:
        """0-d bool tensor: every parameter finite and the scale > 0."""
        ok = self.params["scale"] > 0
        for value in self.params.values():
            ok = ok & torch.isfinite(value)
        return ok

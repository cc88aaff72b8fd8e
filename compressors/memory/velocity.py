"""DGC's local momentum correction as a memory: the velocity a worker accumulates and compresses.

Deep Gradient Compression (Lin, Han, Mao, Wang and Dally 2018), Sec. 3.2 "local gradient accumulation with
momentum correction" and Sec. 3.3 "momentum factor masking":

    u_k <- m * u_k + g_k                  (local velocity, what error feedback then accumulates and compresses)
    u_k <- u_k * (1 - mask_k)             (momentum factor masking, mask_k the support of what worker k sent)

The velocity lives in :class:`gradstat.compressors.memory.send.WorkerState` (``velocity``); the send step
(:class:`gradstat.compressors.memory.send.Memory`) computes the new velocity before encoding and stores it, masked,
only once the step's reconstruction is known, so a step that fails leaves the velocity as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LocalMomentum:
    """DGC's local momentum ``m`` in [0, 1) with momentum factor masking (``masking``)."""

    momentum: float = 0.9
    masking: bool = True

    def __post_init__(self) -> None:
        m = self.momentum
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not (0.0 <= float(m) < 1.0):
            raise ValueError(f"DGC momentum must lie in [0, 1), got {m!r}")
        if not isinstance(self.masking, bool):
            raise ValueError(f"DGC masking must be true or false, got {self.masking!r}")

    def accumulate(self, velocity: torch.Tensor | None, g: torch.Tensor) -> torch.Tensor:
        """The new velocity ``m * u + g`` (a float32 copy of ``g`` at the first step: ``g`` may be a view of a
        buffer that is overwritten later, DDP's bucket); ``velocity`` is not changed."""
        return g.to(torch.float32, copy=True) if velocity is None else self.momentum * velocity + g.float()

    def masked(self, velocity: torch.Tensor, sent: torch.Tensor) -> torch.Tensor:
        """The velocity after momentum factor masking: zero where ``sent`` (this worker's reconstruction) is
        nonzero; unchanged without masking."""
        if not self.masking:
            return velocity
        return velocity.masked_fill(sent.reshape(velocity.shape) != 0, 0.0)

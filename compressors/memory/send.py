"""The worker's send step with error feedback, and a round of it over P workers.

GRACE's five-line ``send_step``: compensate, encode, decode, update memory. With ``feedback`` an
:class:`~gradstat.compressors.memory.feedback.ErrorFeedback` (none, plain EF, QCS's weighted feedback eq. (14),
ECQ-SGD), one worker's step is

    z = g + compensation * h;   payload = C.encode(z);   z_hat = C.decode(payload);   h <- decay * h + (z - z_hat)

and the receiver applies the average of the z_hat. A round goes through the compressor's own ``round`` so schemes
with side information (NDQSG) or per-worker compressor state (SIDCo's stage count) work unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from gradstat.compressors.base import Compressor, RoundResult
from gradstat.compressors.context import Context
from gradstat.compressors.memory.feedback import ErrorFeedback, FeedbackState
from gradstat.compressors.wire.payload import Payload


@dataclass
class WorkerState:
    """Everything one worker carries across steps: its feedback residual and its compressor's state."""

    feedback: FeedbackState = field(default_factory=FeedbackState)
    compressor: Any = None


def new_worker_states(compressor: Compressor, workers: int) -> list[WorkerState]:
    """Fresh states for ``workers`` workers (residual zero, compressor state from ``compressor.new_state()``)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return [WorkerState(compressor=compressor.new_state()) for _ in range(workers)]


def send_step(
    compressor: Compressor, feedback: ErrorFeedback, g: torch.Tensor, state: WorkerState, ctx: Context | None = None
) -> tuple[Payload, torch.Tensor]:
    """One worker's step: returns the payload it sends and the reconstruction ``z_hat`` the receiver gets;
    ``state.feedback`` is updated in place."""
    ctx = (ctx or Context()).but(state=state.compressor)
    z = feedback.compensate(g, state.feedback)
    payload = compressor.encode(z, ctx)
    z_hat = compressor.decode(payload, ctx)
    feedback.update(z, z_hat, state.feedback)
    return payload, z_hat


def feedback_round(
    compressor: Compressor,
    feedback: ErrorFeedback,
    grads: Sequence[torch.Tensor],
    states: Sequence[WorkerState],
    ctx: Context | None = None,
) -> RoundResult:
    """One synchronous round over P workers with error feedback: each worker compensates its gradient, the
    compressor's ``round`` encodes, decodes and averages, and each worker's residual is updated from its own
    reconstruction. ``states`` (one per worker) are updated in place."""
    if len(states) != len(grads):
        raise ValueError(f"{len(grads)} gradients but {len(states)} worker states")
    zs = [feedback.compensate(g, s.feedback) for g, s in zip(grads, states, strict=True)]
    result = compressor.round(zs, ctx, [s.compressor for s in states])
    for z, z_hat, s in zip(zs, result.decoded, states, strict=True):
        feedback.update(z, z_hat, s.feedback)
    return result

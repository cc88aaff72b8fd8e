"""Momentum with sparse communication: DGC's local momentum correction and GMC's global momentum memory.

Both wrap any compressor (in the papers a top-K or approximate top-K sparsifier) and keep the coordinates not
sent in a per-worker memory, through :func:`gradstat.compressors.memory.send.feedback_round` with plain error feedback
(``u <- z - C(z)``, which is GMC eq. (4) ``u_{t+1} = (1 - m) * (g + u)`` whenever C sends exact values on a mask).

DGC, local momentum (Lin et al. 2018, Sec. 3.2-3.3; as written in GMC (Zhao et al.), Sec. 2.1 and 3.3):
    velocity  u_k <- momentum * u_k + g_k                  (local momentum)
    memory    v_k <- v_k + u_k; send C(v_k); v_k <- v_k - C(v_k)
    masking   u_k <- u_k * (1 - m_k), m_k the support of C(v_k)   (momentum factor masking)
    update    w <- w - lr * mean_k C(v_k)

GMC, global momentum (GMC (Zhao et al.), Sec. 3 and Algorithm 1):
    g_{t,k} = grad_k / p - beta / (p eta) (w_t - w_{t-1})   (grad_k: worker k's mini-batch mean gradient)
    send m_{t,k} * (g_{t,k} + u_{t,k});  u_{t+1,k} = (1 - m_{t,k}) * (g_{t,k} + u_{t,k})
    server: w_{t+1} = w_t - eta sum_k m_{t,k} * (g_{t,k} + u_{t,k}); everybody learns w_{t+1} - w_t.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from gradstat.compressors.base import Compressor, RoundResult
from gradstat.compressors.context import Context
from gradstat.compressors.memory.feedback import ErrorFeedback
from gradstat.compressors.memory.send import Memory, WorkerState, feedback_round
from gradstat.compressors.memory.velocity import LocalMomentum


def _check_momentum(value: float, who: str) -> None:
    if not (0.0 <= float(value) < 1.0):
        raise ValueError(f"{who} must lie in [0, 1), got {value}")


@dataclass(frozen=True)
class LocalMomentumCorrection:
    """DGC's local momentum correction with momentum factor masking (Lin et al. 2018) over P workers: the send
    step's :class:`~gradstat.compressors.memory.send.Memory` of plain error feedback over
    :class:`~gradstat.compressors.memory.velocity.LocalMomentum`.

    Parameters
    ----------
    compressor : the sparsifier C (e.g. ``create("dgc:ratio=0.001")`` or ``create("topk")``).
    momentum : local momentum m in [0, 1) (DGC and GMC experiments: 0.9).
    masking : momentum factor masking (zero the velocity where a coordinate was sent).
    """

    compressor: Compressor
    momentum: float = 0.9
    masking: bool = True

    def __post_init__(self) -> None:
        LocalMomentum(self.momentum, self.masking)  # checks both

    @property
    def memory(self) -> Memory:
        return Memory(ErrorFeedback.plain(), LocalMomentum(self.momentum, self.masking))

    def new_states(self, workers: int) -> list[WorkerState]:
        return self.memory.new_states(self.compressor, workers)

    def round(
        self, grads: Sequence[torch.Tensor], states: Sequence[WorkerState], ctx: Context | None = None
    ) -> RoundResult:
        """One step over the workers; ``result.mean`` is the averaged sparse update direction (apply
        ``w <- w - lr * result.mean``). States are updated in place."""
        return feedback_round(self.compressor, self.memory, grads, states, ctx)


@dataclass
class GlobalMomentumState:
    """What every GMC node knows after a round: the last model change ``w_t - w_{t-1}`` (None before step 1)."""

    last_update: torch.Tensor | None = None


@dataclass(frozen=True)
class GlobalMomentumCompression:
    """GMC (Zhao et al.), Algorithm 1) over P workers.

    Parameters
    ----------
    compressor : the sparsifier that sets m_{t,k} (``topk`` for top-K, ``gmc_topk`` for the approximate top-K).
    momentum : global momentum beta in [0, 1) (GMC experiments: 0.9; 0 gives gradient dropping).
    lr : step size eta > 0 (constant).
    memory : keep the memory gradient u (GMC); False sends m * g and drops the rest (the paper's counter-example).
    """

    compressor: Compressor
    lr: float
    momentum: float = 0.9
    memory: bool = True

    def __post_init__(self) -> None:
        _check_momentum(self.momentum, "GMC momentum beta")
        if not (float(self.lr) > 0.0):
            raise ValueError(f"GMC lr (eta) must be > 0, got {self.lr}")

    def new_states(self, workers: int) -> list[WorkerState]:
        return Memory().new_states(self.compressor, workers)

    def new_shared(self) -> GlobalMomentumState:
        return GlobalMomentumState()

    def round(
        self,
        grads: Sequence[torch.Tensor],
        states: Sequence[WorkerState],
        shared: GlobalMomentumState,
        ctx: Context | None = None,
    ) -> RoundResult:
        """One step. ``grads[k]`` is worker k's mini-batch mean gradient at w_t; ``states`` one per worker;
        ``shared`` the state every node holds. Returns the round with ``info["update"] = w_{t+1} - w_t`` (add it
        to the model); ``shared`` and the worker memories are updated in place."""
        p = len(grads)
        last = shared.last_update
        g = [x.float() / p if last is None else x.float() / p - (self.momentum / (p * self.lr)) * last for x in grads]
        feedback = ErrorFeedback.plain() if self.memory else ErrorFeedback.none()
        result = feedback_round(self.compressor, feedback, g, states, ctx)
        update = -self.lr * torch.stack([d.float() for d in result.decoded]).sum(0)
        shared.last_update = update
        result.info = {"update": update}
        return result

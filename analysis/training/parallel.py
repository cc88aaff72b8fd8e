"""Simulated synchronous data parallelism in one process.

Each of P workers computes the gradient of its own shard of the mini-batch (``torch.tensor_split`` along the
first dimension); the model is updated with the average of the P gradients, as synchronous distributed SGD does
(SIDCo (Abdelmoniem et al.), App. A, Algorithm 2; ECQ-SGD (Wu et al.), w <- w - eta/P sum_p g_p).

With a compressor in the loop, every worker compresses its whole flat gradient (model order), with its own
error-feedback state (``z = g + compensation*h``, see :mod:`gradstat.compressors.memory.feedback`), through the send
step of :mod:`gradstat.compressors.memory.send` (the compressor's own ``round``, so side-information schemes decode
in their order), and the model is updated with the average of the decoded messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from gradstat.compressors import Compressor, Context, ErrorFeedback, Memory, WorkerState
from gradstat.compressors.memory.send import send_round

Grads = dict[str, torch.Tensor]


@dataclass
class StepResult:
    """One training step: the mean loss over workers, each worker's raw gradient, and extras (with feedback:
    ``residual``, the memory h before this step, and ``compensated``, z = g + compensation*h), one dict per
    worker."""

    loss: float
    grads: list[Grads]
    extras: dict[str, list[Grads]] = field(default_factory=dict)


class DataParallel:
    """P simulated workers training ``model`` with ``optimizer``.

    Parameters
    ----------
    model, optimizer : the model (one replica stands for all workers) and its optimizer.
    loss : ``loss(output, target) -> scalar`` mean loss of a shard.
    workers : P >= 1.
    compressor, feedback : compressor in the loop and its error feedback (None: exact averaging).
    seed : base seed of the compressor's randomness (context seed; step and worker are mixed in).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        workers: int = 1,
        compressor: Compressor | None = None,
        feedback: ErrorFeedback | None = None,
        seed: int = 0,
    ) -> None:
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive integer, got {workers!r}")
        if feedback is not None and compressor is None:
            raise ValueError("error feedback needs a compressor in the loop")
        self.model, self.optimizer, self.loss_fn, self.workers = model, optimizer, loss, workers
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.compressor = compressor
        self.feedback = feedback if feedback is not None else (ErrorFeedback.none() if compressor else None)
        self.states: list[WorkerState] = Memory().new_states(compressor, workers) if compressor is not None else []
        self.seed = seed

    @property
    def extras(self) -> list[str]:
        """Names of the extras each step returns (empty without error feedback)."""
        active = self.feedback is not None and self.feedback.compensation > 0
        return ["residual", "compensated"] if active else []

    def worker_gradients(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list[Grads], float]:
        """Each worker's gradient on its shard, and the mean shard loss. The gradients are the tensors autograd
        produced (no copies)."""
        if x.shape[0] < self.workers:
            raise ValueError(f"a mini-batch of {x.shape[0]} samples cannot be split over {self.workers} workers")
        grads, losses = [], []
        for xs, ys in zip(torch.tensor_split(x, self.workers), torch.tensor_split(y, self.workers), strict=True):
            self.model.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.model(xs), ys)
            loss.backward()
            missing = [n for n, p in self.named if p.grad is None]
            if missing:
                raise ValueError(f"no gradient for {missing[:3]}: the loss does not depend on these parameters")
            grads.append({n: p.grad for n, p in self.named if p.grad is not None})
            losses.append(loss.detach())
        return grads, float(torch.stack(losses).mean())

    def step(self, step: int, x: torch.Tensor, y: torch.Tensor) -> StepResult:
        """Compute the workers' gradients, aggregate them, apply the optimizer step."""
        grads, loss = self.worker_gradients(x, y)
        extras: dict[str, list[Grads]] = {}
        if self.compressor is None:
            update = (
                grads[0]
                if self.workers == 1
                else {n: torch.stack([g[n] for g in grads]).mean(0) for n, _ in self.named}
            )
        else:
            update, extras = self._compressed_round(step, grads)
        for n, p in self.named:
            p.grad = update[n]
        self.optimizer.step()
        return StepResult(loss, grads, extras)

    def _compressed_round(self, step: int, grads: list[Grads]) -> tuple[Grads, dict[str, list[Grads]]]:
        """The workers' send step (:func:`gradstat.compressors.memory.send.send_round`) on their flat gradients."""
        assert self.compressor is not None and self.feedback is not None
        flats = [torch.cat([g[n].reshape(-1) for n, _ in self.named]) for g in grads]
        before = [
            s.feedback.residual if s.feedback.residual is not None else torch.zeros_like(f, dtype=torch.float32)
            for f, s in zip(flats, self.states, strict=True)
        ]
        compensated, result = send_round(
            self.compressor, self.feedback, flats, self.states, Context(seed=self.seed, step=step)
        )
        mean = self.unflatten(torch.stack(result.decoded).mean(0))
        if not self.extras:
            return mean, {}
        return mean, {
            "residual": [self.unflatten(r) for r in before],
            "compensated": [self.unflatten(z) for z in compensated],
        }

    def unflatten(self, flat: torch.Tensor) -> Grads:
        """Split a flat model-order vector into ``{param: view}`` with the parameters' shapes."""
        sizes = [p.numel() for _, p in self.named]
        return {n: part.view_as(p) for (n, p), part in zip(self.named, torch.split(flat, sizes), strict=True)}

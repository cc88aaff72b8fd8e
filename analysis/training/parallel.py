"""Simulated synchronous data parallelism in one process.

Each of P workers computes the gradient of its own shard of the mini-batch (``torch.tensor_split`` along the
first dimension); the model is updated with the average of the P gradients, as synchronous distributed SGD does
(SIDCo (Abdelmoniem et al.), App. A, Algorithm 2; ECQ-SGD (Wu et al.), w <- w - eta/P sum_p g_p).

With a compressor in the loop, every worker compresses its whole flat gradient (model order), with its own
error-feedback state (``z = g + compensation*h``, see :mod:`gradstat.compressors.memory.feedback`), and the model is
updated with the average of the decoded messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from gradstat.compressors import Compressor, Context, ErrorFeedback

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
        self.feedback_states = [self.feedback.new_state() for _ in range(workers)] if self.feedback else []
        self.compressor_states: list[Any] = [None] * workers
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
        assert self.compressor is not None and self.feedback is not None
        decoded, residuals, compensated = [], [], []
        for w, g in enumerate(grads):
            flat = torch.cat([g[n].reshape(-1) for n, _ in self.named])
            state = self.feedback_states[w]
            before = state.residual if state.residual is not None else torch.zeros_like(flat, dtype=torch.float32)
            z = self.feedback.compensate(flat, state)
            if self.compressor_states[w] is None:
                self.compressor_states[w] = self.compressor.new_state(like=z)
            ctx = Context(seed=self.seed, step=step, worker=w, state=self.compressor_states[w])
            z_hat = self.compressor.decode(self.compressor.encode(z, ctx), ctx)
            self.feedback.update(z, z_hat, state)
            decoded.append(z_hat)
            residuals.append(self.unflatten(before))
            compensated.append(self.unflatten(z))
        mean = self.unflatten(torch.stack(decoded).mean(0))
        return mean, ({"residual": residuals, "compensated": compensated} if self.extras else {})

    def unflatten(self, flat: torch.Tensor) -> Grads:
        """Split a flat model-order vector into ``{param: view}`` with the parameters' shapes."""
        sizes = [p.numel() for _, p in self.named]
        return {n: part.view_as(p) for (n, p), part in zip(self.named, torch.split(flat, sizes), strict=True)}

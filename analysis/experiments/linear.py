"""SGD on a linear least-squares model with a compressor in the loop: the setting of QCS Sec. 2 (Fig. 2) and of
ECQ-SGD's Syn-d experiments, shared by both experiment modules.

The model is ``y = W x`` with W of shape (m, n) (m = 1 for ECQ-SGD's scalar target), the loss
``f(W) = 0.5 mean_i ||y_i - W x_i||^2`` (QCS Sec. 2, Example). Each step draws a mini-batch, computes the gradient
in closed form, lets P workers (each with its own shard of the batch) compress it through
:func:`gradstat.compressors.memory.send.feedback_round`, and applies the average: ``W <- W - mu * mean_p C(g_p)``.
The training set comes from the ``linreg`` workload, so it is the one ``gradstat record`` trains on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gradstat.analysis.training.workloads.linreg import LinReg
from gradstat.compressors import Compressor, Context, ErrorFeedback
from gradstat.compressors.memory.send import feedback_round, new_worker_states


@dataclass
class LinearProblem:
    """A training set (x: (N, n), y: (N, m), float32), the optimum W* of the training loss and its loss."""

    x: torch.Tensor
    y: torch.Tensor
    w_star: torch.Tensor
    loss_star: float

    @classmethod
    def from_workload(cls, workload: LinReg) -> "LinearProblem":
        x, y = workload.dataset()
        x64, y64 = x.double(), y.double()
        w_star = torch.linalg.lstsq(x64, y64).solution.T  # (m, n): the least-squares optimum of the training set
        return cls(x, y, w_star.float(), float(loss(w_star, x64, y64)))

    @property
    def shape(self) -> tuple[int, int]:
        return self.y.shape[1], self.x.shape[1]


def loss(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """0.5 mean_i ||y_i - W x_i||^2."""
    return 0.5 * (y - x @ w.T).pow(2).sum(1).mean()


def gradient(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Gradient of :func:`loss` at W on (x, y): -(y - W x)^T x / batch, shape (m, n)."""
    return -((y - x @ w.T).T @ x) / x.shape[0]


@dataclass
class Trajectory:
    """Full training loss and distance ||W - W*||_F at the listed steps (0: the start), and the mean bits per
    worker per step over the steps run (0 without compression)."""

    steps: np.ndarray
    loss: np.ndarray
    distance: np.ndarray
    bits: float


def train(
    problem: LinearProblem,
    compressor: Compressor | None,
    mu: float,
    steps: int,
    batch: int = 32,
    seed: int = 0,
    workers: int = 1,
    feedback: ErrorFeedback | None = None,
    every: int = 10,
    diverged: float = 1e8,
) -> Trajectory:
    """SGD from W = 0 for ``steps`` steps of step size ``mu``. The full training loss and the distance are taken
    every ``every`` steps and at the end (``Trajectory.steps``); the run stops early (the rest is inf) once the
    loss exceeds ``diverged`` times its start or is not finite."""
    m, n = problem.shape
    w = torch.zeros(m, n)
    gen = torch.Generator().manual_seed(seed)
    fb = feedback if feedback is not None else ErrorFeedback.none()
    states = new_worker_states(compressor, workers) if compressor is not None else []
    at = np.unique(np.r_[np.arange(0, steps, every), steps])
    losses, dist = np.full(at.size, np.inf), np.full(at.size, np.inf)
    losses[0] = float(loss(w, problem.x, problem.y))
    dist[0] = float((w - problem.w_star).norm())
    point = 1
    bits, sent = 0.0, 0
    count = problem.x.shape[0]
    for t in range(steps):
        idx = torch.randint(0, count, (batch,), generator=gen)
        xb, yb = problem.x[idx], problem.y[idx]
        if compressor is None:
            update = gradient(w, xb, yb)
        else:
            grads = [
                gradient(w, xs, ys).reshape(-1)
                for xs, ys in zip(xb.tensor_split(workers), yb.tensor_split(workers), strict=True)
            ]
            result = feedback_round(compressor, fb, grads, states, Context(seed=seed, step=t))
            update = result.mean.reshape(m, n)
            bits += result.bits / workers
            sent += 1
        w = w - mu * update
        if t + 1 != at[point]:
            continue
        current = float(loss(w, problem.x, problem.y))
        if not np.isfinite(current) or current > diverged * losses[0]:
            break
        losses[point] = current
        dist[point] = float((w - problem.w_star).norm())
        point += 1
    return Trajectory(at, losses, dist, bits / max(sent, 1))

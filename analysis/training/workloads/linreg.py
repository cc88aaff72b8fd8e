"""Synthetic linear regression.

- ``variant=qcs`` (default): QCS Sec. 2, Example (Abdi & Fekri, Quantized Compressive Sampling): learn z = W x with
  f = 0.5 E||y - W x||^2, x ~ N(0, R), R with eigenvalues spread evenly between ``lambda_min`` = 1 and
  ``lambda_max`` = 4 (random orthogonal eigenvectors), n = ``inputs`` = 64, m = ``outputs`` = 50, batch 32,
  step size below 1/lambda_max.
- ``variant=ecq``: ECQ-SGD's Syn-d (Wu et al., experiments, linear models):
  y_i = w*^T x_i + eps_i with d = ``d`` features (256, 512, 1024), 10k samples, learning rate 0.02;
  x ~ N(0, I) (the source does not give the input distribution).

Both draw a fixed training set of ``samples`` examples from ``data_seed`` with noise of standard deviation
``noise``; the true weights have i.i.d. N(0, 1/n) entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from gradstat.analysis.training.workloads.base import Workload
from gradstat.analysis.training.workloads.registry import register


@register
@dataclass
class LinReg(Workload):
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.0
    variant: Literal["qcs", "ecq"] = "qcs"
    inputs: int = 64
    outputs: int = 50
    lambda_min: float = 1.0
    lambda_max: float = 4.0
    d: int = 256
    samples: int = 10_000
    noise: float = 0.1
    data_seed: int = 0
    name = "linreg"
    description = "linear regression: QCS Sec. 2 (x ~ N(0,R), 64 in, 50 out) or ECQ-SGD Syn-d (variant=ecq)"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.lambda_min <= self.lambda_max:
            raise ValueError(f"linreg: need 0 < lambda_min <= lambda_max, got {self.lambda_min}, {self.lambda_max}")
        for key in ("inputs", "outputs", "d", "samples"):
            if getattr(self, key) < 1:
                raise ValueError(f"linreg: {key} must be >= 1, got {getattr(self, key)}")
        if self.noise < 0:
            raise ValueError(f"linreg: noise must be >= 0, got {self.noise}")

    @property
    def shape(self) -> tuple[int, int]:
        """(n inputs, m outputs)."""
        return (self.d, 1) if self.variant == "ecq" else (self.inputs, self.outputs)

    def _build(self) -> nn.Module:
        n, m = self.shape
        model = nn.Linear(n, m, bias=False)
        nn.init.zeros_(model.weight)
        return model

    def correlation(self) -> torch.Tensor:
        """The input correlation matrix R (n x n, float64): identity for ``ecq``, U diag(lambda) U^T for ``qcs``."""
        n, _ = self.shape
        if self.variant == "ecq":
            return torch.eye(n, dtype=torch.float64)
        gen = torch.Generator().manual_seed(self.data_seed)
        q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
        eig = torch.linspace(self.lambda_min, self.lambda_max, n, dtype=torch.float64)
        return q @ torch.diag(eig) @ q.T

    def true_weights(self) -> torch.Tensor:
        """W* (m x n, float64) with i.i.d. N(0, 1/n) entries."""
        n, m = self.shape
        gen = torch.Generator().manual_seed(self.data_seed + 1)
        return torch.randn(m, n, generator=gen, dtype=torch.float64) / n**0.5

    def dataset(self) -> tuple[torch.Tensor, torch.Tensor]:
        n, m = self.shape
        gen = torch.Generator().manual_seed(self.data_seed + 2)
        root = torch.linalg.cholesky(self.correlation())
        x = torch.randn(self.samples, n, generator=gen, dtype=torch.float64) @ root.T
        y = x @ self.true_weights().T + self.noise * torch.randn(self.samples, m, generator=gen, dtype=torch.float64)
        return x.float(), y.float()

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """0.5 ||y - W x||^2 per sample, averaged over the mini-batch (QCS's f)."""
        return 0.5 * (target - output).pow(2).sum(dim=1).mean()

"""Multinomial logistic regression, GMC's convex case (Zhao et al., Global Momentum Compression, Sec. 5, Table 1:
logistic regression on MNIST, weight decay 1e-4, batch 128), here on the digits upsampled to 28x28
(7,850 parameters)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from gradstat.analysis.training.workloads import data
from gradstat.analysis.training.workloads.base import Workload
from gradstat.analysis.training.workloads.registry import register


@register
@dataclass
class LogReg(Workload):
    batch_size: int = 128
    lr: float = 0.1
    weight_decay: float = 1e-4
    name = "logreg"
    description = "multinomial logistic regression on digits (28x28), GMC convex case"

    def _build(self) -> nn.Module:
        return nn.Sequential(OrderedDict(flatten=nn.Flatten(), linear=nn.Linear(784, 10)))

    def dataset(self) -> tuple[torch.Tensor, torch.Tensor]:
        return data.digits(28)

"""FC-300-100: the 784-300-100-10 ReLU MLP of NDQSG (Abdi & Fekri, Nested Dithered Quantization, Sec. 5, Table 1:
266,610 parameters), trained on the digits upsampled to 28x28."""

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
class FC300(Workload):
    name = "fc300"
    description = "784-300-100-10 MLP on digits (28x28), NDQSG Table 1"

    def _build(self) -> nn.Module:
        return nn.Sequential(
            OrderedDict(
                flatten=nn.Flatten(),
                fc1=nn.Linear(784, 300),
                relu1=nn.ReLU(),
                fc2=nn.Linear(300, 100),
                relu2=nn.ReLU(),
                fc3=nn.Linear(100, 10),
            )
        )

    def dataset(self) -> tuple[torch.Tensor, torch.Tensor]:
        return data.digits(28)

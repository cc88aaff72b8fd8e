"""LeNet of NDQSG (Abdi & Fekri, Nested Dithered Quantization, Sec. 5, Table 1): conv 5x5x32, conv 5x5x64, fc 3136-512,
fc 512-10 (1,663,370 parameters). 'same' padding and 2x2 max-pooling take 28x28 to 14x14 to 7x7 (7*7*64 = 3136)."""

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
class LeNet(Workload):
    lr: float = 0.02
    name = "lenet"
    description = "conv5x5x32-conv5x5x64-fc512-fc10 on digits (28x28), NDQSG Table 1"

    def _build(self) -> nn.Module:
        return nn.Sequential(
            OrderedDict(
                conv1=nn.Conv2d(1, 32, 5, padding=2),
                relu1=nn.ReLU(),
                pool1=nn.MaxPool2d(2),
                conv2=nn.Conv2d(32, 64, 5, padding=2),
                relu2=nn.ReLU(),
                pool2=nn.MaxPool2d(2),
                flatten=nn.Flatten(),
                fc1=nn.Linear(3136, 512),
                relu3=nn.ReLU(),
                fc2=nn.Linear(512, 10),
            )
        )

    def dataset(self) -> tuple[torch.Tensor, torch.Tensor]:
        return data.digits(28)

"""CIFAR ResNet-20 (He et al. 2016, Sec. 4.2: 3 stages of 3 basic blocks, 16/32/64 channels, identity shortcuts
with zero-padding, option A), the SIDCo image workload (Abdelmoniem et al., Table 1), on 3x32x32 inputs
built from the digits (upsampled to 32x32, the grey level repeated over 3 channels). 269,722 parameters
(SIDCo's Table 1 says 269,467; its App. B uses d = 269,722 for the same model)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gradstat.analysis.training.workloads import data
from gradstat.analysis.training.workloads.base import Workload
from gradstat.analysis.training.workloads.registry import register


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers and an identity shortcut, zero-padded on channels and subsampled when the
    block downsamples (option A)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.pad = cout - cin
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x[:, :, :: self.stride, :: self.stride] if self.stride > 1 else x
        if self.pad:
            shortcut = F.pad(shortcut, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return F.relu(out + shortcut)


class ResNet20(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        blocks, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(3):
                blocks.append(BasicBlock(cin, cout, stride if i == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.blocks(F.relu(self.bn(self.conv(x))))
        return self.fc(out.mean(dim=(2, 3)))


@register
@dataclass
class ResNet20Workload(Workload):
    name = "resnet20"
    description = "CIFAR ResNet-20 (option A) on 3x32x32 digits, SIDCo Table 1"

    def _build(self) -> nn.Module:
        return ResNet20()

    def dataset(self) -> tuple[torch.Tensor, torch.Tensor]:
        return data.digits(32, channels=3)

"""The workload contract: a model, a training set, a loss and an SGD optimizer, all reproducible from a seed.

A workload is a dataclass whose fields are its hyper-parameters (settable from a spec string such as
``lenet:batch_size=32,lr=0.01``, see :mod:`gradstat.analysis.training.workloads.registry`). Subclasses implement
``_build`` (the model, initialised from torch's global generator, which :meth:`Workload.model` seeds inside a
forked RNG state so the caller's state is untouched), ``dataset`` and, where needed, ``loss``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Iterator

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Workload(ABC):
    """Common hyper-parameters: mini-batch size (over all workers), SGD learning rate, momentum, weight decay."""

    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"{self.name}: batch_size must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"{self.name}: lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"{self.name}: momentum must lie in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise ValueError(f"{self.name}: weight_decay must be >= 0, got {self.weight_decay}")

    # -- to implement ---------------------------------------------------------------------------------------
    @abstractmethod
    def _build(self) -> nn.Module:
        """A freshly initialised model (on CPU)."""

    @abstractmethod
    def dataset(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole training set (inputs, targets) on CPU, first dimension = samples."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean loss of a mini-batch (default: cross-entropy over classes)."""
        return F.cross_entropy(output, target)

    # -- provided -------------------------------------------------------------------------------------------
    def model(self, seed: int = 0, device: torch.device | str = "cpu") -> nn.Module:
        """The model initialised from ``seed`` (global RNG state is saved and restored), moved to ``device``."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = self._build()
        return model.to(device)

    @property
    def num_params(self) -> int:
        """Number of trainable parameters (counted on the meta device, nothing is allocated)."""
        with torch.device("meta"):
            model = self._build()
        return sum(p.numel() for p in model.parameters() if p.requires_grad)

    def batches(self, seed: int = 0, device: torch.device | str = "cpu") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless mini-batches of ``batch_size`` samples: epochs of a permutation drawn from ``seed``."""
        inputs, targets = self.dataset()
        n = inputs.shape[0]
        if self.batch_size > n:
            raise ValueError(f"{self.name}: batch_size {self.batch_size} exceeds the {n} training samples")
        gen = torch.Generator().manual_seed(seed)
        while True:
            order = torch.randperm(n, generator=gen)
            for start in range(0, n - self.batch_size + 1, self.batch_size):
                idx = order[start : start + self.batch_size]
                yield inputs[idx].to(device), targets[idx].to(device)

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """SGD (momentum SGD when ``momentum`` > 0) over the model's trainable parameters."""
        return torch.optim.SGD(
            [p for p in model.parameters() if p.requires_grad],
            lr=self.lr,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
        )

    def optimizer_config(self) -> dict[str, Any]:
        return {
            "name": "sgd",
            "lr": self.lr,
            "momentum": self.momentum,
            "weight_decay": self.weight_decay,
            "batch_size": self.batch_size,
        }

    def config(self) -> dict[str, Any]:
        """All hyper-parameters (the dataclass fields)."""
        return asdict(self)

    def spec(self) -> str:
        """Spec string that rebuilds this workload with its non-default fields."""
        changed = [f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) != f.default]
        return f"{self.name}:{','.join(changed)}" if changed else self.name

    def metadata(self) -> dict[str, Any]:
        """Facts about the data worth keeping in a dump's manifest (e.g. a corpus checksum)."""
        return {}

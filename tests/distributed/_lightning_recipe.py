"""Lightning's side of tests/distributed/test_lightning.py: the tiny module, the recipe's callback (included by
docs/guide/launchers.md) and the rank functions. Imported only where Lightning is installed, by the test's fixture
and by the ranks, so that collecting the tests does not import Lightning (seconds per test process)."""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gradstat.compressors.ddp import CompressionHookState, HookNeverRan, HookWatch, make_hook, register_hook

COMPRESSOR, FEEDBACK, STEPS = "topk:ratio=0.5", "ef", 3


class Tiny(pl.LightningModule):
    """Two linear layers, SGD: the smallest model with more than one parameter tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


# --8<-- [start:callback]
class GradstatHook(pl.Callback):
    """gradstat's hook under Lightning on any device: registered on the DistributedDataParallel model once Lightning
    has wrapped it, checked before every optimizer step (HookNeverRan when it did not run). ``state`` holds the hook's
    metrics and ``state_dict``."""

    def __init__(self, compressor: str, feedback: str = "none", **options: Any) -> None:
        self.compressor, self.feedback, self.options = compressor, feedback, options
        self.state: CompressionHookState | None = None
        self.watch: HookWatch | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.state = register_hook(trainer.strategy.model, self.compressor, self.feedback, **self.options)
        self.watch = HookWatch(self.state)

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        assert self.watch is not None, "on_fit_start registers the hook first"
        self.watch.check()
        # --8<-- [end:callback]


class KeepBits(GradstatHook):
    """The recipe's callback, also keeping the hook's bits of every step."""

    def __init__(self) -> None:
        super().__init__(COMPRESSOR, FEEDBACK)
        self.bits: list[int] = []

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        super().on_before_optimizer_step(trainer, pl_module, optimizer)
        assert self.state is not None
        self.bits.append(self.state.take_metrics().bits)


class WatchOnly(pl.Callback):
    """Only the check, for a hook that Lightning's strategy was given to register."""

    def __init__(self, state: CompressionHookState) -> None:
        self.watch = HookWatch(state)

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        self.watch.check()


def _fit(rank: int, world: int, callback: pl.Callback, strategy: DDPStrategy, model: Tiny) -> None:
    """``STEPS`` optimizer steps of ``model`` on this rank's share of 64 random samples (batches of 8)."""
    # The process group exists (run_ranks made it): these variables tell Lightning its place in it, as torchrun's do.
    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(world), NODE_RANK="0")
    data = torch.Generator().manual_seed(1)
    samples = TensorDataset(torch.randn(64, 8, generator=data), torch.randn(64, 2, generator=data))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=strategy,
        max_steps=STEPS,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(samples, batch_size=8))


def _strategy_option(rank: int, world: int) -> str:
    """The hook handed to ``DDPStrategy``: the first step's check raises."""
    torch.manual_seed(0)
    model = Tiny()
    state, hook = make_hook(COMPRESSOR, FEEDBACK, model=model)
    strategy = DDPStrategy(process_group_backend="gloo", ddp_comm_hook=hook, ddp_comm_state=state)
    try:
        _fit(rank, world, WatchOnly(state), strategy, model)
    except HookNeverRan as exc:
        return str(exc)
    return "no error"


def _registered_on_fit_start(rank: int, world: int) -> tuple[list[int], list[torch.Tensor]]:
    """The recipe's callback (``register_hook`` in ``on_fit_start``): the bits of every step, the trained
    parameters."""
    torch.manual_seed(0)
    model, callback = Tiny(), KeepBits()
    _fit(rank, world, callback, DDPStrategy(process_group_backend="gloo"), model)
    return callback.bits, [p.detach().clone() for p in model.parameters()]


def _both(rank: int, world: int) -> tuple[str, tuple[list[int], list[torch.Tensor]]]:
    return _strategy_option(rank, world), _registered_on_fit_start(rank, world)

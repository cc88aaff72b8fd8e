"""Train a small model with natural compression as the DDP communication hook, with error feedback.

Run on 2 local processes: ``torchrun --nproc-per-node 2 docs/examples/my_ddp.py``.
"""

from __future__ import annotations

import my_compressor  # noqa: F401  (registers "natural": every rank must import it before make_hook)
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradstat.compressors.ddp import make_hook


def train(steps: int = 3, seed: int = 0) -> list[dict]:
    """``steps`` SGD steps of a linear model on this rank's own random batch; returns each step's metrics."""
    rank = dist.get_rank()
    torch.manual_seed(seed)  # the same initial weights on every rank
    model = nn.Linear(32, 4)
    ddp = DistributedDataParallel(model)
    state, hook = make_hook("natural", "ef", model=ddp.module, seed=seed)
    ddp.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(seed * 1000 + rank)  # each rank its own data
    rows = []
    for step in range(steps):
        x, y = torch.randn(64, 32, generator=data), torch.randn(64, 4, generator=data)
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()  # the hook compresses, exchanges and averages the gradient here
        optimizer.step()
        metrics = state.take_metrics()
        rows.append({"step": step, "loss": loss.item(), "bits": metrics.bits, "sent_bytes": metrics.sent_bytes})
    return rows


if __name__ == "__main__":
    dist.init_process_group("gloo")
    for row in train():
        print(f"rank {dist.get_rank()}: {row}")
    dist.destroy_process_group()

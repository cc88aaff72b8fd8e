"""A DDP run with a compressor as the communication hook: per-rank recording of the local gradients into a dump,
the hook's bits and bytes per step, and a checkpoint of the hook state that a resumed run loads.

Run on 2 local processes: ``torchrun --nproc-per-node 2 docs/examples/ddp_record_train.py OUT``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradstat.analysis.training.recorder import record_ranks
from gradstat.compressors.ddp import make_hook


def build(seed: int) -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
    torch.manual_seed(seed)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))
    ddp = DistributedDataParallel(model)
    return ddp, torch.optim.SGD(ddp.parameters(), lr=0.05)


def steps(ddp, optimizer, state, first: int, count: int, seed: int) -> list[dict]:
    """``count`` training steps from step ``first`` on this rank's own data; each step's hook metrics."""
    rows = []
    for step in range(first, first + count):
        data = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + dist.get_rank())
        x, y = torch.randn(64, 32, generator=data), torch.randn(64, 4, generator=data)
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        m = state.take_metrics()
        rows.append({"step": step, "loss": loss.item(), "bits": m.bits, "sent_bytes": m.sent_bytes})
    return rows


def run(out: str | Path, seed: int = 0) -> list[dict]:
    out, rank = Path(out), dist.get_rank()

    # --8<-- [start:record]
    # 1. train 3 steps with Top-k and error feedback, recording each rank's local gradient and residual
    ddp, optimizer = build(seed)
    state, hook = make_hook("topk:ratio=0.1", "ef", model=ddp.module, seed=seed)
    ddp.register_comm_hook(state, hook)
    record_ranks(out / "dump", ddp, optimizer, workload="mlp", every=1, hook_state=state, residual=True)
    rows = steps(ddp, optimizer, state, 0, 3, seed)
    # --8<-- [end:record]

    # 2. checkpoint: the model, the optimizer and the hook state (residuals, seed, step counter) of this rank
    checkpoint = out / f"rank{rank}.pt"
    torch.save({"model": ddp.module.state_dict(), "optimizer": optimizer.state_dict(), "hook": state.state_dict()},
               checkpoint)  # fmt: skip

    # 3. resume in a fresh model, optimizer and hook, as a restarted job would, and train 2 more steps
    saved = torch.load(checkpoint, weights_only=True)
    ddp, optimizer = build(seed)
    ddp.module.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    state, hook = make_hook("topk:ratio=0.1", "ef", model=ddp.module, seed=seed)
    state.load_state_dict(saved["hook"])
    ddp.register_comm_hook(state, hook)
    return rows + steps(ddp, optimizer, state, 3, 2, seed)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    for row in run(sys.argv[1]):
        print(f"rank {dist.get_rank()}: {row}")
    dist.destroy_process_group()

"""gradstat's hook and per-rank recording in a Hugging Face Accelerate script (not a dependency of gradstat:
``pip install accelerate``).

Run on 2 local processes: ``torchrun --nproc-per-node 2 docs/examples/accelerate_record.py OUT`` (or
``accelerate launch``).
"""

from __future__ import annotations

import sys

import torch
from accelerate import Accelerator
from torch import nn

from gradstat.analysis.training.recorder import record_ranks
from gradstat.compressors.ddp import register_hook

accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))
model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))

# --8<-- [start:register]
# after prepare(): the hook goes on the DistributedDataParallel model prepare() returned; with the optimizer, every
# step checks that the hook ran (DistributedDataParallelKwargs(comm_hook=...) would drop it silently)
state = register_hook(model, "topk:ratio=0.1", "ef", optimizer=optimizer)
record_ranks(sys.argv[1], model, optimizer, workload="mlp", every=1, hook_state=state, residual=True)
# --8<-- [end:register]

rank = accelerator.process_index
data = torch.Generator().manual_seed(rank)
for step in range(3):
    x, y = torch.randn(64, 32, generator=data), torch.randn(64, 4, generator=data)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    accelerator.backward(loss)
    optimizer.step()
    print(f"rank {rank} step {step}: {state.take_metrics().bits} bits")

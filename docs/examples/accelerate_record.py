"""Per-rank recording and a compressed DDP hook in a Hugging Face Accelerate script (not a dependency of gradstat:
``pip install accelerate``).

Run on 2 local processes: ``torchrun --nproc-per-node 2 docs/examples/accelerate_record.py OUT`` (or
``accelerate launch``).
"""

from __future__ import annotations

import sys

import torch
from accelerate import Accelerator
from torch import nn

from gradstat.analysis.training.recorder import RankRecorder
from gradstat.compressors.ddp import make_hook

accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))
model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))

# prepare() returns the DistributedDataParallel module: the hook goes on it, bound to the model it wraps
state, hook = make_hook("topk:ratio=0.1", "ef", model=model.module)
model.register_comm_hook(state, hook)
rank, world = accelerator.process_index, accelerator.num_processes
recorder = RankRecorder.create(sys.argv[1], model.module, rank, world, every=1, residual=True, workload="mlp")
# the recorder hooks the torch optimizer inside Accelerate's wrapper (the wrapper takes no step pre-hooks)
recorder.attach(state, optimizer.optimizer)

data = torch.Generator().manual_seed(rank)
for step in range(3):
    x, y = torch.randn(64, 32, generator=data), torch.randn(64, 4, generator=data)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    accelerator.backward(loss)
    optimizer.step()
    print(f"rank {rank} step {step}: {state.take_metrics().bits} bits")

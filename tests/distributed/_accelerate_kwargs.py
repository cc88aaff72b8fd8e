"""Accelerate's own hook option with gradstat's hook (run under torchrun by test_launchers.py): the hook given to
``DistributedDataParallelKwargs(comm_hook=..., comm_state_option=...)`` is dropped; ``expect_hook`` says so at the
first optimizer step. Prints ``HookNeverRan: <message>`` or ``hook ran`` on each rank."""

from __future__ import annotations

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs
from torch import nn

from gradstat.compressors.ddp import HookNeverRan, expect_hook, make_hook

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
state, hook = make_hook("topk:ratio=0.1", "ef", model=model)
option = DistributedDataParallelKwargs(comm_hook=hook, comm_state_option={"state": state})
accelerator = Accelerator(cpu=True, kwargs_handlers=[option])
model, optimizer = accelerator.prepare(model, optimizer)
expect_hook(state, optimizer)
x, y = torch.randn(8, 32), torch.randn(8, 4)
optimizer.zero_grad()
accelerator.backward(nn.functional.mse_loss(model(x), y))
try:
    optimizer.step()
    print("hook ran", flush=True)
except HookNeverRan as exc:
    print(f"HookNeverRan: {exc}", flush=True)

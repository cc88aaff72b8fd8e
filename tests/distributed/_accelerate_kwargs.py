"""Accelerate's own hook option with gradstat's hook (run under torchrun by test_launchers.py): the hook given to
``DistributedDataParallelKwargs(comm_hook=..., comm_state_option=...)`` is dropped; ``expect_hook`` says so at the
first optimizer step. Each rank writes ``HookNeverRan: <message>`` or ``hook ran`` to ``<OUT>/rank-<r>.txt``
(``OUT``: the first argument; the ranks' prints would interleave)."""

from __future__ import annotations

import sys
from pathlib import Path

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
    said = "hook ran"
except HookNeverRan as exc:
    said = f"HookNeverRan: {exc}"
(Path(sys.argv[1]) / f"rank-{accelerator.process_index}.txt").write_text(said)
accelerator.wait_for_everyone()  # both verdicts written before either rank tears its process group down
torch.distributed.destroy_process_group()

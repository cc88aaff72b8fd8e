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
# Tear the process group down while the interpreter is fully alive. destroy_process_group alone leaves gloo's worker
# threads running (gloo's shutdown is a no-op; the DDP model and Accelerate's lists still hold the group): a worker
# that drops the last reference to a finished work during interpreter finalization aborts the rank (SIGABRT,
# "terminate called without an active exception"), because the work's saved thread-local state holds a Python object
# (the context that backward stashes) whose release needs the GIL. Releasing every reference first lets
# destroy_process_group delete the group, which joins those threads here; the check below fails every run (not one in
# a few dozen) where a reference is left.
accelerator.wait_for_everyone()  # both verdicts written before either rank tears its process group down
del model, optimizer, state, hook, option, accelerator
torch.distributed.destroy_process_group()
tasks = Path("/proc/self/task")  # Linux: one folder per thread, its name in comm
if tasks.is_dir():
    left = [name for t in tasks.iterdir() if "gloo" in (name := (t / "comm").read_text().strip())]
    assert not left, f"gloo's threads outlive destroy_process_group (a reference to the group is left): {left}"

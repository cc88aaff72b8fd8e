"""Registering gradstat's hook under launchers: ``register_hook`` on the DDP model trains with the hook; a hook that
is never registered (as Accelerate's ``DistributedDataParallelKwargs(comm_hook=...)`` leaves it) is reported at the
first optimizer step by ``expect_hook``, under plain DDP (2 gloo ranks) and under Accelerate (when installed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradstat.compressors.ddp import HookNeverRan, expect_hook, make_hook, register_hook
from tests.distributed._ranks import run_ranks

ROOT = Path(__file__).resolve().parents[2]


def _model_and_optimizer() -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
    torch.manual_seed(0)
    ddp = DistributedDataParallel(nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)))
    return ddp, torch.optim.SGD(ddp.parameters(), lr=0.1)


def _step(ddp: DistributedDataParallel, optimizer: torch.optim.Optimizer, rank: int) -> None:
    data = torch.Generator().manual_seed(rank)
    optimizer.zero_grad()
    nn.functional.mse_loss(ddp(torch.randn(16, 8, generator=data)), torch.randn(16, 2, generator=data)).backward()
    optimizer.step()


def _unregistered(rank: int, world: int) -> str:
    """A hook built but never registered on the DDP model: the first step raises."""
    ddp, optimizer = _model_and_optimizer()
    state, _ = make_hook("topk:ratio=0.5", "ef", model=ddp.module)
    expect_hook(state, optimizer)
    try:
        _step(ddp, optimizer, rank)
    except HookNeverRan as exc:
        return str(exc)
    return "no error"


def _registered(rank: int, world: int) -> list[int]:
    """register_hook on the DDP model: two steps through the hook, each step checked."""
    ddp, optimizer = _model_and_optimizer()
    state = register_hook(ddp, "topk:ratio=0.5", "ef", optimizer=optimizer)
    bits = []
    for _ in range(2):
        _step(ddp, optimizer, rank)
        bits.append(state.take_metrics().bits)
    return bits


def _both(rank: int, world: int) -> tuple[str, list[int]]:
    return _unregistered(rank, world), _registered(rank, world)


@pytest.fixture(scope="module")
def plain_ddp() -> list[tuple[str, list[int]]]:
    """Both scenarios on the same 2 ranks (one start of the ranks)."""
    return run_ranks(_both, world=2)


def test_a_hook_that_never_ran_is_reported_at_the_first_step_under_plain_ddp(plain_ddp):
    for message, _ in plain_ddp:
        assert message.startswith("gradstat's communication hook did not run during the backward pass")
        assert "DistributedDataParallelKwargs(comm_hook=...) drops a callable hook" in message
        assert "register_hook" in message


def test_register_hook_on_the_ddp_model_compresses_every_step(plain_ddp):
    for _, bits in plain_ddp:
        assert len(bits) == 2 and all(b > 0 for b in bits)


def test_register_hook_refuses_a_model_that_ddp_does_not_wrap():
    with pytest.raises(TypeError, match=r"needs the DistributedDataParallel model that trains, got Linear"):
        register_hook(nn.Linear(4, 2), "topk")


def loopback_master() -> list[str]:
    """torchrun's options for a rendezvous on a free loopback port (its default port, 29500, is shared by every
    launch on the machine: two tests' launches at once would meet each other)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return ["--master-addr", "127.0.0.1", "--master-port", str(port)]


def test_accelerates_hook_option_drops_the_hook_and_expect_hook_says_so(tmp_path):
    pytest.importorskip("accelerate")
    # a CPU run (Accelerator(cpu=True)); with a GPU visible Accelerate's barrier still names each rank's CUDA device
    # ("invalid device ordinal" for rank 1 on a one-GPU machine), so the GPUs are hidden
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    script = ROOT / "tests" / "distributed" / "_accelerate_kwargs.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *loopback_master()]
    cmd += [str(script), str(tmp_path)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    # the ranks' own messages come first in torchrun's stderr, its summary of the failure last: show both
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[:4000] + "\n...\n" + run.stderr[-1500:]
    said = [(tmp_path / f"rank-{r}.txt").read_text() for r in range(2)]
    assert all(s.startswith("HookNeverRan: gradstat's communication hook did not run") for s in said), said

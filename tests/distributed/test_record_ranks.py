"""Recording a DDP run from a user's script: ``record_ranks`` writes each rank's local gradient (before the hook
averages it), with or without gradstat's hook, and the single-process ``Recorder`` is refused inside DDP with a
message naming the DDP recorder (2 gloo ranks)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradstat.analysis.dumps import open_dump
from gradstat.analysis.training.recorder import Recorder, record_ranks
from gradstat.compressors.ddp import make_hook
from tests.distributed._ranks import run_ranks

STEPS, EVERY = 4, 2


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 8, generator=data), torch.randn(16, 2, generator=data)


def _train_and_record(rank: int, world: int, out: str, hook: str | None) -> dict:
    """Train STEPS steps recording every EVERY-th; return each recorded step's local gradient (computed on a
    plain copy of the model) and the gradient DDP left in ``.grad`` (the average)."""
    torch.manual_seed(0)
    ddp = DistributedDataParallel(nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    refused = _single_process_recorder(out, ddp)
    state = None
    if hook is not None:
        state, fn = make_hook(hook, "ef", model=ddp.module, seed=0)
        ddp.register_comm_hook(state, fn)
    record_ranks(out, ddp, optimizer, workload="mlp", every=EVERY, hook_state=state, residual=state is not None)
    local, averaged = {}, {}
    for step in range(STEPS):
        x, y = _batch(step, rank)
        plain = copy.deepcopy(ddp.module)
        nn.functional.mse_loss(plain(x), y).backward()
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        if step % EVERY == 0:
            local[step] = {n: p.grad.clone() for n, p in plain.named_parameters()}
            averaged[step] = {n: p.grad.clone() for n, p in ddp.module.named_parameters()}
        optimizer.step()
    return {"local": local, "averaged": averaged, "refused": refused}


def _check(out: Path, results: list[dict]) -> None:
    dump = open_dump(out)
    assert dump.workers == 2 and dump.steps == list(range(0, STEPS, EVERY))
    assert dump.manifest["metadata"]["device"] == "cpu"  # where the ranks computed: where a replay is bit-exact
    for rank, result in enumerate(results):
        for step in dump.steps:
            recorded = dump.read(step, worker=rank)
            for name, g in result["local"][step].items():
                assert torch.allclose(recorded[name], g, rtol=1e-6, atol=1e-7), (rank, step, name)
                assert not torch.allclose(recorded[name], result["averaged"][step][name]), (rank, step, name)


def test_record_ranks_writes_the_local_gradient_and_residual_under_gradstats_hook(tmp_path):
    out = tmp_path / "dump"
    _check(out, run_ranks(_train_and_record, world=2, out=str(out), hook="topk:ratio=0.5"))
    assert open_dump(out).extras == ["residual"]


def _single_process_recorder(out: str, ddp: DistributedDataParallel) -> list[str]:
    """The errors of the single-process Recorder created on a rank, for the module and for the DDP model."""
    errors = []
    for model in (ddp.module, ddp):
        try:
            Recorder.create(out, model, workload="m")
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def test_the_single_process_recorder_is_refused_inside_ddp_and_record_ranks_records_plain_ddp(tmp_path):
    out = tmp_path / "dump"
    results = run_ranks(_train_and_record, world=2, out=str(out), hook=None)
    _check(out, results)  # and then record_ranks recorded each rank's local gradient under plain DDP
    for result in results:
        assert len(result["refused"]) == 2
        assert all("distributed run of 2 ranks" in e and "record_ranks" in e for e in result["refused"])


def test_attaching_the_single_process_recorder_to_a_ddp_model_is_refused():
    """Outside a process group too: a DDP-wrapped model alone is enough to refuse."""

    class Wrapped(DistributedDataParallel):
        def __init__(self, module: nn.Module) -> None:  # no process group needed to tell what it is
            nn.Module.__init__(self)
            self.module = module

    rec = Recorder.__new__(Recorder)  # attach is refused before it reads the recorder's own fields
    with pytest.raises(ValueError, match=r"inside a DistributedDataParallel model .*record_ranks"):
        rec.attach(Wrapped(nn.Linear(4, 2)), torch.optim.SGD(nn.Linear(4, 2).parameters(), lr=0.1))

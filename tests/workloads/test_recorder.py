"""The recorder: every K steps, after backward and before the optimizer step, nothing copied otherwise."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradstat.analysis.dumps import DumpWriter, open_dump
from gradstat.analysis.training.recorder import Recorder, record


def _loop(recorder_every, steps, tmp_path, monkeypatch=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 3), nn.Tanh(), nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder.create(tmp_path / "d", model, "toy", every=recorder_every)
    handle = rec.attach(model, opt)
    seen = {}
    for t in range(steps):
        model.zero_grad()
        model(torch.randn(4, 5)).pow(2).mean().backward()
        seen[t] = model[0].weight.grad.clone()  # the gradient the optimizer is about to apply
        opt.step()
    handle.remove()
    return rec, seen


def test_attach_records_every_k_steps_before_the_update(tmp_path):
    _, seen = _loop(3, 8, tmp_path)
    d = open_dump(tmp_path / "d")
    assert d.steps == [0, 3, 6] and d.params == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for s in d.steps:
        assert torch.equal(d.read(s, params="0.weight")["0.weight"], seen[s])


def test_no_copy_and_no_write_on_steps_not_recorded(tmp_path, monkeypatch):
    """The writer's conversion (the only place gradients are copied) runs on recorded steps only."""
    steps, copies = [], []
    real_write, real_collect = DumpWriter.write_step, DumpWriter._collect

    def write_step(self, step, *args, **kwargs):
        steps.append(step)
        return real_write(self, step, *args, **kwargs)

    def collect(self, *args, **kwargs):
        copies.append(steps[-1])
        return real_collect(self, *args, **kwargs)

    monkeypatch.setattr(DumpWriter, "write_step", write_step)
    monkeypatch.setattr(DumpWriter, "_collect", collect)
    _loop(4, 9, tmp_path)
    assert steps == [0, 4, 8] and copies == [0, 4, 8]


def test_detached_recorder_stops(tmp_path):
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder.create(tmp_path / "d", model, "toy")
    handle = rec.attach(model, opt)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    handle.remove()
    opt.step()
    assert open_dump(tmp_path / "d").steps == [0]


def test_record_function_stores_everything_needed_to_reproduce(tmp_path):
    path = record(
        "linreg:variant=ecq,d=16",
        steps=5,
        every=2,
        workers=2,
        out=tmp_path / "d",
        seed=7,
        progress=False,
        metadata={"purpose": "test"},
    )
    d = open_dump(path)
    m = d.manifest
    assert d.steps == [0, 2, 4] and d.workers == 2 and d.numel == 16
    assert m["seeds"]["seed"] == 7 and m["metadata"]["purpose"] == "test"
    assert m["metadata"]["workload_spec"] == "linreg:variant=ecq,d=16" and m["every"] == 2
    again = record("linreg:variant=ecq,d=16", steps=5, every=2, workers=2, out=tmp_path / "e", seed=7, progress=False)
    assert torch.equal(open_dump(again).flat(4, 1), d.flat(4, 1))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"steps": 0}, "steps must be a positive integer"),
        ({"steps": 2, "every": 0}, "every must be a positive integer"),
        ({"steps": 2, "workers": 0}, "workers must be a positive integer"),
        ({"steps": 2, "workers": 64}, "cannot be split over 64 workers"),
        ({"steps": 2, "compressor": "nope"}, "unknown compressor 'nope'"),
        ({"steps": 2, "compressor": "topk", "feedback": "bogus"}, "unknown feedback 'bogus'"),
        ({"steps": 2, "dtype": "int8"}, "not a storage dtype"),
    ],
)
def test_record_rejects_bad_arguments_before_touching_disk(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        record("linreg", out=tmp_path / "d", progress=False, **kwargs)
    assert not (tmp_path / "d").exists()


@pytest.mark.cuda
def test_record_on_cuda_matches_cpu(tmp_path):
    """The same code trains on the GPU; float32 results agree with the CPU run to rounding."""
    cpu = open_dump(record("fc300:batch_size=8", steps=3, workers=2, out=tmp_path / "c", progress=False))
    gpu = open_dump(
        record(
            "fc300:batch_size=8",
            steps=3,
            workers=2,
            out=tmp_path / "g",
            progress=False,
            device="cuda",
            compressor="topk:ratio=0.01",
            feedback="ef",
        )
    )
    assert gpu.extras == ["residual", "compensated"]
    assert torch.allclose(gpu.flat(0, 1), cpu.flat(0, 1), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("metadata", [None, {"note": "mine"}, {"device": "cuda"}])
def test_a_recorder_writes_the_device_its_model_computes_on(tmp_path, metadata):
    """Where a replay reproduces the run (gradstat compress replays there by default): the parameters' device type,
    unless the caller's metadata says; the caller's other metadata kept."""
    model = nn.Linear(3, 2)
    manifest = {} if metadata is None else {"metadata": metadata}
    rec = Recorder.create(tmp_path / "d", model, "toy", **manifest)
    rec.record(0, [{n: torch.ones_like(p) for n, p in model.named_parameters()}])
    written = open_dump(tmp_path / "d").manifest["metadata"]
    assert written == {**(metadata or {}), "device": (metadata or {}).get("device", "cpu")}

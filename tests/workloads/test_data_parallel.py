"""Simulated data parallelism: per-worker shard gradients, update with their average, compression in the loop."""

from __future__ import annotations

import pytest
import torch

from gradstat.analysis.training.parallel import DataParallel
from gradstat.analysis.training.workloads import get_workload
from gradstat.compressors import create, parse_feedback


def _setup(workers, lr=0.1, compressor=None, feedback=None):
    w = get_workload(f"fc300:batch_size=8,lr={lr},momentum=0")
    model = w.model(seed=0)
    dp = DataParallel(
        model,
        w.optimizer(model),
        w.loss,
        workers,
        create(compressor) if compressor else None,
        parse_feedback(feedback) if feedback else None,
    )
    return w, model, dp


def test_worker_gradients_are_shard_gradients_and_average_to_the_batch_gradient():
    w, model, dp = _setup(workers=4)
    x, y = next(w.batches(seed=0))
    grads, _ = dp.worker_gradients(x, y)
    model.zero_grad()
    w.loss(model(x[2:4]), y[2:4]).backward()  # worker 2's shard alone
    assert torch.allclose(grads[1]["fc1.weight"], model.fc1.weight.grad, atol=1e-7)
    model.zero_grad()
    w.loss(model(x), y).backward()  # the whole batch (equal shards: mean of means)
    mean = torch.stack([g["fc1.weight"] for g in grads]).mean(0)
    assert torch.allclose(mean, model.fc1.weight.grad, atol=1e-6)
    assert not torch.allclose(grads[0]["fc1.weight"], grads[1]["fc1.weight"])


def test_step_applies_the_average():
    w, model, dp = _setup(workers=2, lr=0.1)
    x, y = next(w.batches(seed=0))
    before = model.fc3.bias.detach().clone()
    result = dp.step(0, x, y)
    mean = (result.grads[0]["fc3.bias"] + result.grads[1]["fc3.bias"]) / 2
    assert torch.allclose(model.fc3.bias.detach(), before - 0.1 * mean, atol=1e-7)


def test_compressor_in_the_loop_with_error_feedback():
    """Top-k with plain error feedback: compensated = g + h, h_{t+1} = z_t - C(z_t), update = mean of C(z)."""
    w, model, dp = _setup(workers=2, lr=0.1, compressor="topk:ratio=0.01", feedback="ef")
    assert dp.extras == ["residual", "compensated"]
    flat = lambda named: torch.cat([t.reshape(-1) for t in named.values()])  # noqa: E731
    topk = create("topk:ratio=0.01")
    batches = w.batches(seed=0)
    prev_z = None
    for t in range(3):
        params_before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        r = dp.step(t, *next(batches))
        zs = []
        for k in range(2):
            g, h, z = flat(r.grads[k]), flat(r.extras["residual"][k]), flat(r.extras["compensated"][k])
            assert torch.allclose(z, g + h, atol=1e-6)
            if t == 0:
                assert torch.count_nonzero(h) == 0
            else:
                assert torch.allclose(h, prev_z[k] - topk(prev_z[k]), atol=1e-6)
            zs.append(z)
        params_after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        applied = (topk(zs[0]) + topk(zs[1])) / 2
        assert torch.allclose(params_after, params_before - 0.1 * applied, atol=1e-6)
        prev_z = zs


def test_compressor_without_feedback_has_no_extras():
    _, _, dp = _setup(workers=2, compressor="topk:ratio=0.01")
    assert dp.extras == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"workers": 0}, "workers must be a positive integer"),
        ({"workers": 1, "feedback": parse_feedback("ef")}, "needs a compressor"),
    ],
)
def test_bad_arguments(kwargs, message):
    w = get_workload("logreg")
    model = w.model()
    with pytest.raises(ValueError, match=message):
        DataParallel(model, w.optimizer(model), w.loss, **kwargs)


def test_batch_smaller_than_workers():
    w, _, dp = _setup(workers=4)
    x, y = next(w.batches(seed=0))
    with pytest.raises(ValueError, match="cannot be split over 4 workers"):
        dp.step(0, x[:3], y[:3])


def test_a_parameter_without_gradient_is_named():
    """A parameter the loss does not use gets no gradient: a clear error naming it, not a None in the gradients."""

    class Partly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = torch.nn.Linear(3, 2)
            self.unused = torch.nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    model = Partly()
    dp = DataParallel(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.functional.cross_entropy, 2)
    x, y = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match=r"no gradient for \['unused.weight', 'unused.bias'\]"):
        dp.worker_gradients(x, y)
    with pytest.raises(ValueError, match="unused.weight"):
        dp.step(0, x, y)

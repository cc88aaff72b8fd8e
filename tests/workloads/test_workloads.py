"""Built-in workloads: the papers' architectures with their exact parameter counts, real training (the loss goes
down), reproducibility from the seed, and spec strings."""

from __future__ import annotations

import pytest
import torch

from gradstat.analysis.training.parallel import DataParallel
from gradstat.analysis.training.workloads import data, get_workload, workload_names


@pytest.mark.parametrize(
    "spec, count",
    [
        ("fc300", 266_610),  # NDQSG Table 1
        ("lenet", 1_663_370),  # NDQSG Table 1
        ("resnet20", 269_722),  # SIDCo App. B (d = 269,722)
        ("logreg", 7_850),  # 784 x 10 + 10
        ("linreg", 3_200),  # QCS: W is 50 x 64
        ("linreg:variant=ecq,d=512", 512),
        ("lstm", 222_285),
    ],
)
def test_parameter_counts(spec, count):
    w = get_workload(spec)
    assert w.num_params == count
    assert sum(p.numel() for p in w.model().parameters()) == count


def test_lenet_layers_as_in_the_paper():
    shapes = [tuple(p.shape) for p in get_workload("lenet").model().parameters()]
    assert shapes == [(32, 1, 5, 5), (32,), (64, 32, 5, 5), (64,), (512, 3136), (512,), (10, 512), (10,)]


def test_every_workload_is_registered():
    assert workload_names() == ["fc300", "lenet", "resnet20", "lstm", "logreg", "linreg"]


# Small settings that keep each run to a second or so of CPU; the loss is measured on a fixed held-out sample
# of 128 training examples before and after, and must fall by the stated factor (observed falls are 2x larger).
TRAIN = [
    ("fc300:batch_size=16", 10, 0.85),
    ("lenet:batch_size=16", 12, 0.85),
    ("resnet20:batch_size=16", 30, 0.85),
    ("lstm:batch_size=16,seq_len=16", 20, 0.9),
    ("logreg", 10, 0.8),
    ("linreg", 10, 0.5),
    ("linreg:variant=ecq,lr=0.02", 20, 0.8),
]


@pytest.mark.parametrize("spec, steps, factor", TRAIN)
def test_loss_goes_down(spec, steps, factor):
    w = get_workload(spec)
    model = w.model(seed=0)
    dp = DataParallel(model, w.optimizer(model), w.loss, workers=2)
    x, y = w.dataset()
    idx = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(5))[:128]

    def held_out_loss() -> float:
        with torch.no_grad():  # train mode: BatchNorm uses batch statistics, as during training
            return float(w.loss(model(x[idx]), y[idx]))

    before = held_out_loss()
    batches = w.batches(seed=1)
    for t in range(steps):
        dp.step(t, *next(batches))
    after = held_out_loss()
    assert after < factor * before, f"{spec}: loss {before:.4f} -> {after:.4f}"


def test_same_seed_same_gradients_and_global_rng_untouched():
    w = get_workload("fc300:batch_size=8")
    state = torch.random.get_rng_state()
    grads = []
    for _ in range(2):
        model = w.model(seed=3)
        dp = DataParallel(model, w.optimizer(model), w.loss, workers=2)
        grads.append(dp.worker_gradients(*next(w.batches(seed=4)))[0][1]["fc1.weight"].clone())
    assert torch.equal(grads[0], grads[1])
    assert torch.equal(torch.random.get_rng_state(), state)
    other = get_workload("fc300:batch_size=8").model(seed=4)
    assert not torch.equal(other.fc1.weight, w.model(seed=3).fc1.weight)


def test_batches_are_epochs_of_a_permutation():
    w = get_workload("logreg:batch_size=599")  # 1797 = 3 x 599
    seen = torch.cat([y for _, (_, y) in zip(range(3), w.batches(seed=0), strict=False)])
    assert torch.equal(torch.sort(seen).values, torch.sort(w.dataset()[1]).values)


def test_digits_data():
    x, y = data.digits(28)
    assert x.shape == (1797, 1, 28, 28) and y.shape == (1797,) and set(y.tolist()) == set(range(10))
    assert abs(float(x.mean())) < 1e-5 and float(x.std()) == pytest.approx(1.0, abs=1e-5)
    x3, _ = data.digits(32, channels=3)
    assert x3.shape == (1797, 3, 32, 32) and torch.equal(x3[:, 0], x3[:, 2])


def test_corpus_is_the_zen_of_python():
    text = data.zen_of_python()
    assert text.startswith("The Zen of Python, by Tim Peters") and "Namespaces are one honking great idea" in text
    inputs, targets, vocab = data.char_windows(text, 16)
    assert inputs.shape == (len(text) - 16, 16) and torch.equal(inputs[1:, :], targets[:-1, :])
    assert "corpus_sha256" in get_workload("lstm").metadata()


def test_linreg_qcs_correlation_has_the_chosen_eigenvalues():
    w = get_workload("linreg")
    eig = torch.linalg.eigvalsh(w.correlation())
    assert float(eig.min()) == pytest.approx(1.0) and float(eig.max()) == pytest.approx(4.0)
    x, y = w.dataset()
    assert x.shape == (10_000, 64) and y.shape == (10_000, 50)
    # the sample correlation approaches R (10k samples: entries within ~4/sqrt(10k) * 4)
    assert torch.allclose((x.T.double() @ x.double()) / x.shape[0], w.correlation(), atol=0.2)


def test_linreg_ecq_targets_follow_the_true_weights():
    w = get_workload("linreg:variant=ecq,d=256,noise=0.1")
    x, y = w.dataset()
    residual = y.double() - x.double() @ w.true_weights().T
    assert x.shape == (10_000, 256) and float(residual.std()) == pytest.approx(0.1, rel=0.05)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("vgg", "unknown workload 'vgg'; known: fc300, lenet"),
        ("lenet:depth=3", "bad setting 'depth=3'; accepted keys"),
        ("lenet:lr=fast", "lenet:lr: expected float, got 'fast'"),
        ("linreg:variant=big", "linreg:variant: 'big' is not one of qcs, ecq"),
        ("lenet:batch_size=0", "batch_size must be >= 1"),
        ("linreg:lambda_min=5", "need 0 < lambda_min <= lambda_max"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        get_workload(spec)


def test_spec_round_trip():
    w = get_workload("linreg:variant=ecq,lr=0.02")
    assert get_workload(w.spec()) == w

"""Every tensor an estimator makes lives on its input's device, checked without a GPU.

On CUDA a tensor made without ``device=`` (``torch.tensor(flag)``) lands on the CPU and the first operation that
mixes it with the data fails ("Expected all tensors to be on the same device"). On a CPU-only machine the same
mistake is invisible, since the default device is the input's. These tests make it visible: the estimators run on
CPU input while the default device is ``meta``, so a tensor made without a device is a meta tensor, and either
the computation that mixes it with the data fails or :func:`resolve`'s device check names it.
"""

from __future__ import annotations

import pytest
import torch

from gradstat.theory.estimators import fit
from gradstat.theory.estimators.estimate import Estimate
from gradstat.theory.estimators.fit import resolve
from gradstat.theory.estimators.registry import ESTIMATORS
from gradstat.theory.pot import multistage_threshold

PAIRS = sorted(ESTIMATORS)


def magnitudes(n: int, seed: int) -> torch.Tensor:
    """Heavy-tailed positive values (an exponential to the power 1.5), seeded."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return (-torch.log(torch.rand(n, generator=gen, dtype=torch.float64))) ** 1.5


@pytest.mark.parametrize(("dist", "method"), PAIRS, ids=[f"{d}-{m}" for d, m in PAIRS])
def test_every_estimator_makes_no_tensor_off_the_input_device(dist, method):
    x = magnitudes(5000, 0)
    with torch.device("meta"):  # a tensor made without a device lands here, not beside x
        result = fit(x, dist, method)
    assert {v.device for v in result.params.values()} == {x.device}


@pytest.mark.parametrize("later", ["exponential", "genpareto"])
@pytest.mark.parametrize("method", ["closed_form", "mle"])
def test_peak_over_threshold_makes_no_tensor_off_the_input_device(later, method):
    x = magnitudes(20_000, 1)
    with torch.device("meta"):
        result = multistage_threshold(x, 0.01, 3, later=later, method=method)
    assert result.threshold.device == x.device
    assert all(v.device == x.device for stage in result.stages for v in stage.fit.params.values())


def test_a_tensor_planted_off_the_device_is_named():
    estimate = Estimate(
        params={"scale": torch.ones((), dtype=torch.float64)},
        converged=torch.ones((), dtype=torch.bool),
        flags=[(torch.zeros((), dtype=torch.bool, device="meta"), "planted flag")],
    )
    with pytest.raises(RuntimeError, match=r"\('genpareto', 'mle'\).*flag 'planted flag' on meta"):
        resolve(estimate, "genpareto", "mle", 10, 0)


def test_an_estimator_making_a_flag_without_a_device_fails_under_the_meta_default(monkeypatch):
    """The planted bug of the CUDA crash (a ``torch.tensor(bool)`` flag beside on-device parameters) is caught."""
    honest = ESTIMATORS[("genpareto", "mle")]

    def planted(data):
        estimate = honest(data)
        estimate.flags.append((torch.tensor(False), "made without a device"))
        return estimate

    monkeypatch.setitem(ESTIMATORS, ("genpareto", "mle"), planted)
    x = magnitudes(5000, 2)
    fit(x, "genpareto", "mle")  # invisible with the CPU default
    with pytest.raises(RuntimeError, match="made without a device' on meta"), torch.device("meta"):
        fit(x, "genpareto", "mle")


def test_parameters_off_the_input_device_are_named():
    estimate = Estimate(params={"scale": torch.ones((), dtype=torch.float64, device="meta")})
    with pytest.raises(RuntimeError, match="parameter 'scale' on meta"):
        resolve(estimate, "exponential", "mle", 10, 0, device=torch.device("cpu"))

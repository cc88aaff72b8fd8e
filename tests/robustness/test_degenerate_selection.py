"""A target-count threshold that would keep nothing (magnitudes uniform on [1, 3]: no exponential tail) or every
element (two close values) sends the exact top-k instead and says so; ``exact_fallback=false`` keeps the
threshold's own selection, which is what the cases looked like before (so the cases can fail)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gradstat import compressors
from gradstat.compressors import Context
from gradstat.compressors.schemes.sparsifiers.degenerate import degenerate, exact_top

D, RATIO = 10_000, 0.01
K = math.ceil(RATIO * D)


def _uniform_1_3() -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    signs = torch.where(torch.rand(D, generator=gen) < 0.5, -1.0, 1.0)
    return signs * (1.0 + 2.0 * torch.rand(D, generator=gen))


def _two_close_values() -> torch.Tensor:
    gen = torch.Generator().manual_seed(6)
    return torch.where(torch.rand(D, generator=gen) < 0.5, 1.0, 1.0001)


def _two_values_one_ulp_apart() -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    return torch.where(
        torch.rand(D, generator=gen) < 0.5, 1.0, float(torch.nextafter(torch.ones(()), 2 * torch.ones(())))
    )


def _rare_larger_value() -> torch.Tensor:
    """1 everywhere but 2 on about 50 elements, fewer than the target k = 100."""
    gen = torch.Generator().manual_seed(8)
    return torch.where(torch.rand(D, generator=gen) < 0.005, 2.0, 1.0)


CASES = {
    # (spec, data): what each selected with the threshold alone, at the code before the fallback
    "sidco on U[1,3]": ("sidco", _uniform_1_3, 0),
    "sidco gamma adaptive on U[1,3]": ("sidco:dist=gamma,stages=adaptive", _uniform_1_3, 0),
    "sidco exp mle on U[1,3]": ("sidco:dist=exp,method=mle", _uniform_1_3, 0),
    "sidco gamma on two values": ("sidco:dist=gamma", _two_close_values, D),
    "sidco gp on two values": ("sidco:dist=gp", _two_close_values, D),
    "sidco gamma 2 stages on two values": ("sidco:dist=gamma,stages=2", _two_close_values, D),
    "tailcount on two values": ("tailcount", _two_close_values, D),
    "redsync on two values 1 ulp apart": ("redsync", _two_values_one_ulp_apart, D),
    "sidco 2 stages, fewer larger values than k": ("sidco:stages=2", _rare_larger_value, 0),
}


def reference_top(g: torch.Tensor, k: int) -> np.ndarray:
    """The k largest |g| by a stable sort, ties in index order (numpy, independent of the code under test)."""
    a = np.abs(g.numpy())
    order = np.lexsort((np.arange(a.size), -a))
    return np.sort(order[:k])


def _with(spec: str, fallback: bool) -> compressors.Compressor:
    return compressors.create(spec + ("," if ":" in spec else ":") + f"exact_fallback={str(fallback).lower()}")


@pytest.mark.parametrize("case", list(CASES))
def test_a_degenerate_threshold_falls_back_to_the_exact_top_k(case):
    spec, data, _ = CASES[case]
    g = data()
    c = _with(spec, True)
    p = c.encode(g, Context(seed=1))
    sent = torch.nonzero(c.decode(p)).reshape(-1).numpy()
    assert p.info["k_hat"] == K and np.array_equal(sent, reference_top(g, K))
    assert str(p.info["fallback"]).startswith("exact top-k: the threshold selected")


@pytest.mark.parametrize("case", list(CASES))
def test_without_the_fallback_the_threshold_alone_is_degenerate(case):
    spec, data, selected = CASES[case]
    p = _with(spec, False).encode(data(), Context(seed=1))
    assert p.info["k_hat"] == selected and "fallback" not in p.info


@pytest.mark.parametrize("spec", ["sidco", "sidco:dist=gamma", "sidco:dist=gp", "redsync", "tailcount"])
def test_continuous_data_never_takes_the_fallback(spec):
    g = torch.randn(D, generator=torch.Generator().manual_seed(9))
    p = compressors.create(spec).encode(g, Context(seed=1))
    assert "fallback" not in p.info and p.info["k_hat"] >= 1


def test_the_fallback_is_declared_in_the_spec():
    for name in ("sidco", "redsync", "tailcount"):
        assert compressors.create(name).exact_fallback is True
        assert compressors.create(f"{name}:exact_fallback=false").exact_fallback is False


def test_degenerate_names_none_and_all_and_nothing_else():
    g = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    assert "none of 8" in str(degenerate(g, 0, 2))
    assert "every nonzero element, 7 of 8" in str(degenerate(g, 7, 2))
    assert degenerate(g, 7, 4) is None  # within a factor of two of k: an estimate
    assert degenerate(g, 5, 2) is None


def test_exact_top_takes_ties_in_index_order_and_never_a_zero():
    g = torch.tensor([1.0, -3.0, 2.0, 3.0, -2.0, 2.0, 0.0])
    assert exact_top(g, 3).tolist() == [1, 2, 3]
    assert exact_top(g, 4).tolist() == [1, 2, 3, 4]
    assert exact_top(torch.tensor([0.0, 5.0, 0.0]), 2).tolist() == [1]

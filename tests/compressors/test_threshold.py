"""The shared threshold step: selection, wire format and bits, the threshold search, the fixed threshold."""

from __future__ import annotations

import pytest
import torch
from _sparse_checks import laplace, sparse_bits

from gradstat.compressors import create
from gradstat.compressors.context import Context
from gradstat.compressors.schemes.sparsifiers.threshold import count_at_least, search_threshold, select_at_least


def test_selection_keeps_magnitudes_at_or_above_the_threshold_and_never_zeros():
    abs_g = torch.tensor([0.0, 0.5, 1.0, 2.0, 0.0, 1.0])
    assert select_at_least(abs_g, 1.0).tolist() == [2, 3, 5]
    assert select_at_least(abs_g, 0.0).tolist() == [1, 2, 3, 5]
    assert count_at_least(abs_g, 1.0) == 3


def test_fixed_threshold_sends_exactly_the_large_entries_with_hand_counted_bits(device):
    g = torch.tensor([0.1, -2.0, 0.0, 3.0, -0.5, 1.0, 0.2, -1.0], device=device)  # d = 8: 3-bit indices
    c = create("threshold:eta=1.0")
    payload = c.encode(g, Context())
    assert payload.bits == 4 * (32 + 3) == sparse_bits(4, 8)
    assert c.decode(payload, Context()).tolist() == [0.0, -2.0, 0.0, 3.0, 0.0, 1.0, 0.0, -1.0]
    assert create("threshold:eta=1.0,packed=false").encode(g).bits == 4 * (32 + 32)


@pytest.mark.parametrize("eta", [0.0, -1.0, float("nan"), float("inf")])
def test_fixed_threshold_rejects_a_non_positive_or_non_finite_eta(eta):
    with pytest.raises(ValueError, match="eta"):
        create("threshold", eta=eta)


def test_search_raises_the_threshold_when_too_many_pass_and_lowers_it_when_too_few():
    abs_g = torch.arange(1, 1001, dtype=torch.float32)  # count(>= eta) = 1001 - eta
    k = 100
    too_many, _ = search_threshold(
        abs_g, k, torch.tensor(500.0), (1.0, 2.0), max_iter=2, low=torch.tensor(0.0), high=torch.tensor(1000.0)
    )
    assert float(too_many) > 500.0
    # 75 pass (between k/2 and k): the SIDCo authors' RedSync search raised the threshold here; it must fall
    too_few, _ = search_threshold(
        abs_g, k, torch.tensor(926.0), (1.0, 2.0), max_iter=2, low=torch.tensor(500.0), high=torch.tensor(1000.0)
    )
    assert float(too_few) < 926.0


def test_search_reaches_the_band_and_stops_counting():
    abs_g = laplace(100_000, 1).abs()
    k = 1000
    eta, steps = search_threshold(abs_g, k, abs_g.mean(), (1.0, 2.0), max_iter=40, low=abs_g.mean(), high=abs_g.max())
    assert k <= count_at_least(abs_g, eta) <= 2 * k
    assert steps < 40


@pytest.mark.parametrize("vector", ["zeros", "constant"])
def test_search_terminates_on_degenerate_input(vector):
    abs_g = torch.zeros(1000) if vector == "zeros" else torch.full((1000,), 0.5)
    eta, steps = search_threshold(abs_g, 10, abs_g.mean() * 2, (1.0, 2.0), max_iter=25)
    assert steps <= 25 and bool(torch.isfinite(eta))

"""The exact selection's Triton form (theory/kernels/triton_select.py, select_exact) beyond the battery of
test_equivalence.py (which holds its indices and gathered values to the reference on every device present): the
largest magnitude it reads on the way (scan_at_least's finiteness check), which form the selections take, and the
fallback after a failure."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from gradstat.theory.kernels import policy, primitives, triton_runtime, triton_select

needs_triton = pytest.mark.skipif(not triton_runtime.available(), reason="no Triton 3.0 or newer here")


def _vector(n: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(n)
    return torch.randn(n, generator=gen, dtype=torch.float64).to(dtype).to(device)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("special", "want_top"), [(None, None), (math.nan, math.inf), (-math.inf, math.inf), (0.0, 0.0)]
)
def test_the_largest_magnitude_rides_on_the_count(special, want_top, dtype, device):
    """+inf where the vector holds a NaN or an infinity (anywhere, here in the last block), else max |x|
    exactly; 0 for an all-zero vector; the selection itself as the reference's."""
    x = _vector(1001, device, dtype)
    if special is not None:
        x[-1 if want_top else slice(None)] = special
    t = primitives.positive_threshold(1.5, x)
    indices, values, top = triton_select.select_exact(x, t, True, True)
    want = primitives.select_at_least_reference(x, 1.5, True)
    assert torch.equal(indices, want) and torch.equal(values, x[want])
    assert top == (float(x.abs().max()) if want_top is None else want_top)


@needs_triton
def test_the_selections_take_triton_on_cuda_only_and_never_under_never(device):
    x = _vector(5000, device)
    assert primitives.triton_exact(x) == (device.type == "cuda")
    with policy.forced("never"):
        assert not primitives.triton_exact(x)
    assert not primitives.triton_exact(x.half())
    indices, top = primitives.scan_at_least(x, 2.0, signed=True)
    want = primitives.select_at_least_reference(x, 2.0, True)
    assert torch.equal(indices, want) and top == float(x.abs().max())
    got, magnitudes = primitives.gather_at_least(x, 2.0, signed=True)
    assert torch.equal(got, want) and torch.equal(magnitudes, x[want].abs())


def test_a_failed_triton_selection_warns_once_and_another_form_runs(monkeypatch):
    def broken(*args: object) -> None:
        raise RuntimeError("no GPU compiler here\nsecond line")

    x = _vector(3000, torch.device("cpu"))
    want = primitives.select_at_least_reference(x, 1.0, True)
    monkeypatch.setattr(primitives, "EXACT_FALLBACK", triton_runtime.Fallback("the Triton exact selection", policy.ENV))
    monkeypatch.setattr(primitives, "triton_exact", lambda flat: not primitives.EXACT_FALLBACK.is_set())
    monkeypatch.setattr(triton_select, "count_exact", broken)  # (the first of its two steps)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [primitives.select_at_least(x, 1.0, signed=True), primitives.scan_at_least(x, 1.0, signed=True)[0]]
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "(RuntimeError: no GPU compiler here)" in messages[0], messages
    assert all(torch.equal(g, want) for g in got)

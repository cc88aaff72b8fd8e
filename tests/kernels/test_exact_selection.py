"""The exact selection's Triton form (theory/kernels/triton_select.py, select_exact) beyond the battery of
test_equivalence.py (which holds its indices and gathered values to the reference on every device present): the
largest magnitude it reads on the way (scan_at_least's finiteness check), which form the selections take, and the
fallback after a failure."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from gradstat.theory.kernels import bounded, policy, primitives, triton_runtime, triton_select

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


def _sparse_blocks(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Four blocks of the Triton selection's size on ``device`` (16 elements interpreted, 1024 on a GPU), whose
    selections at |x| >= 1 number 0, 1, 3 and 2: the blocks with nothing to write return before reading."""
    block = triton_runtime.block_for(torch.empty(64, device=device), triton_select.BLOCK)
    x = torch.full((4 * block,), 0.25)
    x[1::2] = -0.5
    picks = [block + 3, 2 * block + 1, 2 * block + 5, 3 * block - 1, 3 * block, 3 * block + 7]
    x[picks] = torch.tensor([1.0, -2.0, 1.5, -1.0, 3.0, -1.25])
    x = x.to(device)
    assert triton_runtime.block_for(x, triton_select.BLOCK) == block
    return x, torch.tensor(picks, device=device)


@needs_triton
def test_blocks_with_nothing_to_write_leave_the_output_as_the_reference(device):
    x, picks = _sparse_blocks(device)
    t = primitives.positive_threshold(1.0, x)
    indices, values, _ = triton_select.select_exact(x, t, True, False)
    assert torch.equal(indices, picks) and torch.equal(values, x[picks])
    for capacity in range(len(picks) + 2):  # the bounded form: blocks starting past the capacity write nothing
        kept = min(capacity, len(picks))
        extremes, ties = capacity % 2 == 1, capacity % 3 != 1
        bounded, sent, count, tally = triton_select.select(x, t, True, capacity, extremes=extremes, ties=ties)
        top, total, tied = tally.tolist()
        assert math.isnan(top) if not extremes else top == float(x.abs().max())
        assert int(count) == len(picks) == total
        # the written magnitudes' smallest, across blocks (1.0 at the 1st and 4th picks), counted
        written = x[picks[:kept]].abs()
        assert tied == (int((written == written.min()).sum()) if ties and kept else 0), (capacity, tied)
        assert torch.equal(bounded[:kept], picks[:kept]) and bool((bounded[kept:] == -1).all())
        assert torch.equal(sent[:kept], x[picks[:kept]]) and bool((sent[kept:] == 0).all())


@needs_triton
@pytest.mark.parametrize("chunk", [1, 2])
def test_the_tally_joins_blocks_read_by_one_lane_in_several_steps(chunk, monkeypatch):
    """The finishing program keeps a running minimum and its count per lane: with fewer lanes than blocks (as on a
    GPU, 2,048 lanes for 25,391 blocks at 26M elements; interpreted, four blocks and 16 lanes, so forced here), a lane
    meets a smaller low (reset its count), an equal one (add) and a larger one (keep)."""
    x, picks = _sparse_blocks(torch.device("cpu"))
    monkeypatch.setattr(triton_runtime, "finishing_steps", lambda blocks, x, _: (chunk, -(-blocks // chunk)))
    t = torch.tensor(1.0, dtype=torch.float64)
    for capacity in range(len(picks) + 1):
        got = triton_select.select(x, t, True, capacity, extremes=True, ties=True)
        want = bounded.reference(x, t, True, capacity, extremes=True, ties=True)
        assert torch.equal(got[3], want.tally), (capacity, got[3].tolist(), want.tally.tolist())
    # the magnitudes the lanes meet: blocks 0-3 write nothing, 1.0, 1.0 (and 2, 1.5) and 1.25 (and 3): two ties
    assert triton_select.select(x, t, True, len(picks), ties=True)[3][2].item() == 2


@needs_triton
def test_a_device_threshold_is_taken_as_it_is_and_rounded_in_the_kernels(monkeypatch, device):
    """count_triton hands a 0-d floating threshold on x's device to the kernels unconverted (they round it to x's
    dtype and raise it to the smallest positive value, as positive_threshold does): float64 thresholds just above,
    at and just below float32 values, a subnormal, 0, a negative one and NaN select what the reference selects."""
    monkeypatch.setattr(primitives, "triton_exact", lambda x: True)
    x = torch.tensor([0.0, 1e-45, -2e-45, 0.5, -0.75, 1.0, 3.0, -1.0000001, float(torch.finfo(torch.float32).tiny)] * 5)
    x = x.to(device)
    one = torch.tensor(1.0, dtype=torch.float64, device=device)
    for t in (one, torch.nextafter(one, one * 2), torch.nextafter(one, one * 0), one * 1.00000001, one * 1e-46,
              one * 0.0, -one, one * float("nan"), one * 0.6):  # fmt: skip
        counted = primitives.count_triton(x, t, True, True)
        assert counted is not None
        got, values, top = counted.finish()
        want = primitives.select_at_least_reference(x, primitives.positive_threshold(t, x), True)
        assert torch.equal(got, want), (float(t), got.tolist(), want.tolist())
        assert torch.equal(values, x[want]) and top == 3.0

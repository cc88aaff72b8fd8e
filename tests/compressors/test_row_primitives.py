"""The row primitives added for the quantizers' hot paths equal their plain forms bit for bit: ``max_abs_rows`` is
``max_abs(x, dim=1)``, ``l2_norm_rows`` is ``l2_norm(x, dim=1)`` (same power-of-two scaling, same reduction), on
ordinary, zero, denormal, huge and mixed-range rows; ``scratch`` hands back one buffer per slot."""

from __future__ import annotations

import pytest
import torch

from gradstat.theory.kernels import primitives as P

FMAX = torch.finfo(torch.float32).max


def _rows(seed: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(257, 512, generator=gen, dtype=torch.float64)
    mixed = g * torch.logspace(-40, 37, 257, dtype=torch.float64)[:, None]
    zeros = g.clone()
    zeros[::3] = 0.0
    return {
        "normal": g.to(dtype),
        "mixed_range": mixed.to(dtype),
        "zero_rows": zeros.to(dtype),
        "denormal": (g * 1e-42).to(dtype),
        "near_overflow": (g / g.abs().max() * FMAX / 64).to(dtype),  # norms up to ~0.35 FMAX
        "one_column": g[:, :1].to(dtype),
        "one_row": g[:1].to(dtype),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_max_abs_rows_equals_max_abs_over_dim_1(dtype):
    for name, x in _rows(1, dtype).items():
        assert torch.equal(P.max_abs_rows(x), P.max_abs(x, dim=1)), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_l2_norm_rows_equals_l2_norm_over_dim_1_bit_for_bit(dtype):
    for name, x in _rows(2, dtype).items():
        got, ref = P.l2_norm_rows(x), P.l2_norm(x, dim=1)
        assert torch.isfinite(ref).all(), name
        assert torch.equal(got, ref), name


def test_scratch_reuses_one_buffer_per_slot_and_release_frees_it():
    a = P.scratch(1000, torch.float32, torch.device("cpu"), "test-a")
    b = P.scratch(500, torch.float32, torch.device("cpu"), "test-a")
    c = P.scratch(500, torch.float32, torch.device("cpu"), "test-b")
    assert a.numel() == 1000 and b.numel() == 500 and b.data_ptr() == a.data_ptr()
    assert c.data_ptr() != a.data_ptr()
    P.release_scratch()
    d = P.scratch(1000, torch.float32, torch.device("cpu"), "test-a")
    assert d.numel() == 1000


def test_scratch_keeps_no_buffer_off_the_cpu():
    """Off the CPU (here the meta device, standing in for CUDA) every call gets a fresh tensor and nothing is kept:
    the device's caching allocator reuses memory itself, and a kept buffer would pin device memory."""
    P.release_scratch()
    a = P.scratch(1000, torch.float32, torch.device("meta"), "test-a")
    b = P.scratch(1000, torch.float32, torch.device("meta"), "test-a")
    assert a.device.type == "meta" and a.numel() == b.numel() == 1000
    assert not getattr(P._SCRATCH, "buffers", {})  # (a kept buffer would be returned as a view: this is the check)

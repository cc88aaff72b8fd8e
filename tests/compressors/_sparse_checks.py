"""Vectors and small checks shared by the sparsifier tests (seeded, CPU or any device)."""

from __future__ import annotations

import math

import torch


def laplace(d: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """d draws of Laplace(0, 1), float32, from a fixed seed."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(d, generator=gen, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).float().to(device)


def double_gamma(d: int, seed: int, shape: float = 0.5) -> torch.Tensor:
    """d draws of a double gamma(shape, 1) (random sign), float32, from a fixed seed."""
    gen = torch.Generator().manual_seed(seed)
    mags = torch._standard_gamma(torch.full((d,), shape, dtype=torch.float64), generator=gen)
    signs = torch.randint(0, 2, (d,), generator=gen, dtype=torch.float64) * 2 - 1
    return (mags * signs).float()


def sparse_bits(k: int, d: int, packed: bool = True) -> int:
    """Hand count of a values+indices payload: k float32 values and k indices of ceil(log2 d) (or 32) bits."""
    return k * (32 + (max(1, math.ceil(math.log2(d))) if packed else 32))


def kept_fraction(out: torch.Tensor, ratio: float) -> float:
    """k_hat / k with k_hat the nonzeros of a reconstruction and k = ratio * d."""
    return int((out != 0).sum()) / (ratio * out.numel())

"""Sign compressors: signSGD (Bernstein et al. 2018) and EF-signSGD's scaled sign (Karimireddy et al. 2019).

Both send one bit per element, ``b_i = [g_i >= 0]`` (so sign(0) is taken as +1: a bit has two values):
- ``signsgd``: ``C(g) = scale * sign(g)``; ``scale`` is a fixed magnitude both sides know (the step of
  signSGD's update ``-lr * sign(g)`` folded in), so nothing but the d bits is sent. Biased, not a contraction.
- ``efsign``: ``C(g) = (||g||_1 / d) sign(g)`` with the 32-bit scale sent: the compressor of EF-signSGD, a
  contraction ``||C(g) - g||^2 = (1 - ||g||_1^2 / (d ||g||_2^2)) ||g||^2 <= (1 - 1/d) ||g||^2``.
Cited by 000_4b111efa75352b2d.txt Sec. 1-2 as the biased baselines that need error feedback.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from compressors.base import Compressor, Properties
from compressors.context import Context
from compressors.payload import Payload
from compressors.registry import register


def sign_bits(g: torch.Tensor) -> torch.Tensor:
    """One bit per element, ``g >= 0`` (bool tensor, sent at 1 bit each)."""
    return g >= 0


def signs(bits: torch.Tensor) -> torch.Tensor:
    """+1 where the bit is set, -1 elsewhere (float32)."""
    return bits.float() * 2.0 - 1.0


@register("signsgd")
@dataclass
class SignSGD(Compressor):
    """scale: the fixed magnitude of every decoded element (known to both sides, not sent), > 0."""

    scale: float = 1.0

    properties = Properties(kind="quantizer", unbiased=False, randomized=False,
                            source="Bernstein et al. 2018 (signSGD), cited in 000_4b111efa75352b2d.txt Sec. 1")

    def __post_init__(self) -> None:
        if not (self.scale > 0) or self.scale == float("inf"):
            raise ValueError(f"signsgd scale must be a finite number > 0, got {self.scale}")

    def _encode(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:
        payload.add("signs", sign_bits(g), 1, "code")

    def _decode(self, payload: Payload, ctx: Context, side: torch.Tensor | None) -> torch.Tensor:
        return self.scale * signs(payload["signs"])


@register("efsign")
@dataclass
class EFSign(Compressor):
    """EF-signSGD's scaled sign ``(||g||_1 / d) sign(g)``: d sign bits and one float32 scale."""

    properties = Properties(kind="quantizer", unbiased=False, randomized=False, contraction="1 - 1/d",
                            source="Karimireddy et al. 2019 (EF-signSGD), cited in 000_4b111efa75352b2d.txt Remark 3")

    def _encode(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:
        payload.add("signs", sign_bits(g), 1, "code")
        payload.add("scale", (g.abs().sum() / g.numel()).reshape(1), 32, "scale")

    def _decode(self, payload: Payload, ctx: Context, side: torch.Tensor | None) -> torch.Tensor:
        return payload["scale"] * signs(payload["signs"])

"""Sign compressors: signSGD (Bernstein et al. 2018) and the scaled sign of EF-signSGD (Karimireddy et al. 2019).

One bit per element, ``b_i = [g_i >= 0]``, decoded as ``m * sign(g)`` (a bit has two values, so sign(0) = +1):
- ``scale="l1"`` (default): ``m = ||g||_1 / d``, sent as one float32 -- the scaled sign of Karimireddy et al.;
  used with error feedback (:meth:`gradstat.compressors.memory.feedback.ErrorFeedback.plain`) it is EF-signSGD. A
  contraction: ``||C(g) - g||^2 = (1 - ||g||_1^2 / (d ||g||_2^2)) ||g||^2 <= (1 - 1/d) ||g||^2``.
- ``scale="unit"``: ``m = 1`` known to both sides (signSGD's update ``-lr sign(g)``, the step folded into lr);
  only the d bits are sent. Not a contraction, and an all-zero gradient decodes to all ones.
Both are biased. Cited by QCS (Abdi & Fekri) Sec. 1-2 as the biased baselines that need error feedback.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from gradstat.compressors.base import Compressor, Properties
from gradstat.compressors.context import Context
from gradstat.compressors.registry import register
from gradstat.compressors.wire.floats import widened
from gradstat.compressors.wire.payload import Payload
from gradstat.theory.kernels.primitives import (
    all_finite,
    at_least_zero,
    mean_abs_scratch,
    plus_minus,
)


def sign_bits(g: torch.Tensor) -> torch.Tensor:
    """One bit per element, ``g >= 0`` (bool tensor, sent at 1 bit each)."""
    return at_least_zero(g)


def signs(bits: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """+1 where the bit is set, -1 elsewhere (float32), times ``scale`` when given: ``scale * (2 b - 1)``
    (:func:`gradstat.theory.kernels.primitives.plus_minus`, the same values in fewer passes)."""
    return plus_minus(bits, scale)


@register("signsgd")
@dataclass
class SignSGD(Compressor):
    """scale: ``l1`` (magnitude ||g||_1/d sent as float32: EF-signSGD's compressor) or ``unit`` (magnitude 1)."""

    defers_checks = True  # (its encode reads back only its finiteness checks)

    scale: Literal["l1", "unit"] = "l1"

    properties = Properties(
        kind="quantizer",
        unbiased=False,
        randomized=False,
        contraction="1 - 1/d",
        source="Karimireddy et al. 2019 (EF-signSGD scaled sign); Bernstein et al. 2018 "
        "(signSGD); cited in QCS (Abdi & Fekri) Sec. 1 and Remark 3",
    )

    def __post_init__(self) -> None:
        if self.scale not in ("l1", "unit"):
            raise ValueError(f"signsgd scale must be 'l1' or 'unit', got {self.scale!r}")
        if self.scale == "unit":
            self.properties = replace(type(self).properties, contraction=None)

    def contraction_constant(self, g: torch.Tensor) -> float:
        """``1 - 1/d``: the declared contraction constant for a gradient like ``g`` (l1 scale only)."""
        return 1.0 - 1.0 / g.numel()

    def _encode(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:
        payload.add("signs", sign_bits(g), 1, "code")
        if self.scale == "l1":
            payload.add_floats("scale", mean_abs_scratch(g).reshape(1), "scale", "signsgd", "l1 scale")

    def _decode(self, payload: Payload, ctx: Context, side: torch.Tensor | None) -> torch.Tensor:
        return signs(payload["signs"], widened(payload["scale"]) if self.scale == "l1" else None)

    def _check_payload(self, payload: Payload) -> None:
        payload.require("signs", numel=payload.numel, dtype=torch.bool)
        if self.scale == "l1":
            payload.require("scale", numel=1, integer=False)

    def _proves_finite(self, payload: Payload) -> bool:
        return self.scale == "unit" or all_finite(payload["scale"])  # the output is +-scale

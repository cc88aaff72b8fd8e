"""TernGrad (Wen et al. 2017): ``g_tilde = s sign(g) * b``, ``s = ||g||_inf``, ``b_i ~ Bernoulli(|g_i| / s)``.

Codes in {-1, 0, 1} at 2 bits (``ceil(log2 3)``) plus one 32-bit scale per bucket (per layer by default). It is
the half-dithered quantizer with step 1 on ``g / ||g||_inf`` (DQSG/NDQSG (Abdi & Fekri), Lemma 2 with M = 1), so
unbiased for the vector it quantizes. Gradient clipping (Wen et al. Sec. 3.3): before quantizing, each
``|g_i| > c sigma`` is set to ``sign(g_i) c sigma``, sigma the standard deviation of g (the paper uses c = 2.5);
the result is then unbiased for the *clipped* gradient only, so a clipping TernGrad declares itself biased.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from gradstat.compressors.base import Properties, check_int
from gradstat.compressors.registry import register
from gradstat.compressors.schemes.quantizers.dither import DitherSource, ScaledQuantizer, ScaledQuantizerCompressor


@register("terngrad")
@dataclass
class TernGrad(ScaledQuantizerCompressor):
    """clip: c of the clipping at ``c * std(g)`` (0 = no clipping; the paper's value is 2.5).
    bucket: elements per scale (0 = one scale for the whole tensor, as the paper's per-layer scaler).
    dither: ``counter`` (default) or ``torch`` (see
    :class:`gradstat.compressors.schemes.quantizers.dither.ScaledQuantizer`)."""

    clip: float = 0.0
    bucket: int = 0
    dither: DitherSource = "counter"

    properties = Properties(
        kind="quantizer",
        unbiased=True,
        randomized=True,
        bound="half_dither_linf",
        source="DQSG/NDQSG (Abdi & Fekri) Sec. 2.1.1, Lemma 2 (M = 1); Wen et al. 2017",
    )

    def __post_init__(self) -> None:
        if not (self.clip >= 0.0) or self.clip == float("inf"):
            raise ValueError(f"terngrad clip must be a finite number >= 0 (0 = off), got {self.clip}")
        check_int("terngrad bucket (0 = whole tensor)", self.bucket, 0)
        self.quantizer(1)
        if self.clip > 0:
            self.properties = replace(type(self).properties, unbiased=False, bound=None)

    def quantizer(self, d: int) -> ScaledQuantizer:
        return ScaledQuantizer(levels=1, bucket=self.bucket, norm="linf", subtract=False, dither=self.dither)

    def prepare(self, g: torch.Tensor) -> torch.Tensor:
        """Clip at ``c * std(g)`` (population std, a tensor: no host sync) when ``clip > 0``."""
        if self.clip == 0:
            return g
        bound = self.clip * g.std(correction=0)
        return torch.maximum(torch.minimum(g, bound), -bound)

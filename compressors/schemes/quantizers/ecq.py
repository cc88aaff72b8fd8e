"""ECQ-SGD's quantizer (Wu et al. 2018), as given in the ECQ-SGD summary (Wu et al.).

``g_tilde_i = ||g|| sgn(g_i) xi(|g_i| / ||g||)`` with ``xi`` the stochastic rounding onto {0, 1/s, ..., 1} and
``||g||`` the l2 or the l_inf norm: codes in {-s..s} at ``r = ceil(log2(2s + 1))`` bits and one 32-bit scale,
``32 + d r`` bits in all. It is QSGD's quantizer over the whole tensor (the half-dithered quantizer of
DQSG/NDQSG (Abdi & Fekri) Lemma 2) with a choice of norm. The error compensation itself
(``h <- beta h + (g - g_tilde)``, ``g_tilde = Q(g + alpha h)``) is
:meth:`gradstat.compressors.memory.feedback.ErrorFeedback.ecq`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from gradstat.compressors.base import Properties, check_int
from gradstat.compressors.registry import register
from gradstat.compressors.schemes.quantizers.dither import DitherSource, ScaledQuantizer, ScaledQuantizerCompressor


@register("ecq")
@dataclass
class ECQ(ScaledQuantizerCompressor):
    """s: non-zero levels (codes in {-s..s}). norm: the scale, ``l2`` or ``linf`` (the paper's experiments: l2, s=4).
    dither: ``counter`` (default) or ``torch`` (see
    :class:`gradstat.compressors.schemes.quantizers.dither.ScaledQuantizer`)."""

    s: int = 4
    norm: Literal["l2", "linf"] = "l2"
    dither: DitherSource = "counter"

    properties = Properties(
        kind="quantizer",
        unbiased=True,
        randomized=True,
        bound="qsgd",
        source="ECQ-SGD (Wu et al.): quantizer Q_s, bit count 32 + d r",
    )

    def __post_init__(self) -> None:
        check_int("ecq s", self.s, 1)
        self.quantizer(1)
        if self.norm == "linf":
            self.properties = replace(type(self).properties, bound="half_dither_linf")

    def quantizer(self, d: int) -> ScaledQuantizer:
        return ScaledQuantizer(levels=self.s, bucket=0, norm=self.norm, subtract=False, dither=self.dither)

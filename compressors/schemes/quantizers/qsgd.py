"""QSGD (Alistarh et al. 2017): s-level stochastic quantization of each bucket scaled by its l2 norm.

Codes in {-s..s} (``ceil(log2(2s + 1))`` bits each, fixed width as in ECQ-SGD's count, ECQ-SGD (Wu et al.))
and one 32-bit l2 norm per bucket. By DQSG/NDQSG (Abdi & Fekri) Lemma 2 the stochastic quantizer is the
(2s + 1)-level half-dithered quantizer with step 1/s, so it is
:class:`gradstat.compressors.schemes.quantizers.dither.ScaledQuantizer` with ``subtract=False``: unbiased, and the
receiver needs no seed. Variance (Alistarh et al. Lemma 3.1, quoted in QCS (Abdi & Fekri) Fig. 3): ``E||Q(v) - v||^2 <=
min(n/s^2, sqrt(n)/s) ||v||^2`` with n the bucket length.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradstat.compressors.base import Properties, check_int
from gradstat.compressors.registry import register
from gradstat.compressors.schemes.quantizers.dither import DitherSource, ScaledQuantizer, ScaledQuantizerCompressor


@register("qsgd")
@dataclass
class QSGD(ScaledQuantizerCompressor):
    """s: positive levels (codes in {-s..s}), >= 1. bucket: elements per l2 scale (0 = whole tensor).
    dither: ``counter`` (default) or ``torch`` (see
    :class:`gradstat.compressors.schemes.quantizers.dither.ScaledQuantizer`)."""

    s: int = 4
    bucket: int = 512
    dither: DitherSource = "counter"

    properties = Properties(
        kind="quantizer",
        unbiased=True,
        randomized=True,
        bound="qsgd",
        source="DQSG/NDQSG (Abdi & Fekri) eq. (1) and Lemma 2 (Alistarh et al. 2017, Lemma 3.1)",
    )

    def __post_init__(self) -> None:
        check_int("qsgd s", self.s, 1)
        check_int("qsgd bucket (0 = whole tensor)", self.bucket, 0)
        self.quantizer(1)

    def quantizer(self, d: int) -> ScaledQuantizer:
        return ScaledQuantizer(levels=self.s, bucket=self.bucket, norm="l2", subtract=False, dither=self.dither)

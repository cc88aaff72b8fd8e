"""1-bit SGD (Seide et al. 2014): one bit per element and two reconstruction values per column (or row).

The gradient is viewed as a matrix: a tensor of shape (r, ...) as (r, numel / r); a 1-D tensor as one column
(d, 1), or as ``(d / columns, columns)`` when ``columns`` is given. Each element sends ``b = [g >= 0]``; for each
column (``axis="column"``) or row (``axis="row"``) the two reconstruction values are the means of the elements of
that group with b = 1 and with b = 0 (the values minimising the squared error for that split), sent as float32.
Meant to be used with error feedback (Seide et al.; DQSG/NDQSG (Abdi & Fekri) Sec. 4 and
QCS (Abdi & Fekri) Sec. 6 use it as the "one-bit" baseline): see
:class:`gradstat.compressors.memory.feedback.ErrorFeedback`.

Contraction: replacing each class by its mean gives ``||C(g) - g||^2 = ||g||^2 - ||C(g)||^2`` and, per group of m
elements, ``||C(g)||^2 >= ||g||_1^2 / m >= ||g||_2^2 / m``, so ``||C(g) - g||^2 <= (1 - 1/m) ||g||^2``.
Bits: numel x 1 + 2 x groups x 32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from gradstat.compressors.base import Compressor, Properties
from gradstat.compressors.context import Context
from gradstat.compressors.registry import register
from gradstat.compressors.schemes.quantizers.sign import sign_bits
from gradstat.compressors.wire.floats import widened
from gradstat.compressors.wire.payload import Payload
from gradstat.theory.kernels.primitives import (
    all_finite,
    choose_by_bits,
    max_abs,
    max_abs_rows,
    pow2_exponent,
    scale_by_pow2,
    scale_by_pow2_scratch,
    scratch_like,
    sign_split_sums,
)

EXACT_COUNT = 2**24
"""Below this group length a float32 sum of 0/1 flags is exact in any order, so it equals an integer count."""


def _class_means(groups: torch.Tensor, bits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group (row), the means of the elements with bit 0 and with bit 1, each divided by the power of two at
    the group's largest magnitude and scaled back (exact): the sums cannot overflow, and each mean (at most the
    largest magnitude) is finite. The plain form's products and sums over whole rows, in place on scratch
    buffers (:meth:`OneBit._encode_reference`)."""
    m = groups.shape[1]
    if groups.shape[0] == 1 and groups.dtype == torch.float32 and sign_split_sums.compiled_for(groups):
        # one group (a flat gradient): its counts and sums from one fused read, in float64 (cannot overflow),
        # each mean rounded once to float32 (the same means as below up to the rounding of the sums)
        n_pos, sum_pos, sum_neg = sign_split_sums(groups.reshape(-1))
        mean_pos = (sum_pos / n_pos.clamp(min=1)).float().reshape(1)
        mean_neg = (sum_neg / (m - n_pos).clamp(min=1)).float().reshape(1)
        return mean_neg, mean_pos
    e = pow2_exponent(max_abs_rows(groups))
    unit = scale_by_pow2_scratch(groups, -e[:, None])  # (groups, m)
    pos = scratch_like(groups, "onebit_flags").copy_(bits)
    if m < EXACT_COUNT:
        n_pos = torch.count_nonzero(bits, dim=1).to(pos.dtype)
    else:
        n_pos = pos.sum(1)
    n_neg = m - n_pos
    sum_pos = torch.mul(unit, pos, out=scratch_like(groups, "onebit_product")).sum(1)
    sum_neg = unit.mul_(pos.neg_().add_(1.0)).sum(1)  # 1 - pos, exactly, for pos in {0, 1}
    return scale_by_pow2(sum_neg / n_neg.clamp(min=1), e), scale_by_pow2(sum_pos / n_pos.clamp(min=1), e)


@register("onebit")
@dataclass
class OneBit(Compressor):
    """axis: reconstruction values per ``column`` or per ``row`` of the matrix view.
    columns: for 1-D tensors, the number of columns of the matrix view (0 = one column); must divide d."""

    defers_checks = True  # (its encode reads back only its finiteness checks)

    axis: Literal["column", "row"] = "column"
    columns: int = 0

    properties = Properties(
        kind="quantizer",
        unbiased=False,
        randomized=False,
        contraction="1 - 1/m",
        source="Seide et al. 2014 (1-bit SGD), baseline of DQSG/NDQSG (Abdi & Fekri) Sec. 4",
    )

    def __post_init__(self) -> None:
        if self.axis not in ("column", "row"):
            raise ValueError(f"onebit axis must be 'column' or 'row', got {self.axis!r}")
        if isinstance(self.columns, bool) or not isinstance(self.columns, int) or self.columns < 0:
            raise ValueError(f"onebit columns must be an integer >= 0 (0 = one column), got {self.columns!r}")

    def matrix_shape(self, shape: torch.Size) -> tuple[int, int]:
        """(rows, columns) of the matrix view of a tensor of ``shape``."""
        d = 1
        for s in shape:
            d *= s
        if len(shape) >= 2:
            return shape[0], d // shape[0]
        if self.columns == 0:
            return d, 1
        if d % self.columns:
            raise ValueError(f"onebit columns={self.columns} must divide the length {d} of a 1-D gradient")
        return d // self.columns, self.columns

    def contraction_constant(self, g: torch.Tensor) -> float:
        """``1 - 1/m`` with m the number of elements per reconstruction group of ``g``'s matrix view."""
        rows, cols = self.matrix_shape(g.shape)
        return 1.0 - 1.0 / (rows if self.axis == "column" else cols)

    def _groups(self, flat: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """The matrix view with one reconstruction group per row of the result."""
        m = flat.reshape(self.matrix_shape(shape))
        return m.T if self.axis == "column" else m

    def _encode(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:
        groups = self._groups(g, payload.shape)  # (groups, m)
        bits = sign_bits(groups)
        mean_neg, mean_pos = _class_means(groups, bits)
        payload.add("bits", bits.reshape(-1), 1, "code")
        payload.add_floats("values", torch.stack((mean_neg, mean_pos), 1), "value", "onebit", "mean")

    def _encode_reference(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:
        """Plain form of :meth:`_encode` (fresh tensors): the same payload, bit for bit."""
        groups = self._groups(g, payload.shape)  # (groups, m)
        bits = sign_bits(groups)
        pos = bits.float()
        n_pos = pos.sum(1)
        n_neg = groups.shape[1] - n_pos
        # means of the group divided by the power of two at its largest magnitude, then scaled back (exact): the
        # sums cannot overflow, and each mean (at most the largest magnitude) is finite
        e = pow2_exponent(max_abs(groups, dim=1))
        unit = scale_by_pow2(groups, -e[:, None])
        mean_pos = scale_by_pow2((unit * pos).sum(1) / n_pos.clamp(min=1), e)
        mean_neg = scale_by_pow2((unit * (1 - pos)).sum(1) / n_neg.clamp(min=1), e)
        payload.add("bits", bits.reshape(-1), 1, "code")
        payload.add_floats("values", torch.stack((mean_neg, mean_pos), 1), "value", "onebit", "mean")

    def _check_payload(self, payload: Payload) -> None:
        rows, cols = self.matrix_shape(payload.shape)
        payload.require("bits", numel=payload.numel, dtype=torch.bool)
        payload.require("values", shape=(cols if self.axis == "column" else rows, 2), integer=False)

    def _proves_finite(self, payload: Payload) -> bool:
        return all_finite(payload["values"])  # the output is one of each group's two means

    def _decode(self, payload: Payload, ctx: Context, side: torch.Tensor | None) -> torch.Tensor:
        values = widened(payload["values"])  # (groups, 2): [mean of b=0, mean of b=1]
        bits = payload["bits"].reshape(values.shape[0], -1)
        groups = choose_by_bits(bits, values[:, 0], values[:, 1])
        return (groups.T if self.axis == "column" else groups).reshape(-1)

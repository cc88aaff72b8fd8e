"""Sub-block maxima ("peaks") of a vector's magnitudes: where a later pass at a high threshold need not read.

A pass that looks only at the elements above a threshold ``t`` (the bounded selection ``|x| >= t``, at a sparsifier's
ratio of 1e-2 or 1e-3) reads every element to find a few. Where an earlier pass over the same vector has stored the
largest magnitude of each run of :func:`sub_for` consecutive elements (a sub-block), the later pass skips every
sub-block whose peak lies below ``t``: none of its elements can be selected. The skip is exact (a hint, never a
change of the result): a sub-block holding a NaN or an infinity has peak +inf and is always read.

At ratio 1e-3 a sub-block of 32 elements holds a selected element with probability 1 - 0.999^32 = 3 %, at 1e-2
with 27 %: a GPU fetches memory in lines of 128 bytes (32 float32 elements), so the masked loads of the other
sub-blocks move no data, and the selection's two reads of the vector cost about those fractions of one.

SIDCo's stage-1 summary (:mod:`gradstat.theory.kernels.triton_stats`) stores them from its read of the vector;
:func:`gradstat.theory.kernels.bounded.select_bounded` takes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUB = 32
"""Elements per sub-block on CUDA: one 128-byte line of float32 elements."""
INTERPRETED_SUB = 4
"""Elements per sub-block for a CPU tensor (Triton's interpreter, in tests): several sub-blocks per program there."""


def sub_for(x: torch.Tensor) -> int:
    """The sub-block length for ``x``'s device: :data:`SUB` on a GPU, :data:`INTERPRETED_SUB` on a CPU."""
    return INTERPRETED_SUB if x.device.type == "cpu" else SUB


@dataclass(frozen=True)
class Peaks:
    """``values[j]``: the largest ``|x|`` over elements ``[j sub, (j + 1) sub)`` of a 1-D ``x`` (its last sub-block
    shorter), in x's dtype, +inf where the sub-block holds a NaN or an infinity; ``sub``: that length."""

    values: torch.Tensor
    sub: int

    def check(self, x: torch.Tensor, block: int) -> None:
        """Refuse (ValueError) peaks that do not describe ``x`` for a reader whose blocks are ``block`` long."""
        want = -(-x.numel() // self.sub)
        v = self.values
        if v.dim() != 1 or v.numel() != want or v.dtype != x.dtype or v.device != x.device:
            raise ValueError(
                f"peaks: {want} {x.dtype} sub-block maxima on {x.device} describe x, got a {v.dim()}-D "
                f"{v.dtype} tensor of {v.numel()} on {v.device}"
            )
        if self.sub < 1 or block % self.sub:
            raise ValueError(f"peaks: sub-blocks of {self.sub} elements do not tile blocks of {block}")


def reference(x: torch.Tensor, sub: int) -> Peaks:
    """The definition, in plain torch: each sub-block's largest ``|x|``, +inf where it holds a NaN or an infinity."""
    flat = x.reshape(-1)
    rows = -(-flat.numel() // sub)
    padded = torch.zeros(rows * sub, dtype=flat.dtype, device=flat.device)
    padded[: flat.numel()] = flat.abs()
    a = padded.reshape(rows, sub)
    bad = ~torch.isfinite(a).all(dim=1)
    return Peaks(torch.where(bad, torch.inf, a.amax(dim=1)), sub)

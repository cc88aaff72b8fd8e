"""Top-k sparsification: keep the k = ceil(delta d) largest magnitudes, send their values and indices.

Reference implementation of the contract (a template for the other compressors). Contraction
E||C(g) - g||^2 <= (1 - delta) ||g||^2 (SIDCo (Abdelmoniem et al.), Lemma 3 / App. C; Stich et al. 2018).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gradstat.compressors.base import Properties, check_ratio
from gradstat.compressors.context import Context
from gradstat.compressors.registry import register
from gradstat.compressors.schemes.sparsifiers.threshold import SparseMessage, add_sparse
from gradstat.compressors.wire.payload import Payload


@register("topk")
@dataclass
class TopK(SparseMessage):
    """ratio: target density delta = k/d in (0, 1). packed: indices bit-packed at ceil(log2 d) bits, else int32."""

    ratio: float = 0.01
    packed: bool = True

    defers_checks = True  # (a fixed k: its encode reads back only its finiteness check)

    properties = Properties(
        kind="sparsifier",
        unbiased=False,
        randomized=False,
        contraction="1 - delta",
        bound="topk_contraction",
        source="SIDCo (Abdelmoniem et al.) Sec. 1, baseline Top-k",
    )

    def __post_init__(self) -> None:
        check_ratio(self.ratio, who="topk ratio")

    def _encode(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:
        d = g.numel()
        check_ratio(self.ratio, d, who="topk ratio")
        k = math.ceil(self.ratio * d)
        idx = torch.topk(g.abs(), k, sorted=False).indices
        add_sparse(payload, g, idx, self.packed)

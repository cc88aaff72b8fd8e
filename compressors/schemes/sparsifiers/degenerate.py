"""A target-count threshold that keeps nothing, or every nonzero element: the exact selection of k instead.

A threshold estimated from a fitted law (SIDCo, Abdelmoniem et al., Sec. 2.3-2.4) or found by a bounded search
(RedSync, Fang et al. 2019; gradstat's tail count) is only as good as the law or the search. On magnitudes without
the assumed tail (uniform on [1, 3]: the exponential quantile lies above the largest magnitude) it selects nothing;
on a handful of distinct values (two, say) every threshold between them selects all the larger ones or, below the
smaller, every element. The tie-break (:func:`~gradstat.compressors.schemes.sparsifiers.threshold.break_ties`)
mends ties at the selection's edge only. Such a selection is degenerate: it says nothing about where the k largest
magnitudes end. A sparsifier declaring ``exact_fallback`` then sends the exact top-k (the k largest nonzero
magnitudes, ties at the k-th taken in index order, as the tie-break does) and says so in ``payload.info``
(``fallback``: what the threshold had selected).

"Every nonzero element" is tested only where the selection holds more than twice the target (so the count of
nonzeros, one more read of the vector, is taken only then): a selection within a factor of two of k is an
estimate, not a degenerate one.
"""

from __future__ import annotations

import math

import torch

from gradstat.compressors.context import Context
from gradstat.compressors.wire.payload import Payload


def degenerate(magnitudes: torch.Tensor, selected: int, k: int) -> str | None:
    """Why a selection of ``selected`` elements of ``magnitudes`` (or of the signed vector: only magnitudes count)
    with target ``k`` is degenerate -- it keeps nothing, or every nonzero element where they outnumber ``2 k`` --
    or None when it is not (callers have already sent nothing for an all-zero vector)."""
    d = magnitudes.numel()
    if selected == 0 and k >= 1:
        return f"the threshold selected none of {d} elements (target {k})"
    if selected > 2 * k and (selected == d or selected == int(torch.count_nonzero(magnitudes))):
        return f"the threshold selected every nonzero element, {selected} of {d} (target {k})"
    return None


def exact_top(magnitudes: torch.Tensor, k: int) -> torch.Tensor:
    """Increasing indices of the ``k`` largest nonzero ``|magnitudes|`` (fewer where fewer are nonzero); ties at the
    k-th largest are taken in index order, so the result does not depend on the sort's order among equals."""
    a = magnitudes.abs()
    k = min(k, a.numel())
    kth = torch.topk(a, k, sorted=False).values.min()
    if not bool(kth > 0):
        return torch.nonzero(a > 0).reshape(-1)
    above = torch.nonzero(a > kth).reshape(-1)
    tied = torch.nonzero(a == kth).reshape(-1)[: k - above.numel()]
    return torch.sort(torch.cat([above, tied])).values


def fall_back(magnitudes: torch.Tensor, indices: torch.Tensor, k: int, info: dict[str, object]) -> torch.Tensor:
    """``indices`` unchanged, or the exact top-k when the selection is :func:`degenerate` (its reason in
    ``info["fallback"]``, unless the rule has put its own there)."""
    why = degenerate(magnitudes, indices.numel(), k)
    if why is None:
        return indices
    info.setdefault("fallback", f"exact top-k: {why}")  # a rule that knows better has said why already
    return exact_top(magnitudes, k)


class ExactFallback:
    """Mixin of a target-count threshold sparsifier (``ratio``, ``exact_fallback`` fields) whose ``_refine`` applies
    :func:`fall_back` to the threshold's selection (before the tie-break, which then has nothing left to trim on
    an exact top-k)."""

    ratio: float
    exact_fallback: bool

    def _refine(self, abs_g: torch.Tensor, indices: torch.Tensor, payload: Payload, ctx: Context) -> torch.Tensor:
        if not self.exact_fallback:
            return indices
        return fall_back(abs_g, indices, math.ceil(self.ratio * abs_g.numel()), payload.info)

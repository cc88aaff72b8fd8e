"""Unbiased (Wangni et al.) sparsification: keep g_i with probability p_i, send g_i / p_i.

Wangni, Wang, Liu, Zhang, "Gradient Sparsification for Communication-Efficient Distributed Optimization",
NeurIPS 2018, Sec. 3 (closed-form solution and its greedy algorithm): the probabilities minimising the variance
``sum_i g_i^2 (1/p_i - 1)`` subject to ``sum_i p_i = k`` (expected density delta = k/d) are

    p_i = min(1, lambda |g_i|),

i.e. the j largest magnitudes are kept with probability 1 and the others with ``p_i = (k - j) |g_i| / S_j``,
``S_j = sum of the magnitudes outside the j largest``, j the smallest count for which no probability exceeds 1.
Variance as in QCS (Abdi & Fekri), Fig. 3 ("unbiased random sparsification").

The draw is a Bernoulli mask from the call's seed (:func:`coins`: the counter hash keyed by (seed, index), the same
mask on every device); indices and scaled values are sent (the receiver cannot regenerate the mask, which depends on
g), so ``bits = k_hat (ceil(log2 d) + 32)`` with ``E[k_hat] = k``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gradstat.compressors.base import Properties, check_ratio
from gradstat.compressors.context import Context
from gradstat.compressors.registry import register
from gradstat.compressors.schemes.sparsifiers.queued import capacity
from gradstat.compressors.schemes.sparsifiers.threshold import SparseMessage, add_sparse
from gradstat.compressors.wire.floats import wire_flags, wire_float
from gradstat.compressors.wire.payload import Payload
from gradstat.theory import scalars as S
from gradstat.theory.kernels import counter_dither
from gradstat.theory.kernels.bounded import first_true
from gradstat.theory.kernels.primitives import all_finite, max_abs, pow2_exponent, scale_by_pow2

COIN_STREAM = 7
"""Sub-stream of the call seed for the keep coins (random-k's subset uses 5, DGC's sample 6)."""


def coins(p: torch.Tensor, seed: int) -> torch.Tensor:
    """The indices kept (1-D int64, increasing) when element i is kept with probability ``p[i]``: kept where its
    counter hash of ``(seed, COIN_STREAM)``, offset by 2^31 into ``h_i`` in ``[0, 2^32)``, satisfies
    ``h_i < p_i 2^32`` (compared in float64, exactly), i.e. with probability ``ceil(p_i 2^32) / 2^32``: within
    2^-32 of ``p_i``, 0 for ``p_i = 0`` and 1 for ``p_i = 1``. The same on every device."""
    return torch.nonzero(coin_mask(p, seed)).squeeze(1)


def coin_mask(p: torch.Tensor, seed: int) -> torch.Tensor:
    """The keep mask of :func:`coins` (bool, ``p``'s length), nothing read back."""
    d = p.numel()
    counter_dither.check_indices(0, d)
    zero = torch.zeros((), dtype=torch.int32, device=p.device)
    h = counter_dither.counter_bits(1, d, zero, counter_dither.keys(seed, COIN_STREAM, p.device), p.device)
    return h.reshape(-1).to(torch.float64).add_(2.0**31) < p.reshape(-1).double() * 2.0**32


def optimal_probabilities(abs_g: torch.Tensor, k: int) -> torch.Tensor:
    """Wangni et al. (2018) optimal keep probabilities for an expected count ``k`` (1 <= k <= d).

    Parameters
    ----------
    abs_g : (d,) float tensor of magnitudes ``|g_i|`` (any device).
    k : expected number of kept coordinates, ``sum_i p_i = min(k, nnz(g))``.

    Returns
    -------
    (d,) tensor of probabilities in [0, 1] on ``abs_g``'s device; zero where ``g_i = 0``.
    """
    d = abs_g.numel()
    if not (1 <= k <= d):
        raise ValueError(f"expected count k must lie in [1, d={d}], got {k}")
    # the probabilities are invariant to the scale of abs_g: compute them on abs_g 2^-e (2^e the power of two at
    # its maximum; exact), where the sums below cannot overflow
    abs_g = scale_by_pow2(abs_g, -pow2_exponent(abs_g.amax()))
    top = torch.topk(abs_g, k, sorted=True).values  # a_1 >= ... >= a_k
    # S_j = sum of the magnitudes outside the j largest, j = 0..k-1
    rest = abs_g.sum() - torch.cat([top.new_zeros(1), torch.cumsum(top, 0)[:-1]])
    j = torch.arange(k, device=abs_g.device, dtype=abs_g.dtype)
    # with the j largest saturated, the largest remaining p is (k - j) a_{j+1} / S_j; j = k - 1 always fits
    # (a_k <= a_k + S_k), and for the first j that fits every saturated a_i has lambda a_i > 1.
    fits = top * (k - j) <= rest
    j_star = torch.argmax(fits.to(torch.uint8))  # first j that fits (0-d tensor, no host sync)
    rest_star = rest.index_select(0, j_star.reshape(1)).reshape(())  # (rest[j_star] would read j_star back)
    lam = torch.where(rest_star > 0, (k - j_star).to(abs_g.dtype) / rest_star, torch.full_like(rest_star, math.inf))
    return torch.where(abs_g > 0, torch.clamp(abs_g * lam, max=1.0), torch.zeros_like(abs_g))


@register("wangni")
@dataclass
class Wangni(SparseMessage):
    """ratio: target expected density delta = E[k_hat]/d in (0, 1). packed: bit-packed indices, else int32."""

    ratio: float = 0.01
    packed: bool = True

    properties = Properties(
        kind="sparsifier",
        unbiased=True,
        randomized=True,
        contraction=None,
        bound="wangni_variance",
        source="Wangni et al. 2018 Sec. 3 (optimal p_i); QCS (Abdi & Fekri) Fig. 3",
    )

    def __post_init__(self) -> None:
        check_ratio(self.ratio, who="wangni ratio")

    def _encode(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:
        d = g.numel()
        check_ratio(self.ratio, d, who="wangni ratio")
        p = optimal_probabilities(g.abs(), math.ceil(self.ratio * d))
        indices = coins(p, ctx.call_seed)  # p_i = 0 is never kept, p_i = 1 always
        self._send(payload, g, p, indices)

    def _enqueue(self, x: torch.Tensor, payload: Payload, ctx: Context) -> Callable[[], Payload] | None:
        """On a device (scalars not on the host: a GPU, or a CPU under ``never``): the probabilities and the coins'
        mask on the device, the kept indices into a buffer of :func:`~gradstat.compressors.schemes.sparsifiers.
        queued.capacity` (the expected count is k, its variance at most k), nothing read back; the returned function
        reads the count, the largest magnitude and the send's checks of the values in one copy and sends (one read
        in every dtype). A non-finite gradient, a draw beyond the buffer or a value the wire cannot carry runs the
        synchronous encode or send (its error, or the same payload)."""
        if S.on_host(x):
            return None
        d = x.numel()
        check_ratio(self.ratio, d, who="wangni ratio")
        k = math.ceil(self.ratio * d)
        p = optimal_probabilities(x.abs(), k)
        room = capacity(d, k)
        wire = wire_float(payload.dtype)
        kept, count = first_true(coin_mask(p, ctx.call_seed), room)
        # the values the wire would carry, over the buffer only (its unused slots hold -1: zero there), and what
        # the send checks of them (their largest magnitude in the wire dtype, a nonzero value arriving as zero)
        at = kept.clamp(min=0)
        values = torch.where(kept >= 0, _scaled(x.index_select(0, at), p.index_select(0, at)), 0.0)
        reads = torch.cat([count.double().reshape(1), max_abs(x).double().reshape(1), wire_flags(values, wire)])

        def finish() -> Payload:
            read = reads.tolist()  # the one host read: the count the wire needs, and the finiteness and range checks
            n = int(read[0])
            if not math.isfinite(read[1]) or n > room:
                return self._encode_now(x, Payload(shape=payload.shape, dtype=payload.dtype), ctx)
            if not math.isfinite(read[2]) or read[3]:  # a value the wire cannot carry: the synchronous send's error
                self._send(payload, x, p, kept[:n])
                return payload
            add_sparse(payload, x, kept[:n], self.packed, exact=False, values=values[:n])
            payload.info["k_hat"] = n
            return payload

        return finish

    def _send(self, payload: Payload, g: torch.Tensor, p: torch.Tensor, indices: torch.Tensor) -> None:
        """Send ``g_i / p_i`` at the kept ``indices``."""
        add_sparse(payload, _scaled(g, p), indices, self.packed, exact=False)
        if not all_finite(payload["values"]):
            raise ValueError(
                f"wangni: a kept value divided by its probability exceeds {payload['values'].dtype}'s range, so the "
                "unbiased reconstruction cannot be sent; scale the gradient down (e.g. by a power of two)"
            )
        payload.info["k_hat"] = indices.numel()


def _scaled(g: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``g_i / p_i`` (``g_i`` where ``p_i = 0``: never kept)."""
    return g / torch.where(p > 0, p, torch.ones_like(p))

"""QCS: quantized compressive sampling of stochastic gradients (unbiased, MMSE and 1-bit).

Source: QCS (Abdi & Fekri), eq. (1)-(13) and Algorithm 1. Per block g of n elements:

    r ~ Rademacher(n)                          regenerated from the seed (stream SIGN_STREAM)
    v = H_k (r * g) / sqrt(k)                  eq. (2): k rows of the n x n Hadamard matrix (the first k)
    varsigma = ||v||_inf / Q,  q = round(v / varsigma + u),  u ~ U(-1/2, 1/2)         eq. (4)
    v_hat = varsigma (q - u)                   eq. (6)
    g_hat = (alpha / sqrt(k)) r * (H_k^T v_hat)                                      eq. (8), Alg. 1 line 13

alpha = 1 (unbiased, eq. (9); Theorem 2: E||g - g_hat||^2 <= gamma ||g||^2, gamma of eq. (10)) or
alpha = 1 / (gamma + 1) (MMSE, eq. (12); Lemma 3: E||e||^2 <= (1 - alpha) ||g||^2). The 1-bit variant (5) sends
``sign(v/varsigma + u)`` with varsigma = 2 ||v||_inf, read as the midrise quantizer with points +-1/2 (see
:mod:`gradstat.compressors.schemes.quantizers.dither`): its error is that of range Q = 1/2, so its gamma is (10) at Q =
1/2.

Blocks: the flat vector is cut into blocks of ``block`` elements, the last one zero-padded (padding is not sent).
Sent per block: k codes at ``ceil(log2(2Q + 1))`` bits (1 bit for 1-bit QCS) and one 32-bit scale (``||v||_inf``,
from which varsigma follows); once per tensor: the seed. The mixing uses :mod:`gradstat.theory.kernels.hadamard`
(fast Walsh-Hadamard transform for powers of two, Paley x Sylvester for the paper's other sizes; when k is a power of
two dividing the Sylvester factor, only a k-point transform of the folded block is computed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch

from gradstat.compressors.base import Compressor, Properties, check_int
from gradstat.compressors.context import Context, generator
from gradstat.compressors.registry import register
from gradstat.compressors.schemes.quantizers.dither import DitherSource, ScaledQuantizer, bucket_rows, to_buckets
from gradstat.compressors.wire.payload import Payload
from gradstat.theory.kernels import counter_dither
from gradstat.theory.kernels.hadamard import factor, first_rows, first_rows_transpose
from gradstat.theory.kernels.primitives import scratch, scratch_like
from gradstat.theory.qcs import gamma as theory_gamma

SIGN_STREAM = 2
"""Sub-stream of the call seed for the Rademacher vector r (the dither uses ``dither.DITHER_STREAM``)."""


def variance_factor(n: int, k: int, Q: float) -> float:
    """gamma of QCS (Abdi & Fekri) eq. (10) for a real range Q > 0 (Q = 1/2 for the 1-bit variant).

    ``n/k - 1 + (n / (4 Q^2)) log(k) / (k - 1)`` for k >= 2, ``n - 1`` for k = 1. Integer Q is
    :func:`gradstat.theory.qcs.gamma` itself; the theory function takes integer ranges only, so the 1-bit variant's
    Q = 1/2 is evaluated here.
    """
    if float(Q).is_integer():
        return theory_gamma(n, k, int(Q))
    if k == 1:
        return n - 1.0
    return n / k - 1.0 + n / (4.0 * Q * Q) * math.log(k) / (k - 1)


def rademacher(shape: tuple[int, ...], seed: int, device: torch.device) -> torch.Tensor:
    """+-1 (float32) with probability 1/2 each, from the generator of ``(seed, SIGN_STREAM)`` on ``device``: the
    int8 draws converted into one fresh float tensor, ``2 b - 1`` in place on it."""
    gen = generator(seed, device, SIGN_STREAM)
    bits = torch.randint(0, 2, shape, generator=gen, device=device, dtype=torch.int8)
    return torch.empty(shape, dtype=torch.float32, device=device).copy_(bits).mul_(2.0).sub_(1.0)


def signs(shape: tuple[int, ...], seed: int, device: torch.device | str) -> torch.Tensor:
    """The default QCS's Rademacher signs r of a ``(rows, n)`` matrix of blocks: the counter signs of
    ``(seed, SIGN_STREAM)`` and each element's index, float32 +-1 (what its fused sign pass applies)."""
    rows, size = shape
    key = counter_dither.keys(seed, SIGN_STREAM, device)
    zero = torch.zeros((), dtype=torch.int32, device=device)
    return counter_dither.sign_rows(rows, size, zero, key, torch.device(device))


def mix(blocks: torch.Tensor, r: torch.Tensor, k: int) -> torch.Tensor:
    """``v = T g = H_k (r * g) / sqrt(k)`` for each row of ``blocks`` (rows, n); returns (rows, k). Eq. (1)-(2).
    The product ``r * g`` is formed in this thread's scratch buffer; neither input is changed."""
    return first_rows(torch.mul(blocks, r, out=scratch_like(blocks, "qcs_mix")), k) / math.sqrt(k)


def unmix(v: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``T^T v = r * (H_k^T v) / sqrt(k)`` for each row of ``v`` (rows, k); returns (rows, n). Alg. 1 line 13."""
    return r * first_rows_transpose(v, r.shape[-1]) / math.sqrt(v.shape[-1])


def _rademacher_reference(shape: tuple[int, ...], seed: int, device: torch.device) -> torch.Tensor:
    """Plain form of :func:`rademacher` (fresh tensors)."""
    gen = generator(seed, device, SIGN_STREAM)
    return torch.randint(0, 2, shape, generator=gen, device=device, dtype=torch.int8).float() * 2.0 - 1.0


@register("qcs")
@dataclass
class QCS(Compressor):
    """k: rows kept per block (1 <= k <= block). Q: quantizer range (codes in {-Q..Q}), >= 1; ignored by 1-bit.
    block: block length n (a power of two, or m 2^a with a Paley order m: 96, 100, 192, 200, 288, 320, 384, ...).
    alpha: ``unbiased`` (alpha = 1) or ``mmse`` (alpha = 1/(gamma + 1)). onebit: the 1-bit variant (5).
    dither: source of the quantizer's dither and of the Rademacher signs: ``counter`` (default; keyed by (seed,
    index), the signs applied in one fused pass) or ``torch`` (torch's seeded generator; see
    :class:`gradstat.compressors.schemes.quantizers.dither.ScaledQuantizer`)."""

    defers_checks = True  # (its encode reads back only its finiteness checks)

    k: int = 64
    Q: int = 4
    block: int = 256
    alpha: Literal["unbiased", "mmse"] = "unbiased"
    onebit: bool = False
    dither: DitherSource = "counter"

    properties = Properties(
        kind="sketch",
        unbiased=True,
        randomized=True,
        bound="qcs_gamma",
        source="QCS (Abdi & Fekri) eq. (1)-(10), Theorem 2, Algorithm 1",
    )

    def __post_init__(self) -> None:
        check_int("qcs block", self.block, 1)
        factor(self.block)  # raises for an unsupported Hadamard order
        check_int("qcs k", self.k, 1)
        if self.k > self.block:
            raise ValueError(f"qcs k must lie in [1, block={self.block}], got {self.k}")
        check_int("qcs Q", self.Q, 1)
        if self.alpha not in ("unbiased", "mmse"):
            raise ValueError(f"qcs alpha must be 'unbiased' or 'mmse', got {self.alpha!r}")
        if self.alpha == "mmse":
            self.properties = replace(
                type(self).properties,
                unbiased=False,
                bound="qcs_mmse",
                contraction="1 - alpha",
                source="QCS (Abdi & Fekri) eq. (12), Lemma 3, Algorithm 1",
            )

    @property
    def gamma(self) -> float:
        """Variance factor (10) of this configuration (range 1/2 for the 1-bit variant)."""
        return variance_factor(self.block, self.k, 0.5 if self.onebit else self.Q)

    def contraction_constant(self, g: torch.Tensor) -> float:
        """MMSE-QCS, Lemma 3 (13): ``E||e||^2 <= (1 - alpha) ||g||^2`` (in expectation only)."""
        return 1.0 - self.reconstruction_scale()

    def reconstruction_scale(self) -> float:
        """alpha of eq. (8): 1 (eq. (9)) or 1/(gamma + 1) (eq. (12))."""
        return 1.0 if self.alpha == "unbiased" else 1.0 / (self.gamma + 1.0)

    def _quantizer(self) -> ScaledQuantizer:
        return ScaledQuantizer(
            levels=1 if self.onebit else self.Q,
            bucket=self.k,
            norm="linf",
            subtract=True,
            onebit=self.onebit,
            dither=self.dither,
        )

    def _encode(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:
        seed = ctx.call_seed
        if self.dither == "counter":
            v = first_rows(self._signed_blocks(g, seed), self.k) / math.sqrt(self.k)
        else:
            blocks = to_buckets(g, self.block)
            v = mix(blocks, rademacher(tuple(blocks.shape), seed, g.device), self.k)
        self._quantizer().encode(v.reshape(-1), payload, seed)
        payload.add_seed(seed)
        if self.dither == "torch":  # torch's draws differ between device types: the payload says whose they are
            payload.add_generator(g.device)

    def _check_payload(self, payload: Payload) -> None:
        self._quantizer().check_payload(payload, math.ceil(payload.numel / self.block) * self.k)
        payload.seed  # noqa: B018  (present, one integer: a PayloadError otherwise)

    def _proves_finite(self, payload: Payload) -> bool:
        # the output r * (H_k^T v_hat) alpha / sqrt(k) sums k entries +-v_hat: at most sqrt(k) alpha max |v_hat|
        spread = math.sqrt(self.k) * max(self.reconstruction_scale(), 1.0)
        return self._quantizer().proves_finite(payload, spread)

    def _signed_blocks(self, g: torch.Tensor, seed: int) -> torch.Tensor:
        """``r * g`` over the zero-padded blocks, ``r`` the counter signs, in one fused pass from the full blocks of
        flat ``g`` (a view) and its padded last one into this thread's scratch buffer (no padded copy of g)."""
        n = self.block
        head, tail = bucket_rows(g, n)
        full = head.shape[0]
        signed = scratch((full + (tail is not None)) * n, g.dtype, g.device, "qcs_mix").view(-1, n)
        key = counter_dither.keys(seed, SIGN_STREAM, g.device)
        unused = torch.ones((), dtype=g.dtype, device=g.device).expand(signed.shape[0], 1)  # no division
        kernel = counter_dither.signed_rows_into
        counter_dither.run_rows(kernel, signed[:full], head, unused[:full], 0, key, False)
        if tail is not None:
            counter_dither.run_rows(kernel, signed[full:], tail, unused[full:], full * n, key, False)
        return signed

    def _decode(self, payload: Payload, ctx: Context, side: torch.Tensor | None) -> torch.Tensor:
        seed = payload.seed
        rows = math.ceil(payload.numel / self.block)
        v_hat = self._quantizer().decode(payload, rows * self.k, seed).reshape(rows, self.k)
        # unmix(v_hat, r) times alpha, in place on the output (alpha = 1 is skipped: 1 * x is x exactly)
        if self.dither == "counter":  # H^T v_hat in scratch, then r * (.) / sqrt(k) in one fused pass
            key = counter_dither.keys(seed, SIGN_STREAM, v_hat.device)
            t = first_rows_transpose(
                v_hat,
                self.block,
                out=scratch(rows * self.block, v_hat.dtype, v_hat.device, "qcs_mix").view(rows, self.block),
            )
            root = torch.full((rows, 1), math.sqrt(self.k), dtype=t.dtype, device=t.device)
            out = counter_dither.run_rows(counter_dither.signed_rows_into, torch.empty_like(t), t, root, 0, key, True)
        else:
            out = first_rows_transpose(v_hat, self.block, out=v_hat.new_empty(rows, self.block))
            out.mul_(rademacher((rows, self.block), seed, v_hat.device)).div_(math.sqrt(self.k))
        alpha = self.reconstruction_scale()
        if alpha != 1.0:
            out.mul_(alpha)
        return out.reshape(-1)[: payload.numel]

    def _encode_reference(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:
        """Plain form of :meth:`_encode` (fresh tensors): the same payload, bit for bit."""
        seed = ctx.call_seed
        blocks = to_buckets(g, self.block)
        v = first_rows(blocks * self._signs_reference(tuple(blocks.shape), seed, g.device), self.k) / math.sqrt(self.k)
        self._quantizer().encode_reference(v.reshape(-1), payload, seed)
        payload.add_seed(seed)

    def _signs_reference(self, shape: tuple[int, ...], seed: int, device: torch.device) -> torch.Tensor:
        """All Rademacher signs of the padded blocks at once: the counter signs of (seed, index), or torch's."""
        return _rademacher_reference(shape, seed, device) if self.dither == "torch" else signs(shape, seed, device)

    def _decode_reference(self, payload: Payload, ctx: Context, side: torch.Tensor | None) -> torch.Tensor:
        """Plain form of :meth:`_decode`: the same values, bit for bit."""
        seed = payload.seed
        rows = math.ceil(payload.numel / self.block)
        v_hat = self._quantizer().decode_reference(payload, rows * self.k, seed).reshape(rows, self.k)
        r = self._signs_reference((rows, self.block), seed, v_hat.device)
        return (self.reconstruction_scale() * unmix(v_hat, r)).reshape(-1)[: payload.numel]

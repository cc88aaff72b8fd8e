"""Natural compression: each element rounded at random to one of the two powers of two around it.

Horvath, Ho, Horvath, Sahu, Canini, Richtarik, "Natural Compression for Distributed Deep Learning" (MSML 2022,
PMLR 190): the operator C_nat and Theorem 1, C_nat is unbiased and E||C_nat(g) - g||^2 <= (1/8) ||g||^2 (its
second moment is at most 9/8 that of g).

An element t != 0 with 2^e <= |t| < 2^(e+1) is sent as sign(t) 2^(e+1) with probability p = |t| / 2^e - 1 and as
sign(t) 2^e otherwise, so E[C(t)] = 2^e (1 + p) = |t| with the sign of t. The wire carries one sign bit and one
exponent code per element: the codes number the powers of two the input's dtype holds, plus a code for zero.

Departures from the paper, both stated: the random numbers are the counter hash's uniforms, multiples of 2^-24, so
each probability is rounded up to the next multiple of 2^-24 (a bias below 2^-24 |t| per element); an element above
the dtype's largest power of two (e.g. |t| >= 2^127 in float32, 2^15 in float16) is sent as that power, since the
next one is not representable (biased there, never Inf).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gradstat.compressors import Compressor, Context, Payload, Properties, register
from gradstat.theory.kernels.counter_dither import dither_rows, keys


def exponent_range(dtype: torch.dtype) -> tuple[int, int]:
    """The least and greatest e with 2^e representable in ``dtype`` (subnormals included)."""
    info = torch.finfo(dtype)
    least = round(math.log2(info.smallest_normal)) - (info.bits - 1 - _exponent_bits(dtype))
    return least, math.floor(math.log2(info.max))


def _exponent_bits(dtype: torch.dtype) -> int:
    """Width of the exponent field of a floating dtype (1 sign bit, the rest is exponent and mantissa)."""
    return {torch.float16: 5, torch.bfloat16: 8, torch.float32: 8, torch.float64: 11}[dtype]


def code_width(dtype: torch.dtype) -> int:
    """Bits of one exponent code: every power of two of ``dtype`` plus the code 0 for a zero element."""
    least, greatest = exponent_range(dtype)
    return math.ceil(math.log2(greatest - least + 2))


@register("natural")
@dataclass
class NaturalCompression(Compressor):
    """Natural compression (Horvath et al., C_nat, Thm 1): unbiased, ``E||C(g) - g||^2 <= ||g||^2 / 8``, one sign
    bit and one exponent code (9 bits for float32 input) per element. No hyper-parameters."""

    properties = Properties(
        kind="quantizer",
        unbiased=True,
        randomized=True,
        source="Horvath et al., Natural Compression for Distributed Deep Learning, C_nat, Thm 1",
    )

    def _encode(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:
        least, greatest = exponent_range(payload.dtype)
        seed = ctx.call_seed
        payload.add_seed(seed)
        mantissa, exponent = torch.frexp(g)  # g = mantissa 2^exponent, 1/2 <= |mantissa| < 1 (0 for g = 0)
        up_probability = 2.0 * mantissa.abs() - 1.0  # |g| / 2^e - 1 with 2^e = 2^(exponent - 1) <= |g|
        zero = torch.zeros((), dtype=torch.int32, device=g.device)
        uniform = dither_rows(1, g.numel(), zero, keys(seed, 0, g.device), g.device)[0] + 0.5  # in [0, 1)
        power = exponent - 1 + (uniform < up_probability).to(exponent.dtype)
        codes = torch.where(g == 0, 0, power.clamp(max=greatest) - least + 1)
        payload.add("signs", torch.signbit(g), 1, "code")
        payload.add("exponent", codes.to(torch.int16), code_width(payload.dtype), "code")

    def _decode(self, payload: Payload, ctx: Context, side: torch.Tensor | None) -> torch.Tensor:
        least, _ = exponent_range(payload.dtype)
        codes = payload["exponent"].to(torch.int32)
        magnitude = torch.ldexp(torch.ones_like(codes, dtype=torch.float64), codes + (least - 1))
        magnitude = torch.where(codes == 0, 0.0, magnitude)
        return torch.where(payload["signs"], -magnitude, magnitude)

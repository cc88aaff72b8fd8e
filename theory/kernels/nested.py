"""NDQSG's nested dithered quantizer, element by element: the encode (6) and the decode with side information (7).

Source: DQSG/NDQSG (Abdi & Fekri, Nested Dithered Quantization for Communication Reduction), Sec. 3.2, eq. (6)-(7):
nested quantizers Q1 (fine, step Delta1) and Q2 (coarse, Delta2 = k Delta1). Encoder (6): ``t = alpha x + u``,
``s = Q1(t) - Q2(t)``; decoder with side information y (7): ``r = s - u - alpha y``, ``x_hat = y + alpha (r - Q2(r))``.
The scheme around them (groups, scales, the payload) is
:class:`gradstat.compressors.schemes.quantizers.ndqsg.NDQSG`; :mod:`gradstat.theory.dqsg` holds the closed forms.

Forms of the two loops: in place on scratch buffers (:func:`nested_encode`, :func:`nested_decode`, with any dither);
with the counter dither, one pure expression each (:func:`nested_rows_into`, :func:`nested_reconstruct_rows_in_place`,
:data:`NESTED_KERNELS`: the eager reference, compiled where :mod:`gradstat.theory.kernels.policy` allows), and
gradstat's C loops (:func:`gradstat.theory.kernels.counter_native.nested_rows_into` and ``nested_estimate_into``).
Every form performs the same operations in the same order, so they agree bit for bit (``tests/kernels``). On CUDA the
counter-dither forms run as modes of the hand-written Triton kernel (:mod:`gradstat.theory.kernels.triton_dither`),
not compiled by torch; there, as torch's CUDA kernels do, a division by a host number (Delta1, k) is a product by its
float32 reciprocal.
"""

from __future__ import annotations

import torch

from gradstat.theory.kernels import counter_dither
from gradstat.theory.kernels.fused import Fused
from gradstat.theory.kernels.scratch import scratch_like


def nested_encode(x: torch.Tensor, u: torch.Tensor, delta1: float, k: int, alpha: float = 1.0) -> torch.Tensor:
    """Nested index of eq. (6), ``(Q1(t) - Q2(t)) / Delta1`` with ``t = alpha x + u``, taken modulo k into
    ``{-(k-1)//2, ..., k - 1 - (k-1)//2}``: integer codes, int8 for k <= 255 (else int32).

    x : values (any shape); u : dither in the same units, ``U[-Delta1/2, Delta1/2]``; Delta2 = k Delta1.
    ``t``, ``Q1(t) = round(t)`` and ``Q2(t) = k round(t / k)`` are formed in place in this thread's scratch
    buffers (no fresh x-sized float tensors); neither input is changed. Plain form: ``nested_encode_reference``
    in ``tests/compressors/test_sign_nested_fast_paths.py``."""
    t = torch.mul(x, alpha, out=scratch_like(x, "nested_t")).add_(u).div_(delta1)  # alpha x == x alpha exactly
    coarse = torch.div(t, k, out=scratch_like(t, "nested_coarse")).add_(0.5).floor_().mul_(k)
    h = (k - 1) // 2
    s = t.add_(0.5).floor_().sub_(coarse).add_(h).remainder_(k).sub_(h)
    return s.to(torch.int8 if k <= 255 else torch.int32)


def nested_decode(
    s: torch.Tensor, u: torch.Tensor, y: torch.Tensor, delta1: float, k: int, alpha: float = 1.0
) -> torch.Tensor:
    """Eq. (7): ``r = s Delta1 - u - alpha y``, ``x_hat = y + alpha (r - Q2(r))``, Q2 of step ``k Delta1``.

    ``s`` integer or float codes. One fresh float tensor (the result), every step in place on it or on scratch
    buffers; no input is changed."""
    dtype = s.dtype if s.is_floating_point() else torch.promote_types(u.dtype, y.dtype)
    r = torch.empty(s.shape, dtype=dtype, device=s.device).copy_(s).mul_(delta1).sub_(u)
    r.sub_(y if alpha == 1.0 else torch.mul(y, alpha, out=scratch_like(y, "nested_side")))  # 1 y is y exactly
    r.div_(delta1)  # in units of Delta1
    coarse = torch.div(r, k, out=scratch_like(r, "nested_coarse")).add_(0.5).floor_().mul_(k)
    return r.sub_(coarse).mul_(alpha * delta1).add_(y)  # y + alpha Delta1 (r - Q2(r)): addition commutes


def nested_rows_into(
    out: torch.Tensor, g: torch.Tensor, kappa: torch.Tensor, base: torch.Tensor, key: torch.Tensor, alpha: float,
    delta1: float, k: int,
) -> torch.Tensor:  # fmt: skip
    """:func:`nested_encode` of ``g / kappa`` (``kappa`` nonzero, shape (rows, 1)) with the counter dither of
    ``(key, index)`` times Delta1, over a ``(rows, size)`` block whose first element has index ``base``, into
    ``out``: one generated loop where compiled."""
    u = counter_dither.dither_rows(g.shape[0], g.shape[1], base, key, g.device) * delta1
    return out.copy_(nested_index(g / kappa, u, delta1, k, alpha))


def nested_index(x: torch.Tensor, u: torch.Tensor, delta1: float, k: int, alpha: float = 1.0) -> torch.Tensor:
    """The arithmetic of :func:`nested_encode` (the same operations in the same order) as one pure expression, the
    index as integer-valued floats."""
    t = (x * alpha + u) / delta1
    coarse = torch.floor(t / k + 0.5) * k
    h = (k - 1) // 2
    v = torch.floor(t + 0.5) - coarse + h
    # |t| <= (1 + Delta1/2) / Delta1; below 2^22 the small remainder's range argument holds
    return (_small_remainder(v, k) if 1.0 / delta1 + 1.0 < SMALL_T else torch.remainder(v, k)) - h


SMALL_T = 2.0**22
"""Bound on |t| (in units of Delta1) under which :func:`_small_remainder` is exact: float32 then holds t, t/k
and their roundings to within 1 of the exact values."""


def _small_remainder(v: torch.Tensor, k: int) -> torch.Tensor:
    """``remainder(v, k)`` of integer-valued ``v`` in [-2k, 3k), as two conditional additions and subtractions of
    k (a generated CPU loop vectorises these; its float remainder costs ~3x the whole encode). For |t| below
    :data:`SMALL_T`, v - h = round(t) - k round(t/k) lies within k/2 + 1/2 of 0 in exact arithmetic, each rounded
    float ``floor`` moves it by at most 1 (the outer one by k), and 0 <= h < k/2: so v lies in
    [-(k + 2), 3k/2 + 2], inside [-2k, 3k). Beyond, rounding t/k can move it by many multiples of k."""
    for _ in range(2):
        v = torch.where(v < 0, v + k, v)
    for _ in range(2):
        v = torch.where(v >= k, v - k, v)
    return v


def nested_reconstruct_rows_in_place(
    out: torch.Tensor, side: torch.Tensor, kappa: torch.Tensor, base: torch.Tensor, key: torch.Tensor,
    alpha: float, delta1: float, k: int,
) -> torch.Tensor:  # fmt: skip
    """``kappa`` times :func:`nested_decode` of the codes ``s`` held in ``out`` (float32,
    :func:`gradstat.theory.kernels.counter_dither.widened`) with side information ``side / kappa`` (``kappa`` of
    shape (rows, 1), possibly 0) and the counter dither of ``(key, index)`` times Delta1, written over ``out``:
    one generated loop where compiled, reading no integer codes (their partial vector loads cost more than one
    conversion before the loop)."""
    u = counter_dither.dither_rows(out.shape[0], out.shape[1], base, key, out.device) * delta1
    y = side / torch.where(kappa > 0, kappa, torch.ones_like(kappa))
    return out.copy_(nested_estimate(out, u, y, delta1, k, alpha) * kappa)


def nested_estimate(
    s: torch.Tensor, u: torch.Tensor, y: torch.Tensor, delta1: float, k: int, alpha: float = 1.0
) -> torch.Tensor:
    """The arithmetic of :func:`nested_decode` (the same operations in the same order) as one pure expression."""
    r = (s * delta1 - u - (y if alpha == 1.0 else y * alpha)) / delta1
    coarse = torch.floor(r / k + 0.5) * k
    return (r - coarse) * (alpha * delta1) + y


NESTED_KERNELS = (
    Fused(nested_rows_into, compiles_on=counter_dither.COMPILES_ON),
    Fused(nested_reconstruct_rows_in_place, compiles_on=counter_dither.COMPILES_ON),
)
"""The counter-dither P2 encode and decode as fused kernels (:mod:`gradstat.theory.kernels.counter_dither`)."""

"""The width floating-point parts are sent at: the gradient's own for 16-bit gradients, float32 otherwise.

A bf16 or fp16 gradient holds 16 bits per value; sending its selected values, scales or factors at 32 bits would
halve the saving against a dense 16-bit all-reduce. So a payload sends its floating parts in :func:`wire_float` of
the gradient's dtype (``Payload.dtype``): bf16 and fp16 as themselves, float32 and float64 gradients in float32
(the width gradstat always used for them). The part's dtype is recorded in the wire header, so the receiver reads
it back at its width and the bits count it (:attr:`Payload.bits` is ``numel * width``).

:func:`to_wire` narrows a float tensor to that dtype:

- ``exact=True``: the values are elements of the gradient (a sparsifier's selection), which the dtype holds
  exactly: a cast, nothing read;
- ``up=True`` (non-negative scales that bound the magnitudes they scale: a bucket's l_inf or l2 norm, NDQSG's
  kappa): rounded towards +inf, so a scale never shrinks below what it bounds, and an encoder that quantizes with
  the sent scale (not the exact one) keeps every code in range and stays unbiased;
- otherwise rounded to nearest (a mean, a low-rank factor).

Where the dtype cannot carry a value (a finite value beyond its range, a nonzero value that would arrive as zero) a
``ValueError`` names the compressor and the value, before anything is sent.
"""

from __future__ import annotations

import math

import torch

NARROW_FLOATS: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
"""Gradient dtypes whose floating parts travel at the gradient's own 16 bits."""

_BITS_OF = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def wire_float(dtype: torch.dtype) -> torch.dtype:
    """The dtype a payload of a ``dtype`` gradient sends its floating parts in: bf16 and fp16 as themselves,
    every other floating dtype as float32."""
    return dtype if dtype in NARROW_FLOATS else torch.float32


def to_wire(
    x: torch.Tensor,
    dtype: torch.dtype,
    who: str,
    what: str,
    *,
    up: bool = False,
    exact: bool = False,
    checked: bool = False,
) -> torch.Tensor:
    """``x`` (finite) in ``dtype`` for the wire (see the module docstring for ``up`` and ``exact``); one read of
    the result, except for a float32 ``x`` sent as float32, for ``exact`` values (nothing to check) and where the
    caller has ``checked`` already (with :func:`wire_flags`, read back with its own values)."""
    out = x.to(dtype)
    if exact or checked or x.numel() == 0 or x.dtype == dtype:
        return out
    if up:
        low = out.to(x.dtype) < x  # rounded down: one step up (x >= 0, so the bits of out order as its values)
        bits = _BITS_OF[dtype]
        out = torch.where(low, (out.view(bits) + 1).view(dtype), out)
    name = str(dtype).removeprefix("torch.")
    info = torch.finfo(dtype)
    flags = _flags(x, out).tolist()  # one read
    ok_finite, ok_nonzero = math.isfinite(flags[0]), not flags[1]
    hint = "(e.g. by a power of two) before compressing"
    if not ok_finite:
        big = float(x.abs().max())
        raise ValueError(
            f"{who}: a {what} of {big:.4g} exceeds {name}'s range ({info.max:.4g}); scale the gradient down {hint}"
        )
    if not ok_nonzero:
        raise ValueError(
            f"{who}: a nonzero {what} below {name}'s smallest value ({info.smallest_normal * info.eps:.3g}) would be "
            f"sent as zero; scale the gradient up {hint}"
        )
    return out


def wire_flags(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What :func:`to_wire` (rounded to nearest) checks of ``x`` sent in ``dtype``, nothing read back: the pair of
    :func:`_flags` (a caller reads it with its own values, then sends with ``checked=True``)."""
    return _flags(x, x.to(dtype))


def _flags(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Of ``x`` as sent in ``out`` (its cast), a float64 pair on ``x``'s device: the largest magnitude sent (not
    finite where a value is beyond the range, or NaN) and 1.0 where a nonzero value arrives as zero, else 0.0."""
    if not out.numel():
        return torch.zeros(2, dtype=torch.float64, device=x.device)
    vanished = ((out == 0) & (x != 0)).any() if x.dtype != out.dtype else torch.zeros((), device=x.device)
    return torch.stack([out.abs().amax().double(), vanished.double()])


def widened(t: torch.Tensor) -> torch.Tensor:
    """A received floating part as the decoders compute with it: 16-bit floats widened to float32 (exact), every
    other dtype as it is."""
    return t.float() if t.dtype in NARROW_FLOATS else t

"""The dithered uniform quantization step shared by QSGD, TernGrad, ECQ-SGD, DQSG, NDQSG and QCS.

Source: DQSG/NDQSG (Abdi & Fekri), Sec. 2.1 (dithered quantization ``x_tilde = Q(x + u) - u``, Theorem 1; half-dithered
``x_h = Q(x + u)``; Lemma 2: QSGD's M-level stochastic quantizer, and TernGrad with M = 1, *is* the half-dithered
quantizer with step 1/M) and Sec. 3.1 (DQSG, eq. (2)); QCS (Abdi & Fekri) eq. (4)-(6) (QCS's step on the
mixed vector, and the 1-bit variant (5)).

One step, in units of the quantizer step (so the step is 1):

    scale   s_b = ||x_b|| per bucket b (l2 or l_inf), sent as one 32-bit value per bucket
    y       = L x / s_b                         L = number of positive levels (y in [-L, L])
    dither  u ~ U[-1/2, 1/2)                    keyed by (call seed, index), or from the seeded generator
    code    c = round(y + u) in {-L..L}         (midtread, 2L + 1 codes)
    value   y_tilde = c - u (dithered)  or  c (half-dithered)  ->  x_tilde = s_b y_tilde / L

``round(y + u)`` is computed as ``floor(y + u + 1/2)`` and clamped to the code range: the two agree except on a
set of probability zero (ties), and the clamp only guards float rounding at ``|y| = L``. With a dither uniform
over one step and no overload, Theorem 1 (Schuchman) makes the dithered error ``y_tilde - y`` uniform on
[-1/2, 1/2] and independent of y; the half-dithered error is unbiased with variance depending on y.

The 1-bit variant (QCS eq. (5)) uses the midrise quantizer with reconstruction points +-1/2 (codes c in {-1, 0},
value c + 1/2): with scale 2 ||v||_inf, ``y + u`` lies in (-1, 1), inside the two cells, so Theorem 1 holds with
the same uniform error. This is how ``q = sign(v/s + u)`` with s = 2||v||_inf must be read for (6)-(7) to hold:
taken literally, ``s (q - u)`` with q = +-1 has mean 2v.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import torch

from gradstat.compressors.base import Compressor, nonfinite_error
from gradstat.compressors.context import Context, generator
from gradstat.compressors.pending import finite
from gradstat.compressors.wire.floats import NARROW_FLOATS, to_wire, widened
from gradstat.compressors.wire.payload import Payload, code_width, float_width
from gradstat.theory.kernels import counter_dither, counter_native
from gradstat.theory.kernels.primitives import (
    all_finite,
    l2_norm,
    l2_norm_rows,
    max_abs,
    max_abs_rows,
    scratch,
    scratch_like,
)

Norm = Literal["l2", "linf"]
DitherSource = Literal["torch", "counter"]

DITHER_STREAM = 1
"""Sub-stream of the call seed from which dithers are drawn (other streams: QCS's Rademacher signs)."""


def draw_dither(numel: int, seed: int, device: torch.device, stream: int = DITHER_STREAM) -> torch.Tensor:
    """``numel`` iid U[-1/2, 1/2) dithers (float32) from the generator of ``(seed, stream)`` on ``device``."""
    gen = generator(seed, device, stream)
    return torch.rand(numel, generator=gen, device=device, dtype=torch.float32) - 0.5


def draw_dither_scratch(numel: int, seed: int, device: torch.device, stream: int = DITHER_STREAM) -> torch.Tensor:
    """:func:`draw_dither`'s numbers, bit for bit, drawn into this thread's dither scratch buffer (no fresh
    d-element tensor; valid until the next call of the same thread, see
    :func:`gradstat.theory.kernels.primitives.scratch`)."""
    out = scratch(numel, torch.float32, torch.device(device), "dither")
    torch.rand(numel, generator=generator(seed, device, stream), out=out)
    return out.sub_(0.5)


# -- the scalar step -----------------------------------------------------------------------------------------------
def quantize(y: torch.Tensor, u: torch.Tensor, lo: int, hi: int, offset: float = 0.0) -> torch.Tensor:
    """Codes ``c`` with ``c + offset`` the point of the lattice ``Z + offset`` nearest to ``y + u``, clamped to
    [lo, hi]. offset 0: midtread (``round``), offset 1/2: midrise (1-bit). Returns the integer codes in
    :func:`code_dtype` ``(lo, hi)``; ``floor(y + u + (1/2 - offset))`` is formed in this thread's scratch buffer
    (no fresh y-sized float tensor), and neither input is changed."""
    t = torch.add(y, u, out=scratch_like(y, "quantize")).add_(0.5 - offset).floor_().clamp_(lo, hi)
    return t.to(code_dtype(lo, hi))


def reconstruct(codes: torch.Tensor, u: torch.Tensor | None, offset: float = 0.0) -> torch.Tensor:
    """``c + offset - u`` (dithered) or ``c + offset`` (half-dithered, ``u`` None), in step units: a fresh float32
    tensor of codes' shape, every step after the conversion in place on it."""
    value = torch.empty(codes.shape, dtype=torch.float32, device=codes.device).copy_(codes)
    if offset:
        value.add_(offset)
    return value.sub_(u) if u is not None else value


def code_dtype(lo: int, hi: int) -> torch.dtype:
    """Smallest integer dtype holding codes in [lo, hi] (what is held in memory; the wire width is separate)."""
    big = max(abs(lo), abs(hi))
    return torch.int8 if big <= 127 else torch.int16 if big <= 32767 else torch.int32


# -- buckets and scales --------------------------------------------------------------------------------------------
def to_buckets(x: torch.Tensor, size: int) -> torch.Tensor:
    """Flat ``x`` of length d as a (ceil(d/size), size) matrix, the last row zero-padded."""
    d = x.numel()
    rows = math.ceil(d / size)
    if rows * size == d:
        return x.reshape(rows, size)
    out = x.new_zeros(rows * size)
    out[:d] = x
    return out.reshape(rows, size)


def bucket_norm(blocks: torch.Tensor, norm: Norm) -> torch.Tensor:
    """Per-row norm of a (rows, size) matrix, shape (rows,): ``l2`` or ``linf``. The l2 norm factors out a power
    of two per row first (:func:`gradstat.theory.kernels.primitives.l2_norm`): no overflow of the squares for huge
    values, no underflow for denormal ones, exact equivariance to power-of-two scalings."""
    if norm == "linf":
        return max_abs(blocks, dim=1)
    if norm == "l2":
        return l2_norm(blocks, dim=1)
    raise ValueError(f"norm must be 'l2' or 'linf', got {norm!r}")


def bucket_rows(x: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`to_buckets` without copying the whole vector: the full buckets as a ``(d // size, size)`` view of flat
    ``x`` and the ragged last bucket zero-padded to ``(1, size)`` (None when ``size`` divides d)."""
    d = x.numel()
    full = d // size
    head = x[: full * size].view(full, size)
    if full * size == d:
        return head, None
    tail = x.new_zeros(1, size)
    tail[0, : d - full * size] = x[full * size :]
    return head, tail


def _row_scales(head: torch.Tensor, tail: torch.Tensor | None, norm: Norm) -> torch.Tensor:
    """:func:`bucket_norm` of the rows of ``head`` and then of ``tail``, bit for bit, without an x-sized temporary."""
    if head.numel() == 0 or norm not in ("l2", "linf"):
        scales = bucket_norm(head, norm)
    elif norm == "l2":
        scales = l2_norm_rows(head)
    else:  # one row (the whole-vector scale): one aminmax pass; more rows: two row reductions; the same values
        scales = max_abs(head.reshape(-1)).reshape(1) if head.shape[0] == 1 else max_abs_rows(head)
    return scales if tail is None else torch.cat((scales, bucket_norm(tail, norm)))


def _per_bucket(op: str, src: torch.Tensor, factor: torch.Tensor, size: int, out: torch.Tensor) -> torch.Tensor:
    """``out = src op factor[b]`` over each bucket b of ``size`` elements of the flat ``src`` (``op``: ``torch.div``
    or ``torch.mul``; ``out`` may be ``src``): the plain form's per-row broadcast, without padding a copy."""
    full = src.numel() // size
    fn = getattr(torch, op)
    fn(src[: full * size].view(full, size), factor[:full, None], out=out[: full * size].view(full, size))
    if full * size < src.numel():
        fn(src[full * size :], factor[full], out=out[full * size :])
    return out


def _counter_rows(
    fn: Callable[..., torch.Tensor],
    out: torch.Tensor,
    src: torch.Tensor | None,
    size: int,
    factor: torch.Tensor,
    key: torch.Tensor,
    args: tuple[object, ...],
) -> torch.Tensor:
    """``fn`` of :mod:`gradstat.theory.kernels.counter_dither` over the full buckets of the flat ``src`` (a view;
    None: ``fn`` reads ``out`` itself) and then its ragged last bucket, writing into the flat ``out``; ``factor[b]`` is
    bucket b's scale."""
    d = out.numel()
    full = d // size

    def part(x: torch.Tensor, head: bool) -> torch.Tensor:
        return x[: full * size].view(full, size) if head else x[full * size :].view(1, -1)

    for head, base in ((True, 0), (False, full * size)):
        if (full if head else d - full * size) > 0:
            block = () if src is None else part(src, head)
            rows = factor[:full, None] if head else factor[full:, None]
            if not _native_rows(fn, part(out, head), block, rows, base, key, args):
                counter_dither.run_rows(fn, part(out, head), block, rows, base, key, *args)
    return out


def _native_rows(
    fn: Callable[..., torch.Tensor],
    out: torch.Tensor,
    block: torch.Tensor | tuple[()],
    factor: torch.Tensor,
    base: int,
    key: torch.Tensor,
    args: tuple[object, ...],
) -> bool:
    """Run ``fn`` over the block in C (:mod:`gradstat.theory.kernels.counter_native`) where that loop exists for it
    and these tensors; False where it does not (the caller runs the compiled kernel or the eager tiles)."""
    if not isinstance(block, torch.Tensor):
        return False
    if fn is counter_dither.quantize_rows_into and counter_native.quantizes(block, factor, out.dtype):
        counter_dither.check_indices(base, block.numel())
        gain, lo, hi, shift, _ = args
        counter_native.quantize_rows_into(out, block, factor, base, key, gain, lo, hi, shift)  # type: ignore[arg-type]
        return True
    if fn is counter_dither.reconstruct_rows_into and counter_native.reconstructs(block, factor):
        counter_dither.check_indices(base, block.numel())
        gain, offset, subtract = args
        counter_native.reconstruct_rows_into(out, block, factor, base, key, gain, offset, subtract)  # type: ignore[arg-type]
        return True
    return False


def _safe(scale: torch.Tensor) -> torch.Tensor:
    """The scale with zeros replaced by ones, for dividing (a zero bucket quantizes to zero codes)."""
    return torch.where(scale > 0, scale, 1.0)


@dataclass(frozen=True)
class ScaledQuantizer:
    """Bucketed, norm-scaled dithered (or half-dithered) uniform quantizer: the one home of the step above.

    Attributes
    ----------
    levels : L >= 1, positive levels: codes in {-L..L} (``2L + 1`` symbols, ``ceil(log2(2L + 1))`` bits each).
    bucket : elements per scale factor; 0 means one bucket for the whole vector.
    norm : scale of each bucket, ``l2`` (QSGD) or ``linf`` (TernGrad, DQSG, QCS).
    subtract : True for dithered quantization (the receiver regenerates and subtracts the dither, so the seed is
        sent), False for half-dithered (codes and scales only).
    onebit : QCS's 1-bit variant (5): midrise points +-1/2 at scale ``2 s_b`` (one bit per code); needs
        ``norm="linf"`` and ``levels=1``.
    dither : where the dither comes from: ``counter`` (default; :mod:`gradstat.theory.kernels.counter_dither`:
        keyed by (seed, index), the same numbers on every device, drawn inside one fused pass) or ``torch`` (the
        ctx-seeded torch generator, stream DITHER_STREAM: a separate draw of d uniforms, ~60-100 ms per 26M on one
        CPU thread, and other numbers on CUDA than on a CPU). Both are U[-1/2, 1/2) in multiples of 2^-24; the
        payloads differ.
    """

    levels: int
    bucket: int = 0
    norm: Norm = "linf"
    subtract: bool = True
    onebit: bool = False
    dither: DitherSource = "counter"

    def __post_init__(self) -> None:
        if not isinstance(self.levels, int) or self.levels < 1:
            raise ValueError(f"quantizer levels must be an integer >= 1, got {self.levels!r}")
        if not isinstance(self.bucket, int) or self.bucket < 0:
            raise ValueError(f"bucket size must be an integer >= 0 (0 = whole vector), got {self.bucket!r}")
        if self.norm not in ("l2", "linf"):
            raise ValueError(f"norm must be 'l2' or 'linf', got {self.norm!r}")
        if self.onebit and (self.norm != "linf" or self.levels != 1):
            raise ValueError("the 1-bit quantizer needs norm='linf' and levels=1")
        if self.dither not in ("torch", "counter"):
            raise ValueError(f"dither must be 'torch' or 'counter', got {self.dither!r}")

    # the lattice: midtread codes -L..L at offset 0, or midrise codes -1, 0 at offset 1/2 on y in [-1/2, 1/2]
    @property
    def _range(self) -> tuple[int, int, float, float]:
        """(lo, hi, offset, y per unit of x/scale)."""
        return (-1, 0, 0.5, 0.5) if self.onebit else (-self.levels, self.levels, 0.0, float(self.levels))

    @property
    def code_width(self) -> int:
        """Bits per code on the wire."""
        return 1 if self.onebit else code_width(2 * self.levels + 1)

    @property
    def reach(self) -> float:
        """Largest reconstruction in units of the bucket scale: 1 half-dithered (a code), and half a step beyond
        the outermost lattice point dithered (``c + offset - u`` with ``u`` down to -1/2): (L + 1/2) / L midtread,
        2 for the 1-bit quantizer."""
        if not self.subtract:
            return 1.0
        lo, hi, offset, gain = self._range
        return (max(abs(lo + offset), abs(hi + offset)) + 0.5) / gain

    def _checked_wire(self, scale: torch.Tensor, source: torch.Tensor | None, who: str) -> torch.Tensor:
        """The bucket scales as sent (float32), after one host sync for float32 scales: that they and the
        reconstructions they reach are finite. Otherwise, before anything is sent: ``source`` (the gradient)
        holding NaN/Inf raises :func:`gradstat.compressors.base.nonfinite_error` naming ``who``; a scale or a
        reconstruction float32 cannot carry raises a clear range error."""
        reach = self.reach
        if scale.dtype == torch.float32 and finite(scale if reach == 1.0 else scale * reach):
            return scale
        if source is not None and not all_finite(scale) and not all_finite(source):
            raise nonfinite_error(source, who)
        wire = to_wire(scale, torch.float32, "quantizer", f"{self.norm} bucket scale")
        self._check_wire(wire, reach)
        return wire

    def _check_wire(self, wire: torch.Tensor, reach: float) -> None:
        """The range errors of :meth:`_checked_wire` for float32 scales ``wire`` (none when all is finite)."""
        if all_finite(wire if reach == 1.0 else wire * reach):
            return
        hint = "scale the gradient down (e.g. by a power of two) before compressing"
        if not all_finite(wire):
            raise ValueError(
                f"quantizer: the {self.norm} norm of a bucket exceeds float32's range (3.4e38) and cannot be sent; "
                + hint
            )
        raise ValueError(
            f"quantizer: a dithered reconstruction reaches {reach:g} times its bucket scale (largest scale "
            f"{float(wire.max()):.4g}), beyond float32's range (3.4e38); {hint}"
        )

    def _narrowed(self, wire: torch.Tensor, scale: torch.Tensor, payload: Payload) -> tuple[torch.Tensor, torch.Tensor]:
        """The scales as sent and as the encoder quantizes with: for a 16-bit gradient (bf16, fp16) the float32
        scales ``wire`` rounded up to its dtype (:func:`~gradstat.compressors.wire.floats.to_wire`), so that each
        still bounds its bucket and the codes reconstruct with the scale the receiver reads (unbiased as before);
        otherwise ``(wire, scale)`` unchanged."""
        if payload.dtype not in NARROW_FLOATS:
            return wire, scale
        sent = to_wire(wire, payload.dtype, "quantizer", f"{self.norm} bucket scale", up=True)
        return sent, sent.to(scale.dtype)

    def bucket_size(self, d: int) -> int:
        return self.bucket if 0 < self.bucket < d else d

    def encode(
        self, x: torch.Tensor, payload: Payload, seed: int, source: torch.Tensor | None = None, who: str = "quantizer"
    ) -> None:
        """Add ``codes`` (d at :attr:`code_width` bits) and ``scales`` (one per bucket: float32, or the gradient's
        dtype for a bf16 or fp16 gradient, rounded up) for flat ``x``.

        The dither comes from ``(seed, DITHER_STREAM)``; the caller sends the seed when :attr:`subtract` is set.
        The scales are the finiteness check of ``source`` (the gradient ``x`` was prepared from; NaN and Inf
        reach every norm): see :meth:`_checked_wire`.
        """
        d = x.numel()
        head, tail = bucket_rows(x, self.bucket_size(d))
        scale = _row_scales(head, tail, self.norm)
        wire, scale = self._narrowed(self._checked_wire(scale, source, who), scale, payload)
        lo, hi, offset, gain = self._range
        if self.dither == "counter":
            codes = torch.empty(d, dtype=code_dtype(lo, hi), device=x.device)
            key = counter_dither.keys(seed, DITHER_STREAM, x.device)
            args = (gain, lo, hi, 0.5 - offset, codes.dtype)
            _counter_rows(counter_dither.quantize_rows_into, codes, x, head.shape[1], _safe(scale), key, args)
            payload.add("codes", codes, self.code_width, "code")
            payload.add("scales", wire, float_width(wire.dtype), "scale")
            return
        # x / s first (correctly rounded, in [-1, 1]) and then the gain: gain / s overflows for denormal scales.
        # Every step in place, in the order of the plain form (encode_reference); y reuses the scratch slot of the
        # l2 norm's scaled copy (dead by now), so an encode holds three x-sized scratch buffers: y, u, y + u.
        y = _per_bucket("div", x, _safe(scale), head.shape[1], scratch(d, x.dtype, x.device, "scaled"))
        codes = quantize(y.mul_(gain), draw_dither_scratch(d, seed, x.device), lo, hi, offset)
        payload.add("codes", codes, self.code_width, "code")
        payload.add("scales", wire, float_width(wire.dtype), "scale")

    def check_payload(self, payload: Payload, d: int) -> None:
        """Refuse (PayloadError naming the part) ``codes`` and ``scales`` that :meth:`decode` cannot read for a
        vector of length ``d``: d integer codes, one floating scale per bucket (shapes and dtypes only)."""
        payload.require("codes", numel=d, integer=True)
        payload.require("scales", numel=self.bucket_count(d), integer=False)

    def proves_finite(self, payload: Payload, spread: float = 1.0) -> bool:
        """Whether every reconstruction :meth:`decode` makes from ``payload`` is finite, shown from the scales alone
        (one read of them, not of the output): a code of the codes' dtype, however corrupt, reaches at most
        ``(max |code| + |offset| + 1/2) / gain`` bucket scales, times ``spread`` (what a caller's mixing multiplies
        by, e.g. QCS's ``sqrt(k)``), with a factor 2 to spare for rounding. False (a scale near float32's limit):
        the caller checks the output itself."""
        codes, scales = payload["codes"], payload["scales"]
        info = torch.iinfo(codes.dtype) if codes.dtype != torch.bool else torch.iinfo(torch.uint8)
        _, _, offset, gain = self._range
        reach = (max(abs(info.min), abs(info.max)) + abs(offset) + 0.5) / gain * spread * 2.0
        return all_finite(scales.float() * reach)

    def decode(self, payload: Payload, d: int, seed: int) -> torch.Tensor:
        """Flat float32 reconstruction of length ``d`` from the ``codes`` and ``scales`` parts."""
        codes, scale = payload["codes"], widened(payload["scales"])
        if codes.numel() != d or scale.numel() != self.bucket_count(d):
            raise ValueError(
                f"quantizer payload holds {codes.numel()} codes and {scale.numel()} scales; {d} elements need {d} "
                f"codes and {self.bucket_count(d)} scales (was it encoded for another shape?)"
            )
        _, _, offset, gain = self._range
        flat = codes.reshape(-1)
        counter = self.dither == "counter" and self.subtract  # half-dithered decoding draws nothing
        one_pass = counter_native.reconstructs(flat, scale) or counter_dither.triton_reconstructs(flat, scale)
        if (counter or not self.subtract) and one_pass:
            # one loop reads the codes as they are (and regenerates the counter dither if any): a C loop at full
            # vector width on a CPU, the Triton kernel on CUDA (where the forms below took three passes or more)
            key = counter_dither.keys(seed, DITHER_STREAM, codes.device)
            out = torch.empty(d, dtype=torch.float32, device=codes.device)
            args = (gain, offset, self.subtract)
            return _counter_rows(counter_dither.reconstruct_rows_into, out, flat, self.bucket_size(d), scale, key, args)
        if counter:
            key = counter_dither.keys(seed, DITHER_STREAM, codes.device)
            wide = counter_dither.widened(flat)  # the fused loop then reads and writes float32 in place
            fn = counter_dither.reconstruct_rows_in_place
            return _counter_rows(fn, wide, None, self.bucket_size(d), scale, key, (gain, offset, self.subtract))
        # in place on the output, in the order of the plain form (decode_reference)
        u = draw_dither_scratch(d, seed, codes.device) if self.subtract else None
        out = reconstruct(codes.reshape(-1), u, offset)
        out = counter_dither.divided(out, gain, out=out)  # (IEEE division on every device)
        return _per_bucket("mul", out, scale, self.bucket_size(d), out)

    def encode_reference(self, x: torch.Tensor, payload: Payload, seed: int) -> None:
        """Plain form of :meth:`encode` (fresh tensors, the whole padded matrix): the same payload, bit for bit."""
        d = x.numel()
        blocks = to_buckets(x, self.bucket_size(d))
        scale = bucket_norm(blocks, self.norm)
        wire, scale = self._narrowed(self._checked_wire(scale, None, "quantizer"), scale, payload)
        lo, hi, offset, gain = self._range
        y = (blocks / _safe(scale)[:, None]).mul_(gain).reshape(-1)[:d]
        codes = torch.floor(y + self._dither_reference(d, seed, x.device) + (0.5 - offset)).clamp_(lo, hi)
        payload.add("codes", codes.to(code_dtype(lo, hi)), self.code_width, "code")
        payload.add("scales", wire, float_width(wire.dtype), "scale")

    def decode_reference(self, payload: Payload, d: int, seed: int) -> torch.Tensor:
        """Plain form of :meth:`decode`: the same values, bit for bit."""
        codes, scale = payload["codes"], widened(payload["scales"])
        lo, hi, offset, gain = self._range
        value = codes.float() + offset if offset else codes.float()
        y = value - self._dither_reference(d, seed, codes.device) if self.subtract else value
        blocks = to_buckets(y, self.bucket_size(d))
        return counter_dither.divided(blocks, gain).mul_(scale[:, None]).reshape(-1)[:d]

    def _dither_reference(self, d: int, seed: int, device: torch.device) -> torch.Tensor:
        """All ``d`` dithers of the plain forms at once: torch's draw, or the counter uniforms of indices 0..d-1."""
        if self.dither == "torch":
            return draw_dither(d, seed, device)
        key = counter_dither.keys(seed, DITHER_STREAM, device)
        base = torch.zeros((), dtype=torch.int32, device=device)
        return counter_dither.dither_rows(1, d, base, key, device).reshape(-1)

    def expected_error(self, x: torch.Tensor) -> torch.Tensor:
        """Exact ``E[||x_tilde - x||^2 | x]`` (0-d float64 tensor) over the dither, for flat ``x``.

        Dithered: each element's error is uniform over one step, so ``sum_b n_b step_b^2 / 12``
        (DQSG/NDQSG (Abdi & Fekri), App. B: ``||g||_inf^2 n Delta^2 / 12`` per partition). Half-dithered: element
        i at fractional position f_i of its cell has variance ``step^2 f_i (1 - f_i)`` (Sec. 2.1.1).
        Here ``step_b = s_b / L`` (``2 s_b`` for 1-bit).
        """
        x = x.reshape(-1).double()
        d = x.numel()
        blocks = to_buckets(x, self.bucket_size(d))
        scale = bucket_norm(blocks, self.norm)
        _, _, offset, gain = self._range
        step = (scale / gain)[:, None].expand_as(blocks)
        if self.subtract:
            per = step**2 / 12.0
        else:
            f = torch.frac((blocks * (gain / _safe(scale))[:, None]).abs() + offset)
            per = step**2 * f * (1.0 - f)
        return per.reshape(-1)[:d].sum()

    def bucket_count(self, d: int) -> int:
        return math.ceil(d / self.bucket_size(d))

    def bits(self, d: int) -> int:
        """Hand count of what :meth:`encode` adds for a vector of length d (without the seed)."""
        return d * self.code_width + 32 * self.bucket_count(d)


class ScaledQuantizerCompressor(Compressor):
    """A compressor that is one :class:`ScaledQuantizer` over the (optionally pre-processed) flat gradient.

    Subclasses implement :meth:`quantizer` (built from their hyper-parameters and the gradient length) and may
    override :meth:`prepare` (e.g. TernGrad's clipping). The seed is sent only when the dither is subtracted.
    """

    defers_checks = True  # (its encode reads back only its finiteness checks)

    def quantizer(self, d: int) -> ScaledQuantizer:
        """The quantizer applied to a flat gradient of length ``d``."""
        raise NotImplementedError

    def prepare(self, g: torch.Tensor) -> torch.Tensor:
        """What is quantized (identity by default)."""
        return g

    def expected_error(self, g: torch.Tensor) -> torch.Tensor:
        """Exact ``E[||C(g) - prepare(g)||^2 | g]`` over the dither (0-d float64 tensor); see
        :meth:`ScaledQuantizer.expected_error`."""
        flat = g.reshape(-1)
        return self.quantizer(flat.numel()).expected_error(self.prepare(flat.float()))

    def _validates_finite(self, flat: torch.Tensor) -> bool:
        """The bucket scales are the check: NaN and Inf in ``g`` reach them through :meth:`prepare` (see
        :meth:`ScaledQuantizer.encode`)."""
        return True

    def _encode(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:
        q = self.quantizer(g.numel())
        q.encode(self.prepare(g), payload, ctx.call_seed, source=g, who=self.name)
        if q.subtract:
            payload.add_seed(ctx.call_seed)
            if q.dither == "torch":  # torch's draws differ between device types: the payload says whose they are
                payload.add_generator(g.device)

    def _decode(self, payload: Payload, ctx: Context, side: torch.Tensor | None) -> torch.Tensor:
        q = self.quantizer(payload.numel)
        seed = payload.seed if q.subtract else 0  # half-dithered decoding draws nothing
        return q.decode(payload, payload.numel, seed)

    def _check_payload(self, payload: Payload) -> None:
        q = self.quantizer(payload.numel)
        q.check_payload(payload, payload.numel)
        if q.subtract:
            payload.seed  # noqa: B018  (present, one integer: a PayloadError otherwise)

    def _proves_finite(self, payload: Payload) -> bool:
        return self.quantizer(payload.numel).proves_finite(payload)

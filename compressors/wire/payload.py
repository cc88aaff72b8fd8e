"""What crosses the network: a :class:`Payload` of named parts, each counted at the width it is sent with.

``Payload.bits`` is exact and host-side: it depends only on tensor shapes (known without a device sync) and on
the declared width of each part, never on values. ``Payload.entropy_bits()`` gives the empirical entropy of the
integer codes beside it (it does read values, so it syncs; call it in analysis, not in hot paths).

Wire format (:meth:`Payload.to_bytes` / :meth:`Payload.from_bytes`): one flat ``uint8`` tensor on the payload's
device, a fixed header followed by the body, every part bit-packed at its declared width
(:mod:`gradstat.compressors.wire.bitpack`), back to back, only the very last byte padded with zeros. So
``8 * len(bytes) == header_bits(parts) + 8 * ceil(payload.bits / 8)``. All multi-byte fields are little-endian.

Header, ``HEADER_PREFIX_BYTES + PART_DESCRIPTOR_BYTES * parts`` bytes (96 + 224 per part bits):

====== ===== =============================================================================================
offset bytes field
====== ===== =============================================================================================
0      2     magic ``b"GS"``
2      1     format version (``WIRE_VERSION``)
3      1     number of parts (at most 255)
4      8     body length in bits (uint64), the exact ``payload.bits``
12     28    one descriptor per part, in the payload's part order:
             name (8 bytes ASCII, zero-padded), kind (1, index into ``PART_KINDS``), in-memory dtype
             (1, index into ``WIRE_DTYPES``), width in bits (1), number of dimensions (1, at most 2),
             dimensions (2 x uint32, unused ones 0), bias (int64)
====== ===== =============================================================================================

Body encodings (chosen from the part's dtype and width; nothing else is needed to read it back):
- floating parts: the IEEE bits of each value; the width must equal the dtype's size (e.g. 32 for float32);
- integer and bool parts at a width >= their dtype's size: two's complement truncated to the width (sign-extended
  when read back into a signed dtype);
- integer parts at a narrower width (bit-packed indices, quantizer codes): ``value - bias`` in ``[0, 2**width)``
  with ``bias`` the part's smallest value, computed on the device and stored in the descriptor, so codes in
  ``{-L..L}`` or ``{0..k-1}`` alike fit ``ceil(log2 levels)`` bits. Serialising checks (one sync per payload)
  that every value fits its declared width and raises otherwise: a wrong width never corrupts silently;
- 64-bit values travel as two 32-bit words (low, high).
A part of kind ``seed`` is read back to the CPU (decoders read seeds on the host); every other part is read back
on the device of the byte tensor.

Bytes from another rank are untrusted: :meth:`Payload.from_bytes` refuses, with a :class:`PayloadError` naming the
part, a header or descriptor that does not describe the bytes (magic, version, lengths, names, kinds, dtypes,
widths a dtype cannot be sent at, a bias that puts values outside their dtype, parts that do not fill the announced
body), an ``index`` part (an index into the flattened original tensor) outside ``[0, numel)`` and a floating part
holding NaN or Inf: one extra read of the index and floating parts only (a sparsifier's k values, a quantizer's
scales), with one host read for all of them.

Random draws: a payload whose decoder regenerates random numbers sends the seed (a ``seed`` part). The counter
hash keyed by ``(seed, index)`` (:mod:`gradstat.theory.kernels.counter_dither`) gives the same numbers on any
device, so such a payload says nothing more. A payload drawn from torch's per-device generator (``dither=torch``)
also sends a ``device`` part (:meth:`Payload.add_generator`, 8 bits, counted): the device type its draws belong
to; :meth:`Payload.check_generator` refuses to decode it elsewhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

from gradstat.compressors.wire import bitpack
from gradstat.compressors.wire.errors import PayloadError
from gradstat.compressors.wire.floats import to_wire, wire_float
from gradstat.theory.kernels.primitives import extremes

SEED_BITS = 64
"""Width at which a payload sends the seed material its decoder needs."""

GENERATOR_BITS = 8
"""Width of the ``device`` part of a payload drawn from torch's per-device generator."""

GENERATOR_DEVICES: tuple[str, ...] = ("cpu", "cuda", "mps", "xpu")
"""Device types whose torch generator a ``device`` part can name (its value is the position here)."""

PartKind = Literal["value", "index", "code", "scale", "threshold", "seed", "mask"]
PART_KINDS: tuple[str, ...] = ("value", "index", "code", "scale", "threshold", "seed", "mask")

WIRE_MAGIC = b"GS"
WIRE_VERSION = 1
HEADER_PREFIX_BYTES = 12
PART_DESCRIPTOR_BYTES = 28
PART_NAME_BYTES = 8
WIRE_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
)


@dataclass(frozen=True)
class Part:
    """One transmitted array.

    Attributes
    ----------
    tensor : the data as held in memory (any dtype; the width below, not the dtype, says what is sent).
    width : bits per element on the wire (e.g. 32 for a float32 value, ``ceil(log2 d)`` for a bit-packed index,
        ``ceil(log2 levels)`` for a quantizer code, 1 for a sign or mask bit).
    kind : what it is; ``code`` and ``index`` parts enter :meth:`Payload.entropy_bits`.
    """

    tensor: torch.Tensor
    width: float
    kind: PartKind

    @property
    def bits(self) -> float:
        return self.tensor.numel() * self.width


@dataclass
class Payload:
    """Encoded message of one worker for one tensor.

    ``numel``, ``shape`` and ``dtype`` describe the original tensor; both sides know them from the model, so they
    are not counted. ``parts`` is everything that is sent. ``info`` holds local diagnostics that are *not*
    sent (e.g. the threshold the encoder used when only the mask is transmitted, stage counts) and never count.
    """

    shape: torch.Size
    dtype: torch.dtype
    parts: dict[str, Part] = field(default_factory=dict)
    info: dict[str, object] = field(default_factory=dict)

    def add(self, name: str, tensor: torch.Tensor, width: float, kind: PartKind) -> torch.Tensor:
        """Add a part and return its tensor (for chaining inside ``encode``)."""
        if name in self.parts:
            raise ValueError(f"payload already has a part named {name!r}")
        if width < 0:
            raise ValueError(f"part {name!r}: width must be >= 0 bits, got {width}")
        self.parts[name] = Part(tensor, float(width), kind)
        return tensor

    def add_floats(
        self,
        name: str,
        x: torch.Tensor,
        kind: PartKind,
        who: str,
        what: str,
        *,
        up: bool = False,
        exact: bool = False,
        checked: bool = False,
    ) -> torch.Tensor:
        """Add floating part ``name`` in the wire dtype of this payload's gradient
        (:func:`~gradstat.compressors.wire.floats.wire_float` of :attr:`dtype`: bf16 and fp16 at their 16 bits,
        float32 otherwise), counted at that width; returns the tensor sent. ``exact``: ``x`` holds elements of the
        gradient (a selection), exact in the gradient's dtype; ``up``: non-negative scales, rounded up (see
        :func:`~gradstat.compressors.wire.floats.to_wire`, which raises where the dtype cannot carry ``x``;
        ``checked``: the caller has checked that already)."""
        dtype = wire_float(self.dtype)
        sent = to_wire(x, dtype, who, what, up=up, exact=exact and dtype == self.dtype, checked=checked)
        return self.add(name, sent, float_width(dtype), kind)

    def add_seed(self, seed: int) -> None:
        """Send the call seed the decoder regenerates the encoder's random draws from: a ``seed`` part of
        ``SEED_BITS`` bits, held as a CPU int64 scalar so reading it back never synchronises a device."""
        self.add("seed", torch.tensor([seed], dtype=torch.int64), SEED_BITS, "seed")

    @property
    def seed(self) -> int:
        """The seed sent with :meth:`add_seed` (a PayloadError where the payload has none, or not one value)."""
        seed = self.require("seed", numel=1, integer=True)
        return int(seed.reshape(-1)[0])  # a CPU tensor (from_bytes reads seeds to the host): no device sync

    @property
    def device(self) -> torch.device:
        """Where the payload's data lives (the first part that is not a seed; the CPU for seeds only)."""
        return next((p.tensor.device for p in self.parts.values() if p.kind != "seed"), torch.device("cpu"))

    def add_generator(self, device: torch.device | str) -> None:
        """Record that the payload's random draws come from torch's generator on ``device``'s type, which gives
        other numbers on another device type: a ``device`` part of ``GENERATOR_BITS`` bits (a CPU uint8)."""
        kind = torch.device(device).type
        if kind not in GENERATOR_DEVICES:
            raise ValueError(f"torch's generator on a {kind!r} device cannot be recorded; known: {GENERATOR_DEVICES}")
        self.add("device", torch.tensor([GENERATOR_DEVICES.index(kind)], dtype=torch.uint8), GENERATOR_BITS, "seed")

    def check_generator(self, device: torch.device | str, who: str) -> None:
        """Refuse to decode, on ``device``, a payload drawn from torch's generator on another device type (its
        random numbers would differ there, so the reconstruction would be silently wrong); a payload without a
        ``device`` part was drawn from the counter hash, the same on every device."""
        if "device" not in self.parts:
            return
        code = int(self.require("device", numel=1, integer=True).reshape(-1)[0])
        if not 0 <= code < len(GENERATOR_DEVICES):
            raise PayloadError(f"names generator device {code}, not one of 0..{len(GENERATOR_DEVICES) - 1}", "device")
        here, there = torch.device(device).type, GENERATOR_DEVICES[code]
        if here != there:
            raise PayloadError(
                f"{who}: this payload's random numbers were drawn from torch's {there} generator (dither=torch), "
                f"which draws other numbers on {here}: decode it on a {there} device, or encode with dither=counter "
                "(the same numbers on every device)",
                "device",
            )

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self.parts[name].tensor
        except KeyError:
            raise MissingPartError(f"payload has no part {name!r}; parts are {sorted(self.parts)}") from None

    def require(
        self,
        name: str,
        numel: int | None = None,
        integer: bool | None = None,
        at_most: int | None = None,
        shape: tuple[int, ...] | None = None,
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """The tensor of part ``name``, checked as a decoder needs it: present, with ``numel`` elements (or at
        most ``at_most``, or exactly ``shape``), integer (``integer=True``: an integer or bool dtype) or floating
        (``False``), or exactly ``dtype``. Reads only shapes and dtypes (no device sync); raises
        :class:`PayloadError` naming the part otherwise."""
        t = self[name]
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise PayloadError(f"has shape {tuple(t.shape)} where {tuple(shape)} is expected", name)
        if dtype is not None and t.dtype != dtype:
            raise PayloadError(f"has dtype {t.dtype} where {dtype} is expected", name)
        if numel is not None and t.numel() != numel:
            raise PayloadError(
                f"holds {t.numel()} elements where {numel} are expected (was it encoded for another shape or "
                "compressor?)",
                name,
            )
        if at_most is not None and t.numel() > at_most:
            raise PayloadError(f"holds {t.numel()} elements, more than the {at_most} it can hold", name)
        if integer is not None and t.is_floating_point() == integer:
            raise PayloadError(
                f"has dtype {t.dtype}; {'an integer' if integer else 'a floating'} dtype is expected", name
            )
        return t

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def bits(self) -> int:
        """Exact size on the wire in bits (fractional widths, e.g. log2(3) for ternary codes, are rounded up once)."""
        return math.ceil(sum(p.bits for p in self.parts.values()))

    def bits_by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for p in self.parts.values():
            out[p.kind] = out.get(p.kind, 0.0) + p.bits
        return out

    def entropy_bits(self) -> float:
        """Size if the ``code`` and ``index`` parts were entropy-coded at their empirical entropy (zeroth order);
        every other part keeps its width. Reported beside :attr:`bits`, never instead of it."""
        total = 0.0
        for p in self.parts.values():
            if p.kind in ("code", "index", "mask") and p.tensor.numel() > 0:
                total += p.tensor.numel() * empirical_entropy(p.tensor)
            else:
                total += p.bits
        return total

    @property
    def gain(self) -> float:
        """Compression gain: 32 bits per element of the original over the exact bits sent."""
        return 32.0 * self.numel / max(self.bits, 1)

    # -- wire format --------------------------------------------------------------------------------------------
    @property
    def header_bits(self) -> int:
        """Bits of the wire header of this payload (:func:`header_bits`)."""
        return header_bits(len(self.parts))

    @property
    def wire_bytes(self) -> int:
        """Length of :meth:`to_bytes` in bytes, known without serialising: header + ``ceil(bits / 8)``."""
        return self.header_bits // 8 + bitpack.packed_bytes(self.bits)

    def to_bytes(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The payload as one flat ``uint8`` tensor (see the module docstring for the layout) on ``device``
        (default: the device of the first part that is not a seed). Raises ValueError for a part that cannot
        be sent at its declared width (a fractional width, a float at a width other than its size, a value that
        does not fit)."""
        return _to_bytes(self, device)

    @classmethod
    def from_bytes(cls, data: torch.Tensor, shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> "Payload":
        """Read a payload written by :meth:`to_bytes`. ``shape`` and ``dtype`` describe the original tensor (both
        sides know them from the model; they are not sent). Trailing bytes after the body (padding added for a
        collective) are ignored. The bytes are untrusted (another rank's): raises :class:`PayloadError` naming the part
        (or the header) for bytes that are not a payload ``to_bytes`` writes, an index outside the tensor and a
        floating value that is NaN or Inf (see the module docstring)."""
        return _from_bytes(data, torch.Size(shape), dtype)


class MissingPartError(PayloadError, KeyError):
    """A part a decoder needs is not in the payload (also a KeyError, what a missing name raised before)."""

    def __str__(self) -> str:
        return str(self.args[0])  # the message as it is (KeyError would quote it)


def empirical_entropy(codes: torch.Tensor) -> float:
    """Zeroth-order empirical entropy of integer symbols, in bits per symbol."""
    if codes.numel() == 0:
        return 0.0
    _, counts = torch.unique(codes.reshape(-1), return_counts=True)
    p = counts.double() / codes.numel()
    return float(-(p * torch.log2(p)).sum())


def index_width(d: int, packed: bool = True) -> int:
    """Bits per index into a vector of length ``d``: ``ceil(log2 d)`` bit-packed (at least 1), else 32 (int32)."""
    if d < 1:
        raise ValueError(f"vector length must be >= 1, got {d}")
    return max(1, math.ceil(math.log2(d))) if packed else 32


def code_width(levels: int) -> int:
    """Bits per integer code taking ``levels`` distinct values: ``ceil(log2 levels)``."""
    if levels < 2:
        raise ValueError(f"a code needs at least 2 levels, got {levels}")
    return math.ceil(math.log2(levels))


def float_width(dtype: torch.dtype) -> int:
    """Bits of one floating-point value sent in ``dtype``."""
    return torch.finfo(dtype).bits


# -- wire format ----------------------------------------------------------------------------------------------------
def header_bits(parts: int) -> int:
    """Bits of the wire header of a payload of ``parts`` parts: ``8 * (12 + 28 * parts)``."""
    return 8 * (HEADER_PREFIX_BYTES + PART_DESCRIPTOR_BYTES * parts)


def _dtype_bits(dtype: torch.dtype) -> int:
    return (
        1 if dtype == torch.bool else (torch.finfo(dtype).bits if dtype.is_floating_point else torch.iinfo(dtype).bits)
    )


_SAME_SIZE_INT = {16: torch.int16, 32: torch.int32, 64: torch.int64}


def _wire_words(
    name: str, part: Part, device: torch.device
) -> tuple[torch.Tensor, int, torch.Tensor | None, torch.Tensor | None]:
    """(unsigned words to pack, bits per word, bias or None, "the values fit the width" as a 0-d bool tensor or
    None) of one part; 64-bit parts as 32-bit word pairs.

    Words are handed to :func:`bitpack.pack` in the narrowest dtype that holds them (a part sent at its dtype's own
    size is a view of its bytes; one-byte codes minus their bias stay one byte, the subtraction wrapping modulo 256
    where the values fit the width); wider integer parts sent below their size are widened to int64 for the bias
    subtraction."""
    t = part.tensor.detach().reshape(-1).to(device)
    width, size = int(part.width), _dtype_bits(part.tensor.dtype)
    problem = _width_problem(t.dtype, width)
    if problem:
        raise ValueError(f"part {name!r}: {problem}")
    if t.dtype.is_floating_point:
        t = t.view(_SAME_SIZE_INT[size])
    elif width < size:
        if not t.numel():
            return t, width, torch.zeros((), dtype=torch.int64, device=device), None
        lo, hi = (m.to(torch.int64) for m in torch.aminmax(t))  # one pass: the bias and the spread
        fits = hi - lo < (1 << width)
        if t.dtype in (torch.int8, torch.uint8):
            return t.view(torch.uint8) - lo.to(torch.uint8), width, lo, fits
        return t.to(torch.int64) - lo, width, lo, fits
    if width == 64:
        return bitpack.split_words(t), 32, None, None
    return t, width, None, None


def _to_bytes(payload: Payload, device: torch.device | str | None) -> torch.Tensor:
    if len(payload.parts) > 255:
        raise ValueError(f"a payload can send at most 255 parts, this one has {len(payload.parts)}")
    if device is None:
        devices = [p.tensor.device for p in payload.parts.values() if p.kind != "seed"]
        device = devices[0] if devices else torch.device("cpu")
    device = torch.device(device)
    prefix = bytearray(WIRE_MAGIC) + bytes([WIRE_VERSION, len(payload.parts)])
    body_bits = 0
    descriptors: list[torch.Tensor] = []
    runs: list[tuple[torch.Tensor, int, int]] = []
    fits: list[torch.Tensor] = []
    for name, part in payload.parts.items():
        if not float(part.width).is_integer() or part.width < 1:
            raise ValueError(f"part {name!r}: width {part.width} bits cannot be bit-packed (need an integer >= 1)")
        raw = name.encode("ascii", errors="replace")
        if len(raw) > PART_NAME_BYTES or not name.isascii() or not name.isprintable() or " " in name or not name:
            raise ValueError(f"part name {name!r} is not 1 to {PART_NAME_BYTES} printable ASCII characters")
        shape = tuple(part.tensor.shape)
        if len(shape) > 2 or any(s >= 2**32 for s in shape):
            raise ValueError(f"part {name!r}: shape {shape} cannot be described (at most 2 dimensions < 2**32)")
        if part.tensor.dtype not in WIRE_DTYPES:
            raise ValueError(f"part {name!r}: dtype {part.tensor.dtype} is not one of {WIRE_DTYPES}")
        words, word_width, bias, fit = _wire_words(name, part, device)
        if fit is not None:
            fits.append(fit)
        runs.append((words, word_width, body_bits))
        body_bits += words.numel() * word_width
        static = (
            raw.ljust(PART_NAME_BYTES, b"\0")
            + bytes([PART_KINDS.index(part.kind), WIRE_DTYPES.index(part.tensor.dtype), int(part.width), len(shape)])
            + b"".join(int(s).to_bytes(4, "little") for s in (list(shape) + [0, 0])[:2])
        )
        bias_t = bias if bias is not None else torch.zeros((), dtype=torch.int64, device=device)
        descriptors += [_host_bytes(static, device), bias_t.reshape(1).view(torch.uint8)]
    prefix += int(body_bits).to_bytes(8, "little")
    if fits and not bool(torch.stack(fits).all()):  # one sync for all parts
        raise ValueError("a part holds values that do not fit its declared width (the compressor's bit count is wrong)")
    head = header_bits(len(payload.parts)) // 8
    out = torch.zeros(head + bitpack.packed_bytes(body_bits), dtype=torch.uint8, device=device)
    torch.cat([_host_bytes(bytes(prefix), device), *descriptors], out=out[:head])
    body = out[head:]
    for words, word_width, base in runs:
        bitpack.write_bits(body, bitpack.pack(words, word_width), base)
    return out


def _host_bytes(data: bytes, device: torch.device) -> torch.Tensor:
    return torch.tensor(list(data), dtype=torch.uint8).to(device)


def _from_bytes(data: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> Payload:
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.dim() != 1:
        raise PayloadError(f"payload bytes must be a 1-D uint8 tensor, got {getattr(data, 'dtype', type(data))}")
    n = data.numel()
    if n < HEADER_PREFIX_BYTES:
        raise PayloadError(f"payload bytes: {n} bytes is shorter than the {HEADER_PREFIX_BYTES}-byte header prefix")
    prefix = bytes(data[:HEADER_PREFIX_BYTES].cpu().tolist())
    if prefix[:2] != WIRE_MAGIC or prefix[2] != WIRE_VERSION:
        raise PayloadError(f"payload bytes: bad magic/version {prefix[:3]!r} (expected {WIRE_MAGIC!r} version 1)")
    parts, body_bits = prefix[3], int.from_bytes(prefix[4:12], "little")
    head = header_bits(parts) // 8
    if n < head + bitpack.packed_bytes(body_bits):
        raise PayloadError(f"payload bytes: {n} bytes, the header announces {head + bitpack.packed_bytes(body_bits)}")
    desc = bytes(data[HEADER_PREFIX_BYTES:head].cpu().tolist())
    layouts = [_descriptor(desc[i * PART_DESCRIPTOR_BYTES : (i + 1) * PART_DESCRIPTOR_BYTES], i) for i in range(parts)]
    names = [layout[0] for layout in layouts]
    if len(set(names)) != len(names):
        raise PayloadError(f"payload bytes: part names repeat ({names})")
    filled = sum(_run_bits(layout[4], layout[3]) for layout in layouts)
    if filled != body_bits:
        raise PayloadError(
            f"payload bytes: the parts' descriptors fill {filled} bits, the header announces {body_bits}"
        )
    stream = data[head : head + bitpack.packed_bytes(body_bits)]
    payload = Payload(shape=shape, dtype=dtype)
    numel_of_tensor = math.prod(shape)
    base = 0
    checks: list[tuple[str, str, torch.Tensor]] = []  # (part, what is required, 0-d bool), read in one sync
    for i, (name, kind, part_dtype, width, dims) in enumerate(layouts):
        bias_offset = HEADER_PREFIX_BYTES + i * PART_DESCRIPTOR_BYTES + 20
        bias = data[bias_offset : bias_offset + 8].clone().view(torch.int64)
        values, base = _read_part(stream, math.prod(dims), width, part_dtype, bias, base)
        values = values.reshape(dims)
        if values.numel() and part_dtype.is_floating_point:
            lo, hi = extremes(values)
            checks.append((name, "finite values (no NaN or Inf)", torch.isfinite(torch.stack((lo, hi))).all()))
        elif values.numel() and kind == "index":
            lo, hi = torch.aminmax(values.reshape(-1))
            checks.append((name, f"indices in [0, {numel_of_tensor})", (lo >= 0) & (hi < numel_of_tensor)))
        payload.add(name, values.cpu() if kind == "seed" else values, width, kind)  # type: ignore[arg-type]
    if checks:
        passed = torch.stack([c[2] for c in checks]).tolist()  # one host read for every part
        for (name, what, _), ok in zip(checks, passed, strict=True):
            if not ok:
                raise PayloadError(f"holds values outside what is allowed: {what}", name)
    return payload


def _descriptor(d: bytes, i: int) -> tuple[str, str, torch.dtype, int, list[int]]:
    """(name, kind, dtype, width, dimensions) of descriptor ``i``; PayloadError for one no ``to_bytes`` writes."""
    raw = d[:PART_NAME_BYTES].rstrip(b"\0")
    if not raw or any(not 0x20 < c < 0x7F for c in raw):
        raise PayloadError(f"payload bytes: the name of part {i} is not printable ASCII ({raw!r})")
    name = raw.decode("ascii")
    kind_i, dtype_i, width, ndim = d[8], d[9], d[10], d[11]
    if kind_i >= len(PART_KINDS):
        raise PayloadError(f"kind {kind_i} is not one of 0..{len(PART_KINDS) - 1} ({PART_KINDS})", name)
    if dtype_i >= len(WIRE_DTYPES):
        raise PayloadError(f"dtype {dtype_i} is not one of 0..{len(WIRE_DTYPES) - 1}", name)
    if ndim > 2:
        raise PayloadError(f"{ndim} dimensions; at most 2 are sent", name)
    dims = [int.from_bytes(d[12 + 4 * j : 16 + 4 * j], "little") for j in range(2)]
    if any(dims[ndim:]):
        raise PayloadError(f"unused dimensions must be 0, got {dims[ndim:]}", name)
    part_dtype = WIRE_DTYPES[dtype_i]
    kind = PART_KINDS[kind_i]
    if kind in ("index", "seed") and (part_dtype.is_floating_point or part_dtype == torch.bool):
        raise PayloadError(f"a part of kind {kind!r} holds integers, not {part_dtype}", name)
    problem = _width_problem(part_dtype, width)
    if problem:
        raise PayloadError(problem, name)
    bias = int.from_bytes(d[20:28], "little", signed=True)
    size = _dtype_bits(part_dtype)
    if width >= size or part_dtype.is_floating_point:
        if bias:
            raise PayloadError(f"a part sent at its dtype's size has bias 0, got {bias}", name)
    else:
        info = torch.iinfo(part_dtype)
        if bias < info.min or bias + (1 << width) - 1 > info.max:
            raise PayloadError(
                f"bias {bias} with {width}-bit offsets reaches outside {part_dtype}'s [{info.min}, {info.max}]", name
            )
    return name, kind, part_dtype, width, dims[:ndim]


def _width_problem(dtype: torch.dtype, width: int) -> str | None:
    """Why ``dtype`` cannot be sent at ``width`` bits (None: it can); what ``to_bytes`` writes and ``from_bytes``
    reads are the same set."""
    size = _dtype_bits(dtype)
    if width < 1:
        return f"width {width} bits; at least 1 is needed"
    if dtype.is_floating_point and width != size:
        return f"a {dtype} part is sent at its own {size} bits, not {width}"
    if dtype != torch.bool and width > size:
        return f"a {dtype} part is sent at most at its own {size} bits, not {width}"
    if width > bitpack.MAX_WIDTH and width != 64:
        return f"widths above {bitpack.MAX_WIDTH} bits other than 64 are not supported, got {width}"
    return None


def _run_bits(dims: list[int], width: int) -> int:
    """Bits of a part of ``dims`` at ``width`` bits per value (64-bit values as two 32-bit words)."""
    return (2 * 32 if width == 64 else width) * math.prod(dims)


def _read_part(
    stream: torch.Tensor, numel: int, width: int, dtype: torch.dtype, bias: torch.Tensor, base: int
) -> tuple[torch.Tensor, int]:
    """One part's values (in ``dtype``) and the bit where the next part starts."""
    size = _dtype_bits(dtype)
    bits = _run_bits([numel], width)
    if base + bits > 8 * stream.numel():
        raise PayloadError(
            f"payload bytes: a part of {bits} bits from bit {base} runs past the {stream.numel()}-byte body"
        )
    raw = bitpack.read_bits(stream, base, bitpack.packed_bytes(bits))
    end = base + bits
    if width == size and width % 8 == 0:  # the part's own bytes (IEEE bits, two's complement): a copy, no unpacking
        return raw.clone().view(dtype), end
    if width == 64:
        return bitpack.join_words(bitpack.unpack_bytes(raw, 2 * numel, 32)).to(dtype), end
    v = bitpack.unpack_bytes(raw, numel, width)
    if dtype.is_floating_point:
        return bitpack.sign_extend(v.to(torch.int64), width).to(_SAME_SIZE_INT[size]).view(dtype), end
    if width < size:
        if size == 8:  # one-byte codes: add the bias modulo 256 (exact for values that fit the width)
            return torch.add(v, bias.to(torch.uint8)).view(dtype), end
        return (v.to(torch.int64) + bias).to(dtype), end
    if dtype == torch.bool:
        return (v.view(torch.bool) if width == 1 else v.bool()), end  # one-bit values are 0 or 1: a view
    signed = dtype != torch.uint8
    return (bitpack.sign_extend(v.to(torch.int64), width) if signed else v).to(dtype), end

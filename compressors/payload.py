"""What crosses the network: a :class:`Payload` of named parts, each counted at the width it is sent with.

``Payload.bits`` is exact and host-side: it depends only on tensor shapes (known without a device sync) and on
the declared width of each part, never on values. ``Payload.entropy_bits()`` gives the empirical entropy of the
integer codes beside it (it does read values, so it syncs; call it in analysis, not in hot paths).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

SEED_BITS = 64
"""Width at which a payload sends the seed material its decoder needs."""

PartKind = Literal["value", "index", "code", "scale", "threshold", "seed", "mask"]


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

    def add_seed(self, seed: int) -> None:
        """Send the call seed the decoder regenerates the encoder's random draws from: a ``seed`` part of
        ``SEED_BITS`` bits, held as a CPU int64 scalar so reading it back never synchronises a device."""
        self.add("seed", torch.tensor([seed], dtype=torch.int64), SEED_BITS, "seed")

    @property
    def seed(self) -> int:
        """The seed sent with :meth:`add_seed`."""
        return int(self["seed"][0])

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self.parts[name].tensor
        except KeyError:
            raise KeyError(f"payload has no part {name!r}; parts are {sorted(self.parts)}") from None

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

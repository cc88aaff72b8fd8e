"""The one error a receiver raises for a payload it cannot trust: :class:`PayloadError`.

Bytes from another rank are untrusted input. :meth:`gradstat.compressors.wire.payload.Payload.from_bytes` and every
compressor's ``decode`` check what they read (lengths, widths, dtypes, index ranges, finiteness, the generator that
drew the payload's random numbers) and raise this error, naming the part that is wrong, instead of an ``IndexError``,
a ``KeyError`` or a silently wrong (NaN, Inf) reconstruction.
"""

from __future__ import annotations


class PayloadError(ValueError):
    """A payload (or its bytes) that cannot be decoded: what is wrong and, where one is to blame, which part.

    A ``ValueError``, so callers that already catch bad input keep working; ``part`` is the name of the part at
    fault (None for the header or the payload as a whole)."""

    def __init__(self, message: str, part: str | None = None) -> None:
        super().__init__(message if part is None else f"payload part {part!r}: {message}")
        self.part = part

"""Seeds from integer keys: the one derivation behind every generator and every counter-hash key.

A seed depends only on its keys (a BLAKE2b digest of their decimal forms), never on the platform, the device, the
process or the order of calls, so a decoder rebuilt elsewhere regenerates exactly what the encoder drew.
"""

from __future__ import annotations

import hashlib


def derive_seed(*keys: int) -> int:
    """A 63-bit seed from integer keys (stable across runs, platforms and devices)."""
    h = hashlib.blake2b(b",".join(str(int(k)).encode() for k in keys), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)

"""Bits on the wire per scheme: codes at their width plus the scale factors and seeds that are sent.

Two packings of integer codes are offered everywhere:

- ``"fixed"``: ``ceil(log2 L)`` bits per code of an alphabet of ``L`` symbols (what a plain bit-packed stream
  sends, and what ``compressors.payload.code_width`` counts);
- ``"ideal"``: ``log2 L`` bits per code (several codes packed into one word, or an arithmetic coder on a uniform
  alphabet). The papers' tables use this one: e.g. DQSG/NDQSG (Abdi & Fekri), Table 1, DQSG with M = 1 on
  FC-300-100 (266,610 values, 6 tensors) is 266,610 log2(3) + 6 * 32 bits = 422.8 Kbits.

Entropy coding of the codes (which the papers report separately) is an empirical quantity of the data and is
not a closed form; it is not computed here.
"""

from __future__ import annotations

import math

import numpy as np

from gradstat.theory import _checks
from gradstat.theory.dqsg import nesting_ratio

__all__ = [
    "PACKINGS",
    "code_bits",
    "dqsg_bits",
    "ndqsg_bits",
    "qsgd_bits",
    "qsgd_elias_bits_bound",
    "elias_gamma_length",
    "qsgd_elias_bits",
    "terngrad_bits",
    "one_bit_bits",
    "one_bit_columns",
    "qcs_bits",
    "variable_length_bits_bound",
]

PACKINGS = ("fixed", "ideal")


def code_bits(alphabet_size: int, packing: str = "fixed") -> float:
    """Bits per code of an alphabet of ``alphabet_size`` (>= 2) symbols: ``ceil(log2 L)`` or ``log2 L``."""
    size = _checks.integer("alphabet_size", alphabet_size, minimum=2)
    packing = _checks.choice("packing", packing, PACKINGS)
    return float(math.ceil(math.log2(size))) if packing == "fixed" else math.log2(size)


def _count(name: str, value: object) -> int:
    return _checks.integer(name, value, minimum=0)


def dqsg_bits(n: int, M: int, partitions: int = 1, scale_bits: int = 32, packing: str = "fixed") -> float:
    """Bits of one DQSG message: ``n`` codes in ``{-M..M}`` plus one scale factor per partition.

    Source: DQSG/NDQSG (Abdi & Fekri), eq. (2) (``Delta = 1/M``, ``2M+1`` levels), Algorithm 1 (send ``kappa_p``
    and ``q_p``; the dither seed is advanced by a predetermined rule on both sides, so it is not sent) and the
    remark after (4) (``K`` partitions cost ``K b`` bits of scale factors).

    Parameters
    ----------
    n : number of values, >= 1.
    M : levels per sign, >= 1 (``Delta = 1/M``).
    partitions : K, number of separately scaled partitions, in ``[1, n]``.
    scale_bits : b, bits per scale factor.
    packing : ``"fixed"`` or ``"ideal"`` (see module docstring).
    """
    n = _checks.integer("n", n, minimum=1)
    M = _checks.integer("M", M, minimum=1)
    partitions = _checks.integer("partitions", partitions, minimum=1, maximum=n)
    return n * code_bits(2 * M + 1, packing) + partitions * _count("scale_bits", scale_bits)


def ndqsg_bits(
    n: int, delta1: float, delta2: float, partitions: int = 0, scale_bits: int = 32, packing: str = "fixed"
) -> float:
    """Bits of one NDQSG message: ``n`` nested indices of ``Delta2/Delta1`` symbols each, plus scale factors.

    Source: DQSG/NDQSG (Abdi & Fekri), Sec. 3.2 after (9): ``log2(Delta2/Delta1)`` bits per value instead of about
    ``log2(2/Delta1)``. Algorithm 2 as printed sends only ``s_p`` (``partitions = 0``, the default); the
    experiment of Sec. 4 (422.8 Kbits for FC-300-100 with ``Delta1 = 1/3, Delta2 = 1``) matches one 32-bit scale
    per tensor (``partitions = 6``), as for DQSG.

    ``Delta2 / Delta1`` must be an integer > 1 (nested quantizers, Sec. 2.2).
    """
    n = _checks.integer("n", n, minimum=1)
    ratio = nesting_ratio(delta1, delta2)
    partitions = _checks.integer("partitions", partitions, minimum=0, maximum=n)
    return n * code_bits(ratio, packing) + partitions * _count("scale_bits", scale_bits)


def qsgd_bits(n: int, s: int, scale_bits: int = 32, packing: str = "fixed", partitions: int = 1) -> float:
    """Bits of one QSGD message without entropy coding: ``n`` codes in ``{-s..s}`` plus one 32-bit norm per
    separately scaled partition (``partitions``; one per tensor when a model is sent tensor by tensor).

    Source: Alistarh et al. 2017, Sec. 3 (sign and level of each coordinate, one float norm), as used for the
    QSGD column of NDQSG (Abdi & Fekri, Nested Dithered Quantization), Table 1, whose cells (422.8 Kbits on
    FC-300-100, 2636.7 on LeNet) are ``n log2(3)`` plus one scale per tensor. ECQ-SGD sends the same:
    ``r = ceil(log2(2s + 1))`` bits per element plus one 32-bit scale (``packing="fixed"``); the summary's
    "32 + d bits" total drops the factor r.
    """
    n = _checks.integer("n", n, minimum=1)
    s = _checks.integer("s", s, minimum=1)
    partitions = _checks.integer("partitions", partitions, minimum=1, maximum=n)
    return n * code_bits(2 * s + 1, packing) + partitions * _count("scale_bits", scale_bits)


def qsgd_elias_bits_bound(n: int, s: int, scale_bits: int = 32) -> float:
    """Expected-bits bound of QSGD with Elias coding of gaps and levels (o(1) term dropped)::

        (3 + 1.5 * log2(2 (s^2 + n) / (s (s + sqrt(n))))) * s (s + sqrt(n)) + 32

    Source: Alistarh et al. 2017, *QSGD*, Theorem 3.2 (cited by QCS (Abdi & Fekri) and
    DQSG/NDQSG (Abdi & Fekri); the QSGD paper itself is not among the seeds, so this is transcribed from it, not
    checked against a seed file). It bounds the *expected* code length for any input; it is meaningful in the
    sparse regime ``s << sqrt(n)`` (for ``s = sqrt(n)`` it exceeds the plain ``n log2(2s+1)``).
    """
    n = _checks.integer("n", n, minimum=1)
    s = _checks.integer("s", s, minimum=1)
    nnz = s * (s + math.sqrt(n))
    return (3.0 + 1.5 * math.log2(2.0 * (s * s + n) / nnz)) * nnz + _count("scale_bits", scale_bits)


def elias_gamma_length(x: np.ndarray) -> np.ndarray:
    """Length in bits of the Elias gamma code of each positive integer: ``2 floor(log2 x) + 1``."""
    x = np.asarray(x)
    if x.size and (not np.issubdtype(x.dtype, np.integer) or x.min() < 1):
        raise ValueError("elias_gamma_length needs integers >= 1")
    # floor(log2 x) exactly, via the bit length of each integer
    return 2 * (np.frexp(x.astype(np.float64))[1] - 1) + 1


def qsgd_elias_bits(codes: np.ndarray, scale_bits: int = 32) -> int:
    """Exact length of one concrete Elias encoding of a QSGD code vector (signed levels in ``{-s..s}``).

    Encoding (after Alistarh et al. 2017, Sec. 3.2, with Elias gamma as the integer code): the float norm, then
    for each nonzero code in order: Elias gamma of the gap to the previous nonzero position (first gap counted
    from position -1, so every gap is >= 1), one sign bit, Elias gamma of ``|level|``.

    Returns
    -------
    int, bits.
    """
    codes = np.asarray(codes).reshape(-1)
    if codes.size == 0:
        raise ValueError("codes must have at least one element")
    if not np.issubdtype(codes.dtype, np.integer):
        raise TypeError(f"codes must be integers, got dtype {codes.dtype}")
    pos = np.flatnonzero(codes)
    if pos.size == 0:
        return _count("scale_bits", scale_bits)
    gaps = np.diff(np.concatenate(([-1], pos)))
    levels = np.abs(codes[pos])
    body = elias_gamma_length(gaps).sum() + pos.size + elias_gamma_length(levels).sum()
    return int(body) + _count("scale_bits", scale_bits)


def terngrad_bits(n: int, scale_bits: int = 32, packing: str = "fixed", partitions: int = 1) -> float:
    """Bits of one TernGrad message: ``n`` ternary codes plus one scale per partition (one per tensor when sent
    tensor by tensor, TernGrad's per-layer scaler).

    Source: NDQSG (Abdi & Fekri, Nested Dithered Quantization), Sec. 2.1.1 (TernGrad is the stochastic quantizer
    with M = 1).
    """
    n = _checks.integer("n", n, minimum=1)
    partitions = _checks.integer("partitions", partitions, minimum=1, maximum=n)
    return n * code_bits(3, packing) + partitions * _count("scale_bits", scale_bits)


def one_bit_columns(shapes: list[tuple[int, ...]], rule: str = "matrix") -> int:
    """Number of columns (each with two reconstruction values) of a model sent tensor by tensor with 1-bit SGD.

    ``rule="matrix"``: a tensor of shape (r, ...) is the matrix (r, numel / r) (what
    :mod:`gradstat.compressors.schemes.quantizers.onebit` does): Linear (out, in) has ``in`` columns, a convolution
    (out, in, kh, kw) has ``in kh kw``, a 1-D tensor one column. ``rule="last"``: the last dimension's size (``in`` for
    a Linear, ``kw`` for a convolution, 1 for a 1-D tensor). NDQSG's Table 1 one-bit cells fit ``"matrix"`` on
    FC-300-100 (1,187 columns); its LeNet cell implies 3,663 columns, which ``"last"`` comes within one of (3,662).
    """
    rule = _checks.choice("rule", rule, ("matrix", "last"))
    total = 0
    for shape in shapes:
        if len(shape) < 2:
            total += 1
        elif rule == "matrix":
            total += math.prod(shape[1:])
        else:
            total += shape[-1]
    return total


def one_bit_bits(n: int, columns: int = 1, scale_bits: int = 32) -> float:
    """Bits of 1-bit SGD (Seide et al. 2014): one sign bit per value plus two reconstruction values per column.

    Source: the One-Bit column of DQSG/NDQSG (Abdi & Fekri), Table 1, matches this count: FC-300-100 with columns
    784 + 300 + 100 of the weight matrices and one column per bias vector (3) gives
    ``266,610 + 2 * 32 * 1,187 = 342,578`` bits = 342.6 Kbits.

    Parameters
    ----------
    n : number of values.
    columns : number of columns, each with its own pair of reconstruction values, in ``[1, n]``.
    scale_bits : bits per reconstruction value.
    """
    n = _checks.integer("n", n, minimum=1)
    columns = _checks.integer("columns", columns, minimum=1, maximum=n)
    return n + 2.0 * columns * _count("scale_bits", scale_bits)


def qcs_bits(n: int, k: int, Q: int | None, scale_bits: int = 32, seed_bits: int = 64, packing: str = "fixed") -> float:
    """Bits of one QCS block: ``k`` codes, the scale factor and the seed of ``r`` and ``u``.

    Source: QCS (Abdi & Fekri), (4)-(5) and Algorithm 1: codes in ``{-Q..Q}`` (``2Q+1`` symbols) or, for
    the 1-bit variant (``Q=None``), signs (1 bit each); one scale ``varsigma`` per block; the seed from which the
    receiver regenerates the Rademacher signs and the dither (0 bits if it is derived from shared state).
    """
    n = _checks.integer("n", n, minimum=1)
    k = _checks.integer("k", k, minimum=1, maximum=n)
    per_code = 1.0 if Q is None else code_bits(2 * _checks.integer("Q", Q, minimum=1) + 1, packing)
    return k * per_code + _count("scale_bits", scale_bits) + _count("seed_bits", seed_bits)


def variable_length_bits_bound(level_counts: np.ndarray) -> float:
    """Length bound of a variable-length (Huffman-type) code of the quantization levels: ``sum_k d_k log2(d/d_k)``.

    Source: ECQ-SGD (Wu et al.) (ECQ-SGD, encoding paragraph): with ``d_k`` coordinates at level ``k`` of the
    ``2s + 1`` levels, the whole code needs at most this many bits (the scale factor comes on top). It equals
    ``d`` times the empirical entropy of the levels.

    Parameters
    ----------
    level_counts : counts ``d_k`` >= 0 per level (zeros allowed), at least one positive.
    """
    counts = _checks.vector("level_counts", level_counts)
    if np.any(counts < 0) or not np.any(counts > 0):
        raise ValueError("level_counts must be >= 0 with at least one positive count")
    d = counts.sum()
    used = counts[counts > 0]
    return float(np.sum(used * np.log2(d / used)))

"""Counter-based dither: U[-1/2, 1/2) numbers keyed by ``(seed, index)``, fused into the quantizer's one pass.

Why: torch's CPU generator draws 26M float32 uniforms in ~60-150 ms on one thread (a ceiling of ~1-2 GB/s for any
dithered quantizer), and its per-device generators give different numbers on CPU and CUDA. Here element ``i`` of a
quantized vector gets ``u_i = hash(i; key) / 2^32``, rounded down to a multiple of 2^-24, with ``hash`` a keyed
32-bit integer mixer read as a signed number, so any device computes the same ``u_i`` from the seed alone, and the
draw can be fused with the scale, floor, clamp and cast of
:class:`gradstat.compressors.schemes.quantizers.dither.ScaledQuantizer` into one generated loop (``torch.compile``).

The hash: two rounds of multiply, xor-shift, multiply on 32-bit words (the core of MurmurHash3's ``fmix32``;
multipliers 0x7FEB352D and 0x5BD1E995), keyed by xoring the two 32-bit halves of ``derive_seed(seed, stream)``
into the index before the first round and between the rounds, after the first round's high half is folded into its
low one (``x ^ (x >>> 16)``). The top 24 bits of the last product, read as a signed number (an
arithmetic shift) and times 2^-24, are an exact float32 in [-1/2, 1/2). A product's high bits depend on all of its
input's bits, so ``fmix32``'s closing fold, which only carries them down to the low bits, is left out: it cost
~10 ms per 26M elements on one CPU thread, a fifth of the fused loop. The arithmetic is
int32 with wrapping multiplication and logical shifts written as arithmetic shifts plus masks (the same bits as
uint32 arithmetic): AVX2 has 32-bit but no 64-bit vector multiplies, so int64 arithmetic runs ~4x slower on a CPU.
Indices are int32, so one call quantizes at most 2^31 - 1 elements.

It is the quantizers' default dither. On a CPU, float32 values with int8 codes (every quantizer of at most 127
levels, and NDQSG's nested worker) run the same arithmetic in C loops
(:mod:`gradstat.theory.kernels.counter_native`, about twice as fast as the generated loop, equal bit for bit); the
compiled kernels below serve the other cases where they compile (on a CPU only: :data:`COMPILES_ON`). On CUDA the
quantize, reconstruct and sign kernels run as one hand-written Triton kernel each
(:mod:`gradstat.theory.kernels.triton_dither`, :func:`triton_for`). Eager torch is the reference and the fallback
(no compiler, vectors below the compile threshold, ``GRADSTAT_COMPILE=never``, a GPU without Triton, another kernel
on a GPU, or a compile error): the same
functions, run op by op (on a CPU over chunks of rows, so that the temporaries stay in cache). Compiled and eager
results are equal bit for bit (``tests/compressors/test_counter_dither.py``); the first compiled call of a process pays
the compile (seconds); later calls reuse it at any length (``dynamic=True``), each dtype, constant set and
row count of 0 or 1 building its own variant once.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import sys
from collections.abc import Iterator
from typing import Any, Callable

import torch

from gradstat.theory.kernels import counter_native, native, policy, triton_dither, triton_runtime
from gradstat.theory.kernels.fused import Fused
from gradstat.theory.kernels.seeds import derive_seed

MULTIPLIERS = (0x7FEB352D, 0x5BD1E995)
"""Odd 32-bit multipliers of the two mixing rounds (below 2^31, so they are also positive int32 constants)."""

MAX_ELEMENTS = 2**31 - 1
"""Most elements one call may index (int32 counters)."""

CHUNK_ELEMENTS = 1 << 18
"""Elements per chunk of the eager path (a few MB of int32 temporaries: they stay in cache)."""


def keys(seed: int, stream: int, device: torch.device | str) -> torch.Tensor:
    """The two 32-bit key words of ``(seed, stream)`` as an int32 tensor of shape (2,) on ``device`` (a tensor,
    so that a new seed does not recompile the fused kernels). While a graph is being captured
    (:func:`slots_for_keys`), a slot that is filled before each replay instead."""
    slots = _SLOTS.get()
    if slots is not None:
        return slots.take(seed, stream, torch.device(device))
    # filled on the device (a copy from host memory would wait for the device's queue): one int64 fill whose two
    # 32-bit halves, low first in memory, are the key words (three launches, two fills and a stack, before)
    if sys.byteorder != "little":  # (no such GPU; a big-endian CPU gets the words one by one)
        return torch.stack([_int32(w, device) for w in key_words(seed, stream)])
    low, high = key_words(seed, stream)
    packed = (high << 32) | (low & 0xFFFFFFFF)  # (signed: high carries the sign)
    return torch.full((1,), packed, dtype=torch.int64, device=device).view(torch.int32)


def key_words(seed: int, stream: int) -> tuple[int, int]:
    """The two key words of ``(seed, stream)`` as signed 32-bit host integers (low word first)."""
    k = derive_seed(seed, stream)
    low, high = (k & 0xFFFFFFFF, (k >> 32) & 0xFFFFFFFF)
    return (low - (1 << 32) if low >= 1 << 31 else low, high - (1 << 32) if high >= 1 << 31 else high)


KEY_SLOTS = 8
"""Keys one captured encode may draw (each a slot of :class:`KeySlots`; the most any rule draws today is 2)."""


SLOT_WORDS = 4
"""int32 words per row of :class:`KeySlots`' buffer: a key's two, then two unused (a row of 16 bytes)."""


class KeySlots:
    """The keys an encode draws while it is captured as a CUDA graph: each :func:`keys` call of the capture gets a
    slot of its own, which no captured kernel writes; :meth:`fill` writes the keys of a call's seed into every one
    (two small launches each) before that call's replay, so the replay draws that call's numbers. Every key of an
    encode is drawn from its call seed (``Context.call_seed``) and a stream: a key of another seed cannot be
    refilled from the call seed, and the capture refuses it (:class:`ValueError`), as it refuses every key where the
    call seed is None, a key on another device, and more than :data:`KEY_SLOTS` keys.

    The slots are rows of one buffer allocated on ``device`` when the object is made, before the capture: memory
    allocated during a capture comes from the graph's private pool, which gives a later allocation of the capture
    the block of a temporary freed earlier in it, so a slot allocated there could share its memory with a temporary
    that the replay's earlier kernels overwrite after the fill (what the first H100 run of these graphs showed:
    reports/gpu/2026-11-26T1948Z.md). Each row is :data:`SLOT_WORDS` words wide, so that every slot starts on a
    16-byte boundary as a freshly allocated key does: Triton builds a kernel variant per pointer alignment (16 bytes
    or not), and a slot of another alignment than the warm-up's key would make it build (and load) a new variant
    during the capture, which CUDA refuses while a stream is captured."""

    def __init__(self, call_seed: int | None, device: torch.device | str = "cpu", capacity: int = KEY_SLOTS) -> None:
        self.call_seed = call_seed
        with torch.inference_mode(False):  # (an ordinary tensor: refilled in place in either mode, whichever made it)
            rows = capacity if call_seed is not None else 0
            self.buffer = torch.empty((rows, SLOT_WORDS), dtype=torch.int32, device=device)
        self.slots: list[tuple[torch.Tensor, int]] = []

    def take(self, seed: int, stream: int, device: torch.device) -> torch.Tensor:
        if self.call_seed is None or seed != self.call_seed:
            raise ValueError(f"a key of seed {seed} is not the call seed {self.call_seed}'s: it cannot be refilled")
        if torch.device(device) != self.buffer.device:
            raise ValueError(f"a key on {device} is not on the captured device {self.buffer.device}")
        if len(self.slots) == self.buffer.shape[0]:
            raise ValueError(f"the capture draws more than {self.buffer.shape[0]} keys")
        slot = self.buffer[len(self.slots), :2]
        self.slots.append((slot, stream))
        return slot

    def fill(self, call_seed: int) -> None:
        for slot, stream in self.slots:
            for i, word in enumerate(key_words(call_seed, stream)):
                slot[i].fill_(word)


_SLOTS: contextvars.ContextVar[KeySlots | None] = contextvars.ContextVar("gradstat_key_slots", default=None)


@contextlib.contextmanager
def slots_for_keys(slots: KeySlots) -> Iterator[KeySlots]:
    """While the block runs (a graph's capture), :func:`keys` hands out ``slots``' tensors instead of filling keys."""
    token = _SLOTS.set(slots)
    try:
        yield slots
    finally:
        _SLOTS.reset(token)


def _int32(value: int, device: torch.device | str) -> torch.Tensor:
    """A 0-d int32 tensor filled on ``device`` (no host-to-device copy, so no wait on a GPU's queue)."""
    return torch.full((), value, dtype=torch.int32, device=device)


def _shift_right(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int32 bit patterns (an arithmetic shift, then the sign-extended bits masked off)."""
    return (x >> s) & ((1 << (32 - s)) - 1)


def _round(x: torch.Tensor) -> torch.Tensor:
    """Multiply, xor-shift by 15, multiply: the core of ``fmix32`` (wrapping int32 products)."""
    x = x * MULTIPLIERS[0]
    x = x ^ _shift_right(x, 15)
    return x * MULTIPLIERS[1]


def _fold(x: torch.Tensor) -> torch.Tensor:
    """``x ^ (x >>> 16)``: the well-mixed high half folded into the low one."""
    return x ^ _shift_right(x, 16)


def counter_bits(rows: int, size: int, base: torch.Tensor, key: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The hash (int32 bit patterns) of the elements ``base + r size + c`` of a ``(rows, size)`` block; ``base``
    a 0-d int32 tensor."""
    index = base + torch.arange(rows, device=device, dtype=torch.int32)[:, None] * size
    return hash_at(index + torch.arange(size, device=device, dtype=torch.int32), key)


def hash_at(index: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The hash (int32 bit patterns) of the int32 counters ``index`` (any shape): element i's of any block."""
    return _round(_fold(_round(index ^ key[0])) ^ key[1])


def dither_rows(rows: int, size: int, base: torch.Tensor, key: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Counter dithers in [-1/2, 1/2) (float32, multiples of 2^-24) of the elements ``base + r size + c`` of a
    ``(rows, size)`` block; ``base`` a 0-d int32 tensor. The top 24 bits of the hash read as a signed number
    (an arithmetic shift), times 2^-24: uniform over the 2^24 multiples of 2^-24 in [-1/2, 1/2)."""
    return (counter_bits(rows, size, base, key, device) >> 8).to(torch.float32) * (2.0**-24)


def sign_rows(rows: int, size: int, base: torch.Tensor, key: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Counter Rademacher signs (float32 +-1, each with probability 1/2): -1 where the hash's top bit is set."""
    h = counter_bits(rows, size, base, key, device)
    return torch.where(h < 0, -1.0, 1.0)


def indices(n: int, d: int, key: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``n`` indices of ``range(d)`` drawn with replacement (int64): ``floor(h d / 2^32)`` of the 32-bit hash of
    each of the elements ``0 .. n - 1``, offset by 2^31 into ``h`` in ``[0, 2^32)`` (Lemire, "Fast random integer
    generation in an interval", 2019, without its rejection step: each index has probability within ``1 / 2^32``
    of ``1 / d``). The same on every device."""
    if d < 1:
        raise ValueError(f"indices into a vector of length {d} do not exist")
    check_indices(0, max(n, d))
    device = torch.device(device)
    out = torch.empty((1, n), dtype=torch.int64, device=device)
    if device.type == "cpu":  # (gradstat's C loop where it is built and allowed; else the reference over one tile)
        if counter_native.samples(out):
            return counter_native.sample_indices_into(out, 0, key, d).reshape(-1)
        return sample_indices_into(out, torch.ones((1, 1)), torch.zeros((), dtype=torch.int32), key, d).reshape(-1)
    # elsewhere the Triton kernel's one pass where it runs (the eager hash: twenty passes)
    return run_rows(KERNELS["sample_indices_into"], out, (), torch.ones((1, 1), device=device), 0, key, d).reshape(-1)


def sample_indices_into(
    out: torch.Tensor, row_factor: torch.Tensor, base: torch.Tensor, key: torch.Tensor, d: int
) -> torch.Tensor:
    """``floor((h + 2^31) d / 2^32)`` (int64) of the hash h of every element of the ``(rows, size)`` block ``out``
    (first index ``base``; ``row_factor`` unread): :func:`indices`' draws."""
    h = counter_bits(out.shape[0], out.shape[1], base, key, out.device)
    return out.copy_(((h.to(torch.int64) + (1 << 31)) * d) >> 32)


SUBSET_INDEX_BITS = 31
"""Bits of the element index in a :func:`subset` sort key (indices are below 2^31: int32 counters)."""

SUBSET_MARGIN_SIGMAS = 6.0
"""A CPU :func:`subset` first keeps the elements whose hash lies below a cut expected to pass ``k`` plus this many
binomial standard deviations; fewer than ``k`` passing (probability about 1e-9) falls back to the full sort."""


def subset(d: int, k: int, key: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``k`` distinct indices of ``range(d)``, increasing (int64): the ``k`` elements of smallest hash.

    Random-k by sorting random keys (the k smallest of d i.i.d. uniforms are a uniform k-subset, by symmetry;
    Knuth, TAOCP vol. 2, Sec. 3.4.2): each element's key is its 32-bit hash read as a signed number (offset by
    2^31), with its index in the low :data:`SUBSET_INDEX_BITS` bits, so keys are distinct (a 32-bit hash repeats
    among millions of elements: the index breaks ties the same way everywhere) and the subset does not depend on
    the device or on how ``torch.topk`` orders equal keys. The same indices on every device from the seed alone.

    On a CPU only the elements whose hash lies below a cut (``k`` plus :data:`SUBSET_MARGIN_SIGMAS` standard
    deviations expected) are kept and sorted: the k smallest keys lie among them whenever at least k pass, so the
    result is the same as the full sort's. They are found by gradstat's C loop
    (:func:`gradstat.theory.kernels.counter_native.hashes_below`) where the extension is in use, else by the torch
    hash in cache-sized chunks. Elsewhere (a GPU) one
    ``torch.topk`` over all keys (no host read-back)."""
    if not 0 <= k <= d:
        raise ValueError(f"a subset of {k} elements of {d} does not exist")
    check_indices(0, d)
    device = torch.device(device)
    if device.type == "cpu":
        margin = k + SUBSET_MARGIN_SIGMAS * k**0.5 + 16
        # P(h < cut) = margin / d; a cut past every int32 hash would keep them all: the full sort below
        cut = -(1 << 31) + math.ceil(margin / d * 2**32) if margin < d else 1 << 31
        if cut < 1 << 31:
            if native.extension() is not None:  # gradstat's C loop: the candidates' sort keys in one pass
                candidates = counter_native.hashes_below(d, cut, key, math.ceil(margin))
                if candidates.numel() >= k:
                    return k_smallest_keys(candidates, k)
            else:
                hashes, picks = [], []
                for start in range(0, d, CHUNK_ELEMENTS):
                    h = counter_bits(1, min(CHUNK_ELEMENTS, d - start), _int32(start, device), key, device)
                    kept = torch.nonzero(h.reshape(-1) < cut).reshape(-1)
                    hashes.append(h.reshape(-1).index_select(0, kept))
                    picks.append(kept.add_(start))
                if sum(p.numel() for p in picks) >= k:
                    return k_smallest(torch.cat(hashes), torch.cat(picks), k)
    h = counter_bits(1, d, torch.zeros((), dtype=torch.int32, device=device), key, device).reshape(-1)
    return k_smallest(h, torch.arange(d, dtype=torch.int64, device=device), k)


def hashes_below(key: torch.Tensor, d: int, cut: int, expected: int = 0) -> torch.Tensor:
    """The sort keys ``((h + 2^31) << 31) + i`` (int64, :func:`k_smallest_keys`' keys) of the counters ``i < d``
    whose signed hash ``h`` lies below ``cut``, in increasing ``i``: :func:`subset`'s candidates on a CPU, where
    gradstat's C loop computes them (:func:`gradstat.theory.kernels.counter_native.hashes_below`; ``expected``, about
    how many pass, sizes its buffers). This plain form over the whole vector is the reference."""
    h = counter_bits(1, d, torch.zeros((), dtype=torch.int32, device=key.device), key, key.device).reshape(-1)
    kept = torch.nonzero(h.to(torch.int64) < cut).reshape(-1)  # (in int64: an int32 comparison wraps the cut)
    return sort_keys(h.index_select(0, kept), kept)


def hash_keys_into(out: torch.Tensor, row_factor: torch.Tensor, base: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """``2^31 - h`` in float32 of the hash h of every element of the ``(rows, size)`` block ``out`` (first index
    ``base``; ``row_factor`` unread): a key that falls as the hash rises (never rises: the int32 to float32
    conversion and the subtraction are monotone; 0 for the 64 largest hashes), which
    :func:`gradstat.theory.kernels.bounded.random_subset` selects by a threshold."""
    h = counter_bits(out.shape[0], out.shape[1], base, key, out.device)
    return out.copy_(2147483648.0 - h.to(torch.float32))


def subset_room(d: int, margin: float) -> int:
    """The buffer of :func:`gradstat.theory.kernels.bounded.random_subset` for a cut expected to pass ``margin`` of
    ``d`` elements: that many plus :data:`SUBSET_MARGIN_SIGMAS` standard deviations, plus the elements whose hash
    lies past the cut but shares its float32 key (up to 256 hash values, about ``256 d / 2^32`` elements: a float32
    near 2^32 is a multiple of 256), plus 64; at most d."""
    shared = math.ceil(256 * d / 2**32)
    return max(0, min(d, math.ceil(margin + SUBSET_MARGIN_SIGMAS * max(margin, 0.0) ** 0.5) + shared + 64))


def k_smallest(hashes: torch.Tensor, index: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` indices of smallest ``(hash, index)`` key among ``index`` (int64), increasing (see :func:`subset`)."""
    return k_smallest_keys(sort_keys(hashes, index), k)


def sort_keys(hashes: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The int64 sort keys ``((h + 2^31) << 31) + i`` of the int32 hashes ``h`` of the counters ``index`` (int64):
    by hash, then by index (see :func:`subset`; gradstat's C loop forms the same keys)."""
    return ((hashes.to(torch.int64) + (1 << 31)) << SUBSET_INDEX_BITS).add_(index)


def k_smallest_keys(order: torch.Tensor, k: int) -> torch.Tensor:
    """The indices (the low :data:`SUBSET_INDEX_BITS` bits) of the ``k`` smallest int64 sort keys ``order``,
    increasing."""
    chosen = torch.topk(order, k, largest=False, sorted=False).values
    return chosen.bitwise_and_((1 << SUBSET_INDEX_BITS) - 1).sort().values


def signed_rows_into(
    out: torch.Tensor, x: torch.Tensor, row_factor: torch.Tensor, base: torch.Tensor, key: torch.Tensor, divide: bool
) -> torch.Tensor:
    """``out = r * x``, divided by ``row_factor`` (shape (rows, 1)) when ``divide``, of a ``(rows, size)`` block,
    ``r`` the :func:`sign_rows` of its elements (``r * x`` as a negation where r = -1: the same bits)."""
    h = counter_bits(x.shape[0], x.shape[1], base, key, x.device)
    signed = torch.where(h < 0, -x, x)
    return out.copy_(signed / row_factor if divide else signed)


def quantize_rows(
    x: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, key: torch.Tensor, gain: float, lo: int, hi: int,
    shift: float, dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """Codes ``clamp(floor(x / scale * gain + u + shift), lo, hi)`` of a ``(rows, size)`` block, ``scale`` of shape
    (rows, 1), ``u`` the counter dither in [-1/2, 1/2) of the block's elements; in ``dtype``."""
    u = dither_rows(x.shape[0], x.shape[1], base, key, x.device)
    y = x / scale * gain
    return torch.floor(y + u + shift).clamp(lo, hi).to(dtype)


def reconstruct_rows(
    codes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, key: torch.Tensor, gain: float, offset: float,
    subtract: bool,
) -> torch.Tensor:  # fmt: skip
    """``(codes + offset - u) / gain * scale`` (``- u`` only when ``subtract``) of a ``(rows, size)`` block,
    float32."""
    value = codes.to(torch.float32) + offset
    if subtract:
        value = value - dither_rows(codes.shape[0], codes.shape[1], base, key, codes.device)
    return divided(value, gain) * scale


def divided(x: torch.Tensor, divisor: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x / divisor`` rounded once (IEEE division) on every device: divided by a 0-d tensor of ``x``'s dtype on its
    device. torch's CUDA division by a host number multiplies by its rounded reciprocal instead (two roundings: at
    gain 7, half of a decode's values differ in the last bit from the CPU's), so a plain ``x / divisor`` would decode
    differently on CUDA and on a CPU. ``out``: where to write (``x`` itself for in place)."""
    return torch.div(x, torch.full((), divisor, dtype=x.dtype, device=x.device), out=out)


def widened(codes: torch.Tensor) -> torch.Tensor:
    """The integer ``codes`` as a fresh float32 tensor (the conversion a decode reads them through; exact for
    codes below 2^24 in magnitude), for a decode loop to rewrite in place. Compiled on a CPU, a loop that reads
    int8 codes next to float32 values loads each group of 8 codes through a stack buffer (torch's partial vector
    load): DQSG's decode at 26M went from 64-74 to ~41 ms with this conversion first."""
    return torch.empty(codes.shape, dtype=torch.float32, device=codes.device).copy_(codes)


def quantize_rows_into(out: torch.Tensor, *args: object) -> torch.Tensor:
    """``out.copy_(quantize_rows(*args))``: a compiled form writes the codes straight into ``out``."""
    return out.copy_(quantize_rows(*args))  # type: ignore[arg-type]


def reconstruct_rows_into(out: torch.Tensor, *args: object) -> torch.Tensor:
    """``out.copy_(reconstruct_rows(*args))``: a compiled form writes the values straight into ``out``."""
    return out.copy_(reconstruct_rows(*args))  # type: ignore[arg-type]


def reconstruct_rows_in_place(out: torch.Tensor, *args: object) -> torch.Tensor:
    """``out.copy_(reconstruct_rows(out, *args))``: ``out`` holds the codes (:func:`widened`) and receives the
    values (one tensor: a compiled graph given two views of one buffer may write either back last)."""
    return out.copy_(reconstruct_rows(out, *args))  # type: ignore[arg-type]


COMPILES_ON = ("cpu",)
"""The devices the counter-dither kernels run compiled on. On CUDA (one H100, torch 2.11.0+cu130, Triton's code
generated by torch.compile) the compiled quantize, reconstruct and signed rows gave other values than their eager
reference (codes saturated at +-levels: reports/gpu/2026-11-26T1245Z.md, tests/kernels/test_equivalence.py); until
a CUDA run shows them equal they are not used there: the Triton form runs instead (:func:`triton_for`), else the
eager tiles. (Compiling them for CUDA would also need :func:`divided` kept exact there: inductor turns a division by
a constant into a product by its reciprocal on devices other than the CPU, and may see the constant through
``torch.full``.)"""

KERNELS = {
    f.__name__: Fused(f, compiles_on=COMPILES_ON)
    for f in (
        quantize_rows_into,
        reconstruct_rows_into,
        reconstruct_rows_in_place,
        signed_rows_into,
        hash_keys_into,
        sample_indices_into,
    )
}
"""The fused forms (one generated loop each where compiled; :mod:`gradstat.theory.kernels.fused`, whose policy
``GRADSTAT_COMPILE`` they follow: under ``auto``, CPU vectors from ``MIN_ELEMENTS`` up, where the loop saves
tens of milliseconds per call and a build of seconds pays for itself; smaller ones run the eager tiles)."""


TRITON_FALLBACK = triton_runtime.Fallback("the Triton counter-dither kernel", policy.ENV)
"""Set once the Triton form has failed in this process (reported once; the eager tiles run from then on)."""


def triton_for(
    name: str, out: torch.Tensor, blocks: tuple[torch.Tensor, ...], row_factor: torch.Tensor, rest: tuple[Any, ...] = ()
) -> bool:
    """Whether :func:`run_rows` computes the kernel ``name`` by its Triton form
    (:mod:`gradstat.theory.kernels.triton_dither`, one pass instead of the eager hash's twenty): on CUDA, where the
    compiled kernels do not run, Triton is installed, the policy (``GRADSTAT_COMPILE``) is not ``never``, the form
    has not failed in this process and it handles these tensors."""
    return (
        out.device.type == "cuda"
        and policy.policy() != "never"
        and not TRITON_FALLBACK.is_set()
        and triton_dither.applies(name, out, blocks, row_factor, rest)
    )


def triton_reconstructs(codes: torch.Tensor, scale: torch.Tensor) -> bool:
    """Whether a reconstruction of the flat ``codes`` with the per-bucket float32 ``scale`` runs as the Triton
    kernel's one pass (:func:`run_rows` of ``reconstruct_rows_into``: the codes read as they are, the float32 output
    written once): on CUDA, where :func:`triton_for` allows it for such tensors."""
    return (
        codes.device.type == "cuda"
        and codes.numel() <= MAX_ELEMENTS
        and scale.dtype == torch.float32
        and scale.device == codes.device
        and codes.is_contiguous()
        and codes.dtype in triton_dither.CODE_DTYPES
        and policy.policy() != "never"
        and not TRITON_FALLBACK.is_set()
        and triton_runtime.available()
    )


READ_OUT = ("reconstruct_rows_in_place", "hash_keys_into", "sample_indices_into")
"""The kernels of :data:`KERNELS` with no input block (they read ``out`` itself, or nothing but their counters)."""


def triton_form(name: str) -> Callable[..., torch.Tensor]:
    """The Triton form of the kernel ``name`` of :data:`KERNELS` with its reference's arguments (for the catalog)."""
    inputs = 0 if name in READ_OUT else 1

    def run(out: torch.Tensor, *args: Any) -> torch.Tensor:
        blocks, (row_factor, base, key, *rest) = args[:inputs], args[inputs:]
        return triton_dither.run(name, MULTIPLIERS, out, blocks, row_factor, base, key, *rest)

    return run


def triton_form_applies(name: str) -> Callable[..., bool]:
    """Whether :func:`triton_form` of ``name`` exists for these arguments (CPU tensors: interpreted)."""
    inputs = 0 if name in READ_OUT else 1
    return lambda out, *args: triton_dither.applies(name, out, args[:inputs], args[inputs], args[inputs + 3 :])


def check_indices(base: int, n: int) -> None:
    """A clear error where elements ``base .. base + n - 1`` would run past the int32 counters."""
    if base + n > MAX_ELEMENTS:
        raise ValueError(
            f"counter dither: indices run to {base + n:,}, beyond {MAX_ELEMENTS:,} (int32 counters); "
            "compress the tensor in parts or use dither=torch"
        )


def run_rows(
    fn: Callable[..., torch.Tensor] | Fused,
    out: torch.Tensor,
    block: torch.Tensor | tuple[torch.Tensor, ...],
    row_factor: torch.Tensor,
    base: int,
    key: torch.Tensor,
    *rest: object,
    compiled: bool = True,
) -> torch.Tensor:
    """``fn(out, *blocks, row_factor, base, key, *rest)`` over 2-D ``block`` (one tensor, or a tuple of tensors of
    one shape, each tiled alike; an empty tuple for a kernel that reads ``out`` itself) and ``out`` of that shape,
    whose first element has index ``base``, ``row_factor`` of shape (rows, 1): compiled where the policy allows (a
    failed build or run warns once and computes eagerly), else by its Triton form on CUDA (:func:`triton_for`), else
    eager over tiles. ``fn``: a function of
    :data:`KERNELS` or a :class:`Fused` kernel of another module."""
    blocks = block if isinstance(block, tuple) else (block,)
    rows, size = (blocks[0] if blocks else out).shape
    check_indices(base, rows * size)
    device = out.device

    def at(r: int, c: int = 0) -> torch.Tensor:
        return _int32(base + r * size + c, device)

    kernel = fn if isinstance(fn, Fused) else KERNELS[fn.__name__]
    if compiled and kernel.compiled_for(out):
        kernel(out, *blocks, row_factor, at(0), key, *rest)  # a failed build or run warns once and runs eagerly
        return out
    if compiled and triton_for(kernel.name, out, blocks, row_factor, rest):
        try:
            return triton_dither.run(kernel.name, MULTIPLIERS, out, blocks, row_factor, at(0), key, *rest)
        except Exception as exc:  # noqa: BLE001 - any build or launch failure falls back to the eager tiles
            TRITON_FALLBACK.report(exc)
    # eager: on a CPU, tiles of about CHUNK_ELEMENTS (whole rows, or pieces of one long row), so temporaries stay in
    # cache; elsewhere one tile (a GPU reads at its bandwidth, and each tile costs a launch per operation)
    if device.type != "cpu":
        rstep, cstep = max(rows, 1), max(size, 1)
    elif size <= CHUNK_ELEMENTS:
        rstep, cstep = max(1, CHUNK_ELEMENTS // max(size, 1)), size
    else:
        rstep, cstep = 1, CHUNK_ELEMENTS
    for r in range(0, rows, rstep):
        for c in range(0, size, cstep):
            tile = (slice(r, r + rstep), slice(c, c + cstep))
            kernel.reference(out[tile], *(b[tile] for b in blocks), row_factor[r : r + rstep], at(r, c), key, *rest)
    return out

"""Peer bytes are untrusted input: mutated payloads of every registered compressor, read with ``Payload.from_bytes``
and decoded, either raise :class:`PayloadError` or decode to a finite tensor of the right shape: never another
exception type, never a hang, never NaN/Inf without an error.

Mutations (seeded, per compressor and payload form): random bit flips anywhere, bit flips and byte overwrites in the
header, truncation, extension, header field changes (part count, body length, a descriptor's kind, dtype, width,
dimensions and bias), and well-formed bytes of a wrong payload (a part dropped, renamed, shortened, retyped; NaN, Inf
and huge values in floating parts; indices past the end; codes outside their range). Each test of the harness on a
deliberately broken compressor shows it can fail.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch
from _hang import run_with_timeout

from gradstat import compressors
from gradstat.compressors.base import Compressor
from gradstat.compressors.context import Context
from gradstat.compressors.schemes.sparsifiers.topk import TopK
from gradstat.compressors.wire.errors import PayloadError
from gradstat.compressors.wire.payload import (
    HEADER_PREFIX_BYTES,
    PART_DESCRIPTOR_BYTES,
    Part,
    Payload,
)

RANDOM_MUTATIONS = 250  # per payload form; every compressor has at least two forms (1-D and 2-D gradients)
TIMEOUT_S = 60.0  # per compressor: a hang fails the test instead of stalling the suite
SHAPES = [(1000,), (20, 50)]


def _laplace(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(shape, generator=gen, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).float()


# -- mutations of the bytes -----------------------------------------------------------------------------------------
def _flip_bits(data: torch.Tensor, rng: random.Random, lo: int, hi: int, count: int) -> torch.Tensor:
    out = data.clone()
    for _ in range(count):
        bit = rng.randrange(8 * lo, 8 * hi)
        out[bit // 8] ^= 1 << (bit % 8)
    return out


def _set_bytes(data: torch.Tensor, at: int, raw: bytes) -> torch.Tensor:
    out = data.clone()
    end = min(at + len(raw), out.numel())
    out[at:end] = torch.tensor(list(raw[: end - at]), dtype=torch.uint8)
    return out


def byte_mutations(data: torch.Tensor, parts: int, rng: random.Random, n: int) -> list[tuple[str, torch.Tensor]]:
    """``n`` seeded mutations of serialised payload bytes (header of ``parts`` part descriptors)."""
    head = HEADER_PREFIX_BYTES + PART_DESCRIPTOR_BYTES * parts
    size = data.numel()
    out = []
    for _ in range(n):
        op = rng.choice(["flip", "flip header", "byte header", "truncate", "extend", "field"])
        if op == "flip":
            out.append((op, _flip_bits(data, rng, 0, size, rng.randint(1, 4))))
        elif op == "flip header":
            out.append((op, _flip_bits(data, rng, 0, head, 1)))
        elif op == "byte header":
            out.append((op, _set_bytes(data, rng.randrange(head), bytes([rng.randrange(256)]))))
        elif op == "truncate":
            out.append((op, data[: rng.randrange(size)].clone()))
        elif op == "extend":
            extra = torch.tensor([rng.randrange(256) for _ in range(rng.randint(1, 64))], dtype=torch.uint8)
            out.append((op, torch.cat([data, extra])))
        else:
            i = rng.randrange(parts)
            at = HEADER_PREFIX_BYTES + PART_DESCRIPTOR_BYTES * i
            field, raw = rng.choice(
                [
                    ("part count", (3, bytes([rng.randrange(256)]))),
                    ("body bits", (4, rng.randrange(2**64).to_bytes(8, "little"))),
                    (
                        "body bits +-1",
                        (
                            4,
                            (int.from_bytes(bytes(data[4:12].tolist()), "little") + rng.choice([-1, 1])).to_bytes(
                                8, "little"
                            ),
                        ),
                    ),  # noqa: E501
                    ("kind", (at + 8, bytes([rng.randrange(9)]))),
                    ("dtype", (at + 9, bytes([rng.randrange(12)]))),
                    ("width", (at + 10, bytes([rng.randrange(70)]))),
                    ("ndim", (at + 11, bytes([rng.randrange(4)]))),
                    ("dimension", (at + 12 + 4 * rng.randrange(2), rng.randrange(2**32).to_bytes(4, "little"))),
                    (
                        "dimension +-1",
                        (
                            at + 12,
                            (
                                max(
                                    0,
                                    int.from_bytes(bytes(data[at + 12 : at + 16].tolist()), "little")
                                    + rng.choice([-1, 1]),
                                )
                            ).to_bytes(4, "little"),
                        ),
                    ),  # noqa: E501
                    ("bias", (at + 20, rng.randrange(-(2**63), 2**63).to_bytes(8, "little", signed=True))),
                ]
            )
            out.append((f"field {field}", _set_bytes(data, raw[0], raw[1])))
    return out


# -- well-formed bytes of a wrong payload ---------------------------------------------------------------------------
def _with_part(payload: Payload, name: str, part: Part | None, rename: str | None = None) -> Payload:
    out = Payload(shape=payload.shape, dtype=payload.dtype)
    for key, p in payload.parts.items():
        if key != name:
            out.parts[key] = p
        elif part is not None:
            out.parts[rename or key] = part
    return out


def _changed(t: torch.Tensor, value: float) -> torch.Tensor:
    out = t.clone()
    out.reshape(-1)[0] = value
    return out


def payload_mutations(payload: Payload) -> list[tuple[str, Payload]]:
    """Wrong payloads that still serialise: each part dropped, renamed, shortened, widened or narrowed in dtype, and
    extreme values planted in it."""
    out = []
    d = payload.numel
    for name, p in payload.parts.items():
        t = p.tensor
        out.append((f"{name} dropped", _with_part(payload, name, None)))
        out.append((f"{name} renamed", _with_part(payload, name, p, rename=name[:-1] + "x")))
        if t.numel():
            short = t.reshape(-1)[:-1]
            out.append((f"{name} one element short", _with_part(payload, name, dataclasses.replace(p, tensor=short))))
        if t.is_floating_point():
            for v in (math.nan, math.inf, -math.inf, 3.0e38, -3.0e38, 1e-45):
                if t.numel():
                    mutated = dataclasses.replace(p, tensor=_changed(t, v))
                    out.append((f"{name}[0] = {v}", _with_part(payload, name, mutated)))
            if t.dtype == torch.float32:
                wider = dataclasses.replace(p, tensor=t.double(), width=64)
                out.append((f"{name} as float64", _with_part(payload, name, wider)))
        elif t.numel():
            spread = 1 << int(p.width)
            planted = {d, d + 1, -1, int(t.reshape(-1).min()) + spread - 1} if p.kind == "index" else set()
            planted |= {int(t.reshape(-1).min()) + spread - 1, int(t.reshape(-1).min())}
            for v in sorted(planted):
                info = torch.iinfo(t.dtype) if t.dtype != torch.bool else None
                if info is None or not info.min <= v <= info.max:
                    continue
                changed = dataclasses.replace(p, tensor=_changed(t, v))
                out.append((f"{name}[0] = {v}", _with_part(payload, name, changed)))
            if t.dtype != torch.int64 and t.dtype != torch.bool:
                wide = dataclasses.replace(p, tensor=t.to(torch.int64))
                out.append((f"{name} as int64", _with_part(payload, name, wide)))
    return out


# -- the harness ----------------------------------------------------------------------------------------------------
def _outcome(c: Compressor, data: torch.Tensor, payload: Payload, ctx: Context, side: torch.Tensor | None) -> str:
    """'' where the mutated bytes gave a PayloadError or a finite reconstruction of the right shape; else what went
    wrong."""
    try:
        back = Payload.from_bytes(data, payload.shape, payload.dtype)
        out = c.decode(back, ctx, side=side if c.properties.needs_side or "nested" in back.parts else None)
    except PayloadError:
        return ""
    except Exception as exc:  # the finding: any other exception type
        return f"{type(exc).__name__}: {exc}"
    if out.shape != payload.shape:
        return f"decoded shape {tuple(out.shape)} for {tuple(payload.shape)}"
    if not bool(torch.isfinite(out).all()):
        return f"{int((~torch.isfinite(out)).sum())} NaN/Inf decoded without an error"
    return ""


def fuzz_problems(c: Compressor, seed: int, mutations: int = RANDOM_MUTATIONS) -> tuple[list[str], int]:
    """(problems, cases) of the mutations of every payload form of ``c``: 1-D and 2-D gradients, workers 0 and 1
    (NDQSG's worker 1 sends nested codes)."""
    rng = random.Random(seed)
    problems: list[str] = []
    cases = 0
    for shape in SHAPES:
        g = _laplace(shape, seed)
        for worker in (0, 1):
            ctx = Context(seed=seed, worker=worker, state=c.new_state(g))
            payload = c.encode(g, ctx)
            side = g if c.properties.needs_side else None
            data = payload.to_bytes()
            trials = byte_mutations(data, len(payload.parts), rng, mutations)
            for label, wrong in payload_mutations(payload):
                try:
                    trials.append((label, wrong.to_bytes()))
                except ValueError:  # the sender refuses it already (a value that does not fit its width)
                    continue
            for label, mutated in trials:
                problem = _outcome(c, mutated, payload, ctx.but(state=None), side)
                cases += 1
                if problem:
                    problems.append(f"{c.spec()} {shape} worker {worker}, {label}: {problem}")
    return problems, cases


# -- tests ----------------------------------------------------------------------------------------------------------
VARIANTS = [  # payload forms the defaults do not send: int32 indices, 1-bit codes, no scale, torch's draws, rank > 1
    "topk:ratio=0.05,packed=False",
    "qcs:k=32,block=64,onebit=True",
    "signsgd:scale=unit",
    "dqsg:dither=torch",
    "ndqsg:dither=torch",
    "powersgd:rank=3",
    "qsgd:s=1,bucket=7",
    "onebit:axis=column,columns=50",
]


@pytest.mark.parametrize("name", compressors.names() + VARIANTS)
def test_mutated_payloads_give_a_payload_error_or_a_finite_tensor(name):
    c = compressors.create(name)
    result = run_with_timeout(lambda: fuzz_problems(c, seed=sum(map(ord, name))), TIMEOUT_S)
    problems, cases = result  # type: ignore[misc]
    assert cases >= 4 * RANDOM_MUTATIONS
    assert problems == [], f"{len(problems)} of {cases} cases:\n" + "\n".join(problems[:20])


@dataclasses.dataclass
class _OverflowingTopK(TopK):
    """Planted bug: scales every decoded value by 1e38 and claims the output finite without looking."""

    def _decode(self, payload, ctx, side):
        return super()._decode(payload, ctx, side) * 1e38

    def _proves_finite(self, payload):
        return True


@dataclasses.dataclass
class _UncheckedTopK(TopK):
    """Planted bug: reads its parts without checking their sizes (an index_put with mismatched lengths)."""

    def _check_payload(self, payload):
        return None


def test_the_harness_finds_a_silent_inf():
    problems, _ = fuzz_problems(_OverflowingTopK(ratio=0.01), seed=1, mutations=0)
    assert problems and any("NaN/Inf decoded without an error" in p for p in problems)


def test_the_harness_finds_another_exception_type():
    problems, _ = fuzz_problems(_UncheckedTopK(ratio=0.01), seed=1, mutations=0)
    assert problems and any("Error" in p.split(": ", 2)[1] for p in problems)

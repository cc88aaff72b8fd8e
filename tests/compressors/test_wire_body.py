"""Payload.to_bytes (fast bit-packing, narrow words) writes the same body, bit for bit, as a plain reference that
widens every part to int64 words and adds them in with ``bitpack.pack_into``; from_bytes reads it back exactly."""

from __future__ import annotations

import pytest
import torch

from gradstat import compressors
from gradstat.compressors.context import Context
from gradstat.compressors.wire import bitpack
from gradstat.compressors.wire.payload import Payload, header_bits

SPECS = [
    "qsgd",
    "qsgd:s=1,bucket=7",
    "terngrad",
    "signsgd",
    "signsgd:scale=unit",
    "onebit",
    "dqsg",
    "dqsg:M=7,partitions=3",
    "ndqsg",
    "ecq",
    "qcs",
    "qcs:k=256,Q=1",
    "qcs:k=32,block=64,onebit=True",
    "topk:ratio=0.5",
]


def _reference_body(payload: Payload) -> torch.Tensor:
    runs, base = [], 0
    for part in payload.parts.values():
        t = part.tensor.reshape(-1).cpu()
        width = int(part.width)
        size = 1 if t.dtype == torch.bool else t.element_size() * 8
        if t.dtype.is_floating_point:
            t = t.view({16: torch.int16, 32: torch.int32, 64: torch.int64}[size])
        words = t.to(torch.int64)
        if not t.dtype.is_floating_point and width < size and t.numel():
            words = words - words.min()
        if width == 64:
            words, width = bitpack.split_words(words), 32
        runs.append((words, width, base))
        base += words.numel() * width
    acc = torch.zeros(bitpack.packed_bytes(base) + 8, dtype=torch.int64)
    for words, width, at in runs:
        bitpack.pack_into(acc, words, width, at)
    return acc[: bitpack.packed_bytes(base)].to(torch.uint8)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("d", [2, 9, 1000, 4099])
def test_to_bytes_body_equals_the_plain_reference(spec, d):
    c = compressors.create(spec)
    gen = torch.Generator().manual_seed(d)
    g = torch.randn(d, generator=gen) * torch.rand(d, generator=gen) ** 4
    ctx = Context(seed=5, worker=1)
    payload = c.encode(g, ctx)
    data = payload.to_bytes()
    head = header_bits(len(payload.parts)) // 8
    assert torch.equal(data[head:], _reference_body(payload))
    back = Payload.from_bytes(data, payload.shape, payload.dtype)
    for name, part in payload.parts.items():
        assert back[name].dtype == part.tensor.dtype and torch.equal(back[name], part.tensor), name

"""Helpers for the dump tests: deterministic gradients and a small dump with two workers and one extra."""

from __future__ import annotations

from pathlib import Path

import torch

from gradstat.analysis.dumps import DumpWriter

PARAMS = [("layer.weight", (3, 4)), ("layer.bias", (4,))]


def make_grads(step: int, workers: int = 2, scale: float = 1.0) -> list[dict[str, torch.Tensor]]:
    """Deterministic, distinct gradients per (step, worker)."""
    gen = torch.Generator().manual_seed(1000 * step + 7)
    return [{n: scale * torch.randn(s, generator=gen) for n, s in PARAMS} for _ in range(workers)]


def write_dump(path: Path, steps=(0, 5, 10), dtype: str = "float32", workers: int = 2, extras: bool = True) -> dict:
    """Write a dump and return what was written: {step: (grads, extras)}."""
    w = DumpWriter(
        path,
        workload="toy",
        params=PARAMS,
        workers=workers,
        dtype=dtype,
        every=5,
        optimizer={"name": "sgd", "lr": 0.1},
        seeds={"seed": 3},
        metadata={"note": "test"},
        extras=["residual"] if extras else [],
    )
    written = {}
    for s in steps:
        g = make_grads(s, workers)
        x = {"residual": make_grads(s + 1, workers, scale=0.5)} if extras else None
        w.write_step(s, g, x)
        written[s] = (g, x)
    return written


def tensor_byte_range(file: Path, key: str) -> tuple[int, int]:
    """Absolute byte offsets [start, end) of tensor ``key``'s data in a safetensors file."""
    import json
    import struct

    with open(file, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    start, end = header[key]["data_offsets"]
    return 8 + n + start, 8 + n + end


def flip_byte(file: Path, offset: int) -> None:
    """Corrupt one byte in place (same size, so only a checksum can tell)."""
    with open(file, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))

"""Per-call context and seeded randomness.

Every random draw of a compressor comes from a generator seeded from ``(seed, step, worker, block, stream)``,
so the decoder, built separately, regenerates exactly what the encoder drew. Global RNG state is never read or
changed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from gradstat.compressors.wire.payload import SEED_BITS  # noqa: F401  (re-exported: seeds are a context concept too)
from gradstat.theory.kernels.seeds import derive_seed  # noqa: F401  (re-exported: the context derives every seed)


def generator(seed: int, device: torch.device | str = "cpu", *streams: int) -> torch.Generator:
    """A fresh ``torch.Generator`` on ``device`` seeded from ``seed`` and optional sub-stream keys."""
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(derive_seed(seed, *streams) if streams else seed)
    return g


@dataclass(frozen=True)
class Context:
    """Where an encode/decode happens: base seed, training step, worker rank, block (layer) index.

    ``state`` is the worker's per-compressor state object (from ``Compressor.new_state``), or None for stateless
    compressors. It is the only thing that carries across steps inside a compressor.
    """

    seed: int = 0
    step: int = 0
    worker: int = 0
    block: int = 0
    state: Any = None

    @property
    def call_seed(self) -> int:
        """Seed of this (seed, step, worker, block); sent in the payload of randomized schemes."""
        return derive_seed(self.seed, self.step, self.worker, self.block)

    def but(self, **changes: Any) -> "Context":
        return replace(self, **changes)

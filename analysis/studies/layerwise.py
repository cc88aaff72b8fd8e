"""Layer-wise vs whole-model compression: the same compressor applied per tensor and on the flat model vector.

Frameworks differ in what a compressor sees: GRACE and most papers' code compress each parameter tensor on its own
(one scale, one threshold, one k = ceil(delta d_l) per tensor), DDP communication hooks see buckets, and the papers'
analyses (and ``gradstat compress`` by default) treat the model as one vector. This study replays a compressor both
ways over the same gradients, with its own error feedback and per-tensor (or whole-model) state, and reports per
step and mode:

- ``rel_error``: ``||z - z_hat||^2 / ||z||^2`` on the whole model (z the compensated gradient);
- ``k_ratio``: nonzeros sent over ``ceil(delta d)`` (whole) -- for per-layer compression the target is the sum of
  the per-tensor ``ceil(delta d_l)``, reported as ``k_target``;
- ``bits``, ``entropy_bits``: exact and entropy-coded bits of all the tensors' payloads (per-tensor scales, seeds
  and index widths ``ceil(log2 d_l)`` included);
- ``dense_tensors``: tensors too small for the target ratio (``d_l delta < 1``) are sent uncompressed at 32 bits per
  element, as DGC does for small layers; their elements count as sent (k_hat and k_target).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd
import torch

from gradstat import compressors
from gradstat.analysis.measure.tables import write_table
from gradstat.compressors import Compressor, Context, ErrorFeedback, WorkerState
from gradstat.compressors.memory.send import send_locally

MODES = ("whole", "per-layer")


class LayerwiseReplay:
    """One worker's replay of ``comp`` with feedback ``fb``, either on the flat model vector (``whole``) or on each
    named tensor (``per-layer``, one compressor state and one residual per tensor)."""

    def __init__(self, comp: Compressor, fb: ErrorFeedback, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.comp, self.fb, self.mode = comp, fb, mode
        self.states: dict[str, WorkerState] = {}

    def step(self, step: int, grads: Mapping[str, torch.Tensor], seed: int = 0) -> dict[str, float]:
        """Compress one step's gradients ``{param: tensor}`` (model order); returns the step's metrics."""
        if self.mode == "whole":
            blocks = {"<model>": torch.cat([g.reshape(-1).float() for g in grads.values()])}
        else:
            blocks = {name: g.float() for name, g in grads.items()}  # shapes kept: 1-bit SGD's columns need them
        err = norm = bits = ent = 0.0
        sent = target = 0
        ratio = getattr(self.comp, "ratio", None)
        dense = 0
        for i, (name, g) in enumerate(blocks.items()):
            if ratio is not None and float(ratio) * g.numel() < 1:  # too small to sparsify: sent as it is
                dense += 1
                norm += float(g.double().square().sum())
                bits += dense_bits(g)
                ent += dense_bits(g)
                sent += g.numel()
                target += g.numel()
                continue
            if name not in self.states:
                self.states[name] = WorkerState(compressor=self.comp.new_state(like=g))
            one = send_locally(self.comp, self.fb, [g], [self.states[name]], [Context(seed=seed, step=step, block=i)])
            z, payload, z_hat = one.compensated[0], one.payloads[0], one.decoded[0]
            err += float((z_hat.double() - z.double()).square().sum())
            norm += float(z.double().square().sum())
            bits += payload.bits
            ent += payload.entropy_bits()
            if ratio is not None and "indices" in payload.parts:
                sent += payload.parts["indices"].tensor.numel()
                target += math.ceil(float(ratio) * z.numel())
        d = sum(g.numel() for g in blocks.values())
        return {
            "tensors": len(blocks),
            "dense_tensors": dense,
            "d": d,
            "rel_error": err / norm if norm > 0 else math.nan,
            "k_hat": sent if target else math.nan,
            "k_target": target if target else math.nan,
            "k_ratio": sent / math.ceil(float(ratio) * d) if target and ratio is not None else math.nan,
            "bits": bits,
            "entropy_bits": ent,
            "gain": 32.0 * d / bits if bits > 0 else math.nan,
        }


def dense_bits(g: torch.Tensor) -> float:
    """Bits of a tensor sent uncompressed (float32 values)."""
    return 32.0 * g.numel()


def compare(
    steps: Iterable[tuple[int, Mapping[str, torch.Tensor]]],
    specs: Sequence[str],
    feedback: str = "none",
    seed: int = 0,
) -> pd.DataFrame:
    """Replay every spec in both modes over ``steps`` (pairs ``(step, {param: gradient})``, one worker); one row per
    (compressor, mode, step)."""
    fb = compressors.parse_feedback(feedback)
    replays = {(spec, mode): LayerwiseReplay(compressors.create(spec), fb, mode) for spec in specs for mode in MODES}
    rows = []
    for step, grads in steps:
        for (spec, mode), rep in replays.items():
            rows.append(
                {
                    "compressor": spec,
                    "feedback": feedback,
                    "mode": mode,
                    "step": int(step),
                    **rep.step(step, grads, seed),
                }
            )
    if not rows:
        raise ValueError("layer-wise comparison needs at least one step")
    return pd.DataFrame(rows)


def summarize(per_step: pd.DataFrame) -> pd.DataFrame:
    """Means over steps per (compressor, feedback, mode)."""
    cols = ["tensors", "dense_tensors", "d", "rel_error", "k_ratio", "k_target", "bits", "entropy_bits", "gain"]
    return per_step.groupby(["compressor", "feedback", "mode"], sort=False)[cols].mean().reset_index()


def run(
    dump: Any,
    out: Path,
    specs: Sequence[str],
    feedback: str,
    steps: Sequence[int],
    worker: int,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``gradstat compress --per-layer``: both modes over a dump's steps of one worker; writes
    ``layerwise_steps`` and ``layerwise_summary``."""
    source = ((s, dump.read(s, worker=worker, device=device, dtype=torch.float32)) for s in steps)
    per_step = compare(source, specs, feedback, seed)
    summary = summarize(per_step)
    write_table(per_step, out, "layerwise_steps")
    write_table(summary, out, "layerwise_summary")
    return per_step, summary

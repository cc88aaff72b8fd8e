"""Replay of a layer-wise DDP compression hook over the per-rank dump of its run: what each rank sent, per block.

gradstat's DDP hook in layer-wise mode (``gradstat train --granularity layer``, hook bound to the model) compresses
every parameter on its own. On rank r at training step t, parameter j -- its position among the model's trainable
parameters, which is the order of the dump's parameters -- is compressed with ``Context(seed, step = t,
worker = r, block = j)`` and with its own error-feedback residual and compressor state per rank and parameter;
side-information schemes (NDQSG) decode the ranks in the order of Algorithm 2 of Abdi & Fekri (Nested Dithered
Quantization), and DGC's local momentum correction (Lin et al. 2018, Sec. 3.2-3.3) keeps a velocity per rank and
parameter. This replay does the same from the dump that run recorded (every step, ``worker = rank``), through the
library's round (:func:`gradstat.compressors.memory.send.feedback_round`: the send step the hook runs too, around
the compressor's own ``round`` instead of the hook's serialisation, exchange and decoding): payloads that agree
bit for bit are evidence that what runs online is what gradstat measures offline.

Per (seed, step, worker, block) it reports the exact payload ``bits`` and ``wire_bytes`` (the serialised length:
header plus ``ceil(bits / 8)``, :attr:`gradstat.compressors.wire.payload.Payload.wire_bytes`); per (seed, step, worker)
their sums, which are the ``bits`` and ``wire_bytes`` columns of ``gradstat train``'s ``steps.csv`` for that rank.
Where the dump holds the run's residual (``gradstat train --residual``), ``residual_as_recorded`` says whether the
replay's residual before the step is the recorded one bit for bit -- the residual after a step is ``z - z_hat``, so
this checks the decoded tensors of the run from its files (per rank and step: the share of blocks that agree).
With ``decoded`` a folder, each step's decoded blocks (what every rank decodes of worker w's message) are written
to ``step-<step>.safetensors`` there, one tensor ``<worker>/<param>`` each.

The replay is faithful from step 0 over consecutive steps (the residuals, velocities and compressor states start
empty, as the hook's do); it warns otherwise.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch
from safetensors.torch import save as safetensors_bytes

from gradstat import compressors
from gradstat.analysis.dumps.atomic import write_atomic
from gradstat.analysis.measure.tables import atomic_write_text, write_table
from gradstat.analysis.studies.replay import ReplayWarning
from gradstat.compressors import Compressor, Context, Memory, WorkerState
from gradstat.compressors.base import RoundResult
from gradstat.compressors.memory.send import feedback_round
from gradstat.compressors.schemes.dense import SmallDense

LABELS = ("compressor", "feedback", "seed")


@dataclass(frozen=True)
class HookRound:
    """The per-block round of one hook configuration: ``compressor`` with ``memory`` (error feedback, optionally
    over DGC's local momentum correction, as the hook runs it)."""

    compressor: Compressor
    memory: Memory

    @classmethod
    def parse(cls, compressor: str, feedback: str) -> "HookRound":
        """``feedback`` as the hook takes it: none | ef | qcs:beta=B | ecq:alpha=A,beta=B | dgc:momentum=M; the
        compressor as the hook runs it (tensors it does not compress sent dense: SmallDense)."""
        return cls(SmallDense(compressors.create(compressor)), compressors.parse_memory(feedback))

    def new_states(self, workers: int) -> list[WorkerState]:
        return self.memory.new_states(self.compressor, workers)

    def round(self, grads: Sequence[torch.Tensor], states: list[WorkerState], ctx: Context) -> RoundResult:
        return feedback_round(self.compressor, self.memory, grads, states, ctx)


def replay_blocks(
    dump: Any,
    compressor: str,
    feedback: str,
    steps: Sequence[int],
    seed: int,
    device: torch.device | str = "cpu",
    decoded: Path | None = None,
) -> pd.DataFrame:
    """Replay the layer-wise hook's rounds of ``compressor``/``feedback`` over ``steps`` of ``dump`` (all its
    workers, every parameter a block keyed by its position); one row per (step, worker, block) with columns
    ``step, worker, block, param, numel, bits, wire_bytes, residual_as_recorded`` (None without a recorded
    residual). ``decoded``: folder for the decoded blocks."""
    hook = HookRound.parse(compressor, feedback)
    workers = int(dump.workers)
    names = list(dump.params)
    states = [hook.new_states(workers) for _ in names]
    _warn_unfaithful(dump, compressor, feedback, list(steps), seed)
    recorded = "residual" in getattr(dump, "extras", ())
    rows = []
    for step in steps:
        grads = [dump.read(step, worker=w, device=device) for w in range(workers)]
        residuals = (
            [dump.read_extra("residual", step, worker=w, device=device) for w in range(workers)] if recorded else None
        )
        kept: dict[str, torch.Tensor] = {}
        for j, name in enumerate(names):
            same = [_same_memory(states[j][w], residuals[w][name]) if residuals else None for w in range(workers)]
            try:
                result = hook.round(
                    [g[name] for g in grads], states[j], Context(seed=int(seed), step=int(step), block=j)
                )
            except ValueError as exc:  # say where: the hook would have failed on the same block
                raise ValueError(f"{compressor}, step {step}, block {j} ({name}): {exc}") from exc
            for w, (payload, z_hat) in enumerate(zip(result.payloads, result.decoded, strict=True)):
                row = {
                    "step": int(step),
                    "worker": w,
                    "block": j,
                    "param": name,
                    "numel": z_hat.numel(),
                    "bits": int(payload.bits),
                    "wire_bytes": int(payload.wire_bytes),
                    "residual_as_recorded": same[w],
                }
                rows.append(row)
                if decoded is not None:
                    kept[f"{w}/{name}"] = z_hat.detach().to("cpu", copy=True).contiguous()
        if decoded is not None:
            meta = {"compressor": compressor, "feedback": feedback, "seed": str(seed), "step": str(step)}
            decoded.mkdir(parents=True, exist_ok=True)
            write_atomic(decoded / f"step-{step}.safetensors", safetensors_bytes(kept, metadata=meta))
    return pd.DataFrame(rows)


def _same_memory(state: Any, recorded: torch.Tensor) -> bool:
    """Whether the replay's residual before this step is, bit for bit, the one the run recorded (zero when the
    replay has none yet)."""
    mine = state.feedback.residual
    if mine is None:
        return not bool(recorded.count_nonzero())
    return mine.shape == recorded.shape and mine.dtype == recorded.dtype and torch.equal(mine, recorded)


def per_rank(blocks: pd.DataFrame) -> pd.DataFrame:
    """Per (compressor, feedback, seed, step, worker): the sums over blocks of ``bits`` and ``wire_bytes`` (what
    ``gradstat train`` logs per step and rank), the number of blocks and the share of blocks whose residual is the
    recorded one."""
    keys = ["compressor", "feedback", "seed", "step", "worker"]
    out = blocks.groupby(keys, sort=False).agg(
        blocks=("block", "size"),
        numel=("numel", "sum"),
        bits=("bits", "sum"),
        wire_bytes=("wire_bytes", "sum"),
        residual_as_recorded=("residual_as_recorded", _fraction),
    )
    return out.reset_index()


def _fraction(flags: pd.Series) -> float:
    """Share of True among the flags that are set (NaN when none is: the dump has no residual)."""
    known = flags.dropna()
    return float(known.astype(bool).mean()) if len(known) else math.nan


def summarize(ranks: pd.DataFrame) -> pd.DataFrame:
    """Per (compressor, feedback): steps, workers, blocks, and the means over steps, workers and seeds of the bits
    and bytes each rank sends per step and of ``residual_as_recorded``; ``gain = 32 d / bits``."""
    g = ranks.groupby(["compressor", "feedback"], sort=False)
    out = g.agg(
        steps=("step", "nunique"),
        workers=("worker", "nunique"),
        blocks=("blocks", "max"),
        d=("numel", "max"),
        bits=("bits", "mean"),
        wire_bytes=("wire_bytes", "mean"),
        residual_as_recorded=("residual_as_recorded", "mean"),
    ).reset_index()
    out["gain"] = [32.0 * d / b if b > 0 else math.nan for d, b in zip(out["d"], out["bits"], strict=True)]
    return out


def run(
    dump: Any,
    out: Path,
    specs: Sequence[tuple[str, str]],
    steps: Sequence[int],
    seeds: Sequence[int],
    device: torch.device | str = "cpu",
    save_decoded: bool = False,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``gradstat compress --blocks layer``: every (compressor, feedback) pair and seed; writes ``compress_blocks``
    (per step, worker, block), ``compress_ranks`` (per step and worker) and ``compress_summary``, and with
    ``save_decoded`` (one pair and one seed only) ``decoded/step-<step>.safetensors``. Returns the three tables."""
    check(specs, None, int(dump.workers), len(seeds), save_decoded)
    frames = []
    for spec, feedback in specs:
        for seed in seeds:
            decoded = out / "decoded" if save_decoded else None
            df = replay_blocks(dump, spec, feedback, steps, int(seed), device, decoded)
            frames.append(df.assign(compressor=spec, feedback=feedback, seed=int(seed)))
    blocks = pd.concat(frames, ignore_index=True)
    blocks = blocks[[*LABELS, *[c for c in blocks.columns if c not in LABELS]]]
    ranks = per_rank(blocks)
    summary = summarize(ranks)
    atomic_write_text(out / "compress_blocks.csv", blocks.to_csv(index=False))  # one row per block: CSV only
    write_table(ranks, out, "compress_ranks")
    write_table(summary, out, "compress_summary")
    return blocks, ranks, summary


def check(
    pairs: Sequence[tuple[str, str]],
    workers: Sequence[int] | None,
    recorded_workers: int,
    seeds: int,
    save_decoded: bool,
) -> None:
    """Refuse what the layer-wise replay cannot do, before anything is written: a bad (compressor, feedback) spec,
    a selection of some workers only (the hook's seeds use the rank, and NDQSG decodes every rank in turn), and
    decoded tensors of more than one replay."""
    if not pairs:
        raise ValueError("--blocks layer needs at least one --compressor")
    for spec, feedback in pairs:
        HookRound.parse(spec, feedback)
    if workers is not None and list(workers) != list(range(recorded_workers)):
        raise ValueError(
            f"--blocks layer replays the exchange of every rank (the seeds use the rank, side-information schemes "
            f"decode the ranks in turn): the dump has {recorded_workers} workers, the selection is "
            f"{', '.join(map(str, workers))}; leave out --workers"
        )
    if save_decoded and (len(pairs) != 1 or seeds != 1):
        raise ValueError(
            f"--save-decoded writes the tensors of one replay: give one --compressor (got {len(pairs)}) and "
            f"--seeds 1 (got {seeds})"
        )


def _warn_unfaithful(dump: Any, compressor: str, feedback: str, steps: list[int], seed: int) -> None:
    """Warn where the replay cannot be what the hook sent: steps not 0, 1, 2, ... with a residual, velocity or
    compressor state to carry (they start empty at step 0 in the hook), a dump recorded under whole-bucket
    compression, a seed other than the run's."""
    manifest = getattr(dump, "manifest", None) or {}
    label = f"{compressor} with feedback {feedback}"
    hook = HookRound.parse(compressor, feedback)
    memory = hook.memory
    carries = (
        memory.momentum is not None or memory.feedback.compensation != 0 or hook.compressor.new_state() is not None
    )
    if carries and steps != list(range(len(steps))):
        warnings.warn(
            ReplayWarning(
                f"{label}: the replay starts with empty residuals and compressor states at step {steps[0]} and "
                f"replays steps {', '.join(map(str, steps[:6]))}{', ...' if len(steps) > 6 else ''}; the hook "
                "started at step 0 and carried them over every step, so these payloads are not the ones it sent. "
                "Record with --record-every 1 and replay from step 0 for those"
            ),
            stacklevel=3,
        )
    granularity = (manifest.get("compression") or {}).get("granularity")
    if granularity == "whole bucket":
        warnings.warn(
            ReplayWarning(
                f"{label}: the dump was recorded under a hook compressing whole DDP buckets (gradstat train "
                "--granularity bucket); --blocks layer replays a layer-wise hook (--granularity layer), so these "
                "are not the payloads that run sent"
            ),
            stacklevel=3,
        )
    recorded = (manifest.get("seeds") or {}).get("seed")
    if recorded is not None and int(recorded) != int(seed):
        warnings.warn(
            ReplayWarning(
                f"{label}: the run drew its compressors' randomness from seed {recorded}, this replay from seed "
                f"{seed}; pass --seed {recorded} for the payloads the run sent"
            ),
            stacklevel=3,
        )

"""Replay of a compressor (with its error feedback and per-worker state) over the steps of a gradient dump.

For every selected step and seed, each selected worker compensates its gradient with its own feedback residual,
compresses it with its own compressor state, and the receiver averages the reconstructions (``Compressor.round``).
Per step and seed the replay reports (``w`` runs over workers, ``z_w`` is the compensated gradient, ``z_hat_w`` its
reconstruction, ``g`` the worker-mean gradient and ``g_hat`` the worker-mean reconstruction):

- ``rel_error``: mean over workers of ``||z_w - z_hat_w||^2 / ||z_w||^2`` (the QCS paper's metric, Sec. 6);
- ``agg_rel_error``: ``||g - g_hat||^2 / ||g||^2`` (what the model update loses against full precision);
- ``bias``: mean over workers of ``<z_hat_w - z_w, z_w> / ||z_w||^2`` (0 for an unbiased compressor in
  expectation, ``alpha - 1`` for a scaled one, ``-rel_error`` for a sparsifier that keeps exact values);
- ``k_ratio``: k_hat/k, nonzeros sent over the target ``ceil(ratio * d)`` (sparsifiers with a ``ratio`` only);
- ``bits``, ``entropy_bits``: exact and entropy-coded bits per worker; ``gain = 32 d / bits``;
- ``residual_norm``: mean over workers of ``||r_w||`` after the step; ``residual_rel = ||r_w||^2 / ||g_w||^2``.

Seeds are independent replays (states restart for each seed); :func:`summarize` averages them per step.

A replay warns (:class:`ReplayWarning`) where its numbers would mislead: error feedback (or another state that
carries across steps) replayed over steps that are not consecutive, an adaptive SIDCo given no more steps than its
adaptation period, and an aggregate error that grows over the replay past the gradient itself.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from gradstat import compressors
from gradstat.analysis.measure.tables import CsvLog, write_table
from gradstat.compressors import Compressor, Context, ErrorFeedback, Memory, WorkerState
from gradstat.compressors.memory.send import send_round

GROWTH_FACTOR = 4.0
"""A warning is given when ``agg_rel_error`` ends above 1 and at least this many times its first value: the update
then carries more error than the gradient itself, and the rise is far beyond the step-to-step spread of a replay
without feedback (about +-20 % on the built-in workloads)."""


class ReplayWarning(UserWarning):
    """A replay whose numbers do not mean what they seem to (see the module docstring)."""


@dataclass
class ReplayConfig:
    """What to replay: compressor and feedback specs, steps, workers, seeds, device."""

    compressor: str
    feedback: str = "none"
    steps: Sequence[int] | None = None
    workers: Sequence[int] | None = None
    seeds: Sequence[int] = (0,)
    device: torch.device | str = "cpu"


def replay(
    dump: Any, config: ReplayConfig, on_step: Callable[[dict], None] | None = None, progress: bool = False
) -> pd.DataFrame:
    """Replay ``config`` over ``dump`` (an ``analysis.dumps`` dump); one row per (seed, step).

    Parameters
    ----------
    dump : opened dump with ``steps``, ``workers`` and ``flat(step, worker, device, dtype)``.
    config : see :class:`ReplayConfig`; unknown specs raise ``ValueError`` from the registries.
    on_step : called with each row as soon as it is computed (write results as you go).
    progress : show a progress bar.

    Returns
    -------
    DataFrame with columns ``seed, step, workers, d, rel_error, agg_rel_error, bias, k_ratio, bits, entropy_bits,
    gain, residual_norm, residual_rel``.
    """
    comp = compressors.create(config.compressor)
    fb = compressors.parse_feedback(config.feedback)
    steps = list(config.steps) if config.steps is not None else list(dump.steps)
    workers = list(config.workers) if config.workers is not None else list(range(dump.workers))
    if not steps or not workers:
        raise ValueError("replay needs at least one step and one worker")
    device = torch.device(config.device)
    _warn_before(dump, config, comp, fb, steps)
    rows = []
    bar = tqdm(total=len(config.seeds) * len(steps), desc="replay", disable=not progress, leave=False)
    for seed in config.seeds:
        states = Memory(fb).new_states(comp, len(workers))
        for step in steps:
            grads = [dump.flat(step, worker=w, device=device, dtype=torch.float32) for w in workers]
            row = replay_step(comp, fb, grads, states, Context(seed=int(seed), step=int(step)))
            row = {"seed": int(seed), "step": int(step), **row}
            rows.append(row)
            if on_step is not None:
                on_step(row)
            bar.update(1)
    bar.close()
    df = pd.DataFrame(rows)
    _warn_growth(df, config)
    return df


def _label(config: ReplayConfig) -> str:
    return config.compressor + ("" if config.feedback.strip() == "none" else f" with feedback {config.feedback}")


def _warn_before(dump: Any, config: ReplayConfig, comp: Compressor, fb: ErrorFeedback, steps: list[int]) -> None:
    """Warnings that the selection alone decides: gaps between replayed steps, too few steps for SIDCo."""
    gaps = sorted({b - a for a, b in zip(steps, steps[1:], strict=False)} - {1})
    if gaps and fb.compensation > 0:
        every = (getattr(dump, "manifest", None) or {}).get("every", 1)
        why = f"the dump was recorded every {every} iterations" if every and every > 1 else "the selection skips steps"
        warnings.warn(
            ReplayWarning(
                f"{_label(config)}: steps {_shown(steps)} are not consecutive ({why}); each residual is added to a "
                f"gradient {', '.join(map(str, gaps))} iterations later instead of the next one, unlike in training. "
                "Record with --every 1 or select consecutive --steps for a faithful replay"
            ),
            stacklevel=3,
        )
    period = getattr(comp, "period", None)
    if getattr(comp, "stages", None) == "adaptive" and period is not None and len(steps) <= int(period):
        warnings.warn(
            ReplayWarning(
                f"{config.compressor}: SIDCo adapts its number of stages every period = {period} calls, and the "
                f"replay has {len(steps)} steps, so the stage count never adapts; replay more than {period} steps "
                "or fix stages=M"
            ),
            stacklevel=3,
        )


def _warn_growth(df: pd.DataFrame, config: ReplayConfig) -> None:
    """Warn when the aggregate error (mean over seeds) ends above 1 and ``GROWTH_FACTOR`` times its start."""
    per_step = df.groupby("step", sort=True)[["agg_rel_error", "residual_rel"]].mean()
    if len(per_step) < 3:
        return
    err = per_step["agg_rel_error"].to_numpy()
    first, last = float(err[0]), float(err[-1])
    if not (last > 1.0 and last >= GROWTH_FACTOR * first):
        return
    message = (
        f"{_label(config)}: the aggregate error ||g - g_hat||^2/||g||^2 grows over the replay, from {first:.3g} at "
        f"step {per_step.index[0]} to {last:.3g} at step {per_step.index[-1]}: the update carries more error than "
        "the gradient itself"
    )
    if config.feedback.strip() != "none":
        resid = per_step["residual_rel"].to_numpy()
        message += f", and the residual ||r||^2/||g||^2 went from {resid[0]:.3g} to {resid[-1]:.3g}"
        rel = float(df["rel_error"].mean())
        if rel >= 1.0:
            message += (
                f". The compressor's error ||z - C(z)||^2/||z||^2 averages {rel:.3g} >= 1: it is not a contraction "
                "on these gradients, so error feedback accumulates its error instead of correcting it"
            )
    warnings.warn(ReplayWarning(message), stacklevel=3)


def _shown(steps: Sequence[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 6 else f"{steps[0]}, {steps[1]}, ..., {steps[-1]}"


def replay_step(
    comp: Compressor,
    fb: ErrorFeedback,
    grads: Sequence[torch.Tensor],
    states: Sequence[WorkerState],
    ctx: Context,
) -> dict[str, float]:
    """One synchronous round with feedback (the send step's :func:`~gradstat.compressors.memory.send.feedback_round`);
    updates ``states`` in place; returns the step's metrics."""
    z, res = send_round(comp, fb, grads, states, ctx)
    d = grads[0].numel()
    rel, bias, resid, resid_rel = [], [], [], []
    for g, zi, zh, st in zip(grads, z, res.decoded, (s.feedback for s in states), strict=True):
        zz = float(zi.double().square().sum())
        err = zh.double() - zi.double()
        rel.append(float(err.square().sum()) / zz if zz > 0 else math.nan)
        bias.append(float((err * zi.double()).sum()) / zz if zz > 0 else math.nan)
        r = st.residual
        rn = 0.0 if r is None else float(r.double().square().sum())
        gg = float(g.double().square().sum())
        resid.append(math.sqrt(rn))
        resid_rel.append(rn / gg if gg > 0 else math.nan)
    g_mean = torch.stack([g.double() for g in grads]).mean(0)
    gm = float(g_mean.square().sum())
    agg = float((res.mean.double() - g_mean).square().sum()) / gm if gm > 0 else math.nan
    bits = sum(p.bits for p in res.payloads) / len(grads)
    ent = sum(p.entropy_bits() for p in res.payloads) / len(grads)
    return {
        "workers": len(grads),
        "d": d,
        "rel_error": _mean(rel),
        "agg_rel_error": agg,
        "bias": _mean(bias),
        "k_ratio": k_ratio(comp, res.payloads, d),
        "bits": bits,
        "entropy_bits": ent,
        "gain": 32.0 * d / bits if bits > 0 else math.nan,
        "residual_norm": _mean(resid),
        "residual_rel": _mean(resid_rel),
    }


def k_ratio(comp: Compressor, payloads: Sequence[Any], d: int) -> float:
    """k_hat/k for a sparsifier with a target ``ratio`` (k = ceil(ratio d)); NaN for other compressors."""
    ratio = getattr(comp, "ratio", None)
    if ratio is None or not payloads or "indices" not in payloads[0].parts:
        return math.nan
    k = math.ceil(float(ratio) * d)
    return _mean([p.parts["indices"].tensor.numel() / k for p in payloads])


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per-step mean over seeds (``*_mean``) and standard deviation of ``rel_error`` over seeds."""
    if df.empty:
        raise ValueError("nothing to summarize: the replay produced no rows")
    cols = [c for c in df.columns if c not in ("seed", "step", "workers", "d")]
    g = df.groupby("step", sort=True)
    out = g[cols].mean().add_suffix("_mean")
    out["rel_error_sd"] = g["rel_error"].std(ddof=1) if df["seed"].nunique() > 1 else math.nan
    out["seeds"] = g["seed"].nunique()
    return out.reset_index()


def _mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _log_row(log: CsvLog, compressor: str, feedback: str, row: dict) -> None:
    log.add({"compressor": compressor, "feedback": feedback, **row})


def run(
    dump: Any,
    out: Path,
    specs: Sequence[tuple[str, str]],
    steps: Sequence[int],
    workers: Sequence[int],
    seeds: Sequence[int],
    device: torch.device,
    progress: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Replays (``analysis.studies.replay``) of each (compressor, feedback) pair; per-step rows and a one-row-per-pair
    summary (means over steps and seeds)."""
    log = CsvLog(out / "compress_steps.csv")
    frames = []
    try:
        for comp, fb in specs:
            cfg = ReplayConfig(comp, fb, steps, workers, seeds, device)
            df = replay(
                dump,
                cfg,
                on_step=functools.partial(_log_row, log, comp, fb),
                progress=progress,
            )
            frames.append(df.assign(compressor=comp, feedback=fb))
    finally:
        log.close()
    per_step = pd.concat(frames, ignore_index=True)
    cols = [
        "rel_error",
        "agg_rel_error",
        "bias",
        "k_ratio",
        "bits",
        "entropy_bits",
        "gain",
        "residual_norm",
        "residual_rel",
    ]
    summary = per_step.groupby(["compressor", "feedback"], sort=False)[cols].mean().reset_index()
    sd = per_step.groupby(["compressor", "feedback"], sort=False)["rel_error"].std(ddof=1).to_numpy()
    summary.insert(3, "rel_error_sd", sd)
    write_table(per_step, out, "compress_steps")
    write_table(summary, out, "compress_summary")
    return per_step, summary

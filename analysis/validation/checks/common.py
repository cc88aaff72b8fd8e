"""Shared steps of the check modules: building a compressor, the check's gradient blocks with their provenance
(which dump step, worker and coordinates, or which synthetic law), random blocks for checks whose randomness is
the vector's, a paired comparison with an exact reference, and the factory of the most common kind of check,
``E||C(g) - g||^2 / ||g||^2`` of one compressor against its closed-form bound."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from gradstat import compressors
from gradstat.analysis.measure.intervals import Estimate, mean_ci
from gradstat.analysis.measure.sources import GradientSource, law_label
from gradstat.analysis.studies.bounds import closed_form_bound
from gradstat.analysis.studies.variance import error_samples
from gradstat.analysis.validation.engine import Check, Claim, Measurement, NotApplicable, Setting
from gradstat.theory.sources import cite, file_of

if TYPE_CHECKING:
    from gradstat.analysis.dumps.reader import Dump


def create(spec: str) -> compressors.Compressor:
    """The compressor of ``spec``, or :class:`NotApplicable` when its name is not registered."""
    name = spec.partition(":")[0]
    if name not in compressors.names():
        raise NotApplicable(f"compressor {name!r} is not available")
    return compressors.create(spec)


def source_of(setting: Setting) -> GradientSource:
    return setting.source if setting.source is not None else GradientSource()


def block(setting: Setting, n: int, index: int = 0) -> torch.Tensor:
    """The check's gradient block of length ``n`` on the setting's device (synthetic unless a dump is given)."""
    return source_of(setting).vector(n, setting.device, index=index)


def _dump_name(src: GradientSource) -> str:
    return str(getattr(src.dump, "workload", None) or "dump")


def synthetic_label(src: GradientSource, n: int) -> str:
    return f"synthetic: {law_label(src.family)}, d = {n} (seed {src.seed})"


def origin(setting: Setting, n: int, indices: Sequence[int] = (0,)) -> str:
    """Provenance of the blocks ``block(setting, n, i)`` for ``i in indices``: ``dump lenet step 3 worker 0
    (block 1024:2048 of 1663370)`` or ``synthetic: Laplace(1), d = 1024 (seed 1234)``."""
    src = source_of(setting)
    if src.dump is None:
        return synthetic_label(src, n) + ("" if len(indices) == 1 else f", {len(indices)} draws")
    steps, off = [], 0
    for i in indices:
        step, off = src.block_origin(n, i)
        if step not in steps:
            steps.append(step)
    cycled = f" (cycled over {len(indices)} blocks)" if len(indices) > len(steps) else ""
    label = "step" if len(steps) == 1 else "steps"
    return (
        f"dump {_dump_name(src)} {label} {','.join(map(str, steps))}{cycled} worker {src.worker} "
        f"(block {off}:{off + n} of {src.dump.numel})"
    )


@lru_cache(maxsize=4)
def _flat(dump: Dump, step: int, worker: int) -> torch.Tensor:
    return dump.flat(step, worker=worker, device="cpu", dtype=torch.float64)


def random_block(setting: Setting, n: int, trial: int) -> torch.Tensor:
    """A block of ``n`` drawn at random for ``trial``: on a dump, a random step of the selection and a random
    window of nonzero norm (what the paper's i.i.d. gradients are, on real data); synthetic otherwise (a fresh
    draw per trial). Seeded by ``(setting.seed, trial)``."""
    src = source_of(setting)
    if src.dump is None:
        return src.vector(n, setting.device, index=trial + 1_000)
    steps = list(src.steps) if src.steps else list(src.dump.steps)
    rng = np.random.default_rng([setting.seed, trial, 7])
    for _ in range(100):
        flat = _flat(src.dump, int(steps[rng.integers(len(steps))]), src.worker)
        if flat.numel() < n:
            raise NotApplicable(f"the dump's gradient has {flat.numel()} elements, fewer than the block n={n}")
        off = int(rng.integers(flat.numel() - n + 1))
        x = flat[off : off + n]
        if bool(x.any()):
            return x.to(device=setting.device, dtype=torch.float32)
    raise NotApplicable("100 random blocks of the dump were all zero")


def random_origin(setting: Setting, n: int, trials: int, per: str = "trial") -> str:
    """Provenance of :func:`random_block` (one block per ``per``, ``trials`` trials)."""
    src = source_of(setting)
    if src.dump is None:
        return f"{synthetic_label(src, n)}, a fresh draw per {per}, {trials} trials"
    steps = list(src.steps) if src.steps else list(src.dump.steps)
    return (
        f"dump {_dump_name(src)} steps {','.join(map(str, steps))} worker {src.worker} "
        f"(random block of {n} of {src.dump.numel} per {per}, {trials} trials)"
    )


def paired(
    measured: Sequence[float] | np.ndarray, reference: Sequence[float] | np.ndarray
) -> tuple[float, Estimate, bool]:
    """Compare per-trial ``measured`` values with an exact ``reference`` computed on the same vectors.

    Returns ``(theory, estimate, deterministic)``: theory is the mean of the reference, the estimate is the mean
    of ``measured`` with the interval of the paired difference (so the vectors' own spread does not hide a small
    systematic error), and ``deterministic`` says that the difference is the same in every trial (no randomness
    left: a single measurement)."""
    m = np.asarray(measured, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    diff = mean_ci(m - r)
    ref = float(r.mean())
    est = Estimate(float(m.mean()), ref + diff.low, ref + diff.high, diff.trials, diff.level)
    return ref, est, bool(np.ptp(m - r) == 0.0)


def exact_agreement(
    measured: Sequence[float] | np.ndarray, reference: Sequence[float] | np.ndarray
) -> tuple[float, Estimate]:
    """Compare per-trial ``measured`` values with an exact ``reference`` where nothing is random: each trial is a
    deterministic computation (a sort, a recursion replayed with the same draws), so the trials are not samples
    and an interval over them means nothing. One measurement is returned: ``theory`` is the mean of the
    reference and the estimate is ``theory`` plus the trials' largest deviation (signed), the same value as its
    interval; the caller sets ``Measurement.deterministic``."""
    m = np.asarray(measured, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    if m.shape != r.shape or m.size == 0:
        raise ValueError(f"measured and reference must be equal, non-empty lengths, got {m.shape} and {r.shape}")
    dev = m - r
    worst = float(dev[int(np.argmax(np.abs(dev)))])
    ref = float(r.mean())
    return ref, Estimate(ref + worst, ref + worst, ref + worst, int(m.size))


def variance_check(
    name: str,
    spec: str,
    n: int,
    claim: Claim,
    paper: str,
    where: str,
    quick: int,
    full: int,
    must_hold: bool = True,
) -> Check:
    """``E||C(g) - g||^2 / ||g||^2`` of ``spec`` on a block of ``n`` vs
    :func:`gradstat.analysis.studies.bounds.closed_form_bound`; ``paper`` is a key or file of
    :mod:`gradstat.theory.sources`, ``where`` the equation."""

    def measure(s: Setting) -> Measurement:
        comp = create(spec)
        g = block(s, n)
        bound = closed_form_bound(comp, g)
        est = mean_ci(error_samples(comp, g, s.trials, s.seed))
        return Measurement(
            bound.value,
            est,
            f"{spec}; bound {bound.name}; expectation over the compressor's randomness",
            origin(s, n),
            setup={"compressor": spec, "n": n},
        )

    return Check(
        name,
        cite(paper, where),
        claim,
        "E||C(g) - g||^2 / ||g||^2",
        measure,
        {"quick": quick, "full": full},
        must_hold=must_hold,
        paper=file_of(paper),
    )

"""Before training: measure each compressor's error factor on the workload and refuse a feedback that diverges.

With error feedback ``z = g + c h``, ``h <- d h + (z - C(z))`` (:mod:`gradstat.compressors.memory.feedback`) and a
compressor whose error ``e = z - C(z)`` has ``E||e||^2 = f ||z||^2``, uncorrelated with the residual, the residual's
second moment is multiplied by ``d^2 + f c^2`` every step
(:meth:`~gradstat.compressors.memory.feedback.ErrorFeedback.residual_growth`; QCS (Abdi & Fekri) Lemma 4, eq.
(15), where it is ``(1 - beta)^2 + beta^2 gamma``). At or above 1 it grows geometrically: the compensated gradient
the compressor is given grows with it, and the run reaches NaN after a few dozen steps. Plain error feedback
(c = 1, d = 0) needs f < 1, which every contractive sparsifier has and the unbiased quantizers do not: on lenet's
initial gradient QSGD's default measures f = 2.8, QCS's 3.1, NDQSG's (each rank's reconstruction) over 250.
A biased compressor's error is not independent of the residual: for it the growth is a reading of the measured
factor, not a theorem (with plain error feedback, a factor below 1 for every input bounds the residual:
Karimireddy et al. 2019).

:func:`error_factors` measures f where the ranks will compress: each of the P ranks' gradients of the workload's
initial model on its slice of the first mini-batch, through the compressor's own round (so NDQSG decodes with its
side information), as one flat vector (bucket mode: DDP's buckets hold the model's gradients in a few pieces) or
parameter by parameter (layer mode, and PowerSGD's matrices), what the hook sends dense sent dense, pooled over
ranks, blocks and :data:`SEEDS` seeds:
``f = sum ||C(g) - g||^2 / sum ||g||^2``. :func:`check_feedback` refuses a combination whose growth at the measured
f is >= 1, before anything is launched, and names the compressor's own paper's feedback
(:func:`gradstat.compressors.memory.defaults.paper_feedback`) with its growth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from gradstat.analysis.training.workloads import get_workload
from gradstat.compressors import Compressor, Context, create, parse_memory
from gradstat.compressors.context import derive_seed
from gradstat.compressors.memory.defaults import paper_feedback
from gradstat.compressors.schemes.dense import SmallDense

SEEDS = 3
"""Independent encodes pooled into one measured error factor (step 0, seeds 0..SEEDS-1 after the run's seed)."""


@dataclass(frozen=True)
class FeedbackVerdict:
    """One compressor and feedback on one workload: the measured error factor f, the residual's growth per step
    ``d^2 + f c^2`` and whether it stays bounded (growth < 1)."""

    compressor: str
    feedback: str
    error_factor: float
    growth: float

    @property
    def bounded(self) -> bool:
        return self.growth < 1.0


def initial_gradients(workload: str, world: int, seed: int) -> list[list[torch.Tensor]]:
    """Each of the ``world`` ranks' parameter gradients (model order) of ``workload``'s initial model on its slice
    of the first mini-batch, with the seeds ``gradstat train`` uses (model ``derive_seed(seed, 0)``, data
    ``derive_seed(seed, 1)``)."""
    wl = get_workload(workload)
    model = wl.model(derive_seed(seed, 0), "cpu")
    x, y = next(wl.batches(derive_seed(seed, 1), "cpu"))
    local = wl.batch_size // world
    out = []
    for r in range(world):
        model.zero_grad(set_to_none=True)
        wl.loss(model(x[r * local : (r + 1) * local]), y[r * local : (r + 1) * local]).backward()
        out.append([p.grad.detach().clone() for p in model.parameters() if p.requires_grad and p.grad is not None])
    return out


def error_factor(comp: Compressor, grads: Sequence[Sequence[torch.Tensor]], layer: bool, seed: int = 0) -> float:
    """``sum ||C(g) - g||^2 / sum ||g||^2`` over the ranks' gradients ``grads[rank][param]``, compressed as the DDP
    hook compresses them: whole (``layer`` False: one flat vector per rank) or per parameter (``layer``, or a
    compressor that works on each parameter's matrix, such as PowerSGD), what the compressor cannot compress sent
    dense (:class:`~gradstat.compressors.schemes.dense.SmallDense`); pooled over :data:`SEEDS` seeds."""
    per_parameter = layer or comp.per_parameter
    comp = SmallDense(comp)
    blocks = (
        [[g[i] for g in grads] for i in range(len(grads[0]))]
        if per_parameter
        else [[torch.cat([t.reshape(-1) for t in g]) for g in grads]]
    )
    err = norm = 0.0
    for s in range(SEEDS):
        for b, per_rank in enumerate(blocks):
            ctx = Context(seed=seed + s, step=0, block=b)
            decoded = comp.round(per_rank, ctx, [comp.new_state() for _ in per_rank]).decoded
            for g, d in zip(per_rank, decoded, strict=True):
                err += float((d.double() - g.double()).square().sum())
                norm += float(g.double().square().sum())
    return err / norm if norm > 0 else 0.0


def error_factors(
    workload: str, world: int, compressors: Sequence[str], layer: bool, seed: int = 0
) -> dict[str, float]:
    """The measured error factor of each compressor spec on ``workload``'s initial gradients (see the module
    docstring). A compressor that refuses the gradient (its own error is reported when the run starts) is left
    out."""
    grads = initial_gradients(workload, world, seed)
    out = {}
    for spec in dict.fromkeys(compressors):
        try:
            out[spec] = error_factor(create(spec), grads, layer, seed)
        except ValueError:
            continue
    return out


def verdict(spec: str, feedback: str, factor: float) -> FeedbackVerdict:
    """The residual's growth of ``feedback`` (a memory spec; DGC's momentum is judged by the error feedback
    under it) at the measured error factor ``factor``."""
    return FeedbackVerdict(spec, feedback, factor, parse_memory(feedback).feedback.residual_growth(factor))


def check_feedback(pairs: Sequence[tuple[str, str]], factors: dict[str, float]) -> list[FeedbackVerdict]:
    """The verdict of every (compressor spec, feedback spec) pair with a measured factor; raises ValueError for
    the first whose residual grows without bound, naming the measured factor, the growth and the compressor's own
    paper's feedback."""
    out = []
    for spec, fb in pairs:
        if spec not in factors:
            continue
        v = verdict(spec, fb, factors[spec])
        if not v.bounded:
            raise ValueError(
                f"{spec} with feedback {fb} diverges: the compressor's error factor measured on this workload's "
                f"initial gradients is f = E||C(z) - z||^2/||z||^2 = {v.error_factor:.3g}, so this feedback "
                f"multiplies the residual's second moment by decay^2 + f compensation^2 = {v.growth:.3g} >= 1 every "
                f"step (QCS Lemma 4 needs beta < 2/(1 + f)); use {_alternatives(spec, factors[spec])}"
            )
        out.append(v)
    return out


def _alternatives(spec: str, factor: float) -> str:
    """The feedbacks that keep the residual bounded at ``factor``: the compressor's own paper's (when it does),
    QCS's weighted feedback at the optimal weight 1/(1 + f) (Remark 2 eq. (17), growth f/(1 + f)) and none."""
    own, source = paper_feedback(create(spec))
    options = (
        [] if own == "none" or not verdict(spec, own, factor).bounded else [f"its paper's feedback {own} ({source})"]
    )
    weighted = f"qcs:beta={1.0 / (1.0 + factor):.3g}"
    options.append(
        f"{weighted} (QCS Remark 2's optimal weight 1/(1 + f), growth {verdict(spec, weighted, factor).growth:.3g})"
    )
    options.append("none" + (f" (its paper's: {source})" if own == "none" else ""))
    return ", or ".join(options)

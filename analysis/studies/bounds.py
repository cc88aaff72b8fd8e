"""The closed-form bound on ``E||C(g) - g||^2 / ||g||^2`` that applies to a compressor, from its declared
``properties.bound`` key and its hyper-parameters. One home for that mapping (variance, validation, plots).

Keys and formulas (each computed by :mod:`theory`, never here; papers as in :mod:`gradstat.theory.sources`: QCS
(Abdi & Fekri), DQSG (Abdi & Fekri), SIDCo (Abdelmoniem et al.), QSGD (Alistarh et al.), Wangni et al.):

========================  ==========================================================  ======  ===================
key                       bound                                                       claim   source
========================  ==========================================================  ======  ===================
``qcs_gamma``             gamma(n, k, Q)                                              upper   QCS Thm 2 eq. (10)
``qcs_mmse``              1 - alpha = gamma / (gamma + 1)                             upper   QCS Lemma 3 eq. (13)
``dqsg_exact``            ||g||_inf^2 n Delta^2 / 12 / ||g||^2 (per block, summed)    equal   DQSG Lemma 3
``qsgd``                  min(n / s^2, sqrt(n) / s) (per bucket of n)                 upper   QSGD Lemma 3.1
``half_dither_linf``      sum_i Var of the l_inf-scaled stochastic quantizer / ||g||^2  equal   DQSG Sec. 2.1.1, L2
``topk_contraction``      1 - k/d, k = ceil(ratio d)                                  upper   SIDCo Lemma 3 / App. C
``wangni_variance``       sum g_i^2 (1/p_i - 1) / ||g||^2 with the optimal p_i        equal   Wangni et al. Sec. 3
========================  ==========================================================  ======  ===================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol, cast

import torch

from gradstat.analysis.measure.verdicts import Claim
from gradstat.compressors import Compressor
from gradstat.theory.sources import cite


@dataclass(frozen=True)
class Bound:
    """A closed-form value (None: no bound applies), its name, claim direction and source."""

    value: float | None
    name: str
    claim: Claim = "upper"
    source: str = ""


_RULES: dict[str, Callable[[Compressor, torch.Tensor], Bound]] = {}


def rule(key: str) -> Callable:
    def deco(fn: Callable[[Compressor, torch.Tensor], Bound]) -> Callable:
        _RULES[key] = fn
        return fn

    return deco


def closed_form_bound(comp: Compressor, g: torch.Tensor) -> Bound:
    """The bound for ``comp`` on the 1-D gradient ``g`` (``Bound(None, ...)`` when the compressor declares none)."""
    key = comp.properties.bound
    if key is None:
        return Bound(None, "none declared")
    if key not in _RULES:
        return Bound(None, f"{key} (no rule in analysis.studies.bounds)")
    return _RULES[key](comp, g)


class _Sparsifier(Protocol):
    """A compressor whose bound is stated through its target ratio (Top-k, Wangni et al.)."""

    ratio: float


class _BucketQuantizer(Protocol):
    """A stochastic quantizer with scale buckets (QSGD, DQSG, half-dither)."""

    def prepare(self, g: torch.Tensor) -> torch.Tensor: ...

    def quantizer(self, d: int) -> Any: ...


class _QCSConfig(Protocol):
    """The QCS parameters of (10)."""

    gamma: float
    onebit: bool
    block: int
    k: int
    Q: int


# Each rule reads the attributes of the compressors whose ``properties.bound`` names it (cast, not checked).
@rule("topk_contraction")
def _topk(comp: Compressor, g: torch.Tensor) -> Bound:
    d = g.numel()
    k = math.ceil(float(cast(_Sparsifier, comp).ratio) * d)
    return Bound(1.0 - k / d, "1 - k/d", "upper", cite("SIDCo", "Lemma 3 / App. C"))


@rule("wangni_variance")
def _wangni(comp: Compressor, g: torch.Tensor) -> Bound:
    """The optimal p come from :func:`gradstat.theory.wangni.optimal_probabilities` (not from the compressor), so a
    compressor that draws wrong probabilities disagrees with the bound."""
    from gradstat.theory.wangni import optimal_probabilities, variance

    x = g.double().cpu().numpy()
    k = math.ceil(float(cast(_Sparsifier, comp).ratio) * g.numel())
    p, _ = optimal_probabilities(x, k / g.numel())
    return Bound(
        variance(x, p) / float((x * x).sum()),
        "sum g^2 (1/p - 1) / ||g||^2",
        "equal",
        cite("wangni", "Sec. 3; QCS Fig. 3"),
    )


def _quantizer_blocks(comp: Compressor, g: torch.Tensor) -> tuple[list, int, str]:
    """The (prepared) gradient cut into the compressor's scale buckets, its levels per sign and its norm."""
    quantizer = cast(_BucketQuantizer, comp)
    flat = quantizer.prepare(g.reshape(-1).float()).double().cpu().numpy()
    q = quantizer.quantizer(flat.size)
    size = q.bucket_size(flat.size)
    return [flat[i : i + size] for i in range(0, flat.size, size)], int(q.levels), str(q.norm)


@rule("dqsg_exact")
def _dqsg(comp: Compressor, g: torch.Tensor) -> Bound:
    from gradstat.theory.dqsg import conditional_error

    blocks, levels, _ = _quantizer_blocks(comp, g)
    total = sum(conditional_error(b, 1.0 / levels) for b in blocks if (b != 0).any())
    return Bound(
        total / float(g.double().square().sum()),
        "sum_K ||g_K||_inf^2 n_K Delta^2/12 / ||g||^2",
        "equal",
        cite("DQSG", "Lemma 3 / App. B"),
    )


@rule("half_dither_linf")
def _half(comp: Compressor, g: torch.Tensor) -> Bound:
    from gradstat.theory.qsgd import total_variance

    blocks, levels, norm = _quantizer_blocks(comp, g)
    total = sum(total_variance(b, levels, norm) for b in blocks if (b != 0).any())
    return Bound(
        total / float(g.double().square().sum()),
        "sum_i step^2 f_i (1 - f_i) / ||g||^2",
        "equal",
        cite("DQSG", "Sec. 2.1.1 and Lemma 2"),
    )


@rule("qsgd")
def _qsgd(comp: Compressor, g: torch.Tensor) -> Bound:
    from gradstat.theory.qsgd import variance_bound

    d = g.numel()
    q = cast(_BucketQuantizer, comp).quantizer(d)
    if q.norm != "l2":
        return _half(comp, g)
    return Bound(
        variance_bound(q.bucket_size(d), int(q.levels)),
        "min(n/s^2, sqrt(n)/s), n = bucket",
        "upper",
        cite("QSGD", "Lemma 3.1 (QCS Fig. 3)"),
    )


def qcs_gamma(comp: Compressor) -> float:
    """gamma (10) of a QCS configuration; the 1-bit variant's range 1/2 is outside theory.qcs.gamma's integer Q,
    so it comes from the compressor's own evaluation of (10)."""
    from gradstat.theory.qcs import gamma

    qcs = cast(_QCSConfig, comp)
    return float(qcs.gamma) if qcs.onebit else gamma(qcs.block, qcs.k, qcs.Q)


@rule("qcs_gamma")
def _qcs(comp: Compressor, g: torch.Tensor) -> Bound:
    return Bound(qcs_gamma(comp), "gamma(n, k, Q)", "upper", cite("QCS", "Thm 2 eq. (10)"))


@rule("qcs_mmse")
def _qcs_mmse(comp: Compressor, g: torch.Tensor) -> Bound:
    from gradstat.theory.qcs import mmse_error_factor

    return Bound(
        mmse_error_factor(qcs_gamma(comp)),
        "1 - alpha = gamma/(gamma+1)",
        "upper",
        cite("QCS", "Lemma 3 eq. (13)"),
    )

"""Each compressor's own paper's memory: the feedback (or none) that the paper trains it with.

``gradstat train`` uses it when no feedback is given (``--feedback paper``), so that every compressor runs as its
paper runs it. The choice matters most for the unbiased quantizers: their error has a variance factor gamma above 1
on real gradients, and plain error feedback (compensation 1) then multiplies the residual's second moment by about
gamma each step (:meth:`~gradstat.compressors.memory.feedback.ErrorFeedback.residual_growth`); their papers send
without feedback (QSGD, TernGrad, DQSG/NDQSG, Wangni et al.) or with QCS's weighted feedback at its optimal weight.

==================  ======================================  ===============================================
compressor          memory                                  source
==================  ======================================  ===============================================
sparsifiers         ``ef``                                  SIDCo (Abdelmoniem et al.) Sec. 4, App. A (EC)
``dgc``             ``ef`` (see below)                      DGC (Lin et al. 2018) momentum correction
``gmc_topk``        ``ef`` (global momentum: the optimizer)  GMC (Zhao et al.) Sec. 4, memory u_{t+1,k}
``onebit``          ``ef``                                  Seide et al. 2014 (error feedback)
``signsgd``         ``ef``                                  Karimireddy et al. 2019 (EF-signSGD)
``powersgd``        ``ef``                                  Vogels et al. 2019, Algorithm 2 (error feedback)
``qcs`` unbiased    ``qcs:beta=1/(gamma+1)``                QCS (Abdi & Fekri) eq. (14), Remark 2 eq. (17)
``qcs`` MMSE        ``ef`` (beta_m* = 1)                    QCS (Abdi & Fekri) Remark 2 eq. (18)
``ecq``             ``ecq:alpha=0.2,beta=0.99``             ECQ-SGD (Wu et al.): error compensation
``qsgd``            ``none``                                QSGD (Alistarh et al.); DQSG eq. (1)
``terngrad``        ``none``                                TernGrad (Wen et al.); DQSG Sec. 2.1.1
``dqsg``/``ndqsg``  ``none``                                DQSG/NDQSG (Abdi & Fekri) Algorithms 1, 2
``wangni``          ``none``                                Wangni et al. 2018 (unbiased sparsification)
``randk_unbiased``  ``none``                                Wangni et al. 2018 (uniform p_i = k/d)
==================  ======================================  ===============================================

DGC's momentum correction (``dgc:momentum=0.9``) replaces the optimizer's momentum; with a momentum optimizer (every
built-in workload's SGD) it would apply momentum twice, so the default is the error feedback underneath it. ECQ's
source (a summary of the paper) gives no coefficients: alpha = 0.2, beta = 0.99 are the ones the ``ecq-syn``
experiment uses (with alpha = 1 the accumulated error grows without bound at QSGD's variance factor).
"""

from __future__ import annotations

from gradstat.compressors.base import Compressor
from gradstat.compressors.schemes.quantizers.qcs import QCS

ECQ_ALPHA, ECQ_BETA = 0.2, 0.99
"""ECQ-SGD's compensation coefficient alpha and time decay beta (the source gives none; see the module docstring)."""

PAPER = "paper"
"""The feedback spec that stands for each compressor's own paper's memory."""

_SPARSIFIER = ("ef", "SIDCo (Abdelmoniem et al.) Sec. 4 and App. A: memory-based compression (error compensation)")
_FIXED: dict[str, tuple[str, str]] = {
    "dgc": ("ef", "DGC (Lin et al. 2018): error feedback under its momentum correction (the optimizer keeps momentum)"),
    "gmc_topk": (
        "ef",
        "GMC (Zhao et al.) Sec. 4: memory u_{t+1,k} = (1 - m) * (g + u), global momentum in the optimizer",
    ),
    "onebit": ("ef", "Seide et al. 2014: 1-bit SGD with error feedback"),
    "signsgd": ("ef", "Karimireddy et al. 2019: EF-signSGD"),
    "powersgd": ("ef", "Vogels et al. 2019 (PowerSGD), Algorithm 2: error feedback"),
    "ecq": (
        f"ecq:alpha={ECQ_ALPHA},beta={ECQ_BETA}",
        "ECQ-SGD (Wu et al.): error compensation (alpha, beta: ecq-syn's)",
    ),
    "qsgd": ("none", "QSGD (Alistarh et al. 2017): no feedback; DQSG (Abdi & Fekri) eq. (1)"),
    "terngrad": ("none", "TernGrad (Wen et al. 2017): no feedback; DQSG (Abdi & Fekri) Sec. 2.1.1"),
    "dqsg": ("none", "DQSG (Abdi & Fekri) Algorithm 1: no feedback"),
    "ndqsg": ("none", "NDQSG (Abdi & Fekri) Algorithm 2: no feedback"),
    "wangni": ("none", "Wangni et al. 2018: unbiased sparsification, no feedback"),
    "randk_unbiased": ("none", "Wangni et al. 2018 (uniform p_i = k/d): unbiased, no feedback"),
}


def paper_feedback(comp: Compressor) -> tuple[str, str]:
    """``(feedback spec, source)`` of ``comp``'s own paper (see the module docstring's table). QCS's weight is
    beta_u* = 1/(gamma + 1) of Remark 2 eq. (17) with gamma of eq. (10) for this configuration (unbiased QCS) and
    beta_m* = 1 of eq. (18) (MMSE QCS). A compressor not in the table that is a sparsifier gets error feedback;
    anything else none."""
    if isinstance(comp, QCS):
        if comp.alpha == "mmse":
            return "ef", "QCS (Abdi & Fekri) Remark 2 eq. (18): beta_m* = 1"
        gamma = float(comp.gamma)
        return (
            f"qcs:beta={1.0 / (gamma + 1.0):.6g}",
            f"QCS (Abdi & Fekri) Remark 2 eq. (17): beta_u* = 1/(gamma+1), gamma = {gamma:.4g}",
        )
    if comp.name in _FIXED:
        return _FIXED[comp.name]
    if comp.properties.kind == "sparsifier":
        return _SPARSIFIER
    return "none", "no feedback declared for this compressor"

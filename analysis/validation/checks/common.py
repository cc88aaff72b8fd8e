"""Shared steps of the check modules: building a compressor, the check's gradient block, and the factory of the
most common kind of check, ``E||C(g) - g||^2 / ||g||^2`` of one compressor against its closed-form bound."""

from __future__ import annotations

import torch

from gradstat import compressors
from gradstat.analysis.measure.intervals import mean_ci
from gradstat.analysis.measure.sources import GradientSource
from gradstat.analysis.studies.bounds import closed_form_bound
from gradstat.analysis.studies.variance import error_samples
from gradstat.analysis.validation.engine import Check, Claim, Measurement, NotApplicable, Setting


def create(spec: str) -> compressors.Compressor:
    """The compressor of ``spec``, or :class:`NotApplicable` when its name is not registered."""
    name = spec.partition(":")[0]
    if name not in compressors.names():
        raise NotApplicable(f"compressor {name!r} is not available")
    return compressors.create(spec)


def block(setting: Setting, n: int, index: int = 0) -> torch.Tensor:
    """The check's gradient block of length ``n`` on the setting's device (synthetic unless a dump is given)."""
    source = setting.source if setting.source is not None else GradientSource()
    return source.vector(n, setting.device, index=index)


def variance_check(
    name: str, spec: str, n: int, claim: Claim, source: str, quick: int, full: int, must_hold: bool = True
) -> Check:
    """``E||C(g) - g||^2 / ||g||^2`` of ``spec`` on a block of ``n`` vs :func:`gradstat.analysis.studies.bounds.closed_form_bound`."""

    def measure(s: Setting) -> Measurement:
        comp = create(spec)
        g = block(s, n)
        bound = closed_form_bound(comp, g)
        est = mean_ci(error_samples(comp, g, s.trials, s.seed))
        return Measurement(bound.value, est, f"{spec}, n={n}; bound {bound.name}")

    return Check(
        name, source, claim, "E||C(g) - g||^2 / ||g||^2", measure, {"quick": quick, "full": full}, must_hold=must_hold
    )

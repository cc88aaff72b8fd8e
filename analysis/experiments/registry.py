"""The registry of experiments: one module per experiment, each exposing ``EXPERIMENT`` (an
:class:`~gradstat.analysis.experiments.base.Experiment`), imported here by name. Listing order is the order of
:data:`MEMBERS`; a module that fails to import fails the registry (nothing is skipped)."""

from __future__ import annotations

from gradstat.analysis.experiments import (
    ecq_syn,
    gmc,
    layerwise,
    ndqsg_bits,
    qcs_fig2,
    qcs_fig4,
    sidco_microbench,
    sidco_quality,
)
from gradstat.analysis.experiments.base import Experiment

MEMBERS = (qcs_fig2, qcs_fig4, ecq_syn, gmc, ndqsg_bits, sidco_quality, sidco_microbench, layerwise)
"""The experiment modules, in listing order."""


def experiments() -> dict[str, Experiment]:
    """name -> experiment, in listing order."""
    found: dict[str, Experiment] = {}
    for mod in MEMBERS:
        exp: Experiment = mod.EXPERIMENT
        if exp.name in found:
            raise ValueError(f"two experiments are called {exp.name!r} ({mod.__name__} and another module)")
        found[exp.name] = exp
    return found


def get_experiment(name: str) -> Experiment:
    """The experiment called ``name``; a ValueError naming the known ones otherwise."""
    known = experiments()
    if name not in known:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(known)} (see 'gradstat experiment list')")
    return known[name]

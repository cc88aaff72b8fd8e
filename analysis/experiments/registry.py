"""The registry of experiments: one module per experiment, each exposing ``EXPERIMENT`` (an
:class:`~gradstat.analysis.experiments.base.Experiment`). Listing order is the order below."""

from __future__ import annotations

import importlib

from gradstat.analysis.experiments.base import Experiment

MODULES = (
    "qcs_fig2",
    "qcs_fig4",
    "ecq_syn",
    "gmc",
    "ndqsg_bits",
    "sidco_quality",
    "sidco_microbench",
    "layerwise",
)
"""Experiment modules under :mod:`gradstat.analysis.experiments`, in listing order."""


def experiments() -> dict[str, Experiment]:
    """name -> experiment, for every module in :data:`MODULES` that exists."""
    found: dict[str, Experiment] = {}
    for module in MODULES:
        try:
            mod = importlib.import_module(f"gradstat.analysis.experiments.{module}")
        except ModuleNotFoundError as exc:
            if exc.name == f"gradstat.analysis.experiments.{module}":
                continue
            raise
        exp: Experiment = mod.EXPERIMENT
        found[exp.name] = exp
    return found


def get_experiment(name: str) -> Experiment:
    """The experiment called ``name``; a ValueError naming the known ones otherwise."""
    known = experiments()
    if name not in known:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(known)} (see 'gradstat experiment list')")
    return known[name]

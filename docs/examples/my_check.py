"""A validation check of natural compression's bound: E||C(g) - g||^2 / ||g||^2 <= 1/8 (Horvath et al., "Natural
Compression for Distributed Deep Learning", Theorem 1), measured by Monte Carlo with a confidence interval."""

from __future__ import annotations

import my_compressor  # noqa: F401  (registers "natural")

from gradstat import compressors
from gradstat.analysis.measure.intervals import mean_ci
from gradstat.analysis.studies.variance import error_samples
from gradstat.analysis.validation.checks.common import block, origin
from gradstat.analysis.validation.engine import Check, Measurement, Setting

N = 4096  # length of the gradient block


def measure(setting: Setting) -> Measurement:
    """E||C(g) - g||^2 / ||g||^2 of natural compression over ``setting.trials`` seeds, on the setting's block
    (synthetic Laplace(1), or a dump's gradient), against the 1/8 of Theorem 1."""
    comp = compressors.create("natural")
    g = block(setting, N)
    samples = error_samples(comp, g, setting.trials, setting.seed)
    return Measurement(1 / 8, mean_ci(samples), "natural; bound 1/8", origin(setting, N), setup={"n": N})


NATURAL_VARIANCE = Check(
    name="natural-variance",
    source="Horvath et al., Natural Compression, Thm 1",
    claim="upper",
    quantity="E||C(g) - g||^2 / ||g||^2",
    measure=measure,
    trials={"quick": 200, "full": 2000},
)

if __name__ == "__main__":
    result = NATURAL_VARIANCE.run("quick", seed=0)
    print(result.verdict, result.row()["empirical"], result.row()["ci_high"], result.theory)

"""NDQSG's decoding-failure probability against Theorem 6 (002_87c17e3716ede1d0.txt).

Worker 1 (group P2 of Algorithm 2) encodes x = y + z with nested quantizers; the receiver decodes with side
information y. An element fails when it lands in the wrong coarse bin, i.e. differs from the decode with perfect
side information (x itself) by more than ``alpha Delta2 / 2`` (in the units of the scale kappa = ||x||_inf the
compressor sends). The theorem's sigma_z^2 = E z_i^2 is taken in those units, averaged over elements and trials;
each trial draws a fresh Gaussian z and dither. The bound is Chebyshev's, so it is expected to be loose; the note
gives the exact Gaussian probability (:func:`gradstat.theory.dqsg.nested_failure_probability`) for comparison.
"""

from __future__ import annotations

import numpy as np
import torch

from gradstat.analysis.measure.intervals import mean_ci
from gradstat.analysis.validation.checks.common import block, create
from gradstat.analysis.validation.engine import Check, Measurement, Setting
from gradstat.compressors import Context

DQSG = "002_87c17e3716ede1d0.txt"
N = 4096
DELTA1, DELTA2, ALPHA = 1.0 / 3.0, 1.0, 1.0
NOISE = 0.15
"""Standard deviation of z relative to ||y||_inf."""


def _failure(s: Setting) -> Measurement:
    from gradstat.theory.dqsg import nested_failure_bound, nested_failure_probability

    comp = create(f"ndqsg:delta1={DELTA1},delta2={DELTA2},alpha={ALPHA}")
    y = block(s, N).double()
    fractions, sz2 = [], []
    for t in range(s.trials):
        gen = torch.Generator(device=s.device).manual_seed(s.seed * 1_000_003 + t)
        z = torch.randn(N, generator=gen, device=s.device, dtype=torch.float64) * NOISE * float(y.abs().max())
        x = (y + z).float()
        ctx = Context(seed=s.seed, step=t, worker=1)
        payload = comp.encode(x, ctx)
        kappa = float(payload["scales"])
        out, oracle = comp.decode(payload, ctx, side=y.float()), comp.decode(payload, ctx, side=x)
        fractions.append(float(((out - oracle).abs() > 0.5 * ALPHA * DELTA2 * kappa).double().mean()))
        sz2.append(float((z / kappa).square().mean()))
    sigma_z = float(np.sqrt(np.mean(sz2)))
    exact = nested_failure_probability(DELTA1, DELTA2, ALPHA, sigma_z)
    return Measurement(
        nested_failure_bound(DELTA1, DELTA2, ALPHA, sigma_z),
        mean_ci(fractions),
        f"Delta1=1/3, Delta2=1, alpha=1, n={N}, sigma_z={sigma_z:.3g}; exact Gaussian probability {exact:.3g}",
    )


CHECKS = [
    Check(
        "ndqsg-failure",
        f"{DQSG} Thm 6 eq. (8)",
        "upper",
        "Pr(element decoded in the wrong coarse bin)",
        _failure,
        {"quick": 50, "full": 500},
    )
]

"""NDQSG's decoding with side information (Abdi & Fekri, Nested Dithered Quantization, Theorem 6 and eq. (9)).

Set-up: worker 1 (group P2 of Algorithm 2) encodes ``x = y + z`` with nested quantizers (Delta1 = 1/3, Delta2 = 1,
alpha = 1: the paper's experiment); the receiver decodes with side information ``y``. ``y`` is the check's gradient
block; each trial draws a fresh Gaussian ``z`` (standard deviation ``NOISE ||y||_inf``) and a fresh dither.

Reference, independent of the code under test: with alpha = 1, eq. (6)-(7) give ``x_hat - x = e - Q2(z + e)``
(``e`` the fine quantization error, uniform on one step of Delta1 by Theorem 1), so a correct decode is within
``Delta1/2`` of the truth and a failed one at least ``Delta2 - Delta1/2`` away. An element is counted as failed
when ``|x_hat - x| > (Delta1 + Delta2)/4`` (in units of the scale kappa = ||x||_inf the compressor sends), i.e. by
comparing the decoded value with the true x, not with a second decode.

Three rows:

- ``ndqsg-failure`` (equality, must hold): the failure rate against the exact probability
  ``Pr(|alpha z + u| > Delta2/2)`` for Gaussian z (:func:`gradstat.theory.dqsg.nested_failure_probability`),
  evaluated per trial at that trial's ``sigma_z = NOISE ||y||_inf / kappa_t`` and averaged over the trials
  (the exact probability is not linear in sigma_z, so a pooled sigma_z would be biased);
- ``ndqsg-error`` (equality, must hold): the mean squared error without the coarse-bin part, ``x_hat - x`` reduced
  modulo Delta2 (which is ``e`` for every element, failed or not), against (9) ``alpha^2 Delta1^2 / 12 +
  (1 - alpha^2)^2 sigma_z^2`` (= Delta1^2/12 at alpha = 1). Averaging over the correct elements only would be
  biased low (elements with a large |e| fail more often);
- ``ndqsg-failure-chebyshev`` (upper, reported, not required): the same failure rate against Theorem 6's bound
  (8), a Chebyshev bound about 30 times the rate, too loose to catch a realistic bug.
"""

from __future__ import annotations

import numpy as np
import torch

from gradstat.analysis.measure.intervals import mean_ci
from gradstat.analysis.validation.checks.common import block, create, origin, paired
from gradstat.analysis.validation.engine import Check, Measurement, Setting
from gradstat.compressors import Context
from gradstat.theory.sources import cite, file_of

NDQSG = "NDQSG"
N = 4096
DELTA1, DELTA2, ALPHA = 1.0 / 3.0, 1.0, 1.0
NOISE = 0.15
"""Standard deviation of z relative to ||y||_inf."""
SPEC = f"ndqsg:delta1={DELTA1},delta2={DELTA2},alpha={ALPHA}"


def _trials(s: Setting) -> dict[str, np.ndarray]:
    """Per trial: failure fraction, exact failure probability, MSE of the correct elements, sigma_z (kappa units)."""
    from gradstat.theory.dqsg import nested_failure_probability

    comp = create(SPEC)
    y = block(s, N).double()
    ymax = float(y.abs().max())
    out: dict[str, list[float]] = {"fail": [], "exact": [], "mse": [], "sigma_z": []}
    for t in range(s.trials):
        gen = torch.Generator(device=s.device).manual_seed(s.seed * 1_000_003 + t)
        z = torch.randn(N, generator=gen, device=s.device, dtype=torch.float64) * NOISE * ymax
        x = (y + z).float()
        ctx = Context(seed=s.seed, step=t, worker=1)
        payload = comp.encode(x, ctx)
        kappa = float(x.abs().max())  # the scale the encoder must send (kappa = ||x||_inf), computed here
        err = (comp.decode(payload, ctx, side=y.float()).double() - x.double()) / kappa
        failed = err.abs() > (DELTA1 + DELTA2) / 4
        sigma_z = NOISE * ymax / kappa
        out["fail"].append(float(failed.double().mean()))
        out["exact"].append(nested_failure_probability(DELTA1, DELTA2, ALPHA, sigma_z))
        folded = err - DELTA2 * torch.round(err / DELTA2)
        out["mse"].append(float(folded.square().mean()))
        out["sigma_z"].append(sigma_z)
    return {k: np.asarray(v) for k, v in out.items()}


_SETUP = {"compressor": SPEC, "n": N, "noise": f"z ~ N(0, ({NOISE} ||y||_inf)^2)"}


def _note(r: dict[str, np.ndarray]) -> str:
    return (
        f"Delta1=1/3, Delta2=1, alpha=1, n={N}, z ~ N(0, ({NOISE} ||y||_inf)^2) per trial; sigma_z/kappa from "
        f"{r['sigma_z'].min():.3g} to {r['sigma_z'].max():.3g}; failure = |x_hat - x| > (Delta1 + Delta2)/4"
    )


def _failure(s: Setting) -> Measurement:
    r = _trials(s)
    theory, est, _ = paired(r["fail"], r["exact"])
    return Measurement(
        theory,
        est,
        _note(r) + "; theory: exact Gaussian probability at each trial's sigma_z, averaged over trials; interval of "
        "the paired difference (measured - exact per trial)",
        origin(s, N) + "; side information y = this block, x = y + z",
        setup=_SETUP,
    )


def _chebyshev(s: Setting) -> Measurement:
    from gradstat.theory.dqsg import nested_failure_bound

    r = _trials(s)
    bound = float(np.mean([nested_failure_bound(DELTA1, DELTA2, ALPHA, v) for v in r["sigma_z"]]))
    return Measurement(
        bound,
        mean_ci(r["fail"]),
        _note(r) + f"; bound (8) averaged over trials; exact probability {r['exact'].mean():.3g}",
        origin(s, N) + "; side information y = this block, x = y + z",
        setup=_SETUP,
    )


def _error(s: Setting) -> Measurement:
    from gradstat.theory.dqsg import nested_error_variance

    r = _trials(s)
    theory = float(np.mean([nested_error_variance(DELTA1, ALPHA, v) for v in r["sigma_z"]]))
    return Measurement(
        theory,
        mean_ci(r["mse"]),
        _note(r) + "; mean of ((x_hat - x) / kappa mod Delta2)^2 over all elements",
        origin(s, N) + "; side information y = this block, x = y + z",
        setup=_SETUP,
    )


CHECKS = [
    Check(
        "ndqsg-failure",
        cite(NDQSG, "Thm 6 (p = Pr(|alpha z + u| > Delta2/2)), exact for Gaussian z"),
        "equal",
        "Pr(element decoded in the wrong coarse bin)",
        _failure,
        {"quick": 100, "full": 1000},
        paper=file_of(NDQSG),
    ),
    Check(
        "ndqsg-error",
        cite(NDQSG, "eq. (9)"),
        "equal",
        "E[((x_hat - x) / kappa mod Delta2)^2]",
        _error,
        {"quick": 100, "full": 1000},
        paper=file_of(NDQSG),
    ),
    Check(
        "ndqsg-failure-chebyshev",
        cite(NDQSG, "Thm 6 eq. (8) (Chebyshev bound)"),
        "upper",
        "Pr(element decoded in the wrong coarse bin)",
        _chebyshev,
        {"quick": 100, "full": 1000},
        must_hold=False,
        paper=file_of(NDQSG),
    ),
]

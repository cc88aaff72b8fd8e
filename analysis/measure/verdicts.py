"""Claims and verdicts: how a measured interval is compared with a theory value.

The rule (the same for the validation checks, the studies and the report):

- upper bound (empirical <= theory): **holds** when the whole interval lies below the bound, **violated** when it
  lies entirely above it, **tight** when it touches or contains it;
- lower bound: the mirror image;
- equality (an exact identity such as DQSG's variance or unbiasedness): **holds** when the interval meets
  ``[theory - tolerance, theory + tolerance]``, **violated** otherwise (an equality is never "tight");
- **not applicable** when there is no finite theory value.
"""

from __future__ import annotations

import math
from typing import Literal

from gradstat.analysis.measure.intervals import Estimate

Claim = Literal["upper", "lower", "equal"]
Verdict = Literal["holds", "tight", "violated", "not applicable"]
Size = Literal["quick", "full"]
VERDICTS: tuple[Verdict, ...] = ("holds", "tight", "violated", "not applicable")


def verdict(claim: Claim, theory: float | None, est: Estimate, tolerance: float = 0.0) -> Verdict:
    """The verdict of ``est`` against ``theory`` for a claim direction (see the module docstring)."""
    if theory is None or not math.isfinite(theory):
        return "not applicable"
    if claim == "upper":
        return "holds" if est.high < theory else "violated" if est.low > theory else "tight"
    if claim == "lower":
        return "holds" if est.low > theory else "violated" if est.high < theory else "tight"
    if claim == "equal":
        return "holds" if est.low - tolerance <= theory <= est.high + tolerance else "violated"
    raise ValueError(f"claim must be upper, lower or equal, got {claim!r}")

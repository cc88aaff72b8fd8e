"""Every check the project knows, in the order of the validation table."""

from __future__ import annotations

from gradstat.analysis.validation.checks import feedback, gmc, ndqsg, quantizers, sidco, sparsifiers
from gradstat.analysis.validation.engine import Check

CHECKS: tuple[Check, ...] = (
    *quantizers.CHECKS,
    *sparsifiers.CHECKS,
    *ndqsg.CHECKS,
    *sidco.CHECKS,
    *gmc.CHECKS,
    *feedback.CHECKS,
)


def names() -> list[str]:
    return [c.name for c in CHECKS]


def get(name: str) -> Check:
    for c in CHECKS:
        if c.name == name:
            return c
    raise ValueError(f"unknown check {name!r}; known: {', '.join(names())}")


def select(spec: str | None) -> list[Check]:
    """Checks by a comma list of names or prefixes (``qcs`` selects every ``qcs-*``); None or ``all``: every check."""
    if spec is None or spec.strip().lower() in ("", "all"):
        return list(CHECKS)
    out: list[Check] = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        hit = [c for c in CHECKS if c.name == item or c.name.startswith(item + "-")]
        if not hit:
            raise ValueError(f"--checks: {item!r} matches no check; known: {', '.join(names())}")
        out.extend(c for c in hit if c not in out)
    return out

"""QCS weighted error feedback: residual bounds eta(beta) of Lemma 4 (000_4b111efa75352b2d.txt)."""
from __future__ import annotations

CHECKS: list = []

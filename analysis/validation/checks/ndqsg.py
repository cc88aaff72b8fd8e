"""NDQSG's decoding-failure probability against Theorem 6 (002_87c17e3716ede1d0.txt)."""
from __future__ import annotations

CHECKS: list = []

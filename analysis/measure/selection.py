"""Parsing of the selections every command takes: ``--steps``, ``--layers``, ``--workers`` and ``--device``.

Grammar of an integer selection (steps, workers): ``all``, a comma list of items, each an integer ``7``, a range
``2-10`` (inclusive) or a strided range ``0-100:10``; ``first:N`` / ``last:N`` take the first/last N available.
Layers: ``all``, or a comma list of parameter names or ``fnmatch`` patterns (``conv*.weight``).
Everything selected must exist; an empty selection is an error.
"""

from __future__ import annotations

import fnmatch
from typing import Sequence

import torch


def parse_indices(spec: str | None, available: Sequence[int], what: str = "steps") -> list[int]:
    """Select from ``available`` (sorted ints) by ``spec`` (see the module docstring); None means all.

    Raises
    ------
    ValueError : malformed spec, an item not in ``available``, or an empty result.
    """
    avail = sorted(int(a) for a in available)
    if not avail:
        raise ValueError(f"no {what} available to select from")
    if spec is None or spec.strip().lower() in ("", "all"):
        return avail
    spec = spec.strip().lower()
    for head in ("first:", "last:"):
        if spec.startswith(head):
            n = _int(spec[len(head) :], what, spec)
            if n < 1:
                raise ValueError(f"--{what} {spec!r}: N must be >= 1")
            return avail[:n] if head == "first:" else avail[-n:]
    chosen: list[int] = []
    aset = set(avail)
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            raise ValueError(f"--{what} {spec!r}: empty item")
        rng, _, stride_s = item.partition(":")
        stride = _int(stride_s, what, spec) if stride_s else 1
        if stride < 1:
            raise ValueError(f"--{what} {spec!r}: stride must be >= 1")
        if "-" in rng:
            a_s, _, b_s = rng.partition("-")
            a, b = _int(a_s, what, spec), _int(b_s, what, spec)
            if b < a:
                raise ValueError(f"--{what} {spec!r}: range {item!r} is empty (end < start)")
            chosen.extend(i for i in range(a, b + 1, stride) if i in aset)
        else:
            i = _int(rng, what, spec)
            if i not in aset:
                raise ValueError(f"--{what}: {i} is not available; available {what}: {_summary(avail)}")
            chosen.append(i)
    out = sorted(set(chosen))
    if not out:
        raise ValueError(f"--{what} {spec!r} selects nothing; available {what}: {_summary(avail)}")
    return out


def parse_layers(spec: str | None, params: Sequence[str]) -> list[str]:
    """Select parameter names (in model order) by names or fnmatch patterns; None/``all`` means all."""
    if not params:
        raise ValueError("no layers available to select from")
    if spec is None or spec.strip().lower() in ("", "all"):
        return list(params)
    patterns = [p.strip() for p in spec.split(",") if p.strip()]
    keep = set()
    for p in patterns:
        hit = [n for n in params if fnmatch.fnmatchcase(n, p)]
        if not hit:
            raise ValueError(f"--layers: {p!r} matches no parameter; parameters: {', '.join(params)}")
        keep.update(hit)
    return [n for n in params if n in keep]


def parse_floats(
    spec: str, what: str, low: float | None = None, high: float | None = None, open_interval: bool = True
) -> list[float]:
    """A comma list of floats (``0.1,0.01``), each checked to lie in (low, high) (or [low, high])."""
    out = []
    for item in (s.strip() for s in str(spec).split(",")):
        try:
            v = float(item)
        except ValueError:
            raise ValueError(f"--{what}: {item!r} is not a number (expected a comma list like 0.1,0.01)") from None
        bad_low = low is not None and (v <= low if open_interval else v < low)
        bad_high = high is not None and (v >= high if open_interval else v > high)
        if bad_low or bad_high or v != v:
            br = "()" if open_interval else "[]"
            raise ValueError(f"--{what}: {v} must lie in {br[0]}{low}, {high}{br[1]}")
        out.append(v)
    if not out:
        raise ValueError(f"--{what}: empty list")
    return out


def resolve_device(name: str | None) -> torch.device:
    """``cpu``, ``cuda`` (error if absent), ``cuda:N`` or ``auto`` (CUDA when present, else CPU)."""
    name = (name or "auto").strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: no CUDA device is available here (use cpu or auto)")
        return torch.device(name)
    raise ValueError(f"--device must be cpu, cuda or auto, got {name!r}")


def _int(s: str, what: str, spec: str) -> int:
    try:
        return int(s.strip())
    except ValueError:
        raise ValueError(f"--{what} {spec!r}: {s.strip()!r} is not an integer") from None


def _summary(values: Sequence[int]) -> str:
    return ", ".join(map(str, values)) if len(values) <= 12 else f"{values[0]}..{values[-1]} ({len(values)} in all)"

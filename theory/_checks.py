"""Argument checks shared by the closed-form modules of ``theory``.

Every public closed form validates its inputs with these helpers, so that a wrong input always raises a
``ValueError`` (or ``TypeError``) whose message names the argument, the value received and what is accepted.
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def integer(name: str, value: object, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` as an ``int`` after checking it is an integer in ``[minimum, maximum]``."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        out = int(value)
    elif isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer():
        out = int(math.trunc(value))
    else:
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and out < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {out}")
    if maximum is not None and out > maximum:
        raise ValueError(f"{name} must be an integer <= {maximum}, got {out}")
    return out


def real(
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Return ``value`` as a finite ``float`` inside the interval given by ``low``/``high`` (closed unless open)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    bad_low = low is not None and (value <= low if low_open else value < low)
    bad_high = high is not None and (value >= high if high_open else value > high)
    if bad_low or bad_high:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        raise ValueError(f"{name} must lie in {left}{lo}, {hi}{right}, got {value:g}")
    return value


def positive(name: str, value: object) -> float:
    """A finite real number > 0."""
    return real(name, value, low=0.0, low_open=True)


def nonnegative(name: str, value: object) -> float:
    """A finite real number >= 0."""
    return real(name, value, low=0.0)


def unit_open(name: str, value: object) -> float:
    """A finite real number in the open interval (0, 1) (ratios, probabilities, densities)."""
    return real(name, value, low=0.0, high=1.0, low_open=True, high_open=True)


def vector(name: str, value: object, *, min_size: int = 1, nonzero: bool = False) -> np.ndarray:
    """A finite 1-D float64 array of at least ``min_size`` elements (any array-like or CPU/GPU tensor).

    ``nonzero=True`` additionally rejects the all-zero vector (no norm to scale by, no direction to keep).
    """
    if hasattr(value, "detach"):  # a torch tensor, on any device: theory stays free of a torch import
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array of real numbers, got {type(value).__name__}") from exc
    if arr.size < min_size:
        raise ValueError(f"{name} must have at least {min_size} element(s), got {arr.size}")
    if not np.all(np.isfinite(arr)):
        bad = int(np.count_nonzero(~np.isfinite(arr)))
        raise ValueError(f"{name} must be finite, got {bad} NaN/Inf element(s)")
    if nonzero and not np.any(arr):
        raise ValueError(f"{name} must not be the all-zero vector")
    return arr


def choice(name: str, value: object, accepted: tuple[str, ...]) -> str:
    """One of ``accepted`` (exact string match)."""
    if value not in accepted:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, accepted))}, got {value!r}")
    return str(value)

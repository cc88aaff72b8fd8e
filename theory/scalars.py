"""The scalar arithmetic of fits and thresholds, written once for two kinds of number.

A fit reads a handful of statistics from a vector (counts and sums, :mod:`gradstat.theory.kernels.stage_stats`) and
turns them into parameters and a threshold with a few dozen scalar operations. Where the vector lives on an
accelerator those scalars stay 0-d tensors on its device, so that nothing is read back before the selection (one
synchronisation at the end). On a CPU there is no device to stay on, and each 0-d tensor operation costs a
dispatch of a few microseconds: a three-stage SIDCo threshold of a 260k-element tensor spent most of its time
there. On a CPU the same code therefore runs on host numbers, numpy float64 scalars (IEEE arithmetic: division by
zero, the logarithm of 0 and overflow give inf or NaN as the tensors do, never an exception; a caller computing on
host numbers holds ``numpy.errstate(all="ignore")`` around the whole computation, so that they raise no warning
either).

The estimators, thresholds and peak-over-threshold stages call the functions of this module in place of
``torch.log``, ``torch.where`` and the like; each takes either kind and returns the same kind. Which kind a
computation uses is decided once, from its data, by :func:`on_host`: host numbers for a CPU tensor under any
kernel policy but ``never`` (:mod:`gradstat.theory.kernels.policy`), 0-d tensors otherwise, so ``never`` keeps
the tensor arithmetic as the reference the host form is tested against (``tests/theory/test_scalars.py``). Both
forms evaluate the same float64 expressions; they can differ only in the last bits of a transcendental function
(libm against torch's own), which the tests bound.
"""

from __future__ import annotations

import math
from typing import Any, TypeAlias

import numpy as np
import torch

from gradstat.theory.kernels.policy import native_allowed

Scalar: TypeAlias = Any
"""A 0-d float64 tensor on the data's device, or a host float64 (numpy scalar). Both take the same arithmetic and
comparison operators, mixed with Python numbers; a type checker cannot follow which one a computation holds (the
operators of the two mix in ways their stubs do not describe), so the alias is ``Any``."""

Flag: TypeAlias = Any
"""A 0-d bool tensor on the data's device, or a host bool (numpy or Python); ``Any`` as :data:`Scalar`."""

_NUMPY = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}


def on_host(x: torch.Tensor) -> bool:
    """Whether the scalars computed from ``x`` are host numbers: ``x`` on a CPU and a kernel policy other than
    ``never`` (see the module docstring)."""
    return x.device.type == "cpu" and native_allowed()


def constant(value: float, like: torch.Tensor, host: bool) -> Scalar:
    """``value`` as a float64 scalar of the kind ``host`` selects, on ``like``'s device."""
    if host:
        return np.float64(value)
    return torch.full((), value, dtype=torch.float64, device=like.device)


def flag(value: bool, like: torch.Tensor, host: bool) -> Flag:
    """``value`` as a bool of the kind ``host`` selects, on ``like``'s device."""
    if host:
        return np.bool_(value)
    return torch.full((), value, dtype=torch.bool, device=like.device)


def host_values(values: torch.Tensor | list[Any] | tuple[float, ...]) -> list[np.float64]:
    """Statistics as host float64 numbers (one read of a CPU tensor, no synchronisation)."""
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    return [np.float64(v) for v in values]


def in_dtype(value: Scalar, dtype: torch.dtype) -> Scalar:
    """``value`` rounded to ``dtype`` (as the comparisons of elements of that dtype round it), kept in float64."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype).double()
    return np.float64(_NUMPY[dtype](value)) if dtype != torch.float64 else np.float64(value)


def as_tensor(value: Scalar | Flag, device: torch.device, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A scalar of either kind as a 0-d tensor (the type of every public result)."""
    if isinstance(value, torch.Tensor):
        return value
    return torch.scalar_tensor(float(value), dtype=dtype, device=device)  # (half the cost of torch.tensor)


def _np(fn_name: str) -> Any:
    ufunc = getattr(np, fn_name)
    torch_fn = getattr(torch, fn_name)
    math_fn = getattr(math, fn_name)

    def apply(x: Scalar) -> Scalar:
        if isinstance(x, torch.Tensor):
            return torch_fn(x)
        try:  # the math module's form costs a tenth of a numpy ufunc call on one number
            return np.float64(math_fn(x))
        except (ValueError, OverflowError):  # outside its domain or range: numpy's IEEE result (-inf, NaN, inf)
            return ufunc(x)

    apply.__name__ = fn_name
    apply.__doc__ = f"``{fn_name}`` of a scalar of either kind (host numbers: math, or numpy outside math's domain)."
    return apply


log = _np("log")
sqrt = _np("sqrt")
expm1 = _np("expm1")


def isfinite(x: Scalar) -> Flag:
    """Whether ``x`` is finite (a bool of ``x``'s kind)."""
    return torch.isfinite(x) if isinstance(x, torch.Tensor) else np.bool_(math.isfinite(x))


def where(condition: Flag, a: Scalar | float, b: Scalar | float) -> Scalar:
    """``a`` where ``condition`` else ``b``; both branches are evaluated beforehand, as with ``torch.where``."""
    if isinstance(condition, torch.Tensor):
        like = a if isinstance(a, torch.Tensor) else b
        assert isinstance(like, torch.Tensor)
        return torch.where(condition, _tensor_like(a, like), _tensor_like(b, like))
    return np.float64(a if condition else b)


def _tensor_like(value: Scalar | float, like: torch.Tensor) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    return torch.full_like(like, float(value))


def clamp_min(x: Scalar, low: float) -> Scalar:
    """max(x, low) with NaN kept."""
    if isinstance(x, torch.Tensor):
        return x.clamp_min(low)
    return x if math.isnan(x) else np.float64(max(x, low))


def clamp_max(x: Scalar, high: float) -> Scalar:
    """min(x, high) with NaN kept."""
    if isinstance(x, torch.Tensor):
        return x.clamp_max(high)
    return x if math.isnan(x) else np.float64(min(x, high))


def logical_not(x: Flag) -> Flag:
    """not ``x`` for a bool of either kind (``~`` of a Python bool is an integer)."""
    if isinstance(x, torch.Tensor):
        return ~x
    return np.bool_(not x)


def lgamma(x: Scalar) -> Scalar:
    """log |Gamma(x)|."""
    if isinstance(x, torch.Tensor):
        return torch.lgamma(x)
    from scipy import special  # (imported on first use: the command line's help loads no scipy)

    return np.float64(special.gammaln(x))


def digamma(x: Scalar) -> Scalar:
    """psi(x), the logarithmic derivative of Gamma."""
    if isinstance(x, torch.Tensor):
        return torch.special.digamma(x)
    from scipy import special

    return np.float64(special.psi(x))


def trigamma(x: Scalar) -> Scalar:
    """psi'(x), the derivative of :func:`digamma`."""
    if isinstance(x, torch.Tensor):
        return torch.special.polygamma(1, x)
    from scipy import special

    return np.float64(special.polygamma(1, x))


def read(values: list[Scalar | Flag]) -> list[float]:
    """Every value as a Python float, in one synchronisation for tensors (none for host numbers)."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors:
        return [float(v) for v in values]
    read_back = iter(torch.stack([t.reshape(()).to(torch.float64) for t in tensors]).tolist())
    return [next(read_back) if isinstance(v, torch.Tensor) else float(v) for v in values]

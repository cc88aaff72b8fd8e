"""The common frame of the sparsity-inducing distributions on |g|: input conversion, scale handling, support.

Modelled on scipy.stats' ``rv_continuous``: the public methods convert the input once (torch tensor on any device
and dtype, or numpy array / python number, which then comes back as numpy), divide by the scale and call a few
private *standardized* methods (``_logpdf``, ``_cdf``, ``_sf``, ``_ppf``, ``_isf``) that each distribution
implements on z = x / scale >= 0. Location is always 0 (the distributions model magnitudes |g|; SIDCo
SIDCo (Abdelmoniem et al.), Property 2 and Lemma 1).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Union

import numpy as np
import torch

ArrayLike = Union[torch.Tensor, np.ndarray, float, int]
Param = Union[float, torch.Tensor]


def to_tensor(x: ArrayLike, name: str = "x") -> tuple[torch.Tensor, bool]:
    """Convert an input to a floating tensor; return it with a flag saying whether the caller gave numpy/python.

    Torch tensors keep their device and floating dtype (integer tensors become the default float dtype, float16
    and bfloat16 become float32); numpy arrays and python numbers become float64 CPU tensors.
    """
    if isinstance(x, torch.Tensor):
        if not x.is_floating_point():
            x = x.to(torch.get_default_dtype())
        elif x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()  # special functions (lgamma, gammainc) need at least float32
        return x, False
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a torch tensor, a numpy array or a number, got {type(x).__name__}") from exc
    return torch.from_numpy(np.array(arr, copy=True)), True


def from_tensor(t: torch.Tensor, as_numpy: bool) -> ArrayLike:
    """Give a result back in the caller's type (numpy when the input was numpy or a python number)."""
    return t.detach().cpu().numpy() if as_numpy else t


def tensor_result(v: ArrayLike) -> torch.Tensor:
    """Narrow the result of a distribution method called with a tensor (tensor in, tensor out) to ``Tensor``."""
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"expected a tensor result for a tensor argument, got {type(v).__name__}")
    return v


def check_param(value: Param, name: str, *, positive: bool) -> Param:
    """Validate a distribution parameter given as a number or a tensor; return it unchanged.

    Python numbers and CPU tensors are checked (finite, and > 0 when ``positive``). Tensors on an accelerator are
    not inspected, to avoid a host synchronisation; estimators only produce valid ones.
    """
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor or a number, got dtype {value.dtype}")
        if value.device.type == "cpu":
            bad = ~torch.isfinite(value) | ((value <= 0) if positive else torch.zeros_like(value, dtype=torch.bool))
            if bool(bad.any()):
                need = "finite and > 0" if positive else "finite"
                raise ValueError(f"{name} must be {need}, got {value.tolist()}")
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a float or a tensor, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v) or (positive and v <= 0):
        need = "finite and > 0" if positive else "finite"
        raise ValueError(f"{name} must be {need}, got {value!r}")
    return v


def param_like(value: Param, like: torch.Tensor) -> torch.Tensor:
    """A parameter as a tensor on ``like``'s device and dtype (broadcastable against it)."""
    return torch.as_tensor(value, dtype=like.dtype, device=like.device)


def params_device_dtype(*values: Param) -> tuple[torch.device, torch.dtype]:
    """Device and dtype of the first tensor parameter; CPU float64 when all are numbers."""
    for v in values:
        if isinstance(v, torch.Tensor):
            return v.device, v.dtype
    return torch.device("cpu"), torch.float64


class SparsityInducingDistribution:
    """Base class of the distributions of |g| (location 0, support z >= 0 in standardized units).

    Subclasses set ``name`` and ``_shape_names`` and implement the standardized methods; everything else lives here.
    Parameters are floats or 0-d/broadcastable tensors (see :func:`check_param`).
    """

    name: str = ""

    def __init__(self, scale: Param, shape: Param | None = None) -> None:
        self.scale = check_param(scale, "scale", positive=True)
        self.shape = shape

    # ---- standardized methods (z = x / scale, z >= 0 inside the support) -------------------------------------
    def _logpdf(self, z: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def _cdf(self, z: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def _sf(self, z: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def _ppf(self, p: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def _isf(self, q: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def _upper_end(self, c: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """Right end of the standardized support (inf unless a subclass says otherwise)."""
        return torch.full((), math.inf, dtype=like.dtype, device=like.device)

    # ---- plumbing -------------------------------------------------------------------------------------------
    def _shape_like(self, like: torch.Tensor) -> torch.Tensor | None:
        return None if self.shape is None else param_like(self.shape, like)

    def _on_x(self, x: ArrayLike, body: Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor]) -> ArrayLike:
        t, as_numpy = to_tensor(x)
        scale = param_like(self.scale, t)
        out = body(t / scale, scale, self._shape_like(t))
        return from_tensor(out, as_numpy)

    def _on_prob(self, p: ArrayLike, body: Callable[[torch.Tensor, Any], torch.Tensor]) -> ArrayLike:
        t, as_numpy = to_tensor(p, "probability")
        scale = param_like(self.scale, t)
        z = body(t, self._shape_like(t))
        z = torch.where((t >= 0) & (t <= 1), z, torch.full_like(z, math.nan))
        return from_tensor(z * scale, as_numpy)

    def _inside(self, z: torch.Tensor, c: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask of the support and z clipped into it (so the standardized methods never see invalid points)."""
        hi = self._upper_end(c, z)
        inside = (z >= 0) & (z <= hi)
        zc = torch.minimum(z.clamp_min(0), hi)
        return inside, zc

    # ---- public methods -------------------------------------------------------------------------------------
    def logpdf(self, x: ArrayLike) -> ArrayLike:
        """Log density of |G| at x (natural log, -inf outside the support); same shape as x."""

        def body(z, scale, c):
            inside, zc = self._inside(z, c)
            val = self._logpdf(zc, c) - torch.log(scale)
            return torch.where(inside & ~torch.isnan(z), val, torch.where(torch.isnan(z), z, -math.inf))

        return self._on_x(x, body)

    def pdf(self, x: ArrayLike) -> ArrayLike:
        """Density of |G| at x (1/units of x); 0 outside the support."""
        t, as_numpy = to_tensor(x)
        return from_tensor(torch.exp(tensor_result(self.logpdf(t))), as_numpy)

    def cdf(self, x: ArrayLike) -> ArrayLike:
        """P(|G| <= x)."""

        def body(z, scale, c):
            inside, zc = self._inside(z, c)
            val = self._cdf(zc, c)
            return torch.where(
                z < 0, torch.zeros_like(val), torch.where(inside | torch.isnan(z), val, torch.ones_like(val))
            )

        return self._on_x(x, body)

    def sf(self, x: ArrayLike) -> ArrayLike:
        """P(|G| > x), computed directly (accurate in the far tail)."""

        def body(z, scale, c):
            inside, zc = self._inside(z, c)
            val = self._sf(zc, c)
            return torch.where(
                z < 0, torch.ones_like(val), torch.where(inside | torch.isnan(z), val, torch.zeros_like(val))
            )

        return self._on_x(x, body)

    def ppf(self, p: ArrayLike) -> ArrayLike:
        """Quantile: x with P(|G| <= x) = p; NaN for p outside [0, 1]."""
        return self._on_prob(p, lambda t, c: self._ppf(t.clamp(0, 1), c))

    def isf(self, q: ArrayLike) -> ArrayLike:
        """Inverse survival function: x with P(|G| > x) = q (accurate for tiny q); NaN for q outside [0, 1]."""
        return self._on_prob(q, lambda t, c: self._isf(t.clamp(0, 1), c))

    def mean(self) -> Param:
        """E|G| (units of x); a tensor when a parameter is a tensor, else a float."""
        raise NotImplementedError

    def var(self) -> Param:
        """Var |G| (units of x squared); inf where it does not exist."""
        raise NotImplementedError

    def _standard_sample(
        self, n: int, generator: torch.Generator | None, device: torch.device, dtype: torch.dtype
    ) -> torch.Tensor:
        raise NotImplementedError

    def sample(
        self,
        n: int,
        generator: torch.Generator | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """Draw n independent values of |G|.

        Parameters
        ----------
        n : int
            Number of draws (>= 0).
        generator : torch.Generator, optional
            Source of randomness; its device is the device of the result. Never the global RNG when given.
        device, dtype : optional
            Default: the generator's device (else the parameters' device, else CPU) and the parameters' dtype
            (float64 when the parameters are numbers). Parameters must be scalars (0-d) to sample.

        Returns
        -------
        torch.Tensor of shape (n,).
        """
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        pdev, pdtype = params_device_dtype(self.scale, *(() if self.shape is None else (self.shape,)))
        dev = torch.device(device) if device is not None else (generator.device if generator is not None else pdev)
        dt = dtype or pdtype
        for v in (self.scale, self.shape):
            if isinstance(v, torch.Tensor) and v.numel() != 1:
                raise ValueError(f"sample() needs scalar parameters, got a parameter of shape {tuple(v.shape)}")
        z = self._standard_sample(int(n), generator, dev, dt)
        return z * torch.as_tensor(self.scale, dtype=dt, device=dev).reshape(())

    def __repr__(self) -> str:
        def show(v: Param) -> str:
            return f"{v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v}"

        shape = "" if self.shape is None else f"shape={show(self.shape)}, "
        return f"{type(self).__name__}({shape}scale={show(self.scale)})"


def uniform_open(n: int, generator: torch.Generator | None, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """n uniforms on the open interval (0, 1) (never exactly 0, so logs stay finite)."""
    u = torch.rand(n, generator=generator, device=device, dtype=dtype)
    return u.clamp_min(torch.finfo(dtype).tiny)

"""Fused one-pass reductions over large vectors: a compiled kernel where torch can build one, eager torch otherwise.

Eager torch reads a vector once per operation and writes a full-size temporary for most of them, so a statistic
such as "count and sum of |g| - t over |g| > t" costs a comparison, a subtraction, a clamp, a count and a sum:
five or more passes over memory for a result that needs one. ``torch.compile`` fuses such an expression into one
loop that reads each element once and keeps the intermediates in registers. Its cost is a one-time build of the
kernel (seconds on a CPU, with a C++ compiler; cached on disk for later processes), so it pays only on large
vectors and long runs.

:class:`Fused` wraps a pure torch function that is its own eager reference: called eagerly it computes the same
result in several passes. It is compiled when the policy allows (:func:`policy`, environment variable
``GRADSTAT_COMPILE``):

- ``auto`` (default): compiled for CPU tensors of at least :data:`MIN_ELEMENTS` elements when torch can compile
  here (torch :data:`COMPILE_TORCH` or newer and a C++ compiler on the path); eager otherwise (GPU tensors stay on eager
  torch's kernels, which already read at close to the device's bandwidth);
- ``always``: compiled for every size and device (what the tests use to compare the two paths);
- ``never``: always eager.

A build that fails (no compiler, an unsupported torch) is reported once as a warning and the kernel stays eager
for the rest of the process, as every kernel does where torch's cache folder could be written by another user
(:mod:`gradstat.theory.kernels.compile_cache` points it at a private folder unless ``TORCHINDUCTOR_CACHE_DIR`` is set);
results depend on whether it compiled only through rounding (reordered sums, float32 against float64 arithmetic).
Callers keep their own eager code path where it is cheaper than running the fused function eagerly
(:meth:`Fused.compiled_for` says which applies).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import shutil
import threading
import warnings
from collections.abc import Callable, Iterator

import torch

from gradstat.theory.kernels.compile_cache import UnsafeCacheError, ensure_compile_cache

ENV = "GRADSTAT_COMPILE"
POLICIES = ("auto", "always", "never")
MIN_ELEMENTS = 1 << 21
"""Smallest vector (2,097,152 elements) compiled under ``auto``: below it one eager pass costs well under a
millisecond and the build would not pay for itself in a short run."""


RECOMPILE_LIMIT = 64
"""Variants one kernel may build (torch's default is 8): each dtype, each Python constant and a row count of 0 or
1 builds its own, and the quantizers' kernels serve several of each in one process. Past the limit torch raises,
and the kernel would turn eager for the rest of the run."""


def recompile_limit() -> contextlib.AbstractContextManager[None]:
    """Raise dynamo's variant limit to :data:`RECOMPILE_LIMIT` while a kernel runs. The setting is
    ``recompile_limit`` from torch 2.6 and ``cache_size_limit`` before (torch 2.1-2.5, the declared floor's)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    return config.patch({name: RECOMPILE_LIMIT})


_FORCED: contextvars.ContextVar[str | None] = contextvars.ContextVar("gradstat_compile_forced", default=None)

ALIASES = {"0": "never", "false": "never", "no": "never", "off": "never", "1": "always", "true": "always"}
ALIASES.update({"yes": "always", "on": "always"})


def policy() -> str:
    """The compile policy from ``GRADSTAT_COMPILE`` (``auto`` when unset; ``0``/``off``/``false``/``no`` mean
    ``never``, ``1``/``on``/``true``/``yes`` mean ``always``); a clear error for another value."""
    override = _FORCED.get()
    if override is not None:
        return override
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    value = ALIASES.get(value, value)
    if value not in POLICIES:
        raise ValueError(f"{ENV} must be one of {', '.join(POLICIES)} (or 0/1), got {value!r}")
    return value


@functools.lru_cache(maxsize=1)
def cache_problem() -> str | None:
    """Why compiled kernels may not be built here, once per process: the compile cache folder is not private to
    this user (:mod:`gradstat.theory.kernels.compile_cache`; reported as one warning, and every kernel stays
    eager); None when it is (the folder is then set up for torch)."""
    try:
        ensure_compile_cache()
    except UnsafeCacheError as exc:
        warnings.warn(f"gradstat: {exc}; the fused kernels run eagerly", RuntimeWarning, stacklevel=4)
        return str(exc)
    return None


COMPILE_TORCH = (2, 9)
"""Oldest torch whose compiled kernels equal eager bit for bit on the suite's checks (tests/theory/test_fused.py,
tests/compressors/test_counter_dither.py): 2.9.1, 2.13.0 and 2.14.1 pass; 2.1.0 (other signs from the counter
hash's signed rows; its inductor also needs setuptools' pkg_resources), 2.2.2 and 2.5.1 (last-bit differences in
the nested quantizer's reconstruction, row scales at 1e-40) do not. Below it ``auto`` stays eager."""


def torch_version() -> tuple[int, int]:
    """(major, minor) of the torch in use."""
    major, minor = (int("".join(c for c in part if c.isdigit()) or 0) for part in torch.__version__.split(".")[:2])
    return major, minor


@functools.lru_cache(maxsize=1)
def can_compile() -> bool:
    """Whether this process builds CPU kernels under ``auto``: ``torch.compile`` exists, torch is
    :data:`COMPILE_TORCH` or newer and a C++ compiler is on the path."""
    if not hasattr(torch, "compile") or torch_version() < COMPILE_TORCH:
        return False
    compiler = os.environ.get("CXX") or "c++"
    return any(shutil.which(c) for c in (compiler, "g++", "clang++"))


class Fused:
    """A pure torch function ``fn(x, *args)`` run compiled (one fused pass) or eagerly (its own reference).

    ``x`` is the large vector whose size and device decide (:meth:`compiled_for`); the other arguments are tensors
    (more vectors of its length, or small ones such as 0-d scalars) or Python constants that select a variant
    (each constant value compiles its own kernel). Shapes are dynamic: one kernel serves every length from 2 up
    (a dimension of 0 or 1, each dtype and each constant build a variant of their own, up to
    :data:`RECOMPILE_LIMIT`)."""

    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self._compiled: Callable[..., torch.Tensor] | None = None
        self._broken = False
        self._lock = threading.Lock()

    def compiled_for(self, x: torch.Tensor) -> bool:
        """Whether a call on ``x`` runs compiled under the current policy."""
        if self._broken:
            return False
        mode = policy()
        if mode == "never":
            return False
        if mode != "always" and not (x.device.type == "cpu" and x.numel() >= MIN_ELEMENTS and can_compile()):
            return False
        return cache_problem() is None

    def __call__(self, x: torch.Tensor, *args: object) -> torch.Tensor:
        if self.compiled_for(x):
            try:
                with recompile_limit():
                    return self._kernel()(x, *args)
            except Exception as exc:  # noqa: BLE001 - any build failure falls back to the reference
                self._broken = True
                warnings.warn(
                    f"gradstat: the compiled fused kernel {self.name!r} failed to build or run ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}); using eager torch for the rest of this run "
                    f"(set {ENV}=never to skip the attempt)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return self.fn(x, *args)

    def reference(self, x: torch.Tensor, *args: object) -> torch.Tensor:
        """The eager result (same function, not compiled)."""
        return self.fn(x, *args)

    def _kernel(self) -> Callable[..., torch.Tensor]:
        with self._lock:
            if self._compiled is None:
                self._compiled = torch.compile(self.fn, dynamic=True, fullgraph=True)
            return self._compiled


@contextlib.contextmanager
def forced(mode: str) -> Iterator[None]:
    """Run the enclosed code under compile policy ``mode`` (``auto``, ``always`` or ``never``), e.g. to time or
    test the eager and the compiled path side by side; the previous setting is restored on exit. The override is
    a context variable: it holds in this thread (and context) only, and the environment is not touched."""
    if mode not in POLICIES:
        raise ValueError(f"compile policy must be one of {', '.join(POLICIES)}, got {mode!r}")
    token = _FORCED.set(mode)
    try:
        yield
    finally:
        _FORCED.reset(token)


def fused(fn: Callable[..., torch.Tensor]) -> Fused:
    """Decorator: ``@fused def kernel(x, ...)`` (see :class:`Fused`)."""
    return Fused(fn)

"""Which form of a hot loop runs: the one policy of the kernels layer, and the one place where it is applied.

Every kernel of :mod:`gradstat.theory.kernels` has a plain eager torch reference and may have accelerated forms
(:data:`BACKENDS`): gradstat's own C loops (``native``, the extension built at install,
:mod:`gradstat.theory.kernels.native`) and ``torch.compile`` kernels (``compiled``, one fused loop generated for
the device: C++ on a CPU, Triton on CUDA, :mod:`gradstat.theory.kernels.fused`). A kernel says which forms it has
for a given input; :func:`choose` says which one runs, by one rule:

1. ``native`` where the kernel has a C loop for the input (a contiguous CPU tensor of a dtype it handles, the
   extension built) and the policy is not ``never``;
2. else ``compiled`` where the kernel has a compiled form and :func:`compiles` allows it for the input;
3. else ``eager``, the reference itself.

The policy is the environment variable ``GRADSTAT_COMPILE`` (:func:`policy`), or :func:`forced` for the code it
encloses:

- ``auto`` (default): compiled kernels for tensors of at least :data:`MIN_ELEMENTS` elements where torch can
  compile for their device here (torch :data:`COMPILE_TORCH` or newer, and a C++ compiler on the path for a CPU,
  Triton for CUDA: :func:`compiler_for`); the C loops wherever they apply. On CUDA the compiled kernels were
  measured faster than eager at 26M elements on an H200 (the quantizers' encode 85-247 GB/s against 24-45 GB/s,
  SIDCo 0.39x against 0.31x of ``torch.topk``), where each eager operation is one more launch and one more read;
- ``always``: compiled kernels for every size and device (what the tests use to compare the forms);
- ``never``: the eager reference everywhere (no C loop, nothing compiled).

Every form of a kernel computes the reference's result bit for bit, or within the rounding its kernel declares
(:mod:`gradstat.theory.kernels.catalog`); the equivalence battery (``tests/kernels``) holds each one to it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import shutil
import warnings
from collections.abc import Iterator

import torch

from gradstat.theory.kernels.compile_cache import UnsafeCacheError, ensure_compile_cache

ENV = "GRADSTAT_COMPILE"
POLICIES = ("auto", "always", "never")
BACKENDS = ("native", "compiled", "eager")
"""The forms a kernel may run in, in the order :func:`choose` prefers them."""

MIN_ELEMENTS = 1 << 21
"""Smallest vector (2,097,152 elements) compiled under ``auto``: below it one eager pass costs well under a
millisecond and the build would not pay for itself in a short run."""

COMPILE_TORCH = (2, 9)
"""Oldest torch whose compiled kernels equal eager bit for bit on the suite's checks (tests/theory/test_fused.py,
tests/compressors/test_counter_dither.py): 2.9.1, 2.13.0 and 2.14.1 pass; 2.1.0 (other signs from the counter
hash's signed rows; its inductor also needs setuptools' pkg_resources), 2.2.2 and 2.5.1 (last-bit differences in
the nested quantizer's reconstruction, row scales at 1e-40) do not. Below it ``auto`` stays eager."""

_FORCED: contextvars.ContextVar[str | None] = contextvars.ContextVar("gradstat_compile_forced", default=None)

ALIASES = {"0": "never", "false": "never", "no": "never", "off": "never", "1": "always", "true": "always"}
ALIASES.update({"yes": "always", "on": "always"})


def policy() -> str:
    """The compile policy from ``GRADSTAT_COMPILE`` (``auto`` when unset; ``0``/``off``/``false``/``no`` mean
    ``never``, ``1``/``on``/``true``/``yes`` mean ``always``); a clear error for another value."""
    override = _FORCED.get()
    if override is not None:
        return override
    raw = _setting()
    known = _PARSED.get(raw)
    if known is not None:
        return known
    value = (os.environ.get(ENV) or "auto").strip().lower() or "auto"
    value = ALIASES.get(value, value)
    if value not in POLICIES:
        raise ValueError(f"{ENV} must be one of {', '.join(POLICIES)} (or 0/1), got {value!r}")
    _PARSED[raw] = value
    return value


_PARSED: dict[object, str] = {}
"""Settings of ``GRADSTAT_COMPILE`` already read (the policy is asked several times per call of a kernel)."""

_ENVIRON_DATA = getattr(os.environ, "_data", None)
_ENVIRON_KEY = os.environ.encodekey(ENV) if hasattr(os.environ, "encodekey") else None


def _setting() -> object:
    """The raw value of ``GRADSTAT_COMPILE`` as ``os.environ`` stores it (a tenth of the cost of
    ``os.environ.get``, which encodes the name on every call: the policy is asked some twenty times per encode of a
    small tensor); ``os.environ.get`` where the mapping is not CPython's own."""
    if isinstance(_ENVIRON_DATA, dict) and _ENVIRON_KEY is not None:
        return _ENVIRON_DATA.get(_ENVIRON_KEY)
    return os.environ.get(ENV)


@contextlib.contextmanager
def forced(mode: str) -> Iterator[None]:
    """Run the enclosed code under compile policy ``mode`` (``auto``, ``always`` or ``never``), e.g. to time or
    test the eager and the accelerated forms side by side; the previous setting is restored on exit. The override
    is a context variable: it holds in this thread (and context) only, and the environment is not touched."""
    with overriding(_FORCED, mode, POLICIES, "compile policy"):
        yield


@contextlib.contextmanager
def overriding(
    setting: contextvars.ContextVar[str | None], mode: str, allowed: tuple[str, ...], what: str
) -> Iterator[None]:
    """Hold the context variable ``setting`` at ``mode`` (one of ``allowed``, else a ValueError naming ``what``)
    while the block runs, and restore it after: the override of a policy read from the environment."""
    if mode not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(allowed)}, got {mode!r}")
    token = setting.set(mode)
    try:
        yield
    finally:
        setting.reset(token)


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


def compiler_for(device_type: str) -> bool:
    """Whether ``torch.compile`` can build a kernel for this device type here: torch :data:`COMPILE_TORCH` or newer,
    and a C++ compiler for the CPU (:func:`can_compile`), Triton for CUDA (:func:`can_compile_cuda`)."""
    if device_type == "cpu":
        return can_compile()
    return device_type == "cuda" and can_compile_cuda()


@functools.lru_cache(maxsize=1)
def can_compile_cuda() -> bool:
    """Whether this process builds CUDA kernels under ``auto``: torch :data:`COMPILE_TORCH` or newer with Triton."""
    if not hasattr(torch, "compile") or torch_version() < COMPILE_TORCH:
        return False
    try:
        from torch.utils._triton import has_triton
    except ImportError:
        return False
    return bool(has_triton())


def native_allowed() -> bool:
    """Whether the C loops may run under the current policy (any policy but ``never``)."""
    return policy() != "never"


def compiles(x: torch.Tensor) -> bool:
    """Whether a compiled kernel may run on ``x`` under the current policy (see the module docstring). Never for a
    tensor of fewer than 2 elements, whatever the policy: nothing to fuse, and torch's inductor (2.13, CPU)
    specialises a 1 x 1 block into a kernel that keeps the counter hash's wrapping int32 products wider, so its
    signs differ from eager's (found by the equivalence battery)."""
    mode = policy()
    if mode == "never" or x.numel() < 2:
        return False
    if mode != "always" and not (x.numel() >= MIN_ELEMENTS and compiler_for(x.device.type)):
        return False
    return cache_problem() is None


def choose(x: torch.Tensor, native: bool = False, compiled: bool = False) -> str:
    """The form a kernel runs on ``x``: ``native`` when it has a C loop for ``x`` (``native``), else ``compiled``
    when it has a compiled form (``compiled``) that :func:`compiles` allows, else ``eager`` (the module's rule)."""
    if native and native_allowed():
        return "native"
    if compiled and compiles(x):
        return "compiled"
    return "eager"

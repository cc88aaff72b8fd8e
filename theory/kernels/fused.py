"""Fused one-pass reductions over large vectors: a compiled kernel where torch can build one, eager torch otherwise.

Eager torch reads a vector once per operation and writes a full-size temporary for most of them, so a statistic
such as "count and sum of |g| - t over |g| > t" costs a comparison, a subtraction, a clamp, a count and a sum:
five or more passes over memory for a result that needs one. ``torch.compile`` fuses such an expression into one
loop that reads each element once and keeps the intermediates in registers. Its cost is a one-time build of the
kernel (seconds on a CPU, with a C++ compiler; cached on disk for later processes), so it pays only on large
vectors and long runs.

:class:`Fused` wraps a pure torch function that is its own eager reference: called eagerly it computes the same
result in several passes. It runs compiled where the kernels' one policy says so
(:func:`gradstat.theory.kernels.policy.choose`, environment variable ``GRADSTAT_COMPILE``).

A build that fails (no compiler, an unsupported torch) is reported once as a warning and the kernel stays eager
for the rest of the process, as every kernel does where torch's cache folder could be written by another user
(:mod:`gradstat.theory.kernels.compile_cache` points it at a private folder unless ``TORCHINDUCTOR_CACHE_DIR`` is
set);
results depend on whether it compiled only through rounding (reordered sums, float32 against float64 arithmetic).
Callers keep their own eager code path where it is cheaper than running the fused function eagerly
(:meth:`Fused.compiled_for` says which applies).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gradstat.theory.kernels import policy, triton_runtime
from gradstat.theory.kernels.policy import ENV

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


class Fused:
    """A pure torch function ``fn(x, *args)`` run compiled (one fused pass) or eagerly (its own reference), or by
    its C loop ``native`` (same arguments) where ``native_applies(x, *args)`` says one exists.

    ``x`` is the large vector whose size and device decide (:meth:`compiled_for`); the other arguments are tensors
    (more vectors of its length, or small ones such as 0-d scalars) or Python constants that select a variant
    (each constant value compiles its own kernel). Shapes are dynamic: one kernel serves every length from 2 up
    (a dimension of 0 or 1, each dtype and each constant build a variant of their own, up to
    :data:`RECOMPILE_LIMIT`)."""

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        native: Callable[..., torch.Tensor] | None = None,
        native_applies: Callable[..., bool] | None = None,
        compiles_on: tuple[str, ...] | None = None,
        triton: TritonForm | None = None,
    ) -> None:
        self.fn = fn
        self.triton = triton
        """Its Triton form for CUDA tensors, if it has one: chosen before the others there (see :meth:`form_for`)."""
        self.name = fn.__name__
        self.native = native
        self._native_applies = native_applies
        self.compiles_on = compiles_on
        """The device types its compiled form may run on (None: every one a compiler exists for); elsewhere it
        runs eagerly."""
        self._compiled: Callable[..., torch.Tensor] | None = None
        self._broken = False
        self._lock = threading.Lock()

    def native_for(self, x: torch.Tensor, *args: object) -> bool:
        """Whether this kernel has a C loop for these arguments (whatever the policy)."""
        return self.native is not None and self._native_applies is not None and self._native_applies(x, *args)

    def form_for(self, x: torch.Tensor, *args: object) -> str:
        """The form a call with these arguments runs in: ``native``, ``compiled`` or ``eager``
        (:func:`gradstat.theory.kernels.policy.choose`); ``compiled`` inside a function torch.compile is tracing
        (the kernel joins that function's graph); ``triton`` for a CUDA tensor where the kernel has a Triton form
        that runs on it and the policy is not ``never`` (one read of the vector, no build by torch.compile)."""
        if compiling():
            return "compiled"
        if self.triton is not None and policy.native_allowed() and self.triton.runs_on(x):
            return "triton"
        return policy.choose(x, native=self.native_for(x, *args), compiled=self.may_compile(x))

    def fast_for(self, x: torch.Tensor, *args: object) -> bool:
        """Whether a call with these arguments reads ``x`` once (its C loop or its compiled kernel), not the
        several passes of the eager reference."""
        return self.form_for(x, *args) != "eager"

    def may_compile(self, x: torch.Tensor) -> bool:
        """Whether this kernel's compiled form may run on ``x``'s device (not broken, a device it compiles on)."""
        return not self._broken and (self.compiles_on is None or x.device.type in self.compiles_on)

    def compiled_for(self, x: torch.Tensor) -> bool:
        """Whether a call on ``x`` runs compiled under the current policy (no C loop considered)."""
        return self.may_compile(x) and policy.choose(x, compiled=True) == "compiled"

    def __call__(self, x: torch.Tensor, *args: object) -> torch.Tensor:
        if compiling():  # inside a function torch.compile is tracing: this kernel's expression joins its graph
            triton = self.triton
            if triton is not None and triton.op is not None and triton.in_graph is not None and triton.in_graph(x):
                return triton.op(x, *args)  # (its Triton kernels, called from the compiled function as they are)
            return self.fn(x, *args)
        form = self.form_for(x, *args)
        if form == "triton":
            assert self.triton is not None
            try:
                return self.triton.run(x, *args)
            except Exception as exc:  # noqa: BLE001 - a failed build or launch falls back to the other forms
                self.triton.report(exc)
                form = self.form_for(x, *args)
        if form == "native":
            assert self.native is not None
            return self.native(x, *args)
        if form == "compiled":
            try:
                with recompile_limit():
                    return self._kernel()(x, *args)
            except Exception as exc:  # noqa: BLE001 - any build failure falls back to the reference
                if triton_runtime.capturing():  # (a failure inside a CUDA graph's capture fails the capture only)
                    raise
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
                self._compiled = torch.compile(self.fn, dynamic=True, fullgraph=True, options=compile_options())
            return self._compiled


def compile_options() -> dict[str, str | int | bool | Callable[..., object]]:
    """Inductor's options for every fused kernel: its pattern matcher off where this torch has the switch. Its
    joint-graph pattern ``pointless_convert`` (torch 2.11 and older: 2.13 keeps a narrowing cast) replaces
    float64 -> float32 -> float64 by nothing, i.e. drops the rounding of a threshold to the float32 that the
    elements are compared with and shifted by, which the eager reference does on purpose; measured with torch 2.11
    on a CPU, SIDCo's 3-stage exponential threshold then moved by 6e-8 relative. The switch also turns off the
    matcher's other rewrites (no-op and pointless view/permute removal, group-batch fusion, matrix-product and
    attention patterns): measured on this CPU (torch 2.13, one thread), the fused signs of a 2000 x 2048 block take
    2.5 ms either way (best of 20); on CUDA its cost is not measured yet."""
    try:
        from torch._inductor import config
    except ImportError:  # (a torch without inductor compiles nothing: the policy runs the eager forms)
        return {}
    return {"pattern_matcher": False} if hasattr(config, "pattern_matcher") else {}


def compiling() -> bool:
    """Whether torch.compile is tracing the caller (``torch.compiler.is_compiling``, torch 2.3 and newer)."""
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling())


def fused(fn: Callable[..., torch.Tensor]) -> Fused:
    """Decorator: ``@fused def kernel(x, ...)`` (see :class:`Fused`)."""
    return Fused(fn)


@dataclass(frozen=True)
class TritonForm:
    """A kernel's Triton form (:mod:`gradstat.theory.kernels.triton_runtime`): ``run`` (the kernel's arguments),
    ``runs_on(x)`` (whether it runs on ``x``: a CUDA tensor, Triton installed, the form not failed) and
    ``report(exc)`` (its failure, once per process; the other forms run from then on)."""

    run: Callable[..., torch.Tensor]
    runs_on: Callable[[torch.Tensor], bool]
    report: Callable[[Exception], None]
    op: Callable[..., torch.Tensor] | None = None
    """The same kernels as a torch operator opaque to torch.compile (``torch.library.custom_op``), which a compiled
    function calls in place of tracing the reference where ``in_graph(x)`` holds; None where this torch has none."""
    in_graph: Callable[[torch.Tensor], bool] | None = None


def with_triton(triton: TritonForm) -> Callable[..., Fused]:
    """Decorator: ``@with_triton(form) def kernel(x, ...)``, a :class:`Fused` kernel with a Triton form for CUDA
    tensors and no C loop."""

    def wrap(fn: Callable[..., torch.Tensor]) -> Fused:
        return Fused(fn, triton=triton)

    return wrap


def with_native(
    native: Callable[..., torch.Tensor], applies: Callable[..., bool], triton: TritonForm | None = None
) -> Callable[..., Fused]:
    """Decorator: ``@with_native(loop, applies) def kernel(x, ...)``, a :class:`Fused` kernel with a C loop (and a
    Triton form for CUDA tensors where ``triton`` is given)."""

    def wrap(fn: Callable[..., torch.Tensor]) -> Fused:
        return Fused(fn, native, applies, triton=triton)

    return wrap

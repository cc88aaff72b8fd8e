"""What every Triton kernel of the kernels layer shares: whether Triton is here, building a kernel for a device, and
the block size for an input.

Each kernel is a plain Python function written in ``triton.language``, built twice from the same source:

- for CUDA tensors with :func:`triton.jit` (compiled at its first launch for the GPU present, cached on disk by
  Triton);
- for CPU tensors with :class:`triton.runtime.interpreter.InterpretedFunction`, which runs the same function on
  numpy arrays: how CI checks what the kernels compute without a GPU (about a millisecond of Python per program, so
  a CPU input is cut into at most :data:`INTERPRETED_PROGRAMS` blocks of at least :data:`INTERPRETED_BLOCK`
  elements).

The interpreter replaces some of ``triton.language`` only where ``TRITON_INTERPRET=1`` was set before Triton was
imported (``tl.sum`` and ``tl.cumsum`` among them): kernels use the builtins it always replaces (``tl.reduce``,
``tl.associative_scan``), so one process runs both forms.

Triton is imported on the first build, never when a module of the kernels layer is imported: the project imports
and runs without it (:func:`available` says whether a recent enough one is installed). The kernels read
``triton.language`` as their module's global ``tl`` (as Triton requires), which :func:`build` binds.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

TRITON = (3, 0)
"""Oldest Triton used (the ``triton`` extra's floor): Triton 2.x (torch 2.1's) has no ``InterpretedFunction``."""

INTERPRETED_BLOCK = 16
"""Smallest block of the interpreted (CPU) form."""

INTERPRETED_PROGRAMS = 4
"""Most programs per kernel of the interpreted form: each costs about a millisecond of Python, so a CPU input is cut
into at most this many blocks (still several, so that every check of more than :data:`INTERPRETED_BLOCK` elements
crosses a block boundary)."""


def available() -> bool:
    """Whether a Triton of version :data:`TRITON` or newer is installed here (read from its metadata, not imported)."""
    return _installed()


@functools.lru_cache(maxsize=1)
def _installed() -> bool:
    for distribution in ("triton", "pytorch-triton"):  # (the second: torch's nightly builds)
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        parts = [int("".join(c for c in part if c.isdigit()) or 0) for part in version.split(".")[:2]]
        return tuple(parts) >= TRITON
    return False


_LOCK = threading.Lock()
_BUILT: dict[tuple[Callable[..., Any], bool], Any] = {}


def build(fn: Callable[..., Any], interpret: bool) -> Any:
    """``fn`` interpreted (for CPU tensors) or for compilation on CUDA; Triton is imported here and bound as ``fn``'s
    module global ``tl``. Built once per process and form. Raises ImportError where Triton is not installed."""
    with _LOCK:
        kernel = _BUILT.get((fn, interpret))
        if kernel is None:
            fn.__globals__["tl"] = importlib.import_module("triton.language")
            if interpret:
                wrap = importlib.import_module("triton.runtime.interpreter").InterpretedFunction
            else:
                wrap = importlib.import_module("triton").jit
            kernel = _BUILT[(fn, interpret)] = wrap(fn)
        return kernel


COMPILE_OPTIONS = {"enable_fp_fusion": False}
"""Triton's build options for every compiled (CUDA) kernel here: no contraction of a product and a sum into one
rounding (the references round each operation), stated rather than left to Triton's default, which changes."""


def launch(x: torch.Tensor) -> tuple[contextlib.AbstractContextManager[object], dict[str, bool]]:
    """``(context, options)`` of a launch over ``x``'s tensors: on CUDA, ``x``'s device made current (Triton
    launches on the current device and its stream, whichever device the tensors are on) and
    :data:`COMPILE_OPTIONS`; on a CPU (interpreted) nothing of either."""
    if x.device.type == "cuda":
        return torch.cuda.device(x.device), COMPILE_OPTIONS
    return contextlib.nullcontext(), {}


def block_for(x: torch.Tensor, block: int, count: int | None = None) -> int:
    """Elements per program for ``x`` (or for ``count`` items of work on x's device, e.g. a buffer's positions):
    ``block`` (a power of two) on a GPU; for a CPU tensor (interpreted) the smallest power of two of at least
    :data:`INTERPRETED_BLOCK` that covers them in :data:`INTERPRETED_PROGRAMS` blocks."""
    if x.device.type != "cpu":
        return block
    per_program = -(-(x.numel() if count is None else count) // INTERPRETED_PROGRAMS)
    return max(INTERPRETED_BLOCK, 1 << max(0, per_program - 1).bit_length())


def finishing_steps(blocks: int, x: torch.Tensor, chunk: int) -> tuple[int, int]:
    """``(CHUNK, STEPS)`` of a finishing program that joins ``blocks`` partials ``chunk`` at a time on a GPU
    (:data:`INTERPRETED_BLOCK` at a time interpreted): the steps a power of two (a kernel is built per value: a
    handful of sizes), at least 1."""
    chunk = chunk if x.device.type == "cuda" else INTERPRETED_BLOCK
    steps = -(-blocks // chunk)
    return chunk, 1 << max(0, steps - 1).bit_length()


def capturing() -> bool:
    """Whether this thread's current CUDA stream is being captured into a graph (False without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


class Fallback:
    """A Triton form's switch to its eager form: after the form's first failure to build or run in this process
    (:meth:`report`, one RuntimeWarning, the first failure's), :meth:`is_set` is true and its caller runs the eager
    form from then on; a failure during a CUDA graph's capture is raised instead (see :meth:`report`)."""

    def __init__(self, what: str, setting: str) -> None:
        self.what = what
        """The form, as the warning names it (e.g. ``the Triton bounded selection``)."""
        self.setting = setting
        """The environment variable whose ``never`` skips the attempt (the policy's, which the warning names)."""
        self._event = threading.Event()
        self.failed = False
        """:meth:`is_set` as a plain attribute, for code that torch.compile traces (it guards on its value)."""

    def is_set(self) -> bool:
        return self._event.is_set()

    def report(self, exc: Exception) -> None:
        """Turn the form off for this process, warning once; during a CUDA graph's capture, raise ``exc`` instead:
        the capture fails (gradstat's own, :mod:`gradstat.compressors.graphs`, then launches that input directly,
        where the form may well run; a caller's own capture, or a compiled function's, gets the error), since CUDA
        refuses some things only while a stream is captured, such as loading a kernel Triton has just built."""
        if capturing():
            raise exc
        if self._event.is_set():
            return
        self._event.set()
        self.failed = True
        first = str(exc).splitlines()[0] if str(exc) else ""
        warnings.warn(
            f"gradstat: {self.what} failed to build or run ({type(exc).__name__}: {first}); using the eager form "
            f"for the rest of this run (set {self.setting}=never to skip the attempt)",
            RuntimeWarning,
            stacklevel=3,
        )

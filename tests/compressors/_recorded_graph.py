"""A CUDA graph's semantics emulated on CPU tensors by recording operations (for tests/compressors/test_graphs.py).

A real graph replays the kernels its capture launched, on the same memory, with every host value of the capture
baked in: a Python number, a shape, a decision taken on the host while capturing. This stand-in records each torch
operation the capture runs (a ``TorchDispatchMode``), and each launch of a Triton kernel named to it, with its
arguments; a replay runs them again in order on the same tensors and writes each result into the tensor the capture
returned, as the graph's kernels write into their memory. Operations that only allocate (``empty``) do no work on a
replay, as in a graph: a key slot keeps what was filled into it. A read back to the host (``.item()``, ``bool``)
fails the capture, as it does on a GPU. So a device part that depends on a host value of its capture (rather than on
its input's contents or its key slots) gives the capture's answer on every replay, and the tests see it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

NO_WORK = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default}
HOST_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default}


class Recorder(TorchDispatchMode):
    """Records the operations run inside it: ``(function, args, kwargs, result)``."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Any]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func in HOST_READS:
            raise RuntimeError(f"a value read back to the host while capturing ({func})")
        out = func(*args, **kwargs)
        if func not in NO_WORK:
            self.ops.append((func, args, kwargs, out))
        return out

    def launch(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` (a kernel launch outside torch's operations, e.g. a Triton kernel) and record it."""
        with _disable_current_modes():
            out = fn(*args)
        self.ops.append((fn, args, {}, out))
        return out


def _write_into(old: Any, new: Any) -> None:
    if isinstance(old, torch.Tensor):
        if old.data_ptr() != new.data_ptr() or old.stride() != new.stride():
            old.copy_(new)
    elif isinstance(old, (tuple, list)):
        for a, b in zip(old, new, strict=True):
            _write_into(a, b)


def replay(ops: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Any]]) -> None:
    """Run the recorded operations again, in order, on the same tensors, each result written where the capture's
    went."""
    for func, args, kwargs, out in ops:
        with _disable_current_modes():
            _write_into(out, func(*args, **kwargs))

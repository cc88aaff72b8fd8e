"""A CUDA graph's semantics emulated on CPU tensors by recording operations (for tests/compressors/test_graphs.py).

A real graph replays the kernels its capture launched, on the same memory, with every host value of the capture
baked in: a Python number, a shape, a decision taken on the host while capturing. This stand-in records each torch
operation the capture runs (a ``TorchDispatchMode``), and each launch of a Triton kernel named to it, with its
arguments; a replay runs them again in order on the same tensors and writes each result into the tensor the capture
returned, as the graph's kernels write into their memory. A read back to the host (``.item()``, ``bool``) fails the
capture, as it does on a GPU. So a device part that depends on a host value of its capture (rather than on its input's
contents or its key slots) gives the capture's answer on every replay, and the tests see it.

Memory a capture allocates comes from the graph's private pool, which hands a block freed earlier in the capture to a
later allocation of the same capture: at a replay, a tensor allocated while capturing holds whatever the replay's
earlier kernels wrote into the memory it shares with a dead temporary, not what the host wrote into it between
replays. Operations that only allocate (``empty``) are not replayed, and a replay first poisons every tensor they
made (a finite byte pattern): a value written into one from outside the graph is lost, as on a GPU, while a tensor
the replay itself writes before reading is unaffected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

NO_WORK = {
    torch.ops.aten.empty.memory_format,
    torch.ops.aten.empty_strided.default,
    torch.ops.aten.empty_like.default,
    torch.ops.aten.new_empty.default,
    torch.ops.aten.new_empty_strided.default,
}
HOST_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default}


class Recorder(TorchDispatchMode):
    """Records the operations run inside it: ``(function, args, kwargs, result)``."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Any]] = []
        self.allocated: list[torch.Tensor] = []
        """The tensors the capture allocated (poisoned at the start of each replay)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func in HOST_READS:
            raise RuntimeError(f"a value read back to the host while capturing ({func})")
        out = func(*args, **kwargs)
        if func in NO_WORK:
            self.allocated.append(out)
        else:
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


POISON_BYTE = 0x5A
"""The byte a replay writes into every byte of the capture's allocations (bool ones get True): finite as a float
(about 1.5e16 in float32), so a value written from outside the graph and lost shows in a payload, not as a NaN that a
deferred finiteness check would answer with a synchronous encode."""


def _poison(t: torch.Tensor) -> None:
    if t.dtype == torch.bool:
        t.fill_(True)
        return
    size = t.element_size()
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
    t.view(bits).fill_(int.from_bytes(bytes([POISON_BYTE]) * size, "little"))


def replay(recorder: Recorder) -> None:
    """Poison the capture's allocations, then run the recorded operations again, in order, on the same tensors, each
    result written where the capture's went."""
    with _disable_current_modes():
        for t in recorder.allocated:
            _poison(t)
    for func, args, kwargs, out in recorder.ops:
        with _disable_current_modes():
            _write_into(out, func(*args, **kwargs))

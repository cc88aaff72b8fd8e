"""CUDA code paths run on a machine without a GPU: fake CUDA tensors (torch's ``FakeTensorMode``, which holds shapes,
dtypes and devices but no values) and Triton launches recorded instead of run.

What this shows: the branches a CUDA tensor takes (the Triton forms, the bounded selections, the deferred checks) run
to the end without reading a value back to the host (a read of a fake tensor raises ``DataDependentOutputException``,
as it would have synchronised with a GPU), without a copy between the host and the GPU (refused here: a GPU would
wait for it), without mixing a CPU tensor into the CUDA work (a fake CUDA tensor and a CPU one in one operation
raise, as on a GPU), and which kernels they launch. What it does not show: any value (the
kernels do not run), nor the speed.

Python's indexing of a CUDA tensor (``x[i]``, ``x[a:b] = y``) and ``~x`` ask for the CUDA runtime before they
dispatch, which a CPU build of torch lacks: :func:`fake_cuda` routes them to the same ATen operations. A compiled
function (:class:`gradstat.theory.kernels.fused.Fused` where the policy compiles it on CUDA) runs its reference and
is recorded as one launch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from gradstat.compressors import graphs
from gradstat.theory.kernels import fused, policy, triton_runtime


def _fake_cuda_tensors() -> bool:
    try:
        with FakeTensorMode():
            torch.empty(2, device="cuda").abs()
    except (RuntimeError, AssertionError):
        return False
    return True


needs_fake_cuda = pytest.mark.skipif(
    torch.cuda.is_available() or not _fake_cuda_tensors(),
    reason="a GPU is present (its own tests count the synchronisations; and a device cache filled with fake tensors "
    "would outlive the test)"
    if torch.cuda.is_available()
    else f"torch {torch.__version__} makes no fake CUDA tensor without a CUDA driver (torch 2.11 and 2.13 do)",
)
"""Marks a test that runs CUDA paths on fake tensors: on a machine without a GPU (process-wide caches keyed by the
device, such as the Hadamard matrices', keep what a fake run put there, which no real CUDA work can then meet)."""

VIEWS = {
    "view", "_unsafe_view", "reshape", "expand", "as_strided", "slice", "select", "unsqueeze", "squeeze", "t",
    "detach", "alias", "permute", "transpose", "lift_fresh", "empty", "empty_strided", "empty_like", "new_empty",
    "new_empty_strided", "unbind", "split", "split_with_sizes", "narrow", "movedim",
}  # fmt: skip
"""Operations that launch no kernel (views and allocations)."""


class _Launcher:
    """A Triton kernel's stand-in: ``kernel[grid](*args)`` records the kernel's name (and, in ``constants``, its
    compile-time constants: the upper-case keywords), after Triton's own check that every tensor it is given is on
    the GPU."""

    def __init__(self, fn: Any, launches: list[str], constants: list[tuple[str, dict[str, Any]]]) -> None:
        self.name, self.launches, self.constants = fn.__name__, launches, constants

    def __getitem__(self, grid: object) -> Any:
        def launch(*args: Any, **kwargs: Any) -> None:
            for arg in (*args, *kwargs.values()):  # (Triton refuses a pointer it cannot reach from the GPU)
                if isinstance(arg, torch.Tensor) and arg.device.type != "cuda":
                    raise ValueError(f"{self.name}: a tensor on {arg.device} passed to a CUDA kernel")
            self.launches.append(f"triton:{self.name}")
            self.constants.append((self.name, {k: v for k, v in kwargs.items() if k.isupper()}))

        return launch


COPIES = {"_to_copy", "copy_"}
"""Operations that copy between devices (``Tensor.to`` reaches the dispatcher as ``_to_copy``)."""


def _across(args: tuple[Any, ...], out: Any) -> bool:
    """Whether the copy ``out`` of ``args`` moves data between the host and the GPU, either way (a copy from pageable
    host memory waits for the device too)."""
    if not isinstance(out, torch.Tensor):
        return False
    sources = {a.device.type for a in args if isinstance(a, torch.Tensor)}
    return bool(sources) and out.device.type in ("cpu", "cuda") and sources != {out.device.type}


class _Launches(TorchDispatchMode):
    """Records each ATen operation that launches a kernel, outside compiled functions."""

    def __init__(self, launches: list[str], inside: list[int]) -> None:
        super().__init__()
        self.launches, self.inside = launches, inside

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        out = func(*args, **(kwargs or {}))
        if name in COPIES and _across(args, out):  # (no value is read, but a GPU would wait for it)
            raise RuntimeError(f"{name}: a copy between the host and the GPU")
        if name not in VIEWS and not self.inside[0]:
            self.launches.append(f"aten:{name}")
        return out


def _dim_index(t: torch.Tensor, dim: int, index: Any) -> tuple[torch.Tensor, int]:
    """``t`` indexed at ``dim`` by ``index`` (an int, a slice, None or an integer tensor), and the next dim."""
    if index is None:
        return torch.ops.aten.unsqueeze.default(t, dim), dim + 1
    if isinstance(index, int):
        return torch.ops.aten.select.int(t, dim, index), dim
    if isinstance(index, slice):
        return torch.ops.aten.slice.Tensor(t, dim, index.start, index.stop, index.step or 1), dim + 1
    if isinstance(index, torch.Tensor) and index.dtype != torch.bool:
        return torch.ops.aten.index.Tensor(t.movedim(dim, 0), [index]).movedim(0, dim), dim + 1
    raise TypeError(f"fake CUDA indexing does not handle {index!r}")


def _indexed(t: torch.Tensor, index: Any) -> torch.Tensor:
    dim = 0
    for part in index if isinstance(index, tuple) else (index,):
        t, dim = _dim_index(t, dim, part)
    return t


def _raise(self: object, exc: Exception) -> None:
    raise exc


class FakeCuda:
    """Fake CUDA tensors are made under :attr:`mode` on ``"cuda"``; :meth:`record` runs code on them and records its
    launches in :attr:`launches`."""

    def __init__(self) -> None:
        self.mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.launches: list[str] = []
        self.constants: list[tuple[str, dict[str, Any]]] = []
        """Each Triton launch's kernel and compile-time constants, in order."""
        self.inside = [0]  # (compiled functions being run: their operations are not launches of their own)

    @contextlib.contextmanager
    def record(self) -> Iterator[list[str]]:
        """Run the enclosed code on fake tensors, its launches recorded (the list cleared first)."""
        self.launches.clear()
        self.constants.clear()
        with self.mode, _Launches(self.launches, self.inside):
            yield self.launches


@contextlib.contextmanager
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
    """A :class:`FakeCuda`, with the patches that let CUDA paths run on it (see the module docstring). CUDA graphs
    are off (their capture needs the CUDA runtime; a graph replays the same device part)."""
    fake = FakeCuda()
    getitem, setitem = torch.Tensor.__getitem__, torch.Tensor.__setitem__

    def get(self: torch.Tensor, index: Any) -> torch.Tensor:
        if self.device.type != "cuda":
            return getitem(self, index)
        return _indexed(self, index)

    def put(self: torch.Tensor, index: Any, value: Any) -> None:
        if self.device.type != "cuda":
            setitem(self, index, value)
            return
        target = _indexed(self, index)
        if isinstance(value, torch.Tensor):
            torch.ops.aten.copy_.default(target, value)
        else:
            torch.ops.aten.fill_.Scalar(target, value)

    def compiled(self: fused.Fused) -> Any:
        def run(*args: Any) -> Any:
            fake.launches.append(f"compiled:{self.name}")
            fake.inside[0] += 1
            try:
                return self.fn(*args)
            finally:
                fake.inside[0] -= 1

        return run

    monkeypatch.setattr(torch.Tensor, "__getitem__", get)
    monkeypatch.setattr(torch.Tensor, "__setitem__", put)
    monkeypatch.setattr(torch.Tensor, "__invert__", lambda self: torch.ops.aten.bitwise_not.default(self))
    monkeypatch.setattr(triton_runtime, "build", lambda fn, interpret: _Launcher(fn, fake.launches, fake.constants))
    monkeypatch.setattr(triton_runtime, "available", lambda: True)
    monkeypatch.setattr(triton_runtime, "launch", lambda x: (contextlib.nullcontext(), {}))
    monkeypatch.setattr(policy, "compiler_for", lambda device_type: True)
    monkeypatch.setattr(fused.Fused, "_kernel", compiled)
    # every Triton and compiled form as on a fresh GPU process, and a failure of one raised, not a fallback taken
    monkeypatch.setattr(triton_runtime.Fallback, "is_set", lambda self: False)
    monkeypatch.setattr(triton_runtime.Fallback, "report", _raise)
    monkeypatch.setattr(
        fused.Fused, "may_compile", lambda self, x: self.compiles_on is None or x.device.type in self.compiles_on
    )
    with graphs.forced("never"):
        yield fake

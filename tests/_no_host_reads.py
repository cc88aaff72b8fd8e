"""Proofs that code reads nothing back from a device and copies nothing to it from the host.

Run the code on ``meta`` tensors, which hold no values: every read back (``item``, ``float``, ``bool``, ``tolist``,
``nonzero``, boolean masks, ``cpu``) raises there. A copy of host data to the device does not raise on meta tensors,
so :func:`no_copy_to_device` fails it (on CUDA such a copy waits for the device as a read back does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _meta_frexp() -> bool:
    try:
        torch.frexp(torch.empty(2, device="meta"))
    except (NotImplementedError, RuntimeError):
        return False
    return True


on_meta = pytest.mark.skipif(
    not _meta_frexp(),
    reason=f"torch {torch.__version__} has no meta kernel for frexp (the power-of-two normalisation); the proof on "
    "meta tensors runs under newer torch",
)
"""Marks a proof that runs on meta tensors: skipped under a torch whose meta backend lacks what the code calls."""


class _NoCopyToDevice(TorchDispatchMode):
    """Fails an operation that copies a CPU tensor to the device (a synchronising host-to-device copy)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        inputs = [t.device.type for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outputs = [t.device.type for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        assert not ("cpu" in inputs and "meta" in outputs and func.__name__.split(".")[0] in _COPIES), func
        return out


_COPIES = {"_to_copy", "copy_", "to", "lift_fresh", "lift_fresh_copy", "_copy_from"}


@contextlib.contextmanager
def no_copy_to_device() -> Iterator[None]:
    """Fails a copy of host data or of a CPU tensor to the device (a copy that synchronises): ``torch.tensor`` or
    ``torch.as_tensor`` of host data with a device, or an operation from a CPU tensor to a device tensor."""
    originals = {name: getattr(torch, name) for name in ("tensor", "as_tensor")}

    def guard(original):  # type: ignore[no-untyped-def]
        def guarded(data, *args, **kwargs):  # type: ignore[no-untyped-def]
            device = kwargs.get("device")
            assert isinstance(data, torch.Tensor) or device is None or torch.device(device).type == "cpu", data
            return original(data, *args, **kwargs)

        return guarded

    try:
        for name, original in originals.items():
            setattr(torch, name, guard(original))
        with _NoCopyToDevice():
            yield
    finally:
        for name, original in originals.items():
            setattr(torch, name, original)
        _forget_traced_torch_functions()


def _forget_traced_torch_functions() -> None:
    """Drop torch.compile's map of torch's functions where it was built while the guards stood in for
    ``torch.tensor``/``torch.as_tensor``: built then, it lacks the real ones, and a later compile in this process
    fails on them ("Dynamo does not know how to trace the builtin torch._VariableFunctionsClass.as_tensor"), as
    tests/theory/test_pot_compiled.py did after this file's tests in the same worker."""
    rules = getattr(getattr(torch, "_dynamo", None), "trace_rules", None)
    for name in ("get_torch_obj_rule_map", "get_tensor_method"):
        cached = getattr(rules, name, None)
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()


@contextlib.contextmanager
def host_reads() -> Iterator[list[int]]:
    """Counts the reads of tensor values back to the host (``tolist``, ``item``, ``bool``, ``float``, ``int``, an
    index, ``numpy``) in the enclosed code, except inside :attr:`~gradstat.compressors.wire.payload.Payload.seed` and
    :meth:`~gradstat.compressors.wire.payload.Payload.check_generator`, which read parts held on the host by
    design."""
    from gradstat.compressors.wire.payload import Payload

    count = [0]
    paused = [0]
    names = ("tolist", "item", "__bool__", "__float__", "__int__", "__index__", "numpy")
    originals = {name: getattr(torch.Tensor, name) for name in names}
    own = {name for name in names if name in torch.Tensor.__dict__}  # (the others are inherited from TensorBase)
    seed, check_generator = Payload.seed, Payload.check_generator

    def counted(original):  # type: ignore[no-untyped-def]
        def read(*args, **kwargs):  # type: ignore[no-untyped-def]
            if not paused[0]:
                count[0] += 1
            return original(*args, **kwargs)

        return read

    def host_seed(payload: Payload) -> int:
        paused[0] += 1
        try:
            return seed.fget(payload)  # type: ignore[misc]
        finally:
            paused[0] -= 1

    def host_generator(payload: Payload, device: torch.device | str, who: str) -> None:
        paused[0] += 1
        try:
            check_generator(payload, device, who)
        finally:
            paused[0] -= 1

    try:
        for name in names:
            setattr(torch.Tensor, name, counted(originals[name]))
        Payload.seed = property(host_seed)  # type: ignore[assignment, method-assign]
        Payload.check_generator = host_generator  # type: ignore[method-assign]
        yield count
    finally:
        for name in names:
            if name in own:
                setattr(torch.Tensor, name, originals[name])
            else:
                delattr(torch.Tensor, name)
        Payload.seed = seed  # type: ignore[method-assign]
        Payload.check_generator = check_generator  # type: ignore[method-assign]

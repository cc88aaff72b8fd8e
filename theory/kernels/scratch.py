"""Per-thread scratch buffers: a d-element temporary reused across calls instead of a fresh allocation.

A fresh d-element tensor on a CPU page-faults its whole output on every call (a 104 MB temporary costs ~15 read
passes fresh, ~2 into warm memory); the kernels and the schemes write their temporaries here instead."""

from __future__ import annotations

import threading

import torch

_SCRATCH = threading.local()


def abs_scratch(x: torch.Tensor) -> torch.Tensor:
    """``|x|`` (flat) written into a buffer reused across calls of the same thread, dtype and device.

    A fresh d-element tensor on a CPU page-faults its whole output on every call (a 104 MB ``abs`` costs ~15
    read passes fresh, ~2 into warm memory). The result is valid until the next ``abs_scratch`` call of the same
    thread on a tensor of the same dtype and device: use it inside one encode and keep nothing that views it."""
    flat = x.reshape(-1)
    return torch.abs(flat, out=scratch(flat.numel(), flat.dtype, flat.device, "abs"))


def scratch(numel: int, dtype: torch.dtype, device: torch.device, slot: str, keep: int = 0) -> torch.Tensor:
    """A flat buffer of ``numel`` elements, reused across calls of the same thread, ``slot``, dtype and device.

    The general form of :func:`abs_scratch` for a pass that writes a d-element temporary (a fresh 104 MB CPU tensor
    page-faults ~15 read passes' worth on every call). The contents are undefined; the buffer is valid until the
    next ``scratch`` call of the same thread with the same ``slot``, dtype and device: use it inside one encode or
    decode, return nothing that views it. :func:`release_scratch` frees it. Off the CPU a fresh tensor is returned:
    the device's caching allocator already reuses memory without faults, and a kept buffer would pin device memory
    per thread and slot. ``keep``: when the buffer grows, its first ``keep`` elements are copied into the new one
    (a buffer filled in steps, such as the compaction's output)."""
    if torch.device(device).type != "cpu":
        return torch.empty(numel, dtype=dtype, device=device)
    cache = getattr(_SCRATCH, "buffers", None)
    if cache is None:
        cache = _SCRATCH.buffers = {}
    key = (slot, dtype, torch.device(device))
    buf = cache.get(key)
    # a buffer made under inference mode takes no in-place change outside it: made again (its kept prefix copied)
    stale = buf is not None and buf.is_inference() and not torch.is_inference_mode_enabled()
    if buf is None or stale or buf.numel() < numel:
        grown = torch.empty(numel, dtype=dtype, device=device)
        if buf is not None and keep:
            grown[:keep] = buf[:keep]
        buf = cache[key] = grown
    return buf[:numel]


def release_scratch() -> None:
    """Free this thread's :func:`scratch` buffers (e.g. after compressing a very large tensor once)."""
    _SCRATCH.buffers = {}


def scratch_like(x: torch.Tensor, slot: str) -> torch.Tensor:
    """A :func:`scratch` buffer with the shape and the memory layout of ``x`` where ``x`` is contiguous or the
    transpose of a contiguous matrix (the layout a fresh ``x * c`` would get), else contiguous. Reductions over a
    tensor depend on its layout (the order of the additions), so a scratch copy keeps the plain form's layout."""
    buf = scratch(x.numel(), x.dtype, x.device, slot)
    if x.dim() == 2 and not x.is_contiguous() and x.T.is_contiguous():
        return buf.view(x.T.shape).T
    return buf.view(x.shape)

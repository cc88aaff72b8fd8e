"""Huge pages for the large tensors of the ``gradstat`` command.

A fresh d-element CPU tensor page-faults its whole buffer on its first write: at 26M float32 elements (104 MB) that
costs ~80 ms on 4 KiB pages, against ~6 ms for one read pass over it, and every decode output, gathered copy and
temporary of that size pays it again. torch's CPU allocator asks the kernel for transparent huge pages (2 MiB) on
allocations of at least 2 MiB when the environment variable ``THP_MEM_ALLOC_ENABLE`` is ``1``; it reads the
variable once, at its first allocation, so the setting must come before torch allocates anything. With it, the same
104 MB costs ~20 ms of faults (measured on the 2-core development machine; the kernel must allow huge pages,
``/sys/kernel/mm/transparent_hugepage/enabled`` at ``always`` or ``madvise``).

The ``gradstat`` command requests it (:func:`request`) before it imports anything that uses torch, unless the
environment already sets the variable (``THP_MEM_ALLOC_ENABLE=0`` keeps 4 KiB pages). A program that uses gradstat
as a library (a training script with its DDP hooks) sets the variable itself, in its environment or at its top.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

VARIABLE = "THP_MEM_ALLOC_ENABLE"
KERNEL_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


_LATE: list[bool] = []
"""Set by :func:`request` when it set the variable itself: whether torch had been imported already (then torch
may have read the variable before it was set)."""


def request() -> None:
    """Ask torch's CPU allocator for huge pages on large tensors, unless the environment says otherwise."""
    if VARIABLE not in os.environ:
        os.environ[VARIABLE] = "1"
        _LATE[:] = ["torch" in sys.modules]


def kernel_mode(setting: Path = KERNEL_SETTING) -> str:
    """The kernel's transparent-huge-page mode (``always``, ``madvise`` or ``never``; ``unknown`` where the setting
    cannot be read, e.g. off Linux)."""
    try:
        text = setting.read_text()
    except OSError:
        return "unknown"
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else "unknown"


def describe() -> str:
    """One line on whether large CPU tensors get huge pages in this process, for a benchmark's header."""
    value = os.environ.get(VARIABLE)
    mode = kernel_mode()
    variable = f"{VARIABLE}={value}" if value is not None else f"{VARIABLE} unset"
    if _LATE and _LATE[0] and mode != "always":
        return (
            f"huge pages for large CPU tensors unknown ({variable} was set after torch was imported, so torch may "
            f"have read it unset; kernel transparent huge pages: {mode})"
        )
    if mode == "always" or (value == "1" and mode == "madvise"):
        state = "on"
    else:  # with the variable set, the kernel's mode decides; an unreadable one leaves it open
        state = "unknown" if value == "1" and mode == "unknown" else "off"
    return f"huge pages for large CPU tensors {state} ({variable}; kernel transparent huge pages: {mode})"

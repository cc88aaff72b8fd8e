"""Timing shared by the benchmark modules: median wall time, synchronised on CUDA."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def median_ms(fn: Callable[[], object], repeats: int, device: torch.device | str = "cpu", warmup: int = 1) -> float:
    """Median wall time of ``fn`` in milliseconds over ``repeats`` calls after ``warmup`` calls.

    On CUDA the device is synchronised before and after each call, so the time covers the kernels, not only
    their launch.
    """
    device = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(1, repeats)):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)

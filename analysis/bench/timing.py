"""Timing shared by the benchmark modules: warm-up, then median and spread of wall time (CUDA events on a GPU)."""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Timing:
    """Milliseconds of ``repeats`` timed calls after the warm-up: median and the min-max spread."""

    median: float
    low: float
    high: float


def time_ms(fn: Callable[[], object], repeats: int, device: torch.device | str = "cpu", warmup: int = 1) -> Timing:
    """Time ``fn`` over ``repeats`` calls after ``warmup`` untimed calls (first-call effects are not results).

    On CUDA each call is timed with CUDA events around it (kernel time, not only launch), synchronised after."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    times = [_one_call_ms(fn, device) for _ in range(max(1, repeats))]
    return Timing(statistics.median(times), min(times), max(times))


def time_paired(
    fn: Callable[[], object],
    baseline: Callable[[], object],
    repeats: int,
    device: torch.device | str = "cpu",
    warmup: int = 1,
) -> tuple[Timing, Timing]:
    """:func:`time_ms` of ``fn`` and of ``baseline``, their calls interleaved (baseline, fn, baseline, fn, ...) after
    ``warmup`` untimed calls of each: a ratio of the two medians compares calls made under the same conditions, so
    a slow spell of a shared machine moves both rather than one (a baseline timed once, before every other row,
    moved every ratio of its cell together: 0.80x to 1.21x between runs of the same code). A timed call whose
    function last took under :data:`REWARM_MS` follows an untimed call of the same function, so that it finds the
    caches as repeated calls of its own leave them (as :func:`time_ms`'s consecutive calls do), not as the other
    function left them; a longer call's working set does not stay in a cache anyway."""
    device = torch.device(device)
    last = [0.0, 0.0]
    for _ in range(warmup):
        for j, call in enumerate((baseline, fn)):
            last[j] = _one_call_ms(call, device)
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(max(1, repeats)):
        for j, call in enumerate((baseline, fn)):
            if last[j] < REWARM_MS:
                call()
                if device.type == "cuda":  # (else the timed call's start event would queue behind it)
                    torch.cuda.synchronize(device)
            last[j] = _one_call_ms(call, device)
            times[j].append(last[j])
    base, own = (Timing(statistics.median(t), min(t), max(t)) for t in times)
    return own, base


REWARM_MS = 20.0
"""Calls shorter than this are timed right after an untimed call of their own in :func:`time_paired`."""


def _one_call_ms(fn: Callable[[], object], device: torch.device) -> float:
    """One timed call of ``fn`` in milliseconds (CUDA events around it on a GPU, synchronised after)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        return float(start.elapsed_time(end))
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


SYNC_WARNING = "synchronizing"
"""Part of the warning torch's CUDA sync debug mode gives for each operation that waits for the device."""


def host_syncs(fn: Callable[[], object], device: torch.device | str = "cpu") -> int | None:
    """How many times one call of ``fn`` makes the host wait for the device (torch's CUDA sync debug mode in its
    ``warn`` setting, one warning per synchronising operation); None off CUDA, where nothing waits."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(before)
    return sum(1 for w in caught if SYNC_WARNING in str(w.message).lower())


def median_ms(fn: Callable[[], object], repeats: int, device: torch.device | str = "cpu", warmup: int = 1) -> float:
    """Median of :func:`time_ms`, in milliseconds."""
    return time_ms(fn, repeats, device, warmup).median


def bench_device(device: str) -> torch.device:
    """The device a benchmark runs on (``'cpu'``, ``'cuda'``, ``'cuda:1'``...), with a clear error where CUDA is asked
    for and none is available."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but no CUDA device is available")
    return dev


def progress(message: str) -> None:
    """One progress line on stderr (benchmarks print their table on stdout)."""
    print(message, file=sys.stderr, flush=True)

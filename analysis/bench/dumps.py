"""Dump benchmark: recording overhead per training step and whole-dump read throughput vs raw file reads.

Everything is measured in one run: training steps without a recorder, with a recorder writing every step, and
with a recorder attached that records nothing (the steps in between recordings) are interleaved step by step;
the dump written meanwhile is then read back whole (``Dump.flat`` of every step and worker, with and without
the per-tensor sha256 check) and, as the baseline, its files are read raw (``open(...).read()``). The files are
in the page cache for both, so the ratio compares software overhead, not the disk.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pandas as pd
import torch

from gradstat.analysis.bench.timing import progress
from gradstat.analysis.dumps import open_dump
from gradstat.analysis.training.parallel import DataParallel
from gradstat.analysis.training.recorder import Recorder
from gradstat.analysis.training.workloads import get_workload

OPTIONS = """
workload : workload spec (default ``lenet``).
steps : timed training steps per mode (default 10), after ``warmup`` untimed ones (default 2).
workers : simulated workers P (default 4).
dtype : storage dtype of the recorded dump (default ``float32``).
reads : passes over the whole dump for each read mode; the median is reported (default 3).
"""


def run(
    workload: str = "lenet", steps: int = 10, workers: int = 4, dtype: str = "float32", warmup: int = 2, reads: int = 3
) -> pd.DataFrame:
    """Returns a table with columns ``metric``, ``value``, ``unit``, ``note``."""
    if steps < 1 or warmup < 0 or reads < 1:
        raise ValueError(f"need steps >= 1, warmup >= 0, reads >= 1; got {steps}, {warmup}, {reads}")
    wl = get_workload(workload)
    with tempfile.TemporaryDirectory(prefix="gradstat-bench-") as tmp:
        modes = {"no recorder": None, "recording every step": 1, "recorder attached, step not recorded": 10**9}
        # per mode: the trainer, its recorder (None: none attached), its batches and its step times
        runs: dict[
            str, tuple[DataParallel, Recorder | None, Iterator[tuple[torch.Tensor, torch.Tensor]], list[float]]
        ] = {}
        for name, every in modes.items():
            model = wl.model(seed=0)
            dp = DataParallel(model, wl.optimizer(model), wl.loss, workers)
            rec = None
            if every is not None:
                rec = Recorder.create(
                    Path(tmp) / f"dump{len(runs)}", model, wl.name, every=every, workers=workers, dtype=dtype
                )
            runs[name] = (dp, rec, wl.batches(seed=1), [])
        write_times: list[float] = []
        for t in range(warmup + steps):
            progress(f"bench dumps: training step {t + 1}/{warmup + steps} ({warmup} warm-up)")
            for dp, rec, batches, times in runs.values():
                x, y = next(batches)
                start = time.perf_counter()
                result = dp.step(t, x, y)
                mid = time.perf_counter()
                if rec is not None:
                    rec.record(t + 1 if rec.every > 1 else t, result.grads)  # every>1: t+1 is never a multiple
                end = time.perf_counter()
                if t >= warmup:
                    times.append(end - start)
                    if rec is not None and rec.every == 1:
                        write_times.append(end - mid)
        rows = []
        base = statistics.median(runs["no recorder"][3])
        for name, (_, _, _, times) in runs.items():
            med = statistics.median(times)
            rows.append(
                {
                    "metric": f"train step, {name}",
                    "value": 1e3 * med,
                    "unit": "ms/step",
                    "note": f"median of {steps} (min {1e3 * min(times):.3g}, max {1e3 * max(times):.3g}); "
                    f"{med / base:.3f}x the step without recorder",
                }
            )
        rec_ms = 1e3 * (statistics.median(runs["recording every step"][3]) - base)
        rows.append(
            {
                "metric": "recording overhead per recorded step",
                "value": rec_ms,
                "unit": "ms",
                "note": f"{workers} workers x {wl.num_params:,} parameters as {dtype}; step-time difference",
            }
        )
        step_bytes = open_dump(Path(tmp) / "dump1").manifest["steps"][0]["bytes"]
        write = statistics.median(write_times)
        rows.append(
            {
                "metric": "DumpWriter.write_step inside the loop",
                "value": 1e3 * write,
                "unit": "ms",
                "note": f"{step_bytes / 1e6:.1f} MB per step file: {step_bytes / write / 1e6:.0f} MB/s "
                f"(convert, sha256 per tensor and per file, serialise, write, fsync, manifest)",
            }
        )
        rows += _read_rows(Path(tmp) / "dump1", reads)
    return pd.DataFrame(rows)


def _read_rows(path: Path, reads: int) -> list[dict]:
    files = [path / e["file"] for e in open_dump(path).manifest["steps"]]
    file_bytes = sum(f.stat().st_size for f in files)

    def raw() -> int:
        n = 0
        for f in files:
            with open(f, "rb") as fh:
                n += len(fh.read())
        return n

    def dump_read(check: bool) -> int:
        d = open_dump(path, check=check)
        n = 0
        for s in d.steps:
            for w in range(d.workers):
                t = d.flat(s, w)
                n += t.numel() * t.element_size()
        return n

    timings: dict[str, list[float]] = {"raw file read": [], "Dump.flat, sha256 checked": [], "Dump.flat, unchecked": []}
    amount: dict[str, int] = {}
    progress(f"bench dumps: reading the dump {reads} times per mode")
    for _ in range(reads):  # interleaved so that every mode sees the same cache state
        for name, fn in (
            ("raw file read", raw),
            ("Dump.flat, sha256 checked", lambda: dump_read(True)),
            ("Dump.flat, unchecked", lambda: dump_read(False)),
        ):
            start = time.perf_counter()
            amount[name] = fn()
            timings[name].append(time.perf_counter() - start)
    raw_speed = amount["raw file read"] / statistics.median(timings["raw file read"]) / 1e6
    rows = []
    for name, ts in timings.items():
        speed = amount[name] / statistics.median(ts) / 1e6
        rows.append(
            {
                "metric": f"read whole dump, {name}",
                "value": speed,
                "unit": "MB/s",
                "note": f"median of {len(ts)} (min-max {amount[name] / max(ts) / 1e6:.0f}-"
                f"{amount[name] / min(ts) / 1e6:.0f} MB/s); "
                f"{amount[name] / 1e6:.1f} MB ({file_bytes / 1e6:.1f} MB of files); "
                f"{speed / raw_speed:.2f}x raw read",
            }
        )
    return rows

"""Run a function on P local processes joined in a gloo process group, with timeouts so nothing can hang.

``run_ranks(fn, world=2, **kwargs)`` starts P processes; each joins the group (file rendezvous, process-group
timeout ``PG_TIMEOUT_S``), calls ``fn(rank, world, **kwargs)`` and saves its return value (or its traceback).
The parent waits at most ``timeout_s`` and fails the test (killing the ranks) if they have not finished: a hang
is a failure, never a stuck suite.

From torch :data:`FORKSERVER_TORCH` on, the ranks are forked from multiprocessing's fork server, which imports
:data:`PRELOAD` once per test process: a fresh interpreter per rank (the ``spawn`` start, kept for older torch)
paid about 3 s of CPU in imports, 6 s a launch, more than most scenarios' own work. Each rank still starts from
that clean server, never from the test process (no copy of pytest's state or threads), with the test process's
``sys.path`` and working folder; its environment is the server's, taken when the first launch of the test process
started it.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from gradstat.theory.kernels.policy import torch_version

PG_TIMEOUT_S = 60.0
TEARDOWN_S = 20.0
FORKSERVER_TORCH = (2, 13)
"""Oldest torch whose ranks are forked from the fork server (the version measured). Under torch 2.1 (the oldest
session) ranks forked from it hung in their first DDP step: test_record_ranks and test_launchers' plain-DDP launch
every run with ``torch._dynamo`` preloaded, and test_launchers' launch in a full run without it; there each rank is
a fresh interpreter (``spawn``), as before the server."""

GIL_TEARDOWN_TORCH = (2, 2)
"""Below this torch (the oldest session's 2.1), a rank leaves without tearing the group down once its result is
saved: there gloo's ``destroy_process_group`` after a rank's DDP hooks ran can wait without end while holding the
GIL, so even the bounded teardown below could not time out (a hung rank 0 of test_record_ranks, 2 of 4 runs, sat
in the teardown thread's ``Thread.start``)."""

PRELOAD = [
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "gradstat.compressors.ddp",
    "gradstat.analysis.training.workloads",
]
"""What the fork server imports before it forks any rank (the bulk of every rank's imports; DDP's constructor
imports ``torch._dynamo``, about 1.2 s of CPU)."""


def _entry(fn: Callable, rank: int, world: int, init_file: str, out_dir: str, kwargs: dict) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=PG_TIMEOUT_S),
    )
    try:
        result: Any = {"ok": fn(rank, world, **kwargs)}
    except BaseException:  # report to the parent, which fails the test with it
        result = {"error": traceback.format_exc()}
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    if torch_version() < GIL_TEARDOWN_TORCH:
        os._exit(0)
    # The result is saved. Tear the group down, but not forever: torch 2.1's gloo can wait without end in
    # destroy_process_group after a rank's DDP hooks ran (seen with the docs' DDP examples), and a rank that
    # cannot leave would fail a test whose work is done.
    teardown = threading.Thread(target=dist.destroy_process_group, daemon=True)
    teardown.start()
    teardown.join(TEARDOWN_S)
    if teardown.is_alive():
        os._exit(0)


def run_ranks(fn: Callable, world: int = 2, timeout_s: float = 240.0, **kwargs: Any) -> list[Any]:
    """``[fn(0, world, **kwargs), ..., fn(world - 1, world, **kwargs)]`` computed on ``world`` processes."""
    if torch_version() >= FORKSERVER_TORCH:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)  # read when the server starts: the first launch of this process
    else:
        ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        init_file = str(Path(tmp) / "rendezvous")
        procs = [ctx.Process(target=_entry, args=(fn, r, world, init_file, tmp, kwargs)) for r in range(world)]
        for p in procs:
            p.start()
        end = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.0, end - time.monotonic()))
        alive = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        if alive:
            pytest.fail(f"ranks {alive} did not finish within {timeout_s} s (a hang)")
        results = []
        for r in range(world):
            file = Path(tmp) / f"rank{r}.pt"
            if not file.is_file():
                pytest.fail(f"rank {r} exited with status {procs[r].exitcode} without a result")
            out = torch.load(file, weights_only=True)
            if "error" in out:
                pytest.fail(f"rank {r} raised:\n{out['error']}")
            results.append(out["ok"])
        return results

"""``gradstat train``: launch real data-parallel training with ``torchrun`` on this machine and summarise it.

:func:`train` checks every argument, writes the configuration of the ranks (``train_config.json``), starts
``python -m torch.distributed.run --standalone --nproc-per-node P -m gradstat.analysis.training.distributed``,
waits for it, and writes the summary table (``summary.csv``/``.md``) and the figures beside the per-step table.

Multi-node: write the configuration with ``launch=False`` (``gradstat train ... --config-only``), copy it to
every node (paths in it must exist there; the dump and results directory should be on a shared file system when
recording), and start on each node ``python -m torch.distributed.run --nnodes N --node-rank I --rdzv-backend c10d
--rdzv-endpoint HOST:PORT --nproc-per-node P -m gradstat.analysis.training.distributed --config FILE`` -- the
same arguments as any torchrun job; the training code does not change.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from gradstat.analysis.dumps.writer import check_new_dump_dir
from gradstat.analysis.measure.tables import write_table
from gradstat.analysis.training.distributed import RunSpec, TrainConfig
from gradstat.analysis.training.distributed_report import BASELINE, figures, summarize
from gradstat.analysis.training.workloads import get_workload
from gradstat.compressors import create, parse_feedback
from gradstat.compressors.ddp import BASELINES
from gradstat.compressors.ddp.hook import parse_local_momentum

ENTRY = "gradstat.analysis.training.distributed"


class TrainingFailed(ValueError):
    """The ranks stopped with an error (a compressor refusing its input, a NaN gradient, a rank that died); the
    message holds the ranks' own error lines and the log's path."""


@dataclass
class TrainResult:
    """Where everything went: ``results`` (steps.csv, summary, figures, log), ``dump`` (or None)."""

    results: Path
    dump: Path | None
    summary: pd.DataFrame
    steps: pd.DataFrame
    files: list[Path] = field(default_factory=list)


def build_config(
    workload: str,
    nproc: int,
    compressors: Sequence[str],
    feedback: str = "none",
    iterations: int = 50,
    record_every: int | None = None,
    out: str | Path = "train",
    backend: str = "gloo",
    baselines: Sequence[str] = (),
    granularity: str = "bucket",
    exchange: str = "gather",
    seed: int = 0,
    timeout_s: float = 300.0,
    bucket_cap_mb: float | None = None,
    residual: bool = False,
    powersgd_rank: int = 1,
) -> TrainConfig:
    """Check every argument (clear ValueError) and build the configuration of the ranks.

    Runs: ``allreduce`` first (the baseline of the summary), then ``baselines`` (``fp16``, ``bf16``,
    ``torch-powersgd``), then each compressor spec with ``feedback`` (``SPEC@FEEDBACK`` sets one compressor's own,
    e.g. ``qsgd@none`` beside ``topk@ef``). With ``record_every``, exactly one compressor
    is recorded and ``out`` is its dump; the tables go to ``<out>.train``. Without, ``out`` holds the tables."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"--nproc must be a positive integer, got {nproc!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"--iterations must be a positive integer, got {iterations!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"--backend must be gloo or nccl, got {backend!r}")
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < nproc:
            raise ValueError(f"--backend nccl needs {nproc} CUDA device(s); this machine has none or fewer")
    if granularity not in ("bucket", "layer"):
        raise ValueError(f"--granularity must be bucket or layer, got {granularity!r}")
    if exchange not in ("gather", "allreduce"):
        raise ValueError(f"--exchange must be gather or allreduce, got {exchange!r}")
    if not timeout_s > 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {timeout_s}")
    wl = get_workload(workload)
    if wl.batch_size % nproc:
        raise ValueError(f"workload {wl.name}: batch_size {wl.batch_size} is not divisible by --nproc {nproc}")
    pairs = [_split_feedback(spec, feedback) for spec in compressors]
    for spec, fb in pairs:
        c = create(spec)
        if fb.strip().partition(":")[0] == "dgc":
            parse_local_momentum(fb)
        else:
            parse_feedback(fb)
        if exchange == "allreduce" and c.properties.needs_side:
            raise ValueError(f"{c.name} decodes with side information: use --exchange gather")
    for b in baselines:
        if b != BASELINE and b not in BASELINES:
            raise ValueError(f"unknown baseline {b!r}; known: {BASELINE}, {', '.join(BASELINES)}")
    out = Path(out)
    dump = None
    if record_every is not None:
        if isinstance(record_every, bool) or not isinstance(record_every, int) or record_every < 1:
            raise ValueError(f"--record-every must be a positive integer, got {record_every!r}")
        if len(compressors) != 1:
            raise ValueError(f"recording writes one dump: give exactly one --compressor (got {len(compressors)})")
        check_new_dump_dir(out)
        dump, results = out, Path(f"{out}.train")
    else:
        results = out
    runs = [RunSpec(BASELINE, baseline=BASELINE)]
    runs += [RunSpec(b, baseline=b) for b in dict.fromkeys(baselines) if b != BASELINE]
    runs += [RunSpec(f"{s}+{fb}" if fb != "none" else s, s, fb, record=dump is not None) for s, fb in pairs]
    return TrainConfig(
        workload=workload,
        iterations=iterations,
        runs=runs,
        results=str(results.resolve()),
        dump=None if dump is None else str(dump.resolve()),
        record_every=record_every or 1,
        record_residual=residual,
        seed=seed,
        granularity=granularity,
        exchange=exchange,
        backend=backend,
        timeout_s=timeout_s,
        bucket_cap_mb=bucket_cap_mb,
        powersgd_rank=powersgd_rank,
    )


def _split_feedback(spec: str, default: str) -> tuple[str, str]:
    """``SPEC@FEEDBACK`` gives one compressor its own feedback; a plain ``SPEC`` takes ``default``."""
    spec, at, own = spec.partition("@")
    return spec.strip(), (own.strip() if at else default)


def torchrun_command(config_path: Path, nproc: int) -> list[str]:
    """The single-machine torchrun command line of a configuration file."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "-m",
        ENTRY,
        "--config",
        str(config_path),
    ]


def train(config: TrainConfig, nproc: int, launch: bool = True, wall_timeout_s: float | None = None) -> TrainResult:
    """Write the configuration, run torchrun (unless ``launch`` is False), summarise. Raises
    :class:`TrainingFailed` with the ranks' error lines when training fails."""
    results = Path(config.results)
    results.mkdir(parents=True, exist_ok=True)
    config_path = results / "train_config.json"
    config.save(config_path)
    dump = Path(config.dump) if config.dump else None
    if not launch:
        return TrainResult(results, dump, pd.DataFrame(), pd.DataFrame(), [config_path])
    log_path = results / "torchrun.log"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with open(log_path, "w") as log:
        proc = subprocess.run(
            torchrun_command(config_path, nproc),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=wall_timeout_s,
        )
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()
        errors = [line for line in tail if "Error" in line and "rank" in line][-4:]
        raise TrainingFailed(
            f"distributed training failed (exit status {proc.returncode}); see {log_path}\n"
            + "\n".join(errors or tail[-15:])
        )
    steps = pd.read_csv(results / "steps.csv")
    summary = summarize(steps)
    files = list(write_table(summary, results, "summary").values())
    files += figures(steps, results)
    return TrainResult(results, dump, summary, steps, [config_path, results / "steps.csv", *files])

"""``gradstat train``: launch real data-parallel training on this machine and summarise it.

:func:`train` checks every argument, writes the configuration of the ranks (``train_config.json``), starts P ranks
of ``python -m gradstat.analysis.training.distributed`` with :mod:`.local_launch` (a file rendezvous in a private
folder, collectives on the loopback interface: nothing listens on the network), waits for them, and writes the
summary table (``summary.csv``/``.md``) and the figures beside the per-step table.

Multi-node: ``gradstat train ... --nnodes N --rdzv-endpoint HOST:PORT --config-only`` (with ``--interface IFNAME``
to bind the ranks' collectives to that interface) writes the configuration and prints the one command to run on
each node (:func:`torchrun_command`: torchrun with a c10d rendezvous at HOST:PORT, the rendezvous numbering the
nodes as they join). The configuration's paths must exist on every node (copy it; the dump folder, when
recording, on a file system the nodes share); the ranks send their tables to rank 0 through the process group, and
rank 0 writes the merged tables, the summary and the figures. torch's
rendezvous store listens on every interface of the node at HOST and has no authentication: its port must be
reachable only from the training hosts.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from gradstat.analysis.dumps.writer import check_new_dump_dir, remove_leftovers
from gradstat.analysis.training.distributed import RunSpec, TrainConfig, merge_rank_logs
from gradstat.analysis.training.distributed_report import BASELINE, write_report
from gradstat.analysis.training.feedback_check import check_feedback, error_factors
from gradstat.analysis.training.local_launch import ENTRY, LaunchOutcome, launch_local
from gradstat.analysis.training.workloads import get_workload
from gradstat.compressors import create, parse_memory
from gradstat.compressors.ddp import BASELINES
from gradstat.compressors.memory.defaults import PAPER, paper_feedback


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
    feedback: str = PAPER,
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
    interface: str | None = None,
    nnodes: int = 1,
) -> TrainConfig:
    """Check every argument (clear ValueError) and build the configuration of the ranks.

    Runs: ``allreduce`` first (the baseline of the summary), then ``baselines`` (``fp16``, ``bf16``,
    ``torch-powersgd``), then each compressor spec with ``feedback`` (``SPEC@FEEDBACK`` sets one compressor's own,
    e.g. ``qsgd@none`` beside ``topk@ef``; ``paper``, the default, is each compressor's own paper's feedback,
    :func:`gradstat.compressors.memory.defaults.paper_feedback`). A feedback whose residual grows without bound at
    the compressor's error factor measured on the workload's initial gradients is refused
    (:func:`gradstat.analysis.training.feedback_check.check_feedback`). With ``record_every``, exactly one compressor
    is recorded and ``out`` is its dump; the tables go to ``<out>.train``. Without, ``out`` holds the tables.
    ``interface`` (multi-node configurations) names the network interface of the ranks' collectives; ``nnodes``
    nodes of ``nproc`` ranks each train together (``nnodes * nproc`` ranks)."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"--nproc must be a positive integer, got {nproc!r}")
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        raise ValueError(f"--nnodes must be a positive integer, got {nnodes!r}")
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
    if interface is not None and (not interface.strip() or any(c in interface for c in " /\0")):
        raise ValueError(f"--interface must name a network interface (e.g. eth0), got {interface!r}")
    if not timeout_s > 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {timeout_s}")
    wl = get_workload(workload)
    if wl.batch_size % (nproc * nnodes):
        ranks = f"--nproc {nproc}" if nnodes == 1 else f"{nproc * nnodes} ranks (--nnodes {nnodes} x --nproc {nproc})"
        raise ValueError(f"workload {wl.name}: batch_size {wl.batch_size} is not divisible by {ranks}")
    pairs = [_resolve_feedback(*_split_feedback(spec, feedback)) for spec in compressors]
    for spec, fb in pairs:
        c = create(spec)
        parse_memory(fb)
        if exchange == "allreduce" and c.properties.needs_side:
            raise ValueError(f"{c.name} decodes with side information: use --exchange gather")
    fed = [(spec, fb) for spec, fb in pairs if parse_memory(fb).feedback.compensation > 0]
    if fed:  # refuse a feedback whose residual grows without bound, before anything is launched
        check_feedback(fed, error_factors(workload, nproc * nnodes, [s for s, _ in fed], granularity == "layer", seed))
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
        interface=interface,
    )


def _split_feedback(spec: str, default: str) -> tuple[str, str]:
    """``SPEC@FEEDBACK`` gives one compressor its own feedback; a plain ``SPEC`` takes ``default``."""
    spec, at, own = spec.partition("@")
    return spec.strip(), (own.strip() if at else default)


def _resolve_feedback(spec: str, feedback: str) -> tuple[str, str]:
    """``paper`` becomes the compressor's own paper's feedback
    (:func:`gradstat.compressors.memory.defaults.paper_feedback`); any other feedback spec stays."""
    return spec, paper_feedback(create(spec))[0] if feedback.strip() == PAPER else feedback


def torchrun_command(config_path: Path, nproc: int, nnodes: int = 1, endpoint: str | None = None) -> list[str]:
    """The torchrun command line of a configuration file, the same on every one of ``nnodes`` nodes: c10d
    rendezvous at ``endpoint`` (``HOST:PORT`` on one of the nodes, left as the placeholder ``HOST:PORT`` when None;
    its port must be reachable only from the training hosts: torch's store has no authentication). The c10d
    rendezvous numbers the nodes in the order they join, so no node rank is given."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint or "HOST:PORT",
        "--nproc-per-node",
        str(nproc),
        "-m",
        ENTRY,
        "--config",
        str(config_path),
    ]


def check_endpoint(endpoint: str) -> str:
    """``HOST:PORT`` with a port in 1..65535 (clear ValueError otherwise)."""
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in endpoint):
        raise ValueError(f"--rdzv-endpoint must be HOST:PORT with a port in 1..65535, got {endpoint!r}")
    return endpoint


def train(config: TrainConfig, nproc: int, launch: bool = True, wall_timeout_s: float | None = None) -> TrainResult:
    """Write the configuration, run the ranks on this machine (unless ``launch`` is False; see
    :mod:`.local_launch`), summarise. Raises :class:`TrainingFailed` with the ranks' error lines when a rank
    fails or ``wall_timeout_s`` passes; the steps the ranks logged until then are merged and summarised first."""
    results = Path(config.results)
    results.mkdir(parents=True, exist_ok=True)
    config_path = results / "train_config.json"
    config.save(config_path)
    dump = Path(config.dump) if config.dump else None
    if not launch:
        return TrainResult(results, dump, pd.DataFrame(), pd.DataFrame(), [config_path])
    outcome = launch_local(config_path, nproc, results, wall_timeout_s)
    if not outcome.ok:
        if dump is not None:  # the ranks were stopped: their uncommitted step parts and temporaries go
            remove_leftovers(dump)
        partial = _merge_partial(results, nproc)
        raise TrainingFailed(_failure_message(outcome, wall_timeout_s, partial))
    steps = pd.read_csv(results / "steps.csv")
    return _summarise(config_path, results, dump, steps)


def _summarise(config_path: Path, results: Path, dump: Path | None, steps: pd.DataFrame) -> TrainResult:
    files = write_report(results, steps)
    summary = pd.read_csv(results / "summary.csv")
    return TrainResult(results, dump, summary, steps, [config_path, results / "steps.csv", *files])


def _merge_partial(results: Path, nproc: int) -> Path | None:
    """After a failed launch: merge and summarise the steps every rank logged (whole runs), if any; the path of the
    partial summary or None."""
    if not all((results / f"steps.rank-{r}.csv").is_file() for r in range(nproc)):
        return None
    merge_rank_logs(results, nproc)
    if all((results / f"blocks.rank-{r}.csv").is_file() for r in range(nproc)):
        merge_rank_logs(results, nproc, "blocks")
    steps = pd.read_csv(results / "steps.csv")
    if steps.empty:
        return None
    _summarise(results / "train_config.json", results, None, steps)
    return results / "summary.csv"


def _failure_message(outcome: LaunchOutcome, wall_timeout_s: float | None, partial: Path | None) -> str:
    if outcome.timed_out:
        head = f"distributed training did not finish within {wall_timeout_s} s; every rank was stopped"
    else:
        r = outcome.first_failed
        head = f"distributed training failed: rank {r} exited with status {outcome.codes[r or 0]}"
    lines = [head + f"; see {', '.join(str(p) for p in outcome.logs)}"]
    for r, log in enumerate(outcome.logs):
        text = log.read_text(errors="replace").splitlines() if log.is_file() else []
        errors = [line for line in text if "Error" in line]
        if errors or (r == outcome.first_failed and text):
            lines.append(f"rank {r}: {(errors or text)[-1]}")
    if partial is not None:
        lines.append(f"the runs finished before the failure are summarised in {partial}")
    return "\n".join(lines)

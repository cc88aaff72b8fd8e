"""Real data-parallel training under ``torch.distributed`` with DDP and a compression hook, one process per rank.

This module is what every rank runs (``python -m gradstat.analysis.training.distributed --config FILE``, started by
gradstat's single-machine launcher, :mod:`.local_launch`, with ``--store-file``, or by ``torchrun`` on several
nodes, where rank 0 also writes the summary table and figures at the end); it ends when its parent does
(:mod:`.parent_death`). It joins the process group (gloo on CPU, NCCL on GPU, with a timeout so that nothing waits
forever), and trains the runs of the configuration one after another in the same process group, each from the same
initial model and data order: the baselines (plain all-reduce, torch's fp16/bf16 and PowerSGD hooks) and our
compressors (:func:`gradstat.compressors.ddp.make_hook`). Rank r trains on its slice of every global mini-batch
(``batch_size / world`` samples). Per step and rank it logs the local loss, the exact payload bits, the serialised
bytes, the bytes handed to the collectives, the time in the hook and the step time into
``<results>/steps.rank-<r>.csv``, and per step, rank and block (each parameter in layer-wise mode, each bucket
otherwise) its payload's exact bits and serialised bytes into ``blocks.rank-<r>.csv``; a run whose step fails on
every rank alike (a compressor refusing a NaN gradient after divergence, a diverged all-reduce baseline) stops with
its error in the ``error`` column, and the next run starts; at the end the ranks send them to rank 0 through the
process group, which writes ``steps.csv`` and ``blocks.csv`` (no shared folder needed for them). With recording on
(:class:`~gradstat.analysis.training.recorder.RankRecorder`), the recorded run writes a dump holding each rank's
local gradient as ``worker = rank``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gradstat.analysis.measure.tables import atomic_write_text
from gradstat.analysis.training.parent_death import exit_with_parent
from gradstat.analysis.training.recorder import RankRecorder
from gradstat.analysis.training.workloads import Workload, get_workload
from gradstat.compressors.context import derive_seed
from gradstat.compressors.ddp import BASELINES, CompressionHookState, RemoteError, baseline_hook, make_hook

SINGLE_BUCKET_MB = 4096.0
"""DDP bucket cap that puts every built-in workload in one bucket (torch's PowerSGD baseline on gloo)."""

STEP_COLUMNS = (
    "run",
    "step",
    "rank",
    "loss",
    "bits",
    "wire_bytes",
    "sent_bytes",
    "hook_seconds",
    "step_seconds",
    "buckets",
    "error",
)
BLOCK_COLUMNS = ("run", "step", "rank", "block", "param", "bits", "wire_bytes")
AGREEMENT_S = 30.0
"""Seconds a rank whose step failed waits for the others to report the same failure before it raises."""


@dataclass
class RunSpec:
    """One training run: ``label`` names it; ``baseline`` (``allreduce`` or one of ``BASELINES``) or
    ``compressor`` (a spec) with ``feedback``; ``record``: write the dump of this run."""

    label: str
    compressor: str | None = None
    feedback: str = "none"
    baseline: str | None = None
    record: bool = False


@dataclass
class TrainConfig:
    """Everything every rank needs (written to a JSON file by the launcher).

    workload : workload spec; iterations : training steps per run; runs : the runs, in order;
    results : directory of the per-step tables; dump : dump directory of the recorded run (or None);
    record_every : K; record_residual : record the residual extra; seed : base seed (model, data, compressors);
    granularity : ``bucket`` | ``layer``; exchange : ``gather`` | ``allreduce``; backend : ``gloo`` | ``nccl``;
    timeout_s : process-group timeout; bucket_cap_mb : DDP bucket size (None: DDP's default);
    powersgd_rank : rank of torch's PowerSGD baseline; interface : network interface the ranks' collectives bind to
    (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``; None: torch's choice, or what the environment names).
    """

    workload: str
    iterations: int
    runs: list[RunSpec] = field(default_factory=list)
    results: str = "train"
    dump: str | None = None
    record_every: int = 1
    record_residual: bool = False
    seed: int = 0
    granularity: str = "bucket"
    exchange: str = "gather"
    backend: str = "gloo"
    timeout_s: float = 300.0
    bucket_cap_mb: float | None = None
    powersgd_rank: int = 1
    interface: str | None = None

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> "TrainConfig":
        raw = json.loads(Path(path).read_text())
        raw["runs"] = [RunSpec(**r) for r in raw["runs"]]
        return cls(**raw)


def main(argv: list[str] | None = None) -> None:
    """Entry point of each rank (started by gradstat's single-machine launcher or by torchrun). The rank ends when
    its parent does (:func:`~gradstat.analysis.training.parent_death.exit_with_parent`)."""
    parser = argparse.ArgumentParser(description="one rank of gradstat train (started by gradstat or torchrun)")
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument(
        "--store-file", type=Path, default=None, help="meet through this file store (default: torchrun's environment)"
    )
    args = parser.parse_args(argv)
    exit_with_parent()
    config = TrainConfig.load(args.config)
    if config.interface:
        os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = config.interface
    timeout = datetime.timedelta(seconds=config.timeout_s)
    if args.store_file is None:
        dist.init_process_group(config.backend, timeout=timeout)
    else:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        init = args.store_file.resolve().as_uri()
        dist.init_process_group(config.backend, init_method=init, rank=rank, world_size=world, timeout=timeout)
    failed = False
    try:
        train_rank(config)
        if args.store_file is None and dist.get_rank() == 0:  # under torchrun nobody else summarises
            failed = report(Path(config.results))
    finally:
        dist.destroy_process_group()
    if failed:  # rank 0 ends non-zero, so torchrun (and the node that ran rank 0) reports the failed launch
        raise SystemExit(1)


def report(results: Path) -> bool:
    """Rank 0 under torchrun: the summary table and figures of ``results`` (as the single-machine launcher writes
    them), a first line naming every run that diverged or stopped, and where everything is. Returns whether a run
    diverged or stopped."""
    import pandas as pd

    from gradstat.analysis.training.distributed_report import failure_line, write_report

    files = write_report(results)
    failed = failure_line(pd.read_csv(results / "summary.csv"))
    lines = [failed] if failed else []
    lines += [f"summary and figures: {', '.join(str(f) for f in files)}"]
    print("\n".join(lines), flush=True)
    return failed is not None


def train_rank(config: TrainConfig) -> None:
    """Train every run of ``config`` on this rank (inside an initialised process group)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if config.backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    results = Path(config.results)
    results.mkdir(parents=True, exist_ok=True)
    log_path, blocks_path = results / f"steps.rank-{rank}.csv", results / f"blocks.rank-{rank}.csv"
    with open(log_path, "w", newline="") as fh, open(blocks_path, "w", newline="") as bh:
        log, block_log = csv.DictWriter(fh, fieldnames=STEP_COLUMNS), csv.DictWriter(bh, fieldnames=BLOCK_COLUMNS)
        log.writeheader()
        block_log.writeheader()
        agreement = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=AGREEMENT_S))
        for run in config.runs:
            blocks: list[dict[str, Any]] = []
            for row in train_run(config, run, rank, world, device, blocks, agreement):
                log.writerow(row)
            block_log.writerows(blocks)
            fh.flush()
            bh.flush()
    gather_rank_logs(
        results, rank, world, dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=config.timeout_s))
    )
    dist.barrier()  # leave together: a rank tearing gloo down while another still works can abort (SIGABRT)


def train_run(
    config: TrainConfig,
    run: RunSpec,
    rank: int,
    world: int,
    device: torch.device,
    blocks: list[dict[str, Any]] | None = None,
    agreement: Any = None,
) -> list[dict[str, Any]]:
    """One run from the common initial model; returns this rank's per-step rows and appends its per-block rows
    (gradstat's compression hooks only) to ``blocks``.

    A step that raises on every rank alike (a compressor refusing its input, a diverged run whose all-reduced
    gradient is not finite) ends this run with its error in the last row, and the next run starts; ranks agree on
    that through ``agreement`` (a gloo group of their own). A failure on some ranks only is raised (the launcher
    stops the others)."""
    wl = get_workload(config.workload)
    if wl.batch_size % world:
        raise ValueError(f"workload {wl.name}: batch_size {wl.batch_size} is not divisible by {world} ranks")
    local = wl.batch_size // world
    model = wl.model(derive_seed(config.seed, 0), device)
    ddp_kwargs: dict[str, Any] = {"device_ids": [device.index]} if device.type == "cuda" else {}
    cap = config.bucket_cap_mb
    if run.baseline == "torch-powersgd" and config.backend == "gloo":
        # torch's powerSGD_hook waits inside its then() callbacks: with two buckets on gloo the buckets'
        # collectives interleave and gloo aborts ("Received data size doesn't match expected size"); one bucket
        cap = max(cap or 0.0, SINGLE_BUCKET_MB)
    if cap is not None:
        ddp_kwargs["bucket_cap_mb"] = cap
    ddp = DDP(model, **ddp_kwargs)
    optimizer = wl.optimizer(ddp.module)
    state, hook = _hook_for(config, run, ddp)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    if run.record:
        _recorder(config, run, ddp, state, optimizer, rank, world, wl)
    batches = wl.batches(derive_seed(config.seed, 1), device)
    names = [n for n, p in ddp.module.named_parameters() if p.requires_grad]  # block keys in layer-wise mode
    rows = []
    for step in range(config.iterations):
        x, y = next(batches)
        x, y = x[rank * local : (rank + 1) * local], y[rank * local : (rank + 1) * local]
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = wl.loss(ddp(x), y)
        try:
            loss.backward()
        except Exception as exc:
            if not _failed_on_every_rank(agreement, world):
                raise
            rows.append(
                {"run": run.label, "step": step, "rank": rank, "loss": float(loss.detach()), "error": _why(exc)}
            )
            break
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        m = state.take_metrics() if state is not None else None
        if m is not None and blocks is not None and run.compressor is not None:
            blocks += [
                {
                    "run": run.label,
                    "step": step,
                    "rank": rank,
                    "block": key,
                    "param": names[key] if config.granularity == "layer" else "",
                    "bits": bits,
                    "wire_bytes": wire,
                }
                for key, (bits, wire) in sorted(m.blocks.items())
            ]
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        rows.append(
            {
                "run": run.label,
                "step": step,
                "rank": rank,
                "loss": float(loss.detach()),
                "bits": m.bits if m else 8 * nbytes,
                "wire_bytes": m.wire_bytes if m else nbytes,
                "sent_bytes": m.sent_bytes if m else nbytes,
                "hook_seconds": m.hook_seconds if m else float("nan"),
                "step_seconds": elapsed,
                "buckets": m.buckets if m else 0,
                "error": "",
            }
        )
    return rows


def _failed_on_every_rank(agreement: Any, world: int) -> bool:
    """True when every rank reports a failure of the same step; False when the others do not report within
    :data:`AGREEMENT_S` (they are still waiting in a collective) or without a group."""
    if agreement is None:
        return world == 1
    count = torch.ones(1)
    try:
        dist.all_reduce(count, group=agreement)
    except RuntimeError:
        return False
    return int(count.item()) == world


def _why(exc: BaseException) -> str:
    """The error's own message: a failure inside a DDP hook's callback reaches ``backward`` wrapped by torch
    ("Got the following error when running the callback: ValueError: ..."); a RemoteError is kept whole."""
    text = str(exc)
    if isinstance(exc, RemoteError):
        return text
    inner = text.partition("running the callback: ")[2].strip()
    return inner.splitlines()[0] if inner else f"{type(exc).__name__}: {text}"


def _hook_for(config: TrainConfig, run: RunSpec, ddp: DDP) -> tuple[Any, Any]:
    if run.baseline == "allreduce":
        return make_hook(None, model=ddp.module, seed=config.seed)
    if run.baseline is not None:
        if run.baseline not in BASELINES:
            raise ValueError(f"unknown baseline {run.baseline!r}; known: allreduce, {', '.join(BASELINES)}")
        return baseline_hook(run.baseline, rank=config.powersgd_rank)
    if run.compressor is None:
        raise ValueError(f"run {run.label!r} names neither a compressor nor a baseline")
    return make_hook(
        run.compressor,
        run.feedback,
        model=ddp.module,
        seed=config.seed,
        granularity=config.granularity,  # type: ignore[arg-type]
        exchange=config.exchange,  # type: ignore[arg-type]
    )


def _recorder(
    config: TrainConfig,
    run: RunSpec,
    ddp: DDP,
    state: Any,
    optimizer: torch.optim.Optimizer,
    rank: int,
    world: int,
    wl: Workload,
) -> RankRecorder:
    if config.dump is None:
        raise ValueError("recording needs a dump directory")
    if not isinstance(state, CompressionHookState):
        raise ValueError(f"run {run.label!r}: recording needs one of gradstat's hooks, not a torch baseline")
    seeds = {"seed": config.seed, "model": derive_seed(config.seed, 0), "data": derive_seed(config.seed, 1)}
    compression = {
        "compressor": run.compressor or run.baseline,
        "feedback": run.feedback,
        "granularity": "whole bucket" if config.granularity == "bucket" else "per parameter",
        "engine": f"torch.distributed DDP, {config.backend}, {world} ranks",
    }
    rec = RankRecorder.create(
        config.dump,
        ddp.module,
        rank,
        world,
        every=config.record_every,
        residual=config.record_residual,
        workload=wl.name,
        optimizer=wl.optimizer_config(),
        seeds=seeds,
        metadata={  # (RankRecorder.create adds the device type the model computes on)
            "workload_config": wl.config(),
            "workload_spec": wl.spec(),
            **wl.metadata(),
        },
        compression=compression,
    )
    rec.attach(state, optimizer)
    return rec


def gather_rank_logs(results: Path, rank: int, world: int, group: Any = None) -> None:
    """Every rank sends its ``steps``/``blocks`` tables to rank 0 through the process group ``group`` (gloo; so
    that nodes need no shared folder for them), rank 0 writes the merged ``steps.csv`` and ``blocks.csv``, and every
    rank removes its own rank files. The tables travel as UTF-8 bytes, never pickled."""
    for stem in ("steps", "blocks"):
        own = results / f"{stem}.rank-{rank}.csv"
        texts = _all_gather_text(own.read_text(), world, group)
        if rank == 0:
            _write_merged(results, stem, texts)
        own.unlink()


def _all_gather_text(text: str, world: int, group: Any) -> list[str]:
    """Every rank's ``text``, in rank order (all-gather of the lengths, then of the bytes padded to the longest)."""
    raw = bytearray(text.encode("utf-8"))
    data = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.zeros(0, dtype=torch.uint8)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([data.numel()]), group=group)
    longest = max(int(n.item()) for n in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: data.numel()] = data
    out = [torch.empty(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(out, padded, group=group)
    return [o[: int(n.item())].numpy().tobytes().decode("utf-8") for o, n in zip(out, sizes, strict=True)]


def merge_rank_logs(results: Path, world: int, stem: str = "steps") -> Path:
    """Concatenate ``<stem>.rank-<r>.csv`` into ``<stem>.csv`` (atomically: a failed write, a full disk included,
    leaves no temporary file and names the file) and remove the rank files (after a failed launch, on the machine
    where every rank ran)."""
    files = [results / f"{stem}.rank-{r}.csv" for r in range(world)]
    out = _write_merged(results, stem, [f.read_text() for f in files])
    for f in files:
        f.unlink()
    return out


def _write_merged(results: Path, stem: str, texts: list[str]) -> Path:
    """``<stem>.csv`` from the ranks' CSV texts in rank order: one header, every rank's rows."""
    rows: list[str] = []
    header = None
    for text in texts:
        lines = text.splitlines()
        if not lines:  # a rank stopped before its first row was flushed (a failed launch)
            continue
        header = lines[0]
        rows += lines[1:]
    columns = STEP_COLUMNS if stem == "steps" else BLOCK_COLUMNS
    return atomic_write_text(results / f"{stem}.csv", "\n".join([header or ",".join(columns), *rows]) + "\n")


if __name__ == "__main__":
    main()

"""``gradstat train``: real data-parallel training with DDP and a compression hook (see
:mod:`gradstat.analysis.training.distributed_launch`)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("train")
@click.option("--workload", required=True, help="Built-in workload (spec), e.g. lenet or fc300:lr=0.1.")
@click.option("--nproc", type=int, default=2, show_default=True, help="Processes (ranks) on this machine.")
@click.option(
    "--compressor",
    "compressors",
    multiple=True,
    help="Compressor spec (SPEC@FEEDBACK for its own feedback); repeat to train several in one launch.",
)
@click.option(
    "--feedback",
    default="paper",
    show_default=True,
    help="paper (each compressor's own paper's: ef for sparsifiers, qcs:beta=1/(gamma+1) for QCS, none for QSGD, "
    "TernGrad, DQSG/NDQSG), none, ef, qcs:beta=0.3, ecq:alpha=0.2,beta=0.99, or dgc:momentum=0.9 (DGC local "
    "momentum correction). A feedback whose residual grows without bound at the compressor's measured error "
    "factor is refused before training.",
)
@click.option("--iterations", type=int, default=50, show_default=True, help="Training steps per run.")
@click.option("--record-every", type=int, default=None, help="Record every K-th step's per-rank gradients.")
@click.option("--residual", is_flag=True, help="Also record the feedback residual (with --record-every).")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    required=True,
    help="Results directory; with --record-every the dump (results then go to OUT.train). gradstat's own "
    "earlier result there is replaced; a folder holding other files is refused.",
)
@click.option(
    "--backend",
    type=click.Choice(["gloo", "nccl"]),
    default="gloo",
    show_default=True,
    help="Collective backend: gloo (CPU) or nccl (GPU).",
)
@click.option(
    "--baselines",
    default="",
    help="Extra baselines in the same launch, comma-separated: fp16, bf16, torch-powersgd (all-reduce always runs)",
)
@click.option("--powersgd-rank", type=int, default=1, show_default=True, help="Rank of torch's PowerSGD baseline.")
@click.option(
    "--granularity",
    type=click.Choice(["bucket", "layer"]),
    default="bucket",
    show_default=True,
    help="Compress each DDP bucket whole, or each parameter's slice of it.",
)
@click.option(
    "--exchange",
    type=click.Choice(["gather", "allreduce"]),
    default="gather",
    show_default=True,
    help="All-gather the serialised payloads, or all-reduce the decoded tensors.",
)
@click.option("--bucket-cap-mb", type=float, default=None, help="DDP bucket size (default: DDP's).")
@click.option("--seed", type=int, default=0, show_default=True, help="Base seed of every random draw.")
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True, help="Process-group timeout (s).")
@click.option(
    "--config-only",
    is_flag=True,
    help="Write the ranks' configuration and print the torchrun command to run on each node (rank 0 then writes "
    "the summary and figures).",
)
@click.option(
    "--nnodes",
    type=int,
    default=1,
    show_default=True,
    help="Nodes of --nproc ranks each (more than 1: with --config-only, then run the printed command on each node).",
)
@click.option(
    "--rdzv-endpoint",
    default=None,
    help="Multi-node (--config-only): HOST:PORT of the c10d rendezvous on one of the nodes; the port must be "
    "reachable only from the training hosts (torch's store has no authentication).",
)
@click.option(
    "--interface",
    default=None,
    help="Multi-node (--config-only): the network interface the ranks' collectives bind to, e.g. eth1.",
)
def train_cmd(
    workload: str,
    nproc: int,
    compressors: tuple[str, ...],
    feedback: str,
    iterations: int,
    record_every: int | None,
    residual: bool,
    out: Path,
    backend: str,
    baselines: str,
    powersgd_rank: int,
    granularity: str,
    exchange: str,
    bucket_cap_mb: float | None,
    seed: int,
    timeout_s: float,
    config_only: bool,
    interface: str | None,
    nnodes: int,
    rdzv_endpoint: str | None,
) -> int:
    """Train WORKLOAD for real on NPROC ranks (DDP over gloo/NCCL) with each compressor as a DDP
    communication hook, beside plain all-reduce; per step: loss, exact bits, bytes sent, hook and step time.

    On one machine nothing listens beyond the loopback interface. Multi-node: --nnodes N --rdzv-endpoint
    HOST:PORT --config-only writes the ranks' configuration and prints the torchrun command to start on every node;
    rank 0 writes the summary and figures (the rendezvous port must be reachable only from the training hosts).

    Without --feedback each compressor trains with its own paper's feedback; a feedback whose residual grows
    without bound at the compressor's error factor, measured on the workload's initial gradients, is refused.

    Exit status 1 when a run diverged or stopped (its status in the table says where and why; the first line of
    the output names every such run), 2 for bad input (a feedback known to diverge included)."""
    from gradstat.analysis.cli.outputs import output_folder
    from gradstat.analysis.training.distributed_launch import build_config, check_endpoint, torchrun_command, train
    from gradstat.analysis.training.distributed_report import failure_line

    if nnodes != 1 and not config_only:
        raise ValueError(
            f"--nnodes {nnodes}: multi-node runs start with --config-only, then the printed command on each node"
        )
    if rdzv_endpoint is not None:
        if not config_only:
            raise ValueError(
                f"--rdzv-endpoint {rdzv_endpoint}: a rendezvous endpoint is for multi-node runs, which start with "
                "--config-only, then the printed command on each node"
            )
        check_endpoint(rdzv_endpoint)
    config = build_config(
        workload,
        nproc,
        list(compressors),
        feedback=feedback,
        iterations=iterations,
        record_every=record_every,
        out=out,
        backend=backend,
        baselines=[b.strip() for b in baselines.split(",") if b.strip()],
        granularity=granularity,
        exchange=exchange,
        seed=seed,
        timeout_s=timeout_s,
        bucket_cap_mb=bucket_cap_mb,
        residual=residual,
        powersgd_rank=powersgd_rank,
        interface=interface,
        nnodes=nnodes,
    )
    said: list[str] = []  # printed after the first line, which says whether every run trained
    try:
        with output_folder(config.results, "train", said.append):
            result = train(config, nproc, launch=not config_only)
    except BaseException:
        for line in said:
            click.echo(line)
        raise
    failed = None if config_only else failure_line(result.summary)
    if failed:
        click.echo(failed)
    if config_only:
        command = " ".join(torchrun_command(result.files[0], nproc, nnodes, rdzv_endpoint))
        click.echo(f"run on each of the {nnodes} node(s) (rank 0 writes the summary and figures):\n{command}")
    else:
        import pandas as pd

        with pd.option_context(
            "display.max_columns", 50, "display.width", 250, "display.float_format", "{:.4g}".format
        ):
            click.echo(result.summary.to_string(index=False))
        if result.dump:
            click.echo(f"dump {result.dump}")
    for line in said:
        click.echo(line)
    return 1 if failed else 0


COMMANDS = (train_cmd,)
"""The commands (and groups) this module adds to ``gradstat``, in listing order."""

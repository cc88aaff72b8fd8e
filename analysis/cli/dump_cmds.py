"""Dump commands: ``record``, ``info``, ``workloads``, ``import``, ``export``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from gradstat.analysis.cli.options import (
    check_iterations,
    dump_argument,
    iterations_option,
    no_steps_count,
    steps_option,
    workers_option,
)

if TYPE_CHECKING:
    from gradstat.analysis.dumps import Dump


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError


def summary(dump: Dump, norms: bool = True) -> dict:
    """What ``gradstat info`` shows, as a JSON-ready dict."""
    import torch

    m = dump.manifest
    out = {
        "path": str(dump.path),
        "workload": dump.workload,
        "format_version": m["format_version"],
        "dtype": m["dtype"],
        "steps": dump.steps,
        "every": m["every"],
        "workers": dump.workers,
        "tensors": len(dump.params),
        "parameters": dump.numel,
        "params": [{"name": n, "shape": list(s)} for n, s in dump.shapes.items()],
        "extras": dump.extras,
        "optimizer": m["optimizer"],
        "seeds": m["seeds"],
        "compression": m.get("compression"),
        "bytes_on_disk": dump.size_on_disk(),
        "versions": m["versions"],
        "uncommitted_files": dump.uncommitted,
    }
    if norms:
        rows = []
        for s in dump.steps:
            per_worker = [dump.flat(s, w, dtype=torch.float32) for w in range(dump.workers)]
            rows.append(
                {
                    "step": s,
                    "worker_norms": [float(g.norm()) for g in per_worker],
                    "mean_norm": float(torch.stack(per_worker).mean(0).norm()),
                }
            )
        out["gradient_norms"] = rows
    return out


def _print_summary(info: dict) -> None:
    from gradstat.analysis.measure.tables import plain

    steps = info["steps"]
    shown = ", ".join(map(str, steps if len(steps) <= 10 else steps[:5] + ["..."] + steps[-3:]))
    click.echo(f"dump       {info['path']}")
    click.echo(f"workload   {info['workload']}  (format v{info['format_version']}, stored as {info['dtype']})")
    click.echo(f"steps      {len(steps)} recorded, every {info['every']}: {shown}")
    click.echo(f"workers    {info['workers']}")
    click.echo(f"tensors    {info['tensors']} per worker per step")
    click.echo(f"parameters {info['parameters']:,} per worker per step")
    click.echo(f"layout     {len(steps)} steps x {info['workers']} workers x {info['tensors']} tensors")
    if info["extras"]:
        click.echo(f"extras     {', '.join(info['extras'])}")
    if info["compression"]:
        click.echo(f"in loop    {plain(info['compression'])}")
    if info["optimizer"]:
        click.echo(f"optimizer  {plain(info['optimizer'])}")
    per_step = (info["bytes_on_disk"] / len(steps)) if steps else 0
    click.echo(f"on disk    {human_bytes(info['bytes_on_disk'])} ({human_bytes(int(per_step))} per step)")
    if info["uncommitted_files"]:
        click.echo(f"note       ignoring interrupted write(s): {', '.join(info['uncommitted_files'])}")
    width = max(len(p["name"]) for p in info["params"])
    click.echo("parameter shapes:")
    for p in info["params"]:
        n = 1
        for s in p["shape"]:
            n *= s
        click.echo(f"  {p['name']:<{width}}  {str(tuple(p['shape'])):<18} {n:>12,}")
    if "gradient_norms" in info:
        click.echo("gradient l2 norms (per worker | of the worker average):")
        for row in info["gradient_norms"]:
            ws = " ".join(f"{v:.4g}" for v in row["worker_norms"])
            click.echo(f"  step {row['step']:>6}: {ws} | {row['mean_norm']:.4g}")


STORAGE_DTYPE_HELP = "Storage dtype of the tensors: float32, float16 or bfloat16."
"""The names of :data:`gradstat.analysis.dumps.format.STORAGE_DTYPES` (written out: reading them imports torch,
which ``--help`` does not; a test holds the two equal)."""


def _storage_dtype(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``--dtype`` checked against the dump format's storage dtypes (a usage error naming the accepted ones)."""
    from gradstat.analysis.dumps.format import storage_dtype

    try:
        storage_dtype(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
    return value


dtype_option = click.option(
    "--dtype", default="float32", show_default=True, callback=_storage_dtype, help=STORAGE_DTYPE_HELP
)


@click.command("record")
@click.option("--workload", required=True, help="Workload name or spec (see `gradstat workloads`).")
@iterations_option()
@no_steps_count
@click.option("--every", default=1, show_default=True, type=int, help="Record every K-th iteration.")
@click.option("--workers", default=1, show_default=True, type=int, help="Simulated workers P.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="New dump directory.")
@dtype_option
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the model, data and compressor.")
@click.option("--compressor", default=None, help="Compressor in the loop (spec, e.g. topk:ratio=0.01).")
@click.option("--feedback", default=None, help="Error feedback with the compressor (none, ef, qcs:beta=0.3, ...).")
@click.option("--device", default="cpu", show_default=True, help="Training device (cpu, cuda, ..., or auto).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def record_cmd(
    workload: str,
    iterations: int,
    every: int,
    workers: int,
    out: Path,
    dtype: str,
    seed: int,
    compressor: str | None,
    feedback: str | None,
    device: str,
    quiet: bool,
) -> None:
    """Train a built-in workload and record its gradients into a new dump.

    Trains for --iterations iterations with --workers simulated data-parallel workers and records every
    --every-th iteration's per-worker gradients; --compressor and --feedback put compression in the loop (the
    residual is then recorded too). --out must be a new folder: a dump is never replaced.
    """
    from gradstat.analysis.dumps import open_dump
    from gradstat.analysis.measure.selection import resolve_device
    from gradstat.analysis.training.recorder import record

    if device.strip().lower() == "auto":  # (CUDA where present, as every command's --device auto)
        device = str(resolve_device(device))
    path = record(
        workload,
        check_iterations(iterations),
        every=every,
        workers=workers,
        out=out,
        seed=seed,
        dtype=dtype,
        compressor=compressor,
        feedback=feedback,
        progress=not quiet,
        device=device,
    )
    d = open_dump(path)
    click.echo(
        f"recorded {len(d.steps)} steps x {d.workers} workers x {len(d.params)} tensors "
        f"({d.numel:,} parameters) into {path}"
    )


@click.command("info")
@dump_argument()
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--no-norms", is_flag=True, help="Skip the per-step gradient norms (reads no tensor data).")
def info_cmd(dump: str, as_json: bool, no_norms: bool) -> None:
    """Summarise a dump: steps, workers, parameters, sizes and norms."""
    from gradstat.analysis.dumps import open_dump

    info = summary(open_dump(dump), norms=not no_norms)
    if as_json:
        click.echo(json.dumps(info, indent=1))
    else:
        _print_summary(info)


@click.command("workloads")
def workloads_cmd() -> None:
    """List the built-in workloads with their parameter counts."""
    from gradstat.analysis.training.workloads import get_workload, workload_names

    for name in workload_names():
        w = get_workload(name)
        click.echo(f"{name:<9} {w.num_params:>10,} parameters  {w.description}")


@click.command("import")
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="New dump directory.")
@click.option("--workload", default="imported", show_default=True, help="Name stored in the manifest.")
@dtype_option
def import_cmd(src: Path, out: Path, workload: str, dtype: str) -> None:
    """Import saved gradients as a new dump.

    SRC is a .pt file (a dict of tensors; a list of dicts, one per step; several workers per step as a list of
    lists of dicts, a rank -> dict mapping, or {step: [worker dicts]}), a .npz file (keys w{worker}/{param} for
    several workers) or .npy file, or a folder of them; --out must be a new folder. The layouts are specified
    in data/README.md.
    """
    from gradstat.analysis.dumps import open_dump
    from gradstat.analysis.dumps.convert import import_dump

    d = open_dump(import_dump(src, out, workload=workload, dtype=dtype))
    click.echo(
        f"imported {len(d.steps)} steps x {d.workers} workers x {len(d.params)} tensors "
        f"({d.numel:,} parameters) into {out}"
    )


@click.command("export")
@dump_argument()
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Target .npz file (must not exist).")
@steps_option
@workers_option
@click.option("--extras", is_flag=True, help="Also export the extra tensors.")
def export_cmd(dump: str, out: Path, steps: str | None, workers: str | None, extras: bool) -> None:
    """Export selected steps of a dump to a .npz file.

    Keys are s{step}/w{worker}/{param}, values float32; --out must not exist.
    """
    from gradstat.analysis.dumps import open_dump
    from gradstat.analysis.dumps.convert import export_npz
    from gradstat.analysis.measure.selection import parse_indices

    d = open_dump(dump)
    chosen = parse_indices(steps, d.steps, "steps")
    export_npz(d, out, chosen, parse_indices(workers, range(d.workers), "workers"), extras)
    click.echo(f"exported {len(chosen)} steps to {out}")


COMMANDS = (record_cmd, info_cmd, workloads_cmd, import_cmd, export_cmd)
"""The commands (and groups) this module adds to ``gradstat``, in listing order."""

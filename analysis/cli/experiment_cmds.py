"""``gradstat experiment``: the papers' experiments, reproduced with the published numbers beside ours.

``gradstat experiment list`` lists them with their runtime on this project's CPU machine; ``gradstat experiment NAME
[--quick] [--workload W ...] --out DIR`` runs one and writes its CSV, PNG and ``README.md`` (paper vs ours, verdict).
"""

from __future__ import annotations

from pathlib import Path

import click


@click.command("experiment")
@click.argument("name")
@click.option("--quick", is_flag=True, help="The small size (seconds) used by the tests.")
@click.option("--workload", "workloads", multiple=True, help="Workload(s) to run on (where the experiment has any).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Output folder (required to run).")
@click.option("--seed", type=int, default=0, show_default=True, help="Base seed.")
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    help="Torch device (where the experiment has a choice): cpu, cuda or auto.",
)
def experiment(name: str, quick: bool, workloads: tuple[str, ...], out: Path | None, seed: int, device: str) -> None:
    """Run experiment NAME, or list the experiments with NAME = list."""
    from gradstat.analysis.experiments.base import overall_verdict, run_experiment
    from gradstat.analysis.experiments.registry import experiments, get_experiment
    from gradstat.analysis.measure.selection import resolve_device

    if name == "list":
        for exp in experiments().values():
            wl = f"  workloads: {', '.join(exp.workloads)}" if exp.workloads else ""
            wl += f"  devices: {', '.join(exp.devices)}" if exp.devices != ("cpu",) else ""
            click.echo(f"{exp.name:<16} quick ~{exp.quick_s:.0f} s, full ~{exp.full_s / 60:.1f} min  {exp.title}{wl}")
        return
    exp = get_experiment(name)
    if out is None:
        raise ValueError(f"experiment {name}: --out DIR is required (where the tables and figures go)")
    if device.strip().lower() == "auto":  # (CUDA where present, as every command's --device auto)
        device = resolve_device(device).type
    result, readme = run_experiment(exp, out, quick=quick, workloads=list(workloads) or None, seed=seed, device=device)
    click.echo(f"{exp.title}: {overall_verdict(result.comparisons)}")
    click.echo(f"wrote {readme}")


COMMANDS = (experiment,)
"""The commands (and groups) this module adds to ``gradstat``, in listing order."""

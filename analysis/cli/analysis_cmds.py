"""Analysis commands: ``fit``, ``threshold``, ``compress``, ``variance``, ``feedback``, ``plot variance-vs-gain``,
``validate``, ``report``, ``demo``. Each writes its tables (CSV + Markdown) and figures (PNG + CSV) into ``--out``
and prints a summary; the work itself lives in :mod:`gradstat.analysis.studies`.

Exit status: 0 ok; 1 a check (``validate``, ``variance``) that must hold is violated; 2 bad input.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import click

from gradstat.analysis.cli.options import (
    Distribution,
    HelpGroup,
    check_iterations,
    device_option,
    dump_argument,
    iterations_option,
    no_steps_count,
    out_option,
    quiet_option,
    seed_option,
    selection_options,
    steps_option,
)
from gradstat.analysis.cli.outputs import output_folder
from gradstat.theory.distributions.names import accepted

if TYPE_CHECKING:
    import pandas as pd

    from gradstat.analysis.dumps.reader import Dump
    from gradstat.analysis.measure.sources import GradientSource

DEFAULT_VARIANCE_SPECS = (
    "qcs:block=256,k=64,Q=4",
    "qcs:block=256,k=64,Q=4,alpha=mmse",
    "dqsg:M=4",
    "qsgd:s=4,bucket=512",
    "topk:ratio=0.01",
    "wangni:ratio=0.01",
)


def _open(path: str) -> Dump:
    from gradstat.analysis.dumps import open_dump

    return open_dump(path)


def report_choice_options(fn):
    """--compressor (repeatable) and --feedback of ``report``/``demo``: the replayed and variance comparisons."""
    fn = click.option("--feedback", default=None, help="Feedback of the chosen compressors: none | ef | qcs:beta=B.")(
        fn
    )
    return click.option(
        "--compressor", "specs", multiple=True, help="Compressor spec to compare (repeatable; default: the paper set)."
    )(fn)


def _echo_table(df: pd.DataFrame, title: str, columns: list[str] | None = None) -> None:
    from gradstat.analysis.measure.tables import to_text

    click.echo(f"\n{title}")
    click.echo(to_text(df[columns] if columns else df))


def _results(out: str, command: str) -> contextlib.AbstractContextManager[Path]:
    """The ``--out`` folder of ``command`` (see :mod:`gradstat.analysis.cli.outputs`)."""
    return output_folder(out, command, click.echo)


@click.command("fit")
@dump_argument()
@selection_options("fit")
@click.option("--layers", default=None, help="Parameter names or patterns (conv*.weight); default all.")
@click.option(
    "--method",
    type=click.Choice(["closed_form", "mle", "both"]),
    default="both",
    show_default=True,
    help="The papers' closed-form estimators, exact maximum likelihood, or both.",
)
@click.option(
    "--scope",
    type=click.Choice(["model", "layer", "both"]),
    default="both",
    show_default=True,
    help="Fit the whole model's gradient, each layer's, or both.",
)
@click.option("--normalize", is_flag=True, help="L2-normalise each vector first (SIDCo Fig. 2).")
@click.option("--compensated", is_flag=True, help="Fit the error-compensated gradient recorded in the dump.")
def fit_cmd(dump, steps, workers, device, out, seed, quiet, layers, method, scope, normalize, compensated):
    """Fit the laws of |g| per step, per layer and for the model.

    The laws are exponential (|g| of a Laplace gradient), gamma and genpareto (generalized Pareto), fitted
    with the papers' closed-form estimators and by maximum likelihood; the tables give KS and
    Anderson-Darling distances, the AIC rank, the tail check at delta = 0.01 and 0.001 and the power-law
    exponent p of SIDCo Def. 1. Figures: PDF/CDF, QQ, tail check and drift over steps.
    """
    from gradstat.analysis.measure.selection import parse_indices, parse_layers, resolve_device
    from gradstat.analysis.studies import fits as fit_study

    d = _open(dump)
    methods = ["closed_form", "mle"] if method == "both" else [method]
    scopes = ["model", "layer"] if scope == "both" else [scope]
    chosen = (
        parse_indices(steps, d.steps, "steps"),
        parse_indices(workers, range(d.workers), "workers"),
        parse_layers(layers, d.params),
    )
    dev = resolve_device(device)
    with _results(out, "fit") as folder:
        df = fit_study.run(d, folder, *chosen, scopes, methods, normalize, compensated, dev, not quiet)
        model = df[df["scope"] == df["scope"].iloc[0]]
        best = (
            model.groupby(["family", "method"])[
                ["scale", "shape", "ks", "ad", "aic_rank", "tail_0.01", "tail_0.001", "p"]
            ]
            .mean()
            .reset_index()
        )
        _echo_table(best, f"fits of |g| ({model['scope'].iloc[0]}, mean over {model['step'].nunique()} steps)")


@click.command("threshold")
@dump_argument()
@selection_options("threshold")
@click.option("--ratio", default="0.1,0.01,0.001", show_default=True, help="Target ratios delta, a comma list.")
@click.option("--estimators", default=None, help="Comma list of estimator labels (default: all available).")
def threshold_cmd(dump, steps, workers, device, out, seed, quiet, ratio, estimators):
    """Measure k_hat/k of every threshold estimator per step.

    For each target ratio: the mean of k_hat/k over steps, its 90 % interval, and the binomial band that a
    perfect fit of the law would give (SIDCo Sec. 2.2).
    """
    from gradstat.analysis.measure.selection import parse_floats, parse_indices, resolve_device
    from gradstat.analysis.studies import thresholds as threshold_study

    d = _open(dump)
    w = parse_indices(workers, range(d.workers), "workers")[0]
    ests = [e.strip() for e in estimators.split(",")] if estimators else None
    chosen, ratios, dev = (
        parse_indices(steps, d.steps, "steps"),
        parse_floats(ratio, "ratio", 0.0, 1.0),
        resolve_device(device),
    )
    with _results(out, "threshold") as folder:
        _, summary = threshold_study.run(d, folder, chosen, ratios, w, ests, dev, seed, not quiet)
        _echo_table(summary, "k_hat / k over steps")
        for m in summary.attrs.get("missing", []):
            click.echo(f"skipped: {m}")


@click.command("compress")
@dump_argument()
@selection_options("compress")
@click.option("--compressor", "specs", multiple=True, required=True, help="Compressor spec (repeatable).")
@click.option(
    "--feedback",
    default="none",
    show_default=True,
    help="none | ef | qcs:beta=B | ecq:alpha=A,beta=B; with --blocks layer also dgc:momentum=M (DGC).",
)
@click.option("--seeds", default=1, show_default=True, type=click.IntRange(1), help="Independent replays.")
@click.option(
    "--blocks",
    type=click.Choice(["model", "layer"]),
    default="model",
    show_default=True,
    help="model: the whole model is one vector; layer: one block per parameter, rank by rank, as the layer-wise "
    "DDP hook (gradstat train --granularity layer) compresses.",
)
@click.option(
    "--save-decoded",
    is_flag=True,
    help="With --blocks layer: write each step's decoded blocks to OUT/decoded/step-<step>.safetensors "
    "(one tensor <worker>/<param> each).",
)
@click.option(
    "--per-layer", is_flag=True, help="Compare per-tensor with whole-model compression (first selected worker)."
)
def compress_cmd(
    dump, steps, workers, device, out, seed, quiet, specs, feedback, seeds, blocks, save_decoded, per_layer
):
    """Replay compressors over the dump's steps.

    With --blocks model (the default) the whole model is one vector, as in the papers' analyses. Each worker
    keeps its own compressor state and feedback residual, as in training; the tables give the relative error,
    bias, k_hat/k, exact and entropy-coded bits and the residual per step. Warns when the replay is not
    faithful (feedback over steps that are not consecutive, too few steps for SIDCo's adaptation) or when the
    error or residual grows over the replay.

    --blocks layer replays what gradstat's layer-wise DDP hook sent in the run that recorded the dump
    (gradstat train --granularity layer --record-every 1): every parameter is its own block, seeded by its
    position and the rank (--seed: the run's --seed), with its own residual and state per rank; every
    recorded worker (rank) takes part. It writes the exact bits and serialised bytes per step, worker and
    block (compress_blocks.csv, comparable with the run's blocks.csv) and per step and worker
    (compress_ranks.csv, comparable with its steps.csv); --save-decoded adds the decoded tensors. Where the
    run recorded its residual (--residual), residual_as_recorded says whether the replay's residual before
    each step is the recorded one bit for bit: on the device the run trained on, where the replay runs unless
    --device names another (there ties among equal magnitudes and the transforms' sums may go another way). For
    example, after "gradstat train --workload lenet --nproc 2 --compressor qsgd --feedback ef --granularity layer
    --record-every 1 --residual --seed 0 --out D", "gradstat compress D --blocks layer --compressor qsgd
    --feedback ef --seed 0 --save-decoded --out R" writes R/compress_blocks.csv with the bits and bytes of
    D.train/blocks.csv.

    --per-layer is a study beside these: on the first selected worker it compresses each tensor on its own
    and the flat model vector, and compares the two (tensors too small for the ratio are sent dense, as DGC
    does, unlike the hook); it takes neither --blocks layer nor --save-decoded.

    The replay runs on the device the dump was recorded on (CUDA when the dump does not say and one is
    present) unless --device names one; it warns where that device differs from the recording's, since a
    replay there cannot be bit-exact.
    """
    from gradstat import compressors
    from gradstat.analysis.measure.selection import parse_indices
    from gradstat.analysis.studies import hook_replay
    from gradstat.analysis.studies import replay as replay_study
    from gradstat.analysis.studies.replay_device import replay_device

    d = _open(dump)
    if per_layer and (blocks == "layer" or save_decoded):
        raise ValueError(
            "--per-layer compares layer-wise with whole-model compression itself: drop --blocks "
            "layer and --save-decoded (or drop --per-layer to replay the hook's blocks)"
        )
    if compressors.parse_memory(feedback).momentum is not None and blocks != "layer":
        raise ValueError(f"--feedback {feedback}: DGC's local momentum correction is replayed with --blocks layer only")
    if save_decoded and blocks != "layer":
        raise ValueError("--save-decoded writes the decoded blocks of --blocks layer; add --blocks layer")
    chosen = parse_indices(steps, d.steps, "steps"), parse_indices(workers, range(d.workers), "workers")
    if blocks == "layer":
        hook_replay.check([(s, feedback) for s in specs], chosen[1], d.workers, seeds, save_decoded)
    else:
        _check_specs(specs, feedback)
    named = click.get_current_context().get_parameter_source("device") is not click.core.ParameterSource.DEFAULT
    dev = replay_device(d, device if named else None)
    with _results(out, "compress") as folder:
        if per_layer:
            from gradstat.analysis.studies import layerwise

            _, summary = layerwise.run(d, folder, specs, feedback, chosen[0], chosen[1][0], dev, seed)
            _echo_table(summary, "per-layer vs whole-model (means over steps)")
            return
        pairs = [(s, feedback) for s in specs]
        runs = list(range(seed, seed + seeds))
        if blocks == "layer":
            _, _, summary = hook_replay.run(d, folder, pairs, chosen[0], runs, dev, save_decoded)
            _echo_table(summary, "layer-wise replay of the hook (bits and bytes per rank and step, means)")
            return
        _, summary = replay_study.run(d, folder, pairs, *chosen, runs, dev, not quiet)
        _echo_table(summary, "replay summary (means over steps and seeds)")


@click.command("variance")
@dump_argument(required=False)
@click.option(
    "--synthetic",
    type=Distribution(extra=("normal",)),
    default=None,
    help=f"Use synthetic vectors instead of a dump: |g| of one law, {accepted()}, or normal.",
)
@click.option("--compressor", "specs", multiple=True, help="Compressor spec (repeatable); default: a standard set.")
@click.option("--n", "n", default=1024, show_default=True, type=click.IntRange(2), help="Block length.")
@click.option("--vectors", default=2, show_default=True, type=click.IntRange(1), help="Blocks (steps) to test.")
@click.option("--trials", default=200, show_default=True, type=click.IntRange(2), help="Monte Carlo trials.")
@selection_options("variance")
def variance_cmd(dump, synthetic, specs, n, vectors, trials, steps, workers, device, out, seed, quiet):
    """Compare each compressor's error with its closed-form bound.

    Monte Carlo estimate of E||e||^2/||g||^2 with a 99 % interval next to the bound each compressor declares;
    exit status 1 when a bound is violated. Runs on a dump's gradients or, with --synthetic, on synthetic
    vectors.
    """
    from gradstat.analysis.measure.selection import resolve_device
    from gradstat.analysis.measure.sources import SYNTHETIC, GradientSource
    from gradstat.analysis.studies import variance as variance_study

    if (dump is None) == (synthetic is None):
        raise ValueError(f"give either a DUMP or --synthetic {'|'.join(SYNTHETIC)} (exactly one)")
    dev = resolve_device(device)
    if dump is None:
        _no_selection(steps, workers)
    source = _source(dump, steps, workers) if dump else GradientSource(seed=seed + 1234, family=synthetic)
    _check_specs(specs)
    with _results(out, "variance") as folder:
        vecs = [(f"{source.label} #{i}", source.vector(n, dev, index=i)) for i in range(vectors)]
        df = variance_study.run(vecs, list(specs) or list(DEFAULT_VARIANCE_SPECS), folder, trials, seed, not quiet)
        _echo_table(
            df,
            "relative error vs bound",
            ["compressor", "vector", "empirical", "ci_low", "ci_high", "bound", "theory_over_empirical", "verdict"],
        )
    return 1 if (df["verdict"] == "violated").any() else 0


@click.command("feedback")
@dump_argument(required=False)
@click.option("--compressor", "spec", default="qcs:block=256,k=64,Q=4", show_default=True, help="Compressor spec.")
@click.option("--beta", default="0.1,0.2,0.3,0.5,0.7,0.9,1", show_default=True, help="Feedback weights in (0, 1].")
@click.option(
    "--n",
    "n",
    default=4096,
    show_default=True,
    type=click.IntRange(0),
    help="Block length (coordinates of largest norm), 0 = whole model.",
)
@click.option("--length", default=None, type=click.IntRange(1), help="Steps replayed (default: all selected).")
@click.option("--seeds", default=8, show_default=True, type=click.IntRange(2), help="Independent replays.")
@selection_options("feedback")
def feedback_cmd(dump, spec, beta, n, length, seeds, steps, workers, device, out, seed, quiet):
    """Measure the weighted error-feedback residual against eta(beta).

    max_t E||r_t||^2 / B for each feedback weight beta, against the bound eta(beta) of QCS Lemma 4, with the
    optimal beta* and Karimireddy et al.'s bound. Runs on a dump's gradients or on synthetic vectors.
    """
    from gradstat.analysis.measure.selection import parse_indices, resolve_device
    from gradstat.analysis.studies import feedback as feedback_study

    source = _source(dump, steps, workers)
    ws = [0] if dump is None else parse_indices(workers, range(source.dump.workers), "workers")
    if n == 0:
        if dump is None:
            raise ValueError("--n 0 (the whole model) needs a DUMP")
        n = source.dump.numel
    elif n < 2:
        raise ValueError(f"--n must be 0 (the whole model) or at least 2, got {n}")
    length = length or (len(source.steps or ()) if dump is not None else 20)  # a dump's source lists its steps
    _check_specs([spec])
    betas, dev = _betas(beta), resolve_device(device)
    with _results(out, "feedback") as folder:
        df = feedback_study.run(source, ws, folder, spec, betas, n, length, seeds, dev, not quiet)
        _echo_table(
            df,
            f"eta vs beta ({spec}, gamma = {df['gamma'].iloc[0]:.4g})",
            ["beta", "empirical", "ci_low", "ci_high", "eta", "verdict", "beta_star", "eta_star"],
        )


@click.group("plot", cls=HelpGroup)
def plot_group():
    """Draw the papers' figures with measured points."""


@plot_group.command("variance-vs-gain")
@dump_argument(required=False)
@click.option("--n", "n", default=256, show_default=True, type=click.IntRange(2), help="Block length.")
@click.option("--trials", default=50, show_default=True, type=click.IntRange(2), help="Monte Carlo trials.")
@selection_options("plot")
def variance_gain_cmd(dump, n, trials, steps, workers, device, out, seed, quiet):
    """Plot the variance factor against the compression gain (QCS Fig. 3).

    Lines: the least QCS gamma over (k, Q) at each gain, QSGD's and Wangni's bounds; points: the error
    measured on the dump's gradients (default: synthetic vectors), with 99 % intervals; log axes.
    """
    from gradstat.analysis.measure.selection import resolve_device
    from gradstat.analysis.studies import variance_gain as variance_gain_study

    source = _source(dump, steps, workers)
    with _results(out, "plot variance-vs-gain") as folder:
        pts = variance_gain_study.run(folder, n, source, trials, resolve_device(device))
        _echo_table(pts, "measured points", ["spec", "gain", "exact_gain", "empirical", "ci_low", "ci_high"])


@click.command("validate")
@dump_argument(required=False)
@click.option("--quick", is_flag=True, help="Small Monte Carlo sizes (under two minutes on 2 CPU cores).")
@click.option("--checks", default=None, help="Comma list of check names or prefixes (default: all).")
@selection_options("validate")
def validate_cmd(dump, quick, checks, steps, workers, device, out, seed, quiet):
    """Check every bound of the papers as a Monte Carlo experiment.

    Each check has fixed seeds, a 99 % interval and a verdict; exit status 1 when a check that must hold is
    violated. Runs on a dump's gradients or, without one, on synthetic vectors.
    """
    from gradstat.analysis.measure.selection import resolve_device
    from gradstat.analysis.measure.sources import GradientSource
    from gradstat.analysis.validation import outputs as validation_table
    from gradstat.analysis.validation import registry as validation_registry

    source: GradientSource | None = None
    if dump:
        source = _source(dump, steps, workers)
    else:
        _no_selection(steps, workers)
    validation_registry.select(checks)  # unknown check names fail before --out is touched
    with _results(out, "validate") as folder:
        click.echo(
            f"validating on {source.label if source else GradientSource().label} "
            f"({'quick' if quick else 'full'} sizes, 99 % intervals)"
        )
        df = validation_table.run(
            folder,
            "quick" if quick else "full",
            source,
            resolve_device(device),
            seed,
            checks,
            echo=None if quiet else click.echo,
        )
        _echo_table(
            df, "validation", ["check", "source", "theory", "empirical", "ci_low", "ci_high", "trials", "verdict"]
        )
    failed = df[(df["verdict"] == "violated") & df["must_hold"]]
    if not failed.empty:
        click.echo(f"violated: {', '.join(failed['check'])}", err=True)
        return 1
    return 0


@click.command("report")
@dump_argument(required=False)
@steps_option
@click.option("--quick", is_flag=True, help="Small Monte Carlo sizes.")
@click.option("--checks", default=None, help="Validation checks to run (names or prefixes; default all).")
@device_option
@out_option("gradstat-out/report")
@seed_option
@quiet_option
@report_choice_options
def report_cmd(dump, steps, quick, checks, device, out, seed, quiet, specs, feedback):
    """Write the full Markdown report with its figures and tables.

    Fits, threshold quality, replayed compressors, variance, error feedback and validation on the dump (the
    synthetic sections only without one); every figure and table beside it as PNG and CSV.
    """
    from gradstat.analysis.measure.selection import parse_indices, resolve_device
    from gradstat.analysis.report.document import write_report
    from gradstat.analysis.validation import registry as validation_registry

    if dump is not None:
        parse_indices(steps, _open(dump).steps, "steps")  # a bad dump or selection fails before --out is touched
    else:
        _no_selection(steps, None)
    validation_registry.select(checks)
    if specs or feedback:
        _check_specs(specs, feedback or "none")
    with _results(out, "report") as folder:
        path, failed = write_report(
            dump,
            folder,
            quick,
            steps,
            resolve_device(device),
            seed,
            not quiet,
            echo=click.echo,
            checks=checks,
            compressors=specs,
            feedback=feedback,
        )
        click.echo(f"report: {path}")
    return 1 if failed else 0


@click.command("demo")
@click.option("--workload", default="lenet", show_default=True, help="Built-in workload to record.")
@iterations_option(3)
@no_steps_count
@click.option(
    "--workers", "n_workers", default=2, show_default=True, type=click.IntRange(1), help="Simulated workers P."
)
@click.option("--quick", is_flag=True, help="Fewer Monte Carlo trials.")
@device_option
@out_option("gradstat-demo")
@seed_option
@quiet_option
@report_choice_options
def demo_cmd(workload, iterations, n_workers, quick, device, out, seed, quiet, specs, feedback):
    """Record a small dump and write the report on it.

    Trains a built-in workload for a few iterations with simulated workers, keeps the dump in <out>/dump
    (open it with the other commands) and writes <out>/report.md.
    """
    from gradstat.analysis.measure.selection import resolve_device
    from gradstat.analysis.report.document import demo

    iterations = check_iterations(iterations)
    if specs or feedback:
        _check_specs(specs, feedback or "none")
    with _results(out, "demo") as folder:
        path, failed = demo(
            folder,
            workload,
            iterations,
            n_workers,
            quick,
            resolve_device(device),
            seed,
            not quiet,
            echo=click.echo,
            compressors=specs,
            feedback=feedback,
        )
        click.echo(f"report: {path}\ndump:   {folder / 'dump'}")
    return 1 if failed else 0


COMMANDS = (
    fit_cmd,
    threshold_cmd,
    compress_cmd,
    variance_cmd,
    feedback_cmd,
    plot_group,
    validate_cmd,
    report_cmd,
    demo_cmd,
)
"""The commands (and groups) this module adds to ``gradstat``, in listing order."""


def _betas(text: str) -> list[float]:
    """Feedback weights in (0, 1] (QCS eq. (14))."""
    from gradstat.analysis.measure.selection import parse_floats

    betas = parse_floats(text, "beta", 0.0, 1.0, open_interval=False)
    if any(b == 0.0 for b in betas):
        raise ValueError(f"--beta: the feedback weight must lie in (0, 1], got {text!r}")
    return betas


def _source(dump: str | None, steps: str | None, workers: str | None) -> GradientSource:
    """The dump's gradients (steps and workers selected), or synthetic vectors without a dump."""
    from gradstat.analysis.measure.selection import parse_indices
    from gradstat.analysis.measure.sources import GradientSource

    if dump is None:
        _no_selection(steps, workers)
        return GradientSource()
    d = _open(dump)
    w = parse_indices(workers, range(d.workers), "workers")[0]
    return GradientSource(d, parse_indices(steps, d.steps, "steps"), w)


def _check_specs(specs: Sequence[str], feedback: str = "none") -> None:
    """Build each compressor and the feedback once, so that a bad spec fails before ``--out`` is touched."""
    from gradstat import compressors

    for spec in specs:
        compressors.create(spec)
    compressors.parse_feedback(feedback)


def _no_selection(steps: str | None, workers: str | None) -> None:
    """Without a dump there is nothing to select: say so rather than ignore ``--steps``/``--workers``."""
    given = [name for name, value in (("--steps", steps), ("--workers", workers)) if value is not None]
    if given:
        raise ValueError(f"{' and '.join(given)} select recorded gradients: give a DUMP (first argument)")

"""Analysis commands: ``fit``, ``threshold``, ``compress``, ``variance``, ``feedback``, ``plot variance-vs-gain``,
``validate``, ``report``, ``demo``. Each writes its tables (CSV + Markdown) and figures (PNG + CSV) into ``--out``
and prints a summary; the work itself lives in :mod:`gradstat.analysis.studies`.

Exit status: 0 ok; 1 a check (``validate``, ``variance``) that must hold is violated; 2 bad input.
"""

from __future__ import annotations

from pathlib import Path

import click
import pandas as pd

from gradstat.analysis.measure.selection import parse_floats, parse_indices, parse_layers, resolve_device
from gradstat.analysis.measure.sources import SYNTHETIC, GradientSource
from gradstat.analysis.measure.tables import to_text
from gradstat.analysis.studies import feedback as feedback_study
from gradstat.analysis.studies import fits as fit_study
from gradstat.analysis.studies import replay as replay_study
from gradstat.analysis.studies import thresholds as threshold_study
from gradstat.analysis.studies import variance as variance_study
from gradstat.analysis.studies import variance_gain as variance_gain_study
from gradstat.analysis.validation import outputs as validation_table

DEFAULT_VARIANCE_SPECS = (
    "qcs:block=256,k=64,Q=4",
    "qcs:block=256,k=64,Q=4,alpha=mmse",
    "dqsg:M=4",
    "qsgd:s=4,bucket=512",
    "topk:ratio=0.01",
    "wangni:ratio=0.01",
)


def _open(path: str):
    from gradstat.analysis.dumps import open_dump

    return open_dump(path)


def _out(out: str | None, default: str) -> Path:
    p = Path(out or default)
    p.mkdir(parents=True, exist_ok=True)
    return p


def selection_options(fn):
    """--steps, --workers, --device, --out, --seed, --quiet (every dump command)."""
    for opt in reversed(
        [
            click.option("--steps", default=None, help="steps: all | 3 | 0-10 | 0-100:10 | first:N | last:N | a,b,c"),
            click.option("--workers", default=None, help="dump workers, same grammar as --steps (default: all)"),
            click.option("--device", default="auto", show_default=True, help="cpu | cuda | auto"),
            click.option("--out", default=None, help="output folder (default: gradstat-out/<command>)"),
            click.option("--seed", default=0, show_default=True, type=int, help="base seed of every random draw"),
            click.option("--quiet", is_flag=True, help="no progress bars"),
        ]
    ):
        fn = opt(fn)
    return fn


def _echo_table(df: pd.DataFrame, title: str, columns: list[str] | None = None) -> None:
    click.echo(f"\n{title}")
    click.echo(to_text(df[columns] if columns else df))


def _written(out: Path) -> None:
    click.echo(f"\nwritten to {out}/")


def register(cli: click.Group) -> None:
    @cli.command("fit")
    @click.argument("dump")
    @selection_options
    @click.option("--layers", default=None, help="parameter names or patterns (conv*.weight); default all")
    @click.option("--method", type=click.Choice(["closed_form", "mle", "both"]), default="both", show_default=True)
    @click.option("--scope", type=click.Choice(["model", "layer", "both"]), default="both", show_default=True)
    @click.option("--normalize", is_flag=True, help="l2-normalise each vector first (SIDCo Fig. 2)")
    @click.option("--compensated", is_flag=True, help="fit the error-compensated gradient recorded in the dump")
    def fit_cmd(dump, steps, workers, device, out, seed, quiet, layers, method, scope, normalize, compensated):
        """Fit Laplace, gamma and generalized Pareto to |g| per step, per layer and for the whole model."""
        d = _open(dump)
        out = _out(out, "gradstat-out/fit")
        methods = ["closed_form", "mle"] if method == "both" else [method]
        scopes = ["model", "layer"] if scope == "both" else [scope]
        df = fit_study.run(
            d,
            out,
            parse_indices(steps, d.steps, "steps"),
            parse_indices(workers, range(d.workers), "workers"),
            parse_layers(layers, d.params),
            scopes,
            methods,
            normalize,
            compensated,
            resolve_device(device),
            not quiet,
        )
        model = df[df["scope"] == df["scope"].iloc[0]]
        best = (
            model.groupby(["family", "method"])[
                ["scale", "shape", "ks", "ad", "aic_rank", "tail_0.01", "tail_0.001", "p"]
            ]
            .mean()
            .reset_index()
        )
        _echo_table(best, f"fits of |g| ({model['scope'].iloc[0]}, mean over {model['step'].nunique()} steps)")
        _written(out)

    @cli.command("threshold")
    @click.argument("dump")
    @selection_options
    @click.option("--ratio", default="0.1,0.01,0.001", show_default=True, help="target ratios delta")
    @click.option("--estimators", default=None, help="comma list of estimator labels (default: all available)")
    def threshold_cmd(dump, steps, workers, device, out, seed, quiet, ratio, estimators):
        """k_hat/k per step for each threshold estimator, with the mean, 90 % interval and binomial band."""
        d = _open(dump)
        out = _out(out, "gradstat-out/threshold")
        w = parse_indices(workers, range(d.workers), "workers")[0]
        ests = [e.strip() for e in estimators.split(",")] if estimators else None
        _, summary = threshold_study.run(
            d,
            out,
            parse_indices(steps, d.steps, "steps"),
            parse_floats(ratio, "ratio", 0.0, 1.0),
            w,
            ests,
            resolve_device(device),
            seed,
            not quiet,
        )
        _echo_table(summary, "k_hat / k over steps")
        for m in summary.attrs.get("missing", []):
            click.echo(f"skipped: {m}")
        _written(out)

    @cli.command("compress")
    @click.argument("dump")
    @selection_options
    @click.option("--compressor", "specs", multiple=True, required=True, help="compressor spec (repeatable)")
    @click.option("--feedback", default="none", show_default=True, help="none | ef | qcs:beta=B | ecq:alpha=A,beta=B")
    @click.option("--seeds", default=1, show_default=True, type=click.IntRange(1), help="independent replays")
    @click.option("--per-layer", is_flag=True, help="compare per-tensor with whole-model compression (first worker)")
    def compress_cmd(dump, steps, workers, device, out, seed, quiet, specs, feedback, seeds, per_layer):
        """Replay compressors (with feedback and per-worker state) over the dump's steps."""
        d = _open(dump)
        out = _out(out, "gradstat-out/compress")
        if per_layer:
            from gradstat.analysis.studies import layerwise

            worker = parse_indices(workers, range(d.workers), "workers")[0]
            _, summary = layerwise.run(
                d, out, specs, feedback, parse_indices(steps, d.steps, "steps"), worker, resolve_device(device), seed
            )
            _echo_table(summary, "per-layer vs whole-model (means over steps)")
            return _written(out)
        _, summary = replay_study.run(
            d,
            out,
            [(s, feedback) for s in specs],
            parse_indices(steps, d.steps, "steps"),
            parse_indices(workers, range(d.workers), "workers"),
            list(range(seed, seed + seeds)),
            resolve_device(device),
            not quiet,
        )
        _echo_table(summary, "replay summary (means over steps and seeds)")
        _written(out)

    @cli.command("variance")
    @click.argument("dump", required=False)
    @click.option(
        "--synthetic",
        type=click.Choice(list(SYNTHETIC)),
        default=None,
        help="use synthetic vectors of this law instead of a dump",
    )
    @click.option("--compressor", "specs", multiple=True, help="compressor spec (repeatable); default: a standard set")
    @click.option("--n", "n", default=1024, show_default=True, type=click.IntRange(2), help="block length")
    @click.option("--vectors", default=2, show_default=True, type=click.IntRange(1), help="blocks (steps) to test")
    @click.option("--trials", default=200, show_default=True, type=click.IntRange(2), help="Monte Carlo trials")
    @selection_options
    def variance_cmd(dump, synthetic, specs, n, vectors, trials, steps, workers, device, out, seed, quiet):
        """Monte Carlo E||e||^2/||g||^2 with a 99 % CI next to each compressor's closed-form bound."""
        if (dump is None) == (synthetic is None):
            raise ValueError(f"give either a DUMP or --synthetic {'|'.join(SYNTHETIC)} (exactly one)")
        dev = resolve_device(device)
        source = _source(dump, steps, workers) if dump else GradientSource(seed=seed + 1234, family=synthetic)
        out = _out(out, "gradstat-out/variance")
        vecs = [(f"{source.label} #{i}", source.vector(n, dev, index=i)) for i in range(vectors)]
        df = variance_study.run(vecs, list(specs) or list(DEFAULT_VARIANCE_SPECS), out, trials, seed, not quiet)
        _echo_table(
            df,
            "relative error vs bound",
            ["compressor", "vector", "empirical", "ci_low", "ci_high", "bound", "theory_over_empirical", "verdict"],
        )
        _written(out)
        return 1 if (df["verdict"] == "violated").any() else 0

    @cli.command("feedback")
    @click.argument("dump", required=False)
    @click.option("--compressor", "spec", default="qcs:block=256,k=64,Q=4", show_default=True)
    @click.option("--beta", default="0.1,0.2,0.3,0.5,0.7,0.9,1", show_default=True, help="feedback weights")
    @click.option(
        "--n",
        "n",
        default=4096,
        show_default=True,
        type=click.IntRange(2),
        help="block length (coordinates of largest norm), 0 = whole model",
    )
    @click.option("--length", default=None, type=click.IntRange(1), help="steps replayed (default: all selected)")
    @click.option("--seeds", default=8, show_default=True, type=click.IntRange(2))
    @selection_options
    def feedback_cmd(dump, spec, beta, n, length, seeds, steps, workers, device, out, seed, quiet):
        """Weighted error feedback: max_t E||r_t||^2 / B against eta(beta) of QCS Lemma 4."""
        source = _source(dump, steps, workers)
        ws = [0] if dump is None else parse_indices(workers, range(source.dump.workers), "workers")
        if dump is not None and n == 0:
            n = source.dump.numel
        length = length or (len(source.steps) if dump is not None else 20)
        out = _out(out, "gradstat-out/feedback")
        df = feedback_study.run(
            source, ws, out, spec, _betas(beta), n, length, seeds, resolve_device(device), not quiet
        )
        _echo_table(
            df,
            f"eta vs beta ({spec}, gamma = {df['gamma'].iloc[0]})",
            ["beta", "empirical", "ci_low", "ci_high", "eta", "verdict", "beta_star", "eta_star"],
        )
        _written(out)

    @cli.group("plot")
    def plot_group():
        """Figures."""

    @plot_group.command("variance-vs-gain")
    @click.option("--n", "n", default=256, show_default=True, type=click.IntRange(2), help="block length")
    @click.option("--dump", default=None, help="measure the points on this dump's gradients (default: synthetic)")
    @click.option("--trials", default=50, show_default=True, type=click.IntRange(2))
    @selection_options
    def variance_gain_cmd(n, dump, trials, steps, workers, device, out, seed, quiet):
        """QCS Fig. 3: min gamma over (k, Q) vs gain, QSGD's bound, Wangni's; measured points; log axes."""
        out = _out(out, "gradstat-out/plot")
        pts = variance_gain_study.run(out, n, _source(dump, steps, workers), trials, resolve_device(device))
        _echo_table(pts, "measured points", ["spec", "gain", "exact_gain", "empirical", "ci_low", "ci_high"])
        _written(out)

    @cli.command("validate")
    @click.option("--quick", is_flag=True, help="small Monte Carlo sizes (under two minutes on 2 CPU cores)")
    @click.option("--dump", default=None, help="run the checks on this dump's gradients (default: synthetic)")
    @click.option("--checks", default=None, help="comma list of check names or prefixes (default: all)")
    @selection_options
    def validate_cmd(quick, dump, checks, steps, workers, device, out, seed, quiet):
        """Run every bound check as a Monte Carlo experiment; exit 1 if a check that must hold is violated."""
        out = _out(out, "gradstat-out/validate")
        source = _source(dump, steps, workers) if dump else None
        click.echo(
            f"validating on {source.label if source else 'synthetic Laplace'} "
            f"({'quick' if quick else 'full'} sizes, 99 % intervals)"
        )
        df = validation_table.run(
            out,
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
        _written(out)
        failed = df[(df["verdict"] == "violated") & df["must_hold"]]
        if not failed.empty:
            click.echo(f"violated: {', '.join(failed['check'])}", err=True)
            return 1
        return 0

    @cli.command("report")
    @click.option("--dump", default=None, help="the dump to report on (default: synthetic sections only)")
    @click.option("--out", required=True, help="output folder")
    @click.option("--quick", is_flag=True, help="small Monte Carlo sizes")
    @click.option("--steps", default=None, help="steps to analyse (default: all)")
    @click.option("--device", default="auto", show_default=True)
    @click.option("--seed", default=0, show_default=True, type=int)
    @click.option("--quiet", is_flag=True)
    @click.option("--checks", default=None, help="validation checks to run (names or prefixes; default all)")
    def report_cmd(dump, out, quick, steps, device, seed, quiet, checks):
        """One Markdown report with its PNGs and CSVs: fits, thresholds, variance, feedback, validation."""
        from gradstat.analysis.report.document import write_report

        path, failed = write_report(
            dump, out, quick, steps, resolve_device(device), seed, not quiet, echo=click.echo, checks=checks
        )
        click.echo(f"report: {path}")
        return 1 if failed else 0

    @cli.command("demo")
    @click.option("--out", default="gradstat-demo", show_default=True, help="output folder")
    @click.option("--workload", default="lenet", show_default=True, help="built-in workload to record")
    @click.option("--steps", "n_steps", default=3, show_default=True, type=click.IntRange(1), help="training steps")
    @click.option("--workers", "n_workers", default=2, show_default=True, type=click.IntRange(1))
    @click.option("--quick", is_flag=True, help="fewer steps and Monte Carlo trials")
    @click.option("--device", default="auto", show_default=True)
    @click.option("--seed", default=0, show_default=True, type=int)
    @click.option("--quiet", is_flag=True)
    @click.option("--keep-dump", is_flag=True, help="keep the recorded dump in <out>/dump")
    def demo_cmd(out, workload, n_steps, n_workers, quick, device, seed, quiet, keep_dump):
        """Record a small dump with a built-in workload and write the report on it."""
        from gradstat.analysis.report.document import demo

        path, failed = demo(
            out,
            workload,
            n_steps,
            n_workers,
            quick,
            resolve_device(device),
            seed,
            not quiet,
            echo=click.echo,
            keep_dump=keep_dump,
        )
        click.echo(f"report: {path}")
        return 1 if failed else 0


def _betas(text: str) -> list[float]:
    """Feedback weights in (0, 1] (QCS eq. (14))."""
    betas = parse_floats(text, "beta", 0.0, 1.0, open_interval=False)
    if any(b == 0.0 for b in betas):
        raise ValueError(f"--beta: the feedback weight must lie in (0, 1], got {text!r}")
    return betas


def _source(dump: str | None, steps: str | None, workers: str | None) -> GradientSource:
    if dump is None:
        return GradientSource()
    d = _open(dump)
    w = parse_indices(workers, range(d.workers), "workers")[0]
    return GradientSource(d, parse_indices(steps, d.steps, "steps"), w)

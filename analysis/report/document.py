"""The report: one Markdown file with its PNGs and CSVs beside it, putting every analysis together for a dump,
and ``demo``: record a small dump with a built-in workload, then write the report on it.

Sections: setup; distribution fits and drift; threshold quality; compressors replayed on the dump; variance vs
bounds; error feedback (eta vs beta); variance vs gain (QCS Fig. 3); validation table; known disagreements with
the papers. Without a dump only the synthetic sections (variance vs gain, validation) are written.
"""

from __future__ import annotations

import datetime as _dt
import math
import platform
import time
from pathlib import Path
from typing import Callable

import pandas as pd
import torch

from gradstat.analysis.measure.selection import parse_indices
from gradstat.analysis.measure.sources import GradientSource
from gradstat.analysis.measure.tables import atomic_write_text, to_markdown
from gradstat.analysis.studies import feedback as feedback_study
from gradstat.analysis.studies import fits as fit_study
from gradstat.analysis.studies import replay as replay_study
from gradstat.analysis.studies import thresholds as threshold_study
from gradstat.analysis.studies import variance as variance_study
from gradstat.analysis.studies import variance_gain as variance_gain_study
from gradstat.analysis.validation import outputs as validation_table

REPLAYS = (
    ("topk:ratio=0.01", "ef"),
    ("sidco:ratio=0.01,dist=exponential,stages=adaptive", "ef"),
    ("qcs:block=256,k=64,Q=4", "none"),
    ("qcs:block=256,k=64,Q=4", "qcs:beta=0.2"),
    ("qsgd:s=4,bucket=512", "none"),
    ("dqsg:M=4", "none"),
)
VARIANCE_SPECS = (
    "qcs:block=256,k=64,Q=4",
    "qcs:block=256,k=64,Q=4,alpha=mmse",
    "dqsg:M=4",
    "dqsg:M=4,half=true",
    "qsgd:s=4,bucket=512",
    "topk:ratio=0.01",
    "randk:ratio=0.01",
    "wangni:ratio=0.01",
)
QUICK_ESTIMATORS = (
    "topk",
    "sidco-exp-M1",
    "sidco-exp-M2",
    "sidco-exp-M3",
    "sidco-exp-adaptive",
    "sidco-gamma-M1",
    "sidco-gamma-M1-approx",
    "sidco-gp-M1",
    "dgc",
    "redsync",
    "gaussianksgd",
)
BETAS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)


def _md_table(df: pd.DataFrame, columns: list[str]) -> str:
    return to_markdown(df[[c for c in columns if c in df.columns]])


def _img(name: str, alt: str) -> str:
    return f"![{alt}]({name}.png)\n\n*Data: [{name}.csv]({name}.csv)*\n"


def write_report(
    dump_path: str | None,
    out: str | Path,
    quick: bool = False,
    steps: str | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
    progress: bool = True,
    echo: Callable[[str], None] = print,
    command: str | None = None,
    checks: str | None = None,
) -> tuple[Path, bool]:
    """Write ``<out>/report.md`` and its files; return the path and whether a must-hold check was violated.
    ``command`` (the command line that regenerates the report) is quoted at the top; ``checks`` selects the
    validation checks (``analysis.validation.registry.select``; default all)."""
    from gradstat.analysis.dumps import open_dump

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(device)
    t0 = time.perf_counter()
    echo = _timed(echo, t0)
    dump = open_dump(dump_path) if dump_path else None
    sel = parse_indices(steps, dump.steps, "steps") if dump is not None else []
    source = GradientSource(dump, sel) if dump is not None else GradientSource()
    thresholds = None
    parts = [
        f"# gradstat report\n\nGenerated {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC by "
        f"`gradstat` on {platform.machine()} ({device}), torch {torch.__version__}, "
        f"{'quick' if quick else 'full'} Monte Carlo sizes, base seed {seed}. Every figure has its data in the "
        f"CSV of the same name; every table is also a CSV.\n" + (f"\nRegenerate with `{command}`.\n" if command else "")
    ]
    if dump is not None:
        m = dump.manifest
        parts.append(
            f"## Setup\n\nDump of workload **{dump.workload}**, {dump.numel:,} "
            f"parameters in {len(dump.params)} tensors, {dump.workers} worker(s), steps "
            f"{', '.join(map(str, sel))} analysed (recorded: {len(dump.steps)}, every {m.get('every')}). "
            f"Optimizer: `{m.get('optimizer')}`.\n"
        )
        sections, thresholds = _dump_sections(dump, sel, out, quick, device, seed, progress, echo)
        parts += sections
    echo("variance vs gain ...")
    variance_gain_study.run(out, 256, source, 30 if quick else 100, device)
    parts.append(
        "## Variance vs compression gain (QCS Fig. 3)\n\nLines: the closed-form variance factor of each "
        "scheme at a given gain (QCS: the least gamma (10) over (k, Q) meeting gain (11); QSGD: Lemma 3.1 at "
        "its gain 32/log2(2s+1); Wangni: uniform keep probability, each value sent with its index). Circles: "
        f"the measured relative error on a block of 256 coordinates of {source.label}, with 99 % "
        "intervals; the measured gain counts codes only, as (11) does (`exact_gain` in the CSV counts every "
        "scale and seed sent).\n\n" + _img("variance_vs_gain", "variance vs gain")
    )
    echo("validation ...")
    val = validation_table.run(
        out, "quick" if quick else "full", source, device, seed, checks, echo=(lambda s: echo(s)) if progress else None
    )
    failed = bool(((val["verdict"] == "violated") & val["must_hold"]).any())
    val_md = val.assign(ratio=val["theory_over_empirical"])
    parts.append(
        f"## Validation (on {source.label})\n\nEach claim of the papers as a Monte Carlo experiment with "
        "fixed seeds and a 99 % interval. Verdicts: *holds* (interval entirely on the right side of the bound), "
        "*tight* (interval touches the bound), *violated* (interval entirely on the wrong side), *not applicable*. "
        "Equalities hold when the interval meets the value (within the check's stated tolerance). `ratio` is "
        "theory / empirical: how loose an upper bound is. `must_hold` = no: a claim reported, not required "
        "(see the disagreements below).\n\n"
        + _md_table(
            val_md,
            [
                "check",
                "source",
                "claim",
                "theory",
                "empirical",
                "ci_low",
                "ci_high",
                "trials",
                "ratio",
                "verdict",
                "must_hold",
                "note",
            ],
        )
        + "\n*Data: [validation.csv](validation.csv)*\n"
    )
    parts.append(_disagreements(val, thresholds))
    parts.append(f"\n---\nTotal time {time.perf_counter() - t0:.0f} s.\n")
    path = atomic_write_text(out / "report.md", "\n".join(parts))
    return path, failed


def _dump_sections(
    dump, sel, out: Path, quick: bool, device, seed: int, progress: bool, echo
) -> tuple[list[str], pd.DataFrame]:
    parts = []
    workers = list(range(dump.workers))
    echo("fits ...")
    fits = fit_study.run(
        dump,
        out,
        sel,
        [0],
        None,
        ["model"],
        ["closed_form", "mle"],
        normalize=False,
        compensated=False,
        device=device,
        progress=progress,
    )
    mean = (
        fits.groupby(["family", "method"], sort=False)[
            ["scale", "shape", "ks", "ad", "aic_rank", "tail_0.1", "tail_0.01", "tail_0.001", "p"]
        ]
        .mean()
        .reset_index()
    )
    parts.append(
        "## Distribution of gradient magnitudes\n\nFits of |g| of the whole model (worker 0) by each "
        "family and estimator, averaged over the analysed steps (`fits.csv` has every step). `ks`/`ad`: "
        "Kolmogorov-Smirnov and Anderson-Darling statistics on a fixed-seed subsample of 20,000 nonzero "
        "values; `aic_rank`: 1 = best AIC among the families for that estimator; `tail_delta`: count of |g| "
        "above the fitted (1 - delta) quantile over d delta (1 = the fit's tail is right); `p`: the "
        "compressibility exponent of the sorted magnitudes (SIDCo Def. 1). "
        f"Zero fraction: {fits['zero_fraction'].mean():.1%} of the coordinates are exactly 0.\n\n"
        + to_markdown(mean)
        + "\n"
        + _img("fit_pdf_cdf", "PDF and survival function of |g|")
        + _img("fit_qq", "QQ plot")
        + _img("fit_tail_check", "tail check")
        + _img("fit_drift", "drift")
    )
    echo("thresholds ...")
    th_steps = sel[-2:] if quick else sel
    _, summ = threshold_study.run(
        dump, out, th_steps, [0.1, 0.01, 0.001], 0, QUICK_ESTIMATORS if quick else None, device, seed, progress
    )
    missing = summ.attrs.get("missing", [])
    parts.append(
        f"## Threshold quality\n\nk_hat/k of each threshold estimator over steps {', '.join(map(str, th_steps))}: "
        "mean, central "
        "90 % interval over steps, and the central 90 % band of Binomial(d, delta)/k that a perfect fit "
        "would give (SIDCo App. C).\n\n"
        + to_markdown(summ)
        + "\n"
        + (f"Not run (compressor not available): {', '.join(missing)}.\n\n" if missing else "")
        + _img("threshold_k_ratio", "k_hat / k")
    )
    echo("replays ...")
    _, comp = replay_study.run(
        dump, out, REPLAYS, sel, workers, [seed] if quick else [seed, seed + 1], device, progress
    )
    parts.append(
        f"## Compressors replayed on the dump\n\nEach compressor with its feedback and per-worker state over "
        f"the analysed steps and {dump.workers} worker(s); means over steps and seeds. `rel_error`: "
        "||z - z_hat||^2/||z||^2 per worker (z = the compensated gradient); `agg_rel_error`: the averaged "
        "update against the full-precision average; `bias`: <z_hat - z, z>/||z||^2; `gain`: 32 d / exact "
        "bits per worker.\n\n" + to_markdown(comp) + "\n*Per step: [compress_steps.csv](compress_steps.csv)*\n"
    )
    echo("variance ...")
    src = GradientSource(dump, sel)
    vecs = [(f"step {sel[i % len(sel)]} block", src.vector(1024, device, index=i)) for i in range(2)]
    var = variance_study.run(vecs, list(VARIANCE_SPECS), out, 50 if quick else 200, seed, progress)
    parts.append(
        "## Variance vs closed-form bounds on the dump's gradients\n\nMonte Carlo E||C(g) - g||^2/||g||^2 "
        "(99 % interval) on the block of 1024 coordinates of largest norm, next to each compressor's closed "
        "form; equalities (DQSG's exact variance, Wangni's, the half-dithered one) are compared as "
        "equalities.\n\n"
        + _md_table(
            var,
            [
                "compressor",
                "vector",
                "empirical",
                "ci_low",
                "ci_high",
                "bound",
                "bound_name",
                "theory_over_empirical",
                "verdict",
            ],
        )
        + "\n"
    )
    echo("feedback ...")
    fb = feedback_study.run(
        src, [0], out, "qcs:block=256,k=64,Q=4", list(BETAS), 4096, 20, 4 if quick else 8, device, progress
    )
    g = fb["gamma"].iloc[0]
    parts.append(
        f"## Error feedback: residual vs eta(beta)\n\nUnbiased QCS (n = 256, k = 64, Q = 4, gamma = {g:.4g}) "
        "with weighted feedback (14) on 20 consecutive gradient blocks of 4096 coordinates (cycling through "
        "the analysed steps); empirical: max over t of the seed-mean of ||r_t||^2/B, B = max ||g_t||^2. "
        f"Theory: eta (15), beta* = {fb['beta_star'].iloc[0]:.4g}, eta* = {fb['eta_star'].iloc[0]:.4g} "
        "(17); inf = outside the lemma's range of beta.\n\n"
        + _md_table(fb, ["beta", "empirical", "ci_low", "ci_high", "eta", "eta_reason", "verdict"])
        + "\n"
        + _img("feedback_eta_vs_beta", "eta vs beta")
    )
    fbm = feedback_study.run(
        src,
        [0],
        out,
        "qcs:block=256,k=64,Q=4,alpha=mmse",
        list(BETAS),
        4096,
        20,
        4 if quick else 8,
        device,
        progress,
        stem="feedback_mmse",
    )
    parts.append(
        "The same for MMSE-QCS (alpha = 1/(gamma+1)) against (16) as printed (inf where its base is <= 0) "
        f"and (18): beta* = 1, eta* = {fbm['eta_star'].iloc[0]:.4g}; Karimireddy et al.'s eta_k = "
        f"{fbm['eta_karimireddy'].iloc[0]:.4g}. The paper says every 0 <= beta <= 1 keeps the MMSE residual "
        "bounded; the measured residual agrees, and stays below `eta_minkowski`, the bound derived from "
        "Lemma 3 for every beta (see the disagreements section).\n\n"
        + _md_table(fbm, ["beta", "empirical", "ci_low", "ci_high", "eta", "eta_minkowski", "verdict"])
        + "\n"
        + _img("feedback_mmse_eta_vs_beta", "eta vs beta, MMSE-QCS")
    )
    return parts, summ


def _approx_on_dump(summary: pd.DataFrame | None) -> str:
    """One sentence comparing the exact and approximate gamma quantile on the dump (threshold study)."""
    if summary is None or summary.empty:
        return ""
    ex = summary[summary["estimator"] == "sidco-gamma-M1"].set_index("ratio")["mean"]
    ap = summary[summary["estimator"] == "sidco-gamma-M1-approx"].set_index("ratio")["mean"]
    if ex.empty or ap.empty:
        return ""
    pairs = ", ".join(f"delta = {r:g}: {ex[r]:.3g} exact vs {ap[r]:.3g} approximate" for r in ex.index if r in ap.index)
    return (
        f" On this dump's gradients (single-stage gamma, mean k_hat/k): {pairs}; there the gamma law itself "
        "does not fit the tail (see the tail check), so neither is 1."
    )


def _disagreements(val: pd.DataFrame, thresholds: pd.DataFrame | None = None) -> str:
    """The known disagreements between the papers, THEORY.md and what the checks measure, stated plainly."""

    def row(name: str) -> pd.Series | None:
        r = val[val["check"] == name]
        return None if r.empty else r.iloc[0]

    lines = ["## Known disagreements with the papers\n"]
    r = row("sidco-binomial-gamma")
    if r is not None and not math.isnan(r["empirical"]):
        from gradstat.analysis.measure.intervals import mean_ci
        from gradstat.analysis.validation.checks.sidco import RATIO, D, k_ratio_samples

        approx = mean_ci(k_ratio_samples("gamma", "mle", "approx", 30, 0, torch.device("cpu")))
        lines.append(
            f"- **SIDCo's closed-form gamma fit is biased.** With |g| drawn from a gamma law (shape 0.5) and "
            f"the exact quantile, the closed-form shape estimate (Cor. 1.2) gives k_hat/k = "
            f"{r['empirical']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] at delta = {RATIO} (verdict "
            f"{r['verdict']}, tolerance 0.01); the exact MLE meets the binomial law. The paper's further "
            "approximation of the quantile, -beta (log delta + log Gamma(alpha)), (15), is an upper bound of "
            f"the threshold and selects far fewer than k elements: k_hat/k = {approx} in the same setting "
            f"(d = {D}, MLE fit, 30 trials)." + _approx_on_dump(thresholds)
        )
    lines.append(
        "- **QCS eq. (16) as printed** has base sqrt(gamma+1) - (1-beta)^2 - sqrt(gamma), which is <= 0 for "
        "small beta (e.g. gamma = 1, beta < 0.36): no bound there (reported as inf), although the paper's "
        "text says every 0 <= beta <= 1 is viable for MMSE-QCS and the measured MMSE residual stays bounded "
        "and *decreases* with beta (table above). A reading consistent with the text and with (18) is "
        "base = sqrt(gamma+1) - (1-beta) sqrt(gamma+1) - beta sqrt(gamma) = beta (sqrt(gamma+1) - sqrt(gamma)), "
        "i.e. eta = gamma / (beta^2 (sqrt(gamma+1) - sqrt(gamma))^2): it is what Minkowski's inequality gives "
        "for r_{t+1} = (1-beta) r_t + e_t with E||e||^2 <= (1-alpha) E||g + beta r||^2, it equals (18)'s "
        "eta_m* at beta = 1 and is minimised there. It is implemented as "
        "`theory.qcs.residual_bound_mmse_minkowski` (valid for every beta in (0, 1], attained by the "
        "compressor C(z) = (1 - sqrt(1-alpha)) z on a constant gradient, so it cannot be tightened without "
        "further assumptions), shown as `eta_minkowski` in the MMSE feedback table and checked at beta = 0.2 "
        "by `qcs-feedback-mmse-minkowski`; (16) as printed stays the reported `eta`. At beta = 1 both equal "
        "eta_m*, which the measured residual respects by a wide margin (validation table)."
    )
    lines.append(
        "- **QCS 1-bit variant (5)** read literally (q = sign(v/s + u), v_hat = s (q - u)) has mean 2v; the "
        "compressor uses the midrise reading (points +-1/2), under which Theorem 1 holds (compressors/dither.py)."
    )
    r = row("gmc-memory")
    if r is not None and not math.isnan(r["empirical"]):
        lines.append(
            f"- **GMC Theorem 9 is very loose**: 4 (d - s)(2d + s) G^2 / s^2 exceeds the measured memory "
            f"norm by a factor {r['theory_over_empirical']:.3g} (d = 1000, s = 10, 4 workers, beta = 0)."
        )
    r = row("ndqsg-failure")
    if r is not None and not math.isnan(r["empirical"]):
        lines.append(
            f"- **NDQSG Theorem 6** is a Chebyshev bound: {r['theory']:.3g} against a measured failure rate "
            f"{r['empirical']:.3g} ({r['note'].split('; ')[-1]})."
        )
    lines.append(
        "- **DQSG vs QSGD variance** (002 Sec. 2.1.1): the half-dithered (QSGD-style) quantizer has "
        "data-dependent variance, twice the dithered one for uniform data; the checks `dqsg-exact` and "
        "`half-dither-exact` confirm both closed forms on the same vectors."
    )
    return "\n".join(lines) + "\n"


def demo(
    out: str | Path,
    workload: str = "lenet",
    steps: int = 3,
    workers: int = 2,
    quick: bool = False,
    device: torch.device | str = "cpu",
    seed: int = 0,
    progress: bool = True,
    echo: Callable[[str], None] = print,
) -> tuple[Path, bool]:
    """Record ``steps`` training iterations of ``workload`` with ``workers`` workers into ``<out>/dump`` (kept, for
    the other commands; a dump already there is refused, never replaced), then write the report into ``out``."""
    from gradstat.analysis.training.recorder import record

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dump_dir = out / "dump"
    echo(f"recording {steps} iterations of {workload} with {workers} workers into {dump_dir} ...")
    record(workload, steps, workers=workers, out=dump_dir, seed=seed, progress=progress, device=device)
    command = (
        f"gradstat demo --out {out} --workload {workload} --iterations {steps} --workers {workers} --seed {seed}"
        + (" --quick" if quick else "")
    )
    return write_report(str(dump_dir), out, quick, None, device, seed, progress, echo, command)


def _timed(echo: Callable[[str], None], t0: float) -> Callable[[str], None]:
    """``echo`` with the elapsed time in front of section messages (lines ending in '...')."""

    def out(msg: str) -> None:
        echo(f"[{time.perf_counter() - t0:5.0f} s] {msg}" if msg.endswith("...") else msg)

    return out

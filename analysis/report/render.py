"""Rows -> Markdown: the report rendered from a :class:`~gradstat.analysis.report.data.ReportData` alone.

Every sentence that states a result takes its numbers, verdicts and set-up from the rows of the run; a section
whose table did not run is absent, and a finding about a check appears only when that check's row is there.
Sentences that only define a column or a formula carry no result.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from gradstat.analysis.measure.tables import plain, to_markdown
from gradstat.analysis.report.data import ReportData


# -- small formatting helpers ---------------------------------------------------------------------------------------
def num(v: object, digits: int = 4) -> str:
    """A value as text (``inf`` / ``n/a`` for non-finite)."""
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(v)
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "inf"
    return f"{x:.{digits}g}"


def interval(row: pd.Series) -> str:
    """``0.5 [0.4, 0.6]``, or ``0.5 (one measurement)`` for a deterministic one (no interval)."""
    if bool(row.get("deterministic", False)) or pd.isna(row.get("ci_low")):
        return f"{num(row['empirical'])} (one measurement)"
    return f"{num(row['empirical'])} [{num(row['ci_low'])}, {num(row['ci_high'])}]"


def setup_of(row: pd.Series) -> dict[str, str]:
    """The ``setup`` cell of a validation row (``k=v; k=v``) as a dict."""
    text = row.get("setup", "")
    if not isinstance(text, str) or not text:
        return {}
    return dict(part.split("=", 1) for part in text.split("; ") if "=" in part)


def _img(name: str, alt: str) -> str:
    return f"![{alt}]({name}.png)\n\n*Data: [{name}.csv]({name}.csv)*\n"


def _table(df: pd.DataFrame, columns: list[str]) -> str:
    return to_markdown(df[[c for c in columns if c in df.columns]])


def _names(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


# -- sections -------------------------------------------------------------------------------------------------------
def header(data: ReportData) -> str:
    h = data.header
    text = (
        f"# gradstat report\n\nGenerated {h.get('generated', '?')} UTC by `gradstat` on {h.get('machine', '?')} "
        f"({h.get('device', '?')}), torch {h.get('torch', '?')}, {h.get('size', '?')} Monte Carlo sizes, base seed "
        f"{h.get('seed', '?')}. Every figure has its data in the CSV of the same name; every table is also a CSV.\n"
    )
    if h.get("command"):
        text += f"\nRegenerate with `{h['command']}`.\n"
    return text


def setup(data: ReportData) -> str:
    if data.setup is None:
        return ""
    s = data.setup
    return (
        f"## Setup\n\nDump of workload **{s['workload']}**, {int(s['numel']):,} parameters in {s['tensors']} tensors, "
        f"{s['workers']} worker(s), steps {', '.join(map(str, s['steps']))} analysed (recorded: {s['recorded']}, "
        f"every {s.get('every')}). Optimizer: {plain(s.get('optimizer'))}.\n"
    )


def fits(data: ReportData) -> str:
    if not data.ran("fits"):
        return ""
    info = data.info.get("fits", {})
    zero = info.get("zero_fraction")
    table = data.table("fits")
    best = table.sort_values("aic_rank").groupby("method", sort=False).head(1) if "aic_rank" in table else None
    found = ""
    if best is not None and not best.empty:
        found = (
            " Best AIC by estimator: " + "; ".join(f"{r['method']}: {r['family']}" for _, r in best.iterrows()) + "."
        )
    return (
        f"## Distribution of gradient magnitudes\n\nFits of |g| of the whole model (worker {info.get('worker', 0)}) by "
        f"each family and estimator, averaged over steps {', '.join(map(str, info.get('steps', [])))} (`fits.csv` has "
        "every step). `ks`/`ad`: Kolmogorov-Smirnov and Anderson-Darling statistics on a fixed-seed subsample of "
        "20,000 nonzero values; `aic_rank`: 1 = best AIC among the families for that estimator; `tail_delta`: count "
        "of |g| above the fitted (1 - delta) quantile over d delta (1 = the fit's tail is right); `p`: the "
        "compressibility exponent of the sorted magnitudes (SIDCo Def. 1)."
        + (f" {num(100 * float(zero), 3)} % of the coordinates are exactly 0." if zero is not None else "")
        + found
        + "\n\n"
        + to_markdown(data.table("fits"))
        + "\n"
        + "".join(_img(stem, alt) for stem, alt in info.get("figures", []))
    )


def thresholds(data: ReportData) -> str:
    if not data.ran("thresholds"):
        return ""
    info = data.info.get("thresholds", {})
    missing = info.get("missing", [])
    return (
        f"## Threshold quality\n\nk_hat/k of each threshold estimator over steps "
        f"{', '.join(map(str, info.get('steps', [])))}: mean, central 90 % interval over steps, and the central "
        "90 % band of Binomial(d, delta)/k that a perfect fit would give (SIDCo App. C).\n\n"
        + to_markdown(data.table("thresholds"))
        + "\n"
        + (f"Not run (compressor not available): {', '.join(missing)}.\n\n" if missing else "")
        + _img("threshold_k_ratio", "k_hat / k")
    )


def replays(data: ReportData) -> str:
    if not data.ran("replays"):
        return ""
    info = data.info.get("replays", {})
    df = data.table("replays")
    chosen = info.get("chosen", False)
    gains = "; ".join(f"`{r['compressor']}` ({r['feedback']}): {num(r['gain'], 3)}" for _, r in df.iterrows())
    intro = (
        "the compressors given with `--compressor`"
        if chosen
        else "default groups compared at matched gain, each with its paper's partitioning (QSGD buckets of 512; "
        "DQSG with one scale per 512 coordinates, its K partitions of (4); QCS blocks of 256 at the (k, Q) of "
        "least gamma for the group's gain; Top-k and SIDCo at the same ratio, with error feedback)"
    )
    return (
        f"## Compressors replayed on the dump\n\n{intro[0].upper() + intro[1:]}, "
        f"with their feedback and per-worker state over steps {', '.join(map(str, info.get('steps', [])))} and "
        f"{info.get('workers', '?')} worker(s); means over steps and {info.get('seeds', '?')} seed(s). Measured gain "
        f"(32 d / exact bits per worker): {gains}. `rel_error`: ||z - z_hat||^2/||z||^2 per worker (z = the "
        "compensated gradient); `agg_rel_error`: the averaged update against the full-precision average; `bias`: "
        "<z_hat - z, z>/||z||^2.\n\n" + to_markdown(df) + "\n*Per step: [compress_steps.csv](compress_steps.csv)*\n"
    )


def variance(data: ReportData) -> str:
    if not data.ran("variance"):
        return ""
    df = data.table("variance")
    counts = df["verdict"].value_counts()
    summary = ", ".join(
        f"{int(counts[v])} {v}" for v in ("holds", "tight", "violated", "not applicable") if v in counts
    )
    return (
        "## Variance vs closed-form bounds on the dump's gradients\n\nMonte Carlo E||C(g) - g||^2/||g||^2 (99 % "
        f"interval, {int(df['trials'].iloc[0])} trials) on the blocks named in `vector`, next to each compressor's "
        f"closed form; equalities are compared as equalities. Verdicts: {summary}.\n\n"
        + _table(
            df,
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


def _feedback_setup(df: pd.DataFrame, info: dict) -> str:
    steps = df["steps"].astype(int)
    t = f"T = {steps.min()}" if steps.nunique() == 1 else f"T = {steps.min()} to {steps.max()} steps by beta"
    return (
        f"blocks of n = {info.get('n', '?')} coordinates ({info.get('vectors', '?')}), {t} (each beta replays until "
        f"(1 - beta)^T <= 1e-4, when the residual has settled), {int(df['workers'].iloc[0]) if 'workers' in df else 1} "
        f"worker(s) averaged, {int(df['seeds'].iloc[0])} seeds"
    )


def feedback(data: ReportData) -> str:
    parts = []
    if data.ran("feedback"):
        df, info = data.table("feedback"), data.info.get("feedback", {})
        first = df.iloc[0]
        counts = df["verdict"].value_counts()
        parts.append(
            f"## Error feedback: residual vs eta(beta)\n\n`{info.get('spec', '?')}` (gamma = {num(first['gamma'])}) "
            f"with weighted feedback (14) on {_feedback_setup(df, info)}; empirical: max over t of the seed-mean of "
            f"||r_t||^2/B, B = max ||g_t||^2. Theory: eta (15); beta* = {num(first['beta_star'])}, eta* = "
            f"{num(first['eta_star'])} (17); inf = outside the lemma's range of beta. Verdicts over "
            f"{len(df)} values of beta: "
            + ", ".join(f"{int(counts[v])} {v}" for v in counts.index)
            + ".\n\n"
            + _table(df, ["beta", "steps", "empirical", "ci_low", "ci_high", "eta", "eta_reason", "verdict"])
            + "\n"
            + _img("feedback_eta_vs_beta", "eta vs beta")
        )
    if data.ran("feedback_mmse"):
        df, info = data.table("feedback_mmse"), data.info.get("feedback_mmse", {})
        first = df.iloc[0]
        below = int((df["empirical"] <= df["eta_minkowski"]).sum())
        no_bound = df[~np.isfinite(df["eta"].astype(float))]["beta"].tolist()
        text = (
            f"`{info.get('spec', '?')}` (MMSE-QCS, gamma = {num(first['gamma'])}) on {_feedback_setup(df, info)}, "
            f"against (16) as printed and (18): beta* = 1, eta* = {num(first['eta_star'])}; Karimireddy et al.'s "
            f"eta_k = {num(first['eta_karimireddy'])} applies at beta = 1 only. The measured residual is below "
            f"`eta_minkowski` at {below} of {len(df)} values of beta"
            + (
                f"; (16) as printed gives no bound at beta = {', '.join(num(b, 3) for b in no_bound)}"
                if no_bound
                else ""
            )
            + ".\n\n"
        )
        parts.append(
            ("" if parts else "## Error feedback: residual vs eta(beta)\n\n")
            + text
            + _table(df, ["beta", "steps", "empirical", "ci_low", "ci_high", "eta", "eta_minkowski", "verdict"])
            + "\n"
            + _img("feedback_mmse_eta_vs_beta", "eta vs beta, MMSE-QCS")
        )
    return "\n".join(parts)


def variance_gain(data: ReportData) -> str:
    if not data.ran("variance_gain"):
        return ""
    info = data.info.get("variance_gain", {})
    df = data.table("variance_gain")
    return (
        "## Variance vs compression gain (QCS Fig. 3)\n\nLines: the closed-form variance factor of each scheme at a "
        "given gain (QCS: the least gamma (10) over (k, Q) meeting gain (11); QSGD: Lemma 3.1 at its gain "
        "32/log2(2s+1); Wangni: uniform keep probability, each value sent with its index). Circles: the measured "
        f"relative error of {len(df)} settings on a block of {info.get('n', '?')} coordinates "
        f"({info.get('vectors', '?')}), {int(df['trials'].iloc[0])} trials, 99 % intervals; the measured gain counts "
        "codes only, as (11) does (`exact_gain` in the CSV counts every scale and seed sent).\n\n"
        + _img("variance_vs_gain", "variance vs gain")
    )


_KINDS = (("dump", "dump"), ("synthetic", "synthetic"), ("constructed", "constructed"))


def _vector_kinds(val: pd.DataFrame) -> str:
    kinds = []
    for prefix, word in _KINDS:
        n = int(val["vectors"].astype(str).str.startswith(prefix).sum())
        if n:
            kinds.append(f"{n} on {word} vectors")
    return ", ".join(kinds) or "no vectors recorded"


def validation(data: ReportData) -> str:
    if not data.ran("validation"):
        return ""
    val = data.table("validation")
    info = data.info.get("validation", {})
    dumps = sorted({v.split(" (")[0].split(" step")[0] for v in val["vectors"].astype(str) if v.startswith("dump")})
    title = f"## Validation: {len(val)} checks, {_vector_kinds(val)}" + (f" ({', '.join(dumps)})" if dumps else "")
    by = {v: val[val["verdict"] == v]["check"].tolist() for v in ("holds", "tight", "violated", "not applicable")}
    failed = val[(val["verdict"] == "violated") & val["must_hold"].astype(bool)]["check"].tolist()
    summary = f"{len(by['holds'])} hold"
    for v in ("tight", "violated", "not applicable"):
        if by[v]:
            summary += f", {len(by[v])} {v} ({_names(by[v])})"
    summary += "."
    if failed:
        summary += f" Must hold and violated: {_names(failed)}."
    reported = val[~val["must_hold"].astype(bool)]["check"].tolist()
    shown = val.assign(
        interval=[
            "one measurement" if bool(r.get("deterministic", False)) else f"[{num(r['ci_low'])}, {num(r['ci_high'])}]"
            for _, r in val.iterrows()
        ],
        ratio=val["theory_over_empirical"],
    )
    return (
        f"{title}\n\nEach claim of the papers as a Monte Carlo experiment with fixed seeds and "
        f"{num(100 * float(val['level'].dropna().iloc[0]) if val['level'].notna().any() else 99, 3)} % intervals "
        f"({info.get('size', '?')} sizes). `vectors` says what each row ran on. {summary}"
        + (f" Reported, not required: {_names(reported)}." if reported else "")
        + " Verdicts: *holds* (interval entirely on the right side of the bound), *tight* (the interval touches the "
        "bound), *violated* (entirely on the wrong side); an equality holds when the interval meets the value within "
        "the row's tolerance. `ratio` = theory / empirical.\n\n"
        + _table(
            shown,
            [
                "check",
                "source",
                "claim",
                "vectors",
                "theory",
                "empirical",
                "interval",
                "trials",
                "ratio",
                "verdict",
                "must_hold",
                "note",
            ],
        )
        + "\n*Data: [validation.csv](validation.csv) (with the paper file of each source in `paper_file`)*\n"
    )


# -- findings: one generator per known disagreement, each from the rows it is about ---------------------------------
Finding = tuple[str, bool]
"""A finding's text and whether it is a disagreement with the paper (from the verdicts of its rows)."""


def _sidco_gamma(data: ReportData) -> Finding | None:
    r = data.check("sidco-binomial-gamma")
    if r is None or pd.isna(r["empirical"]):
        return None
    s = setup_of(r)
    where = f"{r['vectors']}, delta = {s.get('delta', '?')}"
    if r["verdict"] == "violated":
        text = (
            f"**SIDCo's closed-form gamma fit (Cor. 1.2) is biased in this run**: k_hat/k = {interval(r)} over "
            f"{int(r['trials'])} trials ({where}), outside 1 +- {num(r['tolerance'], 2)}"
        )
    else:
        text = (
            f"**SIDCo's closed-form gamma fit (Cor. 1.2)** meets the binomial law within +- {num(r['tolerance'], 2)} "
            f"in this run ({r['verdict']}): k_hat/k = {interval(r)} over {int(r['trials'])} trials ({where})"
        )
    mle = data.check("sidco-binomial-gamma-mle")
    if mle is not None and not pd.isna(mle["empirical"]):
        text += f"; the exact MLE gives {interval(mle)} ({mle['verdict']})"
    text += "." + _approx_on_dump(data)
    return text, r["verdict"] == "violated"


def _approx_on_dump(data: ReportData) -> str:
    if not data.ran("thresholds"):
        return ""
    t = data.table("thresholds")
    ex = t[t["estimator"] == "sidco-gamma-M1"].set_index("ratio")["mean"]
    ap = t[t["estimator"] == "sidco-gamma-M1-approx"].set_index("ratio")["mean"]
    common = [r for r in ex.index if r in ap.index]
    if not common:
        return ""
    pairs = [f"delta = {r:g}: {num(ex[r], 3)} exact vs {num(ap[r], 3)} approximate" for r in common]
    fewer = [r for r in common if ap[r] < ex[r]]
    more = [r for r in common if ap[r] > ex[r]]
    verdict = []
    if fewer:
        verdict.append(f"the approximate quantile (15) keeps fewer at delta = {', '.join(f'{r:g}' for r in fewer)}")
    if more:
        verdict.append(f"more at delta = {', '.join(f'{r:g}' for r in more)}")
    return (
        " On this dump (single-stage gamma, mean k_hat/k, threshold table): "
        + "; ".join(pairs)
        + (f" ({', '.join(verdict)})." if verdict else ".")
    )


def _mmse_printed(data: ReportData) -> Finding | None:
    lines, disagree = [], False
    if data.ran("feedback_mmse"):
        df = data.table("feedback_mmse").sort_values("beta")
        gam = float(df["gamma"].iloc[0])
        no_bound = df[~np.isfinite(df["eta"].astype(float))]
        emp = df["empirical"].to_numpy()
        trend = (
            "decreases as beta grows"
            if np.all(np.diff(emp) <= 0)
            else "increases with beta"
            if np.all(np.diff(emp) >= 0)
            else "is not monotone in beta"
        )
        if not no_bound.empty:
            disagree = True
            lines.append(
                f"**QCS eq. (16) as printed** gives no bound for MMSE-QCS (gamma = {num(gam)}) at beta = "
                f"{', '.join(num(b, 3) for b in no_bound['beta'])} (its base sqrt(gamma+1) - (1-beta)^2 - sqrt(gamma) "
                "is <= 0 there), yet the measured residual stays bounded there "
                f"(max {num(no_bound['empirical'].max())}) "
                f"and {trend} (MMSE feedback table)"
            )
        else:
            lines.append(f"The measured MMSE-QCS residual (gamma = {num(gam)}) {trend} (MMSE feedback table)")
        below = int((df["empirical"] <= df["eta_minkowski"]).sum())
        lines.append(
            f"it is below eta_minkowski = gamma / (beta^2 (sqrt(gamma+1) - sqrt(gamma))^2), the bound Minkowski's "
            f"inequality gives from Lemma 3 and (14), at {below} of {len(df)} values of beta"
        )
    r = data.check("qcs-feedback-mmse-minkowski")
    if r is not None and not pd.isna(r["empirical"]):
        s = setup_of(r)
        lines.append(
            f"`qcs-feedback-mmse-minkowski` checks it at beta = {s.get('beta', '?')}: {interval(r)} against "
            f"{num(r['theory'])} ({r['verdict']})"
        )
        disagree = disagree or r["verdict"] == "violated"
    if not lines:
        return None
    return "; ".join(lines) + ".", disagree


def _mmse_beta1(data: ReportData) -> Finding | None:
    r = data.check("qcs-feedback-mmse")
    if r is None or pd.isna(r["empirical"]) or not data.ran("feedback_mmse"):
        return None
    df = data.table("feedback_mmse")
    at1 = df[df["beta"] == 1.0]
    if at1.empty:
        return None
    t = at1.iloc[0]
    s = setup_of(r)
    info = data.info.get("feedback_mmse", {})
    table = {
        "block length n": str(info.get("n", "?")),
        "steps T": str(int(t["steps"])),
        "workers": str(int(t.get("workers", 1))),
    }
    row = {"block length n": s.get("n", "?"), "steps T": s.get("T", "?"), "workers": s.get("workers", "?")}
    differ = [k for k in table if table[k] != row[k]]
    respected = [name for name, v in (("validation", r["verdict"]), ("table", t["verdict"])) if v == "holds"]
    return (
        f"**MMSE-QCS at beta = 1 in two places**: the validation row `qcs-feedback-mmse` measures {interval(r)} "
        f"({', '.join(f'{k} = {row[k]}' for k in row)}, {r['vectors']}); the MMSE feedback table measures "
        f"{num(t['empirical'])} [{num(t['ci_low'])}, {num(t['ci_high'])}] "
        f"({', '.join(f'{k} = {table[k]}' for k in table)}, {info.get('vectors', '?')}). "
        + (
            f"The set-ups differ in {', '.join(differ)} and in the vectors"
            if differ
            else "The set-ups differ in the vectors"
        )
        + f"; eta* = {num(r['theory'])} holds in {len(respected)} of the 2 ({', '.join(respected) or 'neither'})."
    ), "violated" in (r["verdict"], t["verdict"])


def _gmc(data: ReportData) -> Finding | None:
    r = data.check("gmc-memory")
    rec = data.check("gmc-memory-recursion")
    parts, disagree = [], False
    if r is not None and not pd.isna(r["empirical"]):
        s = setup_of(r)
        ratio = float(r["theory_over_empirical"])
        relation = (
            f"the bound is {num(ratio, 3)} times the measured memory"
            if ratio >= 1
            else f"the measured memory is {num(1 / ratio, 3)} times the bound"
        )
        parts.append(
            f"**GMC Theorem 9** (d = {s.get('d')}, s = {s.get('s')}, p = {s.get('p')}, T = {s.get('T')}, "
            f"{s.get('masks')} masks, beta = {s.get('beta')}): 4 (d - s)(2d + s) G^2 / s^2 = {num(r['theory'])} "
            f"against the measured memory {interval(r)}: {relation} ({r['verdict']}"
            + ("" if bool(r["must_hold"]) else ", reported")
            + ")"
        )
        disagree = r["verdict"] == "violated"
    if rec is not None and not pd.isna(rec["empirical"]):
        parts.append(
            f"GMC's memory against Algorithm 1's recursion computed independently: {interval(rec)} against "
            f"{num(rec['theory'])} ({rec['verdict']})"
        )
        disagree = disagree or rec["verdict"] == "violated"
    return (("; ".join(parts) + "."), disagree) if parts else None


def _ndqsg(data: ReportData) -> Finding | None:
    r = data.check("ndqsg-failure")
    cheb = data.check("ndqsg-failure-chebyshev")
    if r is None and cheb is None:
        return None
    parts = []
    if r is not None and not pd.isna(r["empirical"]):
        parts.append(
            f"**NDQSG decoding failures** ({r['vectors']}): measured rate {interval(r)} against the exact "
            f"Gaussian probability averaged per trial, {num(r['theory'])} ({r['verdict']})"
        )
    if cheb is not None and not pd.isna(cheb["empirical"]):
        parts.append(
            f"Theorem 6's Chebyshev bound (8) is {num(cheb['theory'])}, {num(cheb['theory_over_empirical'], 3)} times "
            f"the measured rate ({cheb['verdict']}; reported, not required)"
        )
    failed = any(x is not None and x["verdict"] == "violated" for x in (r, cheb))
    return ("; ".join(parts) + ".", failed) if parts else None


def _dither(data: ReportData) -> Finding | None:
    d, h = data.check("dqsg-exact"), data.check("half-dither-exact")
    if d is None or h is None or pd.isna(d["empirical"]) or pd.isna(h["empirical"]):
        return None
    both = d["verdict"] == "holds" and h["verdict"] == "holds"
    text = (
        f"**DQSG vs QSGD-style (half-dithered) variance** (DQSG Sec. 2.1.1) on {d['vectors']}: dithered "
        f"{interval(d)} against its exact {num(d['theory'])} ({d['verdict']}), half-dithered {interval(h)} against "
        f"{num(h['theory'])} ({h['verdict']}); ratio {num(float(h['empirical']) / float(d['empirical']), 3)}"
    )
    violated = "violated" in (d["verdict"], h["verdict"])
    return text + ("; both closed forms are confirmed on the same vectors." if both else "."), violated


def _tight_or_violated(data: ReportData) -> Finding | None:
    if not data.ran("validation"):
        return None
    val = data.table("validation")
    rows = val[val["verdict"].isin(["tight", "violated"])]
    if rows.empty:
        return None
    return (
        "**Bounds reached in this run**: "
        + "; ".join(
            f"`{r['check']}` {interval(r)} against {num(r['theory'])} "
            f"({r['verdict']}{'' if r['must_hold'] else ', reported'})"
            for _, r in rows.iterrows()
        )
        + ".",
        bool((rows["verdict"] == "violated").any()),
    )


FINDINGS = (_tight_or_violated, _sidco_gamma, _mmse_printed, _mmse_beta1, _gmc, _ndqsg, _dither)


def findings(data: ReportData) -> str:
    """The findings of this run, each generated from the rows it is about: those where the measurement disagrees
    with the paper (a violated claim, an equation that gives no bound where the measured quantity is bounded) under
    "Known disagreements with the papers", the others under "Other findings"."""
    found = [f for f in (g(data) for g in FINDINGS) if f]
    out = []
    for title, wanted in (
        ("Known disagreements with the papers, as measured in this run", True),
        ("Other findings of this run", False),
    ):
        bullets = [text for text, disagrees in found if disagrees == wanted]
        if bullets:
            out.append(f"## {title}\n\n" + "\n".join(f"- {b}" for b in bullets) + "\n")
    return "\n".join(out)


def related(data: ReportData) -> str:
    if not data.related:
        return ""
    items = "\n".join(f"- [{what}]({link})" for what, link in data.related.items())
    return f"## Other results beside this report\n\n{items}\n"


def references(text: str) -> str:
    """The reference list of a rendered report: every paper its text cites (authors, title, venue, year)."""
    from gradstat.theory.sources import cited_in

    papers = cited_in(text)
    if not papers:
        return ""
    return "## References\n\n" + "\n".join(f"- {p.key}: {p.full}." for p in papers) + "\n"


def footer(data: ReportData) -> str:
    return "" if data.seconds is None else f"\n---\nTotal time {data.seconds:.0f} s.\n"


SECTIONS = (
    header,
    setup,
    fits,
    thresholds,
    replays,
    variance,
    feedback,
    variance_gain,
    validation,
    findings,
    related,
    footer,
)


def render(data: ReportData) -> str:
    """The report as Markdown: each section of :data:`SECTIONS` that has data, in order."""
    body = "\n".join(s for s in (section(data) for section in SECTIONS[:-1]) if s)
    return "\n".join(s for s in (body, references(body), SECTIONS[-1](data)) if s)

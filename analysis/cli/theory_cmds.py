"""``gradstat theory ...``: evaluate the papers' closed forms for given parameters.

Each command prints an aligned table of (quantity, value, source) rows, or with ``--json`` a JSON list of
``{"quantity", "value", "source", "paper_file", "note"}`` objects (non-finite values become ``null`` with the reason
in ``note``). Sources read like "QCS (Abdi & Fekri) Thm 2 (10)" (:func:`gradstat.theory.sources.cite`); the paper's
file follows in brackets in the table and in ``paper_file`` in JSON. The maths lives in ``theory``; this module
only collects and formats it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from gradstat.analysis.cli.options import Distribution, HelpGroup, law_help
from gradstat.theory.sources import cite, file_of

if TYPE_CHECKING:
    from gradstat.theory import qcs

QCS = cite("QCS")
NDQ = cite("NDQSG")
DQ = cite("DQSG")
SID = cite("SIDCo")
_KEYS = {QCS: "QCS", NDQ: "NDQSG", DQ: "DQSG", SID: "SIDCo"}


@dataclass(frozen=True)
class Row:
    quantity: str
    value: float | int | str | None
    source: str
    note: str = ""


def _fmt(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _paper_file(source: str) -> str:
    """The seed file of the paper a source cites ("" for papers not kept as a file)."""
    for label, key in _KEYS.items():
        if label in source:
            return file_of(key)
    return ""


def _jsonable(row: Row) -> dict[str, object]:
    value, note = row.value, row.note
    if isinstance(value, float) and not math.isfinite(value):
        value, note = None, note or f"value is {row.value}"
    return {
        "quantity": row.quantity,
        "value": value,
        "source": row.source,
        "paper_file": _paper_file(row.source),
        "note": note,
    }


def _emit(rows: list[Row], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([_jsonable(r) for r in rows], indent=2))
        return
    header = ("quantity", "value", "source")
    cells = [
        (
            r.quantity,
            _fmt(r.value),
            r.source
            + (f"  [{_paper_file(r.source)}]" if _paper_file(r.source) else "")
            + (f"  [{r.note}]" if r.note else ""),
        )
        for r in rows
    ]
    w0 = max(len(header[0]), *(len(c[0]) for c in cells))
    w1 = max(len(header[1]), *(len(c[1]) for c in cells))
    click.echo(f"{header[0]:<{w0}}  {header[1]:>{w1}}  {header[2]}")
    for q, v, s in cells:
        click.echo(f"{q:<{w0}}  {v:>{w1}}  {s}")


def _bound_row(name: str, bound: qcs.ResidualBound, source: str) -> Row:
    return Row(name, bound.value, source, "" if bound.valid else f"no bound: {bound.reason}")


json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
bits_option = click.option(
    "--bits", "value_bits", default=32, show_default=True, help="Bits per uncompressed value (b)."
)


def _qcs_rows(n: int, k: int, Q: int, value_bits: int) -> list[Row]:
    from gradstat.theory import qcs

    gam = qcs.gamma(n, k, Q)
    beta_u, eta_u = qcs.optimal_feedback_unbiased(gam)
    beta_m, eta_m = qcs.optimal_feedback_mmse(gam)
    return [
        Row("gamma (variance factor)", gam, f"{QCS} Thm 2 (10)"),
        Row("gain (scale ignored)", qcs.gain(n, k, Q, value_bits), f"{QCS} (11)"),
        Row(
            "exact gain (ceil codes + 32-bit scale + 64-bit seed)",
            qcs.exact_gain(n, k, Q, value_bits),
            f"{QCS} (11), Alg. 1",
        ),
        Row("MMSE alpha", qcs.mmse_alpha(gam), f"{QCS} (12)"),
        Row("MMSE error factor 1 - alpha", qcs.mmse_error_factor(gam), f"{QCS} Lemma 3 (13)"),
        Row("beta_u*", beta_u, f"{QCS} (17)"),
        Row("eta_u*", eta_u, f"{QCS} (17)"),
        Row("beta_m*", beta_m, f"{QCS} (18)"),
        Row("eta_m*", eta_m, f"{QCS} (18)"),
        Row("eta_k (Karimireddy et al.)", qcs.karimireddy_residual_bound(gam), f"{QCS} Remark 3"),
    ]


@click.group("theory", cls=HelpGroup)
def theory_group() -> None:
    """Closed forms of the papers, evaluated for given parameters (values with their sources)."""


@theory_group.command("qcs")
@click.option("--n", "n", type=int, required=True, help="Block length n.")
@click.option("--k", "k", type=int, required=True, help="Rows kept k (1 <= k <= n).")
@click.option("--Q", "Q", type=int, required=True, help="Quantizer range Q (codes in -Q..Q).")
@bits_option
@json_option
def qcs_cmd(n: int, k: int, Q: int, value_bits: int, as_json: bool) -> None:
    """QCS variance factor, gains, MMSE scale and optimal feedback for (n, k, Q)."""
    _emit(_qcs_rows(n, k, Q, value_bits), as_json)


@theory_group.command("qcs-optimal")
@click.option("--n", "n", type=int, required=True, help="Block length n.")
@click.option("--gain", "target", type=float, required=True, help="Target compression gain by (11).")
@bits_option
@json_option
def qcs_optimal_cmd(n: int, target: float, value_bits: int, as_json: bool) -> None:
    """The valid (k, Q) of least gamma with gain (11) >= the target (k in 1..n, Q >= 1)."""
    from gradstat.theory import qcs

    best = qcs.optimal_pair(n, target, value_bits)
    src = f"{QCS} (10)-(11), Fig. 3"
    rows = [Row("k", best.k, src), Row("Q", best.Q, src), *_qcs_rows(n, best.k, best.Q, value_bits)]
    _emit(rows, as_json)


@theory_group.command("eta")
@click.option("--gamma", "gam", type=float, required=True, help="Variance factor gamma (10).")
@click.option("--beta", type=float, required=True, help="Feedback weight beta in (0, 1].")
@click.option("--mmse", is_flag=True, help="MMSE-QCS (16) instead of unbiased QCS (15).")
@json_option
def eta_cmd(gam: float, beta: float, mmse: bool, as_json: bool) -> None:
    """Residual bound eta of weighted error feedback (Lemma 4) and the optimal beta."""
    from gradstat.theory import qcs

    if mmse:
        bound, eq = qcs.residual_bound_mmse(gam, beta), "(16) as printed"
        best_beta, best_eta = qcs.optimal_feedback_mmse(gam)
        eq_best = "(18)"
    else:
        bound, eq = qcs.residual_bound_unbiased(gam, beta), "(15)"
        best_beta, best_eta = qcs.optimal_feedback_unbiased(gam)
        eq_best = "(17)"
    rows = [
        _bound_row("eta", bound, f"{QCS} Lemma 4 {eq}"),
        Row("beta*", best_beta, f"{QCS} Remark 2 {eq_best}"),
        Row("eta*", best_eta, f"{QCS} Remark 2 {eq_best}"),
        Row("eta_k (Karimireddy et al.)", qcs.karimireddy_residual_bound(gam), f"{QCS} Remark 3"),
    ]
    if mmse:
        rows.insert(
            1,
            _bound_row(
                "eta (Minkowski reading)",
                qcs.residual_bound_mmse_minkowski(gam, beta),
                f"derived from {QCS} (13)-(14), equals (18) at beta = 1",
            ),
        )
    _emit(rows, as_json)


@theory_group.command("dqsg")
@click.option("--n", "n", type=int, required=True, help="Gradient length n.")
@click.option("--M", "M", type=int, required=True, help="Levels per sign M (Delta = 1/M, 2M+1 levels).")
@click.option("--partitions", type=int, default=1, show_default=True, help="K scaled partitions.")
@click.option("--scale-bits", type=int, default=32, show_default=True, help="Bits per scale factor.")
@json_option
def dqsg_cmd(n: int, M: int, partitions: int, scale_bits: int, as_json: bool) -> None:
    """DQSG error factors, QSGD/TernGrad-as-half-dithered variances and bits for (n, M)."""
    from gradstat.theory import bits, dqsg, qsgd

    delta = 1.0 / M
    rows = [
        Row("Delta", delta, f"{DQ} (2)"),
        Row("levels 2M+1", 2 * M + 1, f"{DQ} (2)"),
        Row("n Delta^2/12 (error / ||g||_inf^2)", n * delta**2 / 12.0, f"{DQ} Lemma 3, App. B"),
        Row("second-moment factor 1 + n Delta^2/12", dqsg.second_moment_factor(n, delta), f"{DQ} Sec. 3.1"),
        Row("dithered variance per element (x scale^2)", qsgd.dithered_average_variance(M), f"{DQ} Thm 1"),
        Row("stochastic (QSGD) mean variance, x ~ U[-1,1]", qsgd.uniform_average_variance(M), f"{DQ} Sec. 2.1.1"),
        Row("stochastic (QSGD) max variance 1/(4M^2)", 1.0 / (4.0 * M**2), f"{DQ} Sec. 2.1.1"),
        Row("QSGD Lemma 3.1 factor min(n/s^2, sqrt(n)/s)", qsgd.variance_bound(n, M), cite("QSGD", "Lemma 3.1")),
        Row("bits per value (fixed)", bits.code_bits(2 * M + 1, "fixed"), f"{DQ} (2)"),
        Row("bits per value (ideal)", bits.code_bits(2 * M + 1, "ideal"), f"{DQ} Table 1"),
        Row("message bits (fixed)", bits.dqsg_bits(n, M, partitions, scale_bits, "fixed"), f"{DQ} Alg. 1, (4)"),
        Row("message bits (ideal)", bits.dqsg_bits(n, M, partitions, scale_bits, "ideal"), f"{DQ} Alg. 1, (4)"),
    ]
    _emit(rows, as_json)


@theory_group.command("ndqsg")
@click.option("--delta1", type=float, required=True, help="Fine step Delta1.")
@click.option("--delta2", type=float, required=True, help="Coarse step Delta2 (integer multiple > 1 of Delta1).")
@click.option("--alpha", type=float, default=1.0, show_default=True, help="Shrinkage factor in (0, 1].")
@click.option("--sigma-z", "sigma_z", type=float, required=True, help="Std of z = g - side information.")
@json_option
def ndqsg_cmd(delta1: float, delta2: float, alpha: float, sigma_z: float, as_json: bool) -> None:
    """Nested dithered quantization: failure probability (bound and exact Gaussian), error variance, bits."""
    from gradstat.theory import dqsg

    _, alpha2 = dqsg.nested_alphas(delta1, sigma_z)
    rows = [
        Row("failure bound", dqsg.nested_failure_bound(delta1, delta2, alpha, sigma_z), f"{NDQ} Thm 6 (8)"),
        Row(
            "failure probability (Gaussian z, exact)",
            dqsg.nested_failure_probability(delta1, delta2, alpha, sigma_z),
            f"{NDQ} Thm 6, App. E (closed form)",
        ),
        Row("safe radius (Delta2-Delta1)/(2 alpha)", dqsg.nested_safe_radius(delta1, delta2, alpha), f"{NDQ} Thm 6"),
        Row("error variance per element", dqsg.nested_error_variance(delta1, alpha, sigma_z), f"{NDQ} (9)"),
        Row("dithered variance Delta1^2/12", delta1**2 / 12.0, f"{NDQ} (9) remark"),
        Row(
            "alpha matching dithered variance",
            alpha2,
            f"{NDQ} (9) remark",
            "" if alpha2 is not None else "needs Delta1^2 < 12 sigma_z^2",
        ),
        Row("bits per value log2(Delta2/Delta1)", math.log2(dqsg.nesting_ratio(delta1, delta2)), f"{NDQ} (9)"),
        Row("DQSG bits per value log2(2/Delta1)", math.log2(2.0 / delta1), f"{NDQ} (9) remark"),
    ]
    _emit(rows, as_json)


@theory_group.command("sidco-threshold")
@click.option("--dist", type=Distribution(), required=True, help=law_help("Law of |g|"))
@click.option("--shape", type=float, default=None, help="Shape (gamma alpha / GP alpha); not for exponential.")
@click.option("--scale", type=float, required=True, help="Scale beta.")
@click.option("--ratio", type=float, required=True, help="Target ratio delta = k/d in (0, 1).")
@click.option("--d", "d", type=int, default=None, help="Vector length: also print the binomial law of k_hat.")
@json_option
def sidco_threshold_cmd(
    dist: str, shape: float | None, scale: float, ratio: float, d: int | None, as_json: bool
) -> None:
    """Threshold for a target ratio under a sparsity-inducing law of |g| (exact quantile and approximation)."""
    import torch

    from gradstat.theory import sidco
    from gradstat.theory.distributions import Exponential, Gamma, GenPareto
    from gradstat.theory.distributions.base import SparsityInducingDistribution
    from gradstat.theory.thresholds import tail_quantile

    if not 0.0 < ratio < 1.0:
        raise ValueError(f"--ratio must lie in (0, 1), got {ratio:g}")
    if dist == "exponential":
        if shape is not None:
            raise ValueError("--shape is not a parameter of the exponential law; omit it")
        law: SparsityInducingDistribution = Exponential(scale=scale)
    elif shape is None:
        raise ValueError(f"--shape is required for --dist {dist}")
    else:
        law = Gamma(shape=shape, scale=scale) if dist == "gamma" else GenPareto(shape=shape, scale=scale)
    eta = float(law.isf(ratio))
    eq = {"exponential": "Cor. 1.1 (6)", "gamma": "Cor. 1.2 (14)", "genpareto": "Cor. 1.3 (28)"}[dist]
    rows = [Row("threshold eta (exact quantile 1 - delta)", eta, f"{SID} Lemma 1 (4)-(5), {eq}")]
    if dist == "gamma" and shape is not None:  # shape is given for gamma (checked above)
        params = {
            "shape": torch.tensor(shape, dtype=torch.float64),
            "scale": torch.tensor(scale, dtype=torch.float64),
        }
        approx = float(tail_quantile("gamma", params, ratio, quantile="approx"))
        note = "" if shape <= 1.0 else "approximation derived for shape <= 1"
        rows.append(Row("threshold eta (gamma approximation)", approx, f"{SID} Cor. 1.2 (15), App. B.3 (24)", note))
        rows.append(Row("approximation / exact - 1", approx / eta - 1.0, f"{SID} Cor. 1.2 (15)", note))
    if d is not None:
        lo, hi = sidco.exceedance_count_interval(d, ratio, 0.95)
        mean = sidco.exceedance_count_mean(d, ratio)
        src = f"{SID} Sec. 2.2, App. C (Binomial(d, delta))"
        rows += [
            Row("E[k_hat]", mean, src),
            Row("k_hat 95% interval low", lo, src),
            Row("k_hat 95% interval high", hi, src),
            Row("k_hat/k 95% interval", f"[{lo / mean:.4g}, {hi / mean:.4g}]", src),
        ]
    _emit(rows, as_json)


COMMANDS = (theory_group,)
"""The commands (and groups) this module adds to ``gradstat``, in listing order."""

"""The report: run the studies on a dump, collect what they measured into a
:class:`~gradstat.analysis.report.data.ReportData`, and write ``report.md`` rendered from those rows alone
(:mod:`gradstat.analysis.report.render`), with the PNGs and CSVs beside it; and ``demo``: record a small dump with a
built-in workload, then write the report on it.

Sections: setup; distribution fits and drift; threshold quality; compressors replayed on the dump (chosen with
``compressors``/``feedback``, or the default groups at matched gain); variance vs bounds; error feedback (eta vs
beta); variance vs gain (QCS Fig. 3); validation table; findings of the run. Without a dump only the synthetic
sections (variance vs gain, validation) are written.
"""

from __future__ import annotations

import datetime as _dt
import math
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from gradstat.analysis.measure.selection import parse_indices
from gradstat.analysis.measure.sources import GradientSource, law_label
from gradstat.analysis.measure.tables import atomic_write_text
from gradstat.analysis.report.data import ReportData
from gradstat.analysis.report.render import render
from gradstat.analysis.studies import feedback as feedback_study
from gradstat.analysis.studies import fits as fit_study
from gradstat.analysis.studies import replay as replay_study
from gradstat.analysis.studies import thresholds as threshold_study
from gradstat.analysis.studies import variance as variance_study
from gradstat.analysis.studies import variance_gain as variance_gain_study
from gradstat.analysis.validation import outputs as validation_table
from gradstat.compressors import create as create_compressor
from gradstat.compressors.memory.feedback import parse_feedback

if TYPE_CHECKING:
    from gradstat.analysis.dumps.reader import Dump

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
BETAS = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)
MATCHED_GAIN = 8.0
"""Nominal gain of the default quantizer group (4-bit codes: QSGD s = 4, DQSG M = 4, QCS at its optimal (k, Q))."""
BUCKET = 512
"""Coordinates per scale of QSGD (its buckets) and of DQSG (its partitions) in the default comparison."""
QCS_BLOCK = 256
SPARSE_RATIO = 0.01


def default_replays(numel: int) -> list[tuple[str, str]]:
    """The default side-by-side: quantizers at matched gain, each with its paper's partitioning, and the threshold
    sparsifiers at one ratio with error feedback."""
    from gradstat.theory.qcs import optimal_pair

    p = optimal_pair(QCS_BLOCK, MATCHED_GAIN)
    qcs = f"qcs:block={QCS_BLOCK},k={p.k},Q={p.Q}"
    return [
        (f"qsgd:s=4,bucket={BUCKET}", "none"),
        (f"dqsg:M=4,partitions={max(1, math.ceil(numel / BUCKET))}", "none"),
        (qcs, "none"),
        (f"topk:ratio={SPARSE_RATIO}", "ef"),
        (f"sidco:ratio={SPARSE_RATIO},dist=exp,stages=adaptive", "ef"),
    ]


def default_variance_specs() -> list[str]:
    """Compressors of the variance section: every closed form the project checks."""
    return [
        "qcs:block=256,k=64,Q=4",
        "qcs:block=256,k=64,Q=4,alpha=mmse",
        "dqsg:M=4",
        "dqsg:M=4,half=true",
        f"qsgd:s=4,bucket={BUCKET}",
        f"topk:ratio={SPARSE_RATIO}",
        f"randk:ratio={SPARSE_RATIO}",
        f"wangni:ratio={SPARSE_RATIO}",
    ]


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
    compressors: Sequence[str] = (),
    feedback: str | None = None,
) -> tuple[Path, bool]:
    """Run the studies, write ``<out>/report.md`` (rendered from their rows only) and its files; return the path and
    whether a must-hold check was violated.

    ``command`` (the command line that regenerates the report) is quoted at the top; ``checks`` selects the
    validation checks (``analysis.validation.registry.select``; default all); ``compressors`` (spec strings) and
    ``feedback`` (a feedback spec, default ``none``) replace the default replay and variance comparisons.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = measure(dump_path, out, quick, steps, device, seed, progress, echo, command, checks, compressors, feedback)
    data.related = related_results(out)
    path = atomic_write_text(out / "report.md", render(data))
    val = data.validation
    failed = val is not None and bool(((val["verdict"] == "violated") & val["must_hold"].astype(bool)).any())
    return path, failed


def measure(
    dump_path: str | None,
    out: Path,
    quick: bool,
    steps: str | None,
    device: torch.device | str,
    seed: int,
    progress: bool,
    echo: Callable[[str], None],
    command: str | None,
    checks: str | None,
    compressors: Sequence[str],
    feedback: str | None,
) -> ReportData:
    """Run every study of the report into ``out`` and return what they measured."""
    from gradstat.analysis.dumps import open_dump

    if feedback is not None and not compressors:
        raise ValueError("--feedback applies to the compressors given with --compressor; give at least one")
    for spec in compressors:  # bad specs fail now, not after the fits
        create_compressor(spec)
    if feedback is not None:
        parse_feedback(feedback)
    device = torch.device(device)
    t0 = time.perf_counter()
    echo = _timed(echo, t0)
    dump = open_dump(dump_path) if dump_path else None
    sel = parse_indices(steps, dump.steps, "steps") if dump is not None else []
    source = GradientSource(dump, sel) if dump is not None else GradientSource()
    data = ReportData(
        header={
            "generated": f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M}",
            "machine": platform.machine(),
            "device": str(device),
            "torch": torch.__version__,
            "size": "quick" if quick else "full",
            "seed": seed,
            "command": command,
        }
    )
    if dump is not None:
        m = dump.manifest
        data.setup = {
            "workload": dump.workload,
            "numel": dump.numel,
            "tensors": len(dump.params),
            "workers": dump.workers,
            "steps": sel,
            "recorded": len(dump.steps),
            "every": m.get("every"),
            "optimizer": m.get("optimizer"),
        }
        _dump_sections(data, dump, sel, out, quick, device, seed, progress, echo, list(compressors), feedback)
    echo("variance vs gain ...")
    n_gain = 256
    data.variance_gain = variance_gain_study.run(out, n_gain, source, 30 if quick else 100, device)
    data.info["variance_gain"] = {"n": n_gain, "vectors": _block_label(source, n_gain)}
    echo("validation ...")
    data.validation = validation_table.run(
        out, "quick" if quick else "full", source, device, seed, checks, echo=(lambda s: echo(s)) if progress else None
    )
    data.info["validation"] = {"size": "quick" if quick else "full"}
    data.seconds = time.perf_counter() - t0
    return data


def _block_label(source: GradientSource, n: int, index: int = 0) -> str:
    """Where ``source.vector(n, index=index)`` comes from."""
    if source.dump is None:
        return f"synthetic: {law_label(source.family)}, d = {n} (seed {source.seed})"
    step, off = source.block_origin(n, index)
    return f"dump {source.dump.workload} step {step} worker {source.worker} (block {off}:{off + n})"


def _dump_sections(
    data: ReportData,
    dump: Dump,
    sel: list[int],
    out: Path,
    quick: bool,
    device: torch.device,
    seed: int,
    progress: bool,
    echo: Callable[[str], None],
    chosen: list[str],
    feedback: str | None,
) -> None:
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
    data.fits = (
        fits.groupby(["family", "method"], sort=False)[
            ["scale", "shape", "ks", "ad", "aic_rank", "tail_0.1", "tail_0.01", "tail_0.001", "p"]
        ]
        .mean()
        .reset_index()
    )
    data.info["fits"] = {
        "worker": 0,
        "steps": sel,
        "zero_fraction": float(fits["zero_fraction"].mean()),
        "figures": [
            ("fit_pdf_cdf", "PDF and survival function of |g|"),
            ("fit_qq", "QQ plot"),
            ("fit_tail_check", "tail check"),
            ("fit_drift", "drift"),
        ],
    }
    echo("thresholds ...")
    th_steps = sel[-2:] if quick else sel
    _, data.thresholds = threshold_study.run(
        dump, out, th_steps, [0.1, 0.01, 0.001], 0, QUICK_ESTIMATORS if quick else None, device, seed, progress
    )
    data.info["thresholds"] = {"steps": th_steps, "missing": data.thresholds.attrs.get("missing", [])}
    echo("replays ...")
    pairs = [(c, feedback or "none") for c in chosen] if chosen else default_replays(dump.numel)
    seeds = [seed] if quick else [seed, seed + 1]
    _, data.replays = replay_study.run(dump, out, pairs, sel, list(range(dump.workers)), seeds, device, progress)
    data.info["replays"] = {"steps": sel, "workers": dump.workers, "seeds": len(seeds), "chosen": bool(chosen)}
    echo("variance ...")
    src = GradientSource(dump, sel)
    n = 1024
    vecs = [(_block_label(src, n, i), src.vector(n, device, index=i)) for i in range(2)]
    specs = chosen or default_variance_specs()
    data.variance = variance_study.run(vecs, specs, out, 50 if quick else 200, seed, progress)
    echo("feedback ...")
    n_fb, length, n_seeds = 4096, 20, 4 if quick else 8
    fb_info = {"n": n_fb, "vectors": _block_label(src, n_fb) + f", {len(sel)} step(s) cycled"}
    for key, spec, stem in (
        ("feedback", "qcs:block=256,k=64,Q=4", "feedback"),
        ("feedback_mmse", "qcs:block=256,k=64,Q=4,alpha=mmse", "feedback_mmse"),
    ):
        table = feedback_study.run(
            src, [0], out, spec, list(BETAS), n_fb, length, n_seeds, device, progress, stem=stem, settle=True
        )
        setattr(data, key, table)
        data.info[key] = {**fb_info, "spec": spec}


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
    compressors: Sequence[str] = (),
    feedback: str | None = None,
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
        + "".join(f" --compressor {c}" for c in compressors)
        + (f" --feedback {feedback}" if feedback else "")
    )
    return write_report(
        str(dump_dir),
        out,
        quick,
        None,
        device,
        seed,
        progress,
        echo,
        command,
        compressors=compressors,
        feedback=feedback,
    )


def _timed(echo: Callable[[str], None], t0: float) -> Callable[[str], None]:
    """``echo`` with the elapsed time in front of section messages (lines ending in '...')."""

    def out(msg: str) -> None:
        echo(f"[{time.perf_counter() - t0:5.0f} s] {msg}" if msg.endswith("...") else msg)

    return out


RELATED = (
    ("the papers' experiments, paper against ours", "../experiments/README.md"),
    ("the compressor micro-benchmark", "../experiments/sidco-microbench/bench/bench.md"),
    ("the validation checks against planted bugs (mutation table)", "../mutations.md"),
)
"""Results that live beside a report committed in ``reports/demo/``; linked only where the file exists."""


def related_results(out: Path) -> dict[str, str]:
    """What of :data:`RELATED` exists relative to ``out`` (what it is -> relative link)."""
    return {what: link for what, link in RELATED if (out / link).is_file()}

"""SIDCo's micro-benchmark: every sparsifier next to torch.topk and DGC, every quantizer in GB/s next to a read pass.

SIDCo (Abdelmoniem et al., An Efficient Statistical-based Gradient Compression Technique), Sec. 1 Fig. 1 and
App. E.2: synthetic vectors of 0.26M-260M elements, speed-up of the compressor over Top-k. Here: one Laplace(0, 1)
float32 vector per size; for each number of CPU threads (1 and all), each ratio delta and each sparsifier the
encode time next to ``torch.topk(|g|, ceil(delta d))`` measured in the same run, its calls interleaved with the
encode's (each row's speed-up against its own baseline); each quantizer's encode and decode
throughput in GB/s (4 d bytes per call) next to one measured read pass (``g.sum()``, the machine's own limit);
and SIDCo's time split into its phases (check + summary, fit + threshold, select, pack). SIDCo exp and the fixed
threshold also run with the fused kernels and the compaction kernel off (``(eager)`` rows), and on CUDA SIDCo exp
without CUDA graphs (``(no graphs)`` rows), and each quantizer's encode replayed as a graph, which the default does
not do yet (``(all graphs)`` rows, with whether the replay equals the direct encode), so the compiled kernels' and
the graphs' gains are measured in the same run. Every timing is
the median of ``repeats`` calls after one warm-up call, with the min-max spread. A size whose working set does not
fit in ``memory_fraction`` of the available memory is skipped, and a row says so.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import pandas as pd
import torch

from gradstat.analysis.bench.timing import Timing, bench_device, host_syncs, progress, time_ms, time_paired
from gradstat.analysis.measure import huge_pages
from gradstat.compressors import graphs
from gradstat.theory.kernels import compaction
from gradstat.theory.kernels.policy import can_compile, forced, policy

if TYPE_CHECKING:
    from gradstat.compressors.base import Compressor
    from gradstat.compressors.context import Context
    from gradstat.compressors.wire.payload import Payload

OPTIONS = """
sizes : list[int] -- vector lengths (default 260000,2600000,26000000; the paper also has 260000000).
ratios : list[float] -- target densities delta of the sparsifiers (default 0.1,0.01,0.001).
threads : list[int] -- torch CPU thread counts, 0 meaning all cores (default 1,0).
repeats : int -- timed calls per row after one warm-up call (default 5).
device : str -- 'cpu' or 'cuda' (CUDA events; the threads option is ignored there).
out : str -- directory for bench.csv, bench.md, bench.png (default '': write nothing).
memory_fraction : float -- skip a size whose working set (~12 copies of the vector) exceeds this fraction of the
    available memory (default 0.5).
seed : int -- seed of the Laplace vector and of the compressors' contexts (default 0).
max_elements : int -- skip sizes above this many elements, saying so (default 0: no limit), e.g. to keep a run on
    a shared machine within its time.
only : list[str] -- the compressors to time, by name (e.g. sidco,dgc,threshold,qsgd: every row of those names,
    their variants included); the read pass and torch.topk always run (default: every compressor).
"""

EXTRA_SPARSIFIERS = (
    "sidco:dist=exp,stages=1",
    "sidco:dist=exp,stages=3",
    "sidco:dist=gamma,stages=3",
    "sidco:dist=gp,stages=3",
)
EAGER_TOO = ("sidco:dist=exp,stages=3", "threshold")
"""Also timed with the fused kernels and the compaction kernel off (``GRADSTAT_COMPILE=never``), rows named
``... (eager)``: what each costs without a compiler, measured beside what it costs with one."""
ALL_GRAPHS_TOO = ("threshold",)
"""On CUDA also timed under ``GRADSTAT_CUDA_GRAPHS=all`` (rows ``... (all graphs)``): sparsifiers whose graph the
default does not replay until a GPU run shows it equal to the direct encode (the fixed threshold's)."""
NO_GRAPHS_TOO = ("sidco:dist=exp,stages=1", "sidco:dist=exp,stages=3")
"""On CUDA also timed with every kernel launched one by one (``GRADSTAT_CUDA_GRAPHS=never``), rows named
``... (no graphs)``: what the replay of a captured graph (:mod:`gradstat.compressors.graphs`) saves."""
EXTRA_QUANTIZERS = ("qcs:k=64,Q=4,block=256", "qcs:k=256,Q=1", "dqsg:dither=torch")
"""Beyond the registered defaults: the issue's QCS settings, and DQSG with torch's generator instead of the default
counter dither (what the draw of d uniforms costs, in encode and in decode)."""
WORKING_COPIES = 12


def _laplace(size: int, seed: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    u = torch.rand(size, generator=gen) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).to(device)


def _available_bytes() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def _sparsifier_specs() -> list[str]:
    from gradstat import compressors

    names = [n for n in compressors.names() if compressors.get(n).properties.kind == "sparsifier"]
    return names + list(EXTRA_SPARSIFIERS)


def _quantizer_specs() -> list[str]:
    from gradstat import compressors

    names = [n for n in compressors.names() if compressors.get(n).properties.kind in ("quantizer", "sketch")]
    return names + list(EXTRA_QUANTIZERS)


def _build(spec: str, ratio: float | None, abs_g: torch.Tensor) -> Compressor:
    from gradstat import compressors
    from gradstat.compressors.base import hyper_fields

    name = spec.partition(":")[0]
    fields = {f.name for f in hyper_fields(compressors.get(name))}
    if ratio is not None and "ratio" in fields:
        return compressors.create(spec, ratio=ratio)
    if ratio is not None and name == "threshold":  # the offline-tuned threshold: the exact (1 - delta) quantile
        k = math.ceil(ratio * abs_g.numel())
        return compressors.create(spec, eta=float(torch.topk(abs_g, k).values[-1]))
    return compressors.create(spec)


def _topk_abs(g: torch.Tensor, k: int) -> torch.Tensor:
    """The baseline: the k largest magnitudes of g (unsorted)."""
    return torch.topk(g.abs(), k, sorted=False).values


COLUMNS = (
    "size", "threads", "ratio", "group", "name", "op", "ms", "ms_min", "ms_max", "GB/s", "read_passes",
    "speedup_vs_topk", "topk_ms",
)  # fmt: skip
"""The columns every table has, whatever rows a run measured before it ended (the others follow)."""


def _row(
    size: int, threads: str, ratio: float | None, group: str, name: str, op: str, t: Timing, **extra: object
) -> dict[str, object]:
    return {
        "size": size,
        "threads": threads,
        "ratio": ratio,
        "group": group,
        "name": name,
        "op": op,
        "ms": t.median,
        "ms_min": t.low,
        "ms_max": t.high,
        "GB/s": 4 * size / t.median / 1e6,
        **extra,
    }


def _sidco_phases(g: torch.Tensor, ratio: float, repeats: int, dev: torch.device) -> dict[str, Timing]:
    """SIDCo exp, 3 stages, split into the phases its encode runs. Where its fused kernels run compiled: the
    summary of |g| (the input check, the largest magnitude and the first stage's statistics in one read), the
    later stages (the second over the whole vector, then the elements above its threshold gathered once and the
    third stage on them, where few enough lie there), the selection and the packing. Eagerly: the input check,
    forming |g|, the fit and threshold, the selection and the packing."""
    from gradstat import compressors
    from gradstat.compressors.context import Context
    from gradstat.compressors.schemes.sparsifiers.sidco import SIDCo
    from gradstat.compressors.schemes.sparsifiers.threshold import add_sparse
    from gradstat.compressors.wire.payload import Payload
    from gradstat.theory.kernels.primitives import all_finite, select_at_least, selects_signed
    from gradstat.theory.kernels.stage_stats import tail_moments

    comp = compressors.create("sidco:dist=exp,stages=3", ratio=ratio)  # its own methods: the phases of its encode
    assert isinstance(comp, SIDCo)
    # where SIDCo exp's signed path runs (SIDCo._signed_threshold): a one-pass form of its stage statistics
    signed = tail_moments.fast_for(g, None, None, None, False)
    x = g if signed else g.abs()
    stats = comp._summary(g) if signed else None

    def fit():
        payload = Payload(shape=g.shape, dtype=g.dtype)
        return comp._fit(x, Context(), payload, signed=signed, stats=stats, narrow=signed and selects_signed(g))

    pot = fit()
    eta = pot.threshold

    def select() -> torch.Tensor:  # as ThresholdSparsifier._encode selects
        if pot.candidates is None or pot.candidate_magnitudes is None:
            return select_at_least(x, eta, signed=signed, density=ratio)
        return pot.candidates.index_select(0, select_at_least(pot.candidate_magnitudes, eta))

    idx = select()
    if signed:
        phases = {"check + summary": time_ms(lambda: comp._summary(g), repeats, dev)}
    else:
        phases = {"check": time_ms(lambda: all_finite(g), repeats, dev), "abs": time_ms(lambda: g.abs(), repeats, dev)}
    phases["fit + threshold"] = time_ms(fit, repeats, dev)
    phases["select"] = time_ms(select, repeats, dev)
    phases["pack"] = time_ms(lambda: add_sparse(Payload(shape=g.shape, dtype=g.dtype), g, idx), repeats, dev)
    return phases


def _rows_for(
    rows: list[dict],
    size: int,
    ratios: list[float],
    threads: str,
    repeats: int,
    dev: torch.device,
    seed: int,
    only: frozenset[str],
) -> None:
    """Append the rows of one size to ``rows``, each as soon as it is measured (an interrupted run keeps them)."""
    from gradstat.compressors.context import Context

    def wanted(spec: str) -> bool:
        return not only or spec.partition(":")[0] in only

    g = _laplace(size, seed, dev)
    abs_g = g.abs()
    read = time_ms(lambda: g.sum(), repeats, dev)
    rows.append(_row(size, threads, None, "read", "g.sum() (one read pass)", "read", read, read_passes=1.0))
    if dev.type == "cuda":
        copy = time_ms(lambda: g.clone(), repeats, dev)
        rows.append(_row(size, threads, None, "read", "g.clone() (device copy)", "copy", copy, read_passes=None))
    for ratio in ratios:
        k = math.ceil(ratio * size)
        if k < 1:
            continue
        progress(f"bench microbench: size {size:,}, threads {threads}, ratio {ratio}: torch.topk")
        baseline = functools.partial(_topk_abs, g, k)
        topk = time_ms(baseline, repeats, dev)
        rows.append(
            _row(
                size,
                threads,
                ratio,
                "sparsifier",
                "torch.topk(|g|)",
                "encode",
                topk,
                speedup_vs_topk=1.0,
                topk_ms=topk.median,
                read_passes=topk.median / read.median,
            )
        )
        runs = [(s, "auto", "auto", "") for s in _sparsifier_specs()]
        runs += [(s, "never", "never", " (eager)") for s in EAGER_TOO]
        if dev.type == "cuda":
            runs += [(s, "auto", "never", " (no graphs)") for s in NO_GRAPHS_TOO]
            runs += [(s, "auto", "all", " (all graphs)") for s in ALL_GRAPHS_TOO]
        runs = [run for run in runs if wanted(run[0])]
        for spec, mode, graph_mode, suffix in runs:
            name = spec + suffix
            progress(f"bench microbench: size {size:,}, threads {threads}, ratio {ratio}: {name}")
            try:
                c = _build(spec, ratio, abs_g)
                ctx = Context(seed=seed).but(state=c.new_state(g))
                with forced(mode), graphs.forced(graph_mode):
                    for _ in range(graphs.CAPTURE_AFTER):  # (a graph is captured at the key's second encode)
                        c.encode(g, ctx)
                    t, paired = time_paired(functools.partial(c.encode, g, ctx), baseline, repeats, dev)
                    syncs = host_syncs(functools.partial(c.encode, g, ctx), dev)
                    queued = host_syncs(functools.partial(c.enqueue, g, ctx), dev)
                    settled = host_syncs(c.enqueue(g, ctx).payload, dev)
            except ValueError as exc:  # e.g. a ratio a compressor rejects at this size
                progress(f"  skipped: {exc}")
                continue
            rows.append(
                _row(
                    size,
                    threads,
                    ratio,
                    "sparsifier",
                    name,
                    "encode",
                    t,
                    speedup_vs_topk=paired.median / t.median,
                    topk_ms=paired.median,
                    read_passes=t.median / read.median,
                    host_syncs=syncs,
                    enqueue_syncs=queued,
                    settle_syncs=settled,
                )
            )
        if not wanted("sidco"):
            continue
        progress(f"bench microbench: size {size:,}, threads {threads}, ratio {ratio}: SIDCo phases")
        for phase, t in _sidco_phases(g, ratio, repeats, dev).items():
            rows.append(
                _row(
                    size,
                    threads,
                    ratio,
                    "sidco phase",
                    f"sidco:dist=exp,stages=3 {phase}",
                    phase,
                    t,
                    read_passes=t.median / read.median,
                )
            )
    for spec in filter(wanted, _quantizer_specs()):
        progress(f"bench microbench: size {size:,}, threads {threads}: {spec}")
        c = _build(spec, None, abs_g)
        side = g if c.properties.needs_side else None
        ctx = Context(seed=seed, worker=1 if side is not None else 0)
        payload = c.encode(g, ctx)
        timed: dict[str, Callable[[], object]] = {
            "encode": functools.partial(c.encode, g, ctx),
            "decode": functools.partial(c.decode, payload, ctx, side=side),
        }
        for op, fn in timed.items():
            with graphs.forced("auto"):  # (the default's rows, whatever the environment says)
                t = time_ms(fn, repeats, dev)
                row = _row(size, threads, None, "quantizer", spec, op, t, read_passes=t.median / read.median)
                row["host_syncs"] = host_syncs(fn, dev)
                if op == "encode":
                    row["enqueue_syncs"] = host_syncs(functools.partial(c.enqueue, g, ctx), dev)
                    row["settle_syncs"] = host_syncs(c.enqueue(g, ctx).payload, dev)
            rows.append(row)
        if dev.type == "cuda":
            graphed = _all_graphs_row(c, spec, g, ctx, size, threads, repeats, read, dev)
            if graphed is not None:
                rows.append(graphed)


def _all_graphs_row(
    c: Compressor, spec: str, g: torch.Tensor, ctx: Context, size: int, threads: str, repeats: int, read: Timing,
    dev: torch.device,
) -> dict[str, object] | None:  # fmt: skip
    """A quantizer's encode on CUDA under ``GRADSTAT_CUDA_GRAPHS=all`` (row ``... (all graphs)``): replayed as a
    graph, which the default does not do yet for an encode no GPU run has shown equal to the direct one
    (:attr:`Compressor.replays_as_graph <gradstat.compressors.base.Compressor.replays_as_graph>`). Its ``replayed``
    column says whether the last encode was a replay whose checks passed, and ``replay_equal`` (where it was)
    whether that payload, of other data in the same buffer (reversed and halved) under another call seed than the
    capture's, equals the direct encode's bit for bit.
    None (no row) for an encode that no graph replays (no deferred checks, a generator's draw, a per-worker
    state)."""
    other = ctx.but(step=ctx.step + 1)  # (compared under another call seed than the capture's)
    with graphs.forced("all"):
        if not type(c).defers_checks or c._graph_key(other) is None:
            return None
    cache = graphs.cache_of(c)
    with graphs.forced("all"):
        for _ in range(graphs.CAPTURE_AFTER):  # (a graph is captured at the key's second encode)
            c.encode(g, ctx)
        t = time_ms(functools.partial(c.encode, g, ctx), repeats, dev)
        name = spec + " (all graphs)"
        row = _row(size, threads, None, "quantizer", name, "encode", t, read_passes=t.median / read.median)
        row["host_syncs"] = host_syncs(functools.partial(c.encode, g, ctx), dev)
    # compared on other data in the same buffer (the same graph), reversed and halved: a replay that used a value
    # computed from the capture's data (a scale, a norm, an element) would differ from the direct encode
    original = g.clone()
    try:
        g.copy_(original.flip(0)).mul_(0.5)
        with graphs.forced("never"):
            direct = c.encode(g, other)
        with graphs.forced("all"):
            before = (cache.replays, cache.redone)
            replayed = c.encode(g, other)
            was_replay = cache.replays == before[0] + 1 and cache.redone == before[1]
    finally:
        g.copy_(original)
    row["replayed"] = was_replay
    row["replay_equal"] = _same_bits(replayed, direct) if was_replay else None
    return row


def _same_bits(a: Payload, b: Payload) -> bool:
    """Whether two payloads hold the same parts with the same bits (a float's sign of zero and NaN payload
    included)."""
    if sorted(a.parts) != sorted(b.parts):
        return False
    for name in a.parts:
        x, y = a[name], b[name]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.is_floating_point():
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
            x, y = x.contiguous().view(bits), y.contiguous().view(bits)
        if not torch.equal(x, y):
            return False
    return True


def run(
    sizes: Sequence[int] = (260_000, 2_600_000, 26_000_000),
    ratios: Sequence[float] = (0.1, 0.01, 0.001),
    threads: Sequence[int] = (1, 0),
    repeats: int = 5,
    device: str = "cpu",
    out: str = "",
    memory_fraction: float = 0.5,
    seed: int = 0,
    max_elements: int = 0,
    only: Sequence[str] = (),
) -> pd.DataFrame:
    """The micro-benchmark table, one row per (size, threads, ratio, compressor or phase, operation).

    Columns: ``size``, ``threads`` (``1``, ``all (n)``), ``ratio`` (sparsifiers), ``group`` (read, sparsifier,
    sidco phase, quantizer, skipped), ``name`` (spec), ``op`` (encode, decode, read, phase), ``ms`` (median),
    ``ms_min``/``ms_max``, ``GB/s`` (4 d bytes / ms), ``speedup_vs_topk`` (``topk_ms / ms``) with ``topk_ms``, the
    median of torch.topk's calls (same size, ratio and threads) interleaved with that row's calls
    (:func:`~gradstat.analysis.bench.timing.time_paired`: each sparsifier row has its own baseline, timed beside
    it; the ``torch.topk(|g|)`` row's is its own time), ``read_passes`` (ms / one read pass of the same run),
    ``host_syncs``, and on CUDA ``replayed`` and ``replay_equal`` (the ``(all graphs)`` quantizer rows: whether a
    graph was replayed, and gave the direct encode's payload). With ``out``, also writes ``bench.csv``,
    ``bench.png`` (time vs size, log-log) and ``bench.md`` (the goals of the issue and the table) there.
    """
    sizes, ratios, thread_counts = [int(s) for s in sizes], [float(r) for r in ratios], [int(t) for t in threads]
    if not sizes or min(sizes) < 1 or repeats < 1:
        raise ValueError(f"sizes must be >= 1 and repeats >= 1, got sizes={sizes}, repeats={repeats}")
    if not ratios or not all(0.0 < r < 1.0 for r in ratios):
        raise ValueError(f"ratios must lie in (0, 1), got {ratios}")
    if min(thread_counts, default=0) < 0:
        raise ValueError(f"threads must be >= 0 (0: all cores), got {thread_counts}")
    if not (0.0 < memory_fraction <= 1.0):
        raise ValueError(f"memory_fraction must lie in (0, 1], got {memory_fraction}")
    only = [only] if isinstance(only, str) else list(only)  # (one name as a plain string)
    names = sorted({s.partition(":")[0] for s in _sparsifier_specs() + _quantizer_specs()})
    unknown = sorted(set(only) - set(names))
    if unknown:
        raise ValueError(f"only: no compressor named {', '.join(unknown)}; known: {', '.join(names)}")
    dev = bench_device(device)
    previous = torch.get_num_threads()
    cores = os.cpu_count() or previous
    rows: list[dict] = []
    load_before = os.getloadavg()[0]
    interrupted = False
    try:
        for n_threads in thread_counts if dev.type == "cpu" else [previous]:
            label = "cuda" if dev.type == "cuda" else ("1" if n_threads == 1 else f"all ({n_threads or cores})")
            torch.set_num_threads(n_threads or cores)
            for size in sizes:
                need = WORKING_COPIES * 4 * size
                if max_elements and size > max_elements:
                    progress(f"bench microbench: size {size:,} skipped (max_elements={max_elements:,})")
                    rows.append(
                        {
                            "size": size,
                            "threads": label,
                            "group": "skipped",
                            "name": f"over max_elements={max_elements:,}",
                        }
                    )
                    continue
                if dev.type == "cpu" and need > memory_fraction * _available_bytes():
                    progress(f"bench microbench: size {size:,} skipped (needs ~{need / 1e9:.1f} GB)")
                    rows.append(
                        {
                            "size": size,
                            "threads": label,
                            "group": "skipped",
                            "name": f"needs ~{need / 1e9:.1f} GB, over {memory_fraction:g} of available memory",
                        }
                    )
                    continue
                _rows_for(rows, size, ratios, label, repeats, dev, seed, frozenset(only))
    except KeyboardInterrupt:  # (Ctrl-C, or the command's SIGTERM: a time limit) the rows measured so far
        interrupted = True
        progress(f"bench microbench: interrupted; the table holds the {len(rows)} rows measured before")
    finally:
        torch.set_num_threads(previous)
    table = pd.DataFrame(rows)
    table = table.reindex(columns=[*COLUMNS, *(c for c in table.columns if c not in COLUMNS)])  # (however few rows)
    try:  # (stopped while describing the run or writing its report: the table itself is kept)
        _describe(table, sizes, ratios, thread_counts, repeats, device, memory_fraction, max_elements, only, seed, out)
        table.attrs.update(cores=cores, load=(load_before, os.getloadavg()[0]), interrupted=interrupted)
        if out:
            write_outputs(table, Path(out))
    except KeyboardInterrupt:
        table.attrs["interrupted"] = True
        progress("bench microbench: interrupted while writing its report; the table is kept")
    return table


def _describe(
    table: pd.DataFrame, sizes: list[int], ratios: list[float], thread_counts: list[int], repeats: int, device: str,
    memory_fraction: float, max_elements: int, only: list[str], seed: int, out: str,
) -> None:  # fmt: skip
    """The run's settings and the machine's facts, in ``table.attrs`` (the report's header)."""
    table.attrs.update(
        command="gradstat bench microbench "
        + " ".join(
            f"--set {k}={','.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in (
                ("sizes", sizes),
                ("ratios", ratios),
                ("threads", thread_counts),
                ("repeats", repeats),
                ("device", device),
                ("memory_fraction", memory_fraction),
                ("max_elements", max_elements),
                ("only", list(only)),
                ("seed", seed),
                ("out", out),
            )
            if v not in ("", [])
        ),
        compile_policy=policy(),
        can_compile=can_compile(),
        compaction=compaction.available(torch.zeros(1)),
        torch=torch.__version__,
        huge_pages=huge_pages.describe(),
    )


def write_outputs(table: pd.DataFrame, out: Path) -> dict[str, Path]:
    """``bench.csv`` + ``bench.png`` (via the plots room) and ``bench.md`` (goals summary and full table)."""
    from gradstat.analysis.bench._microbench_report import goals_markdown, plot

    paths = plot(table, out)
    md = out / "bench.md"
    md.write_text(goals_markdown(table))
    paths["md"] = md
    return paths

"""Where each encode's time goes: torch.profiler's kernels (CUDA) or operators (CPU) per encode, next to torch.topk.

One Laplace(0, 1) vector of ``size`` elements on ``device``; each spec (built as ``microbench`` builds it: its
``ratio`` set, a fixed threshold at the exact (1 - ratio) quantile) is encoded once untimed and then ``repeats``
times under torch.profiler, and so is ``torch.topk`` of the magnitudes at the same k. On CUDA the rows are the
device activities the encode caused (kernels, compiled and Triton ones included, and the device's memory copies
and fills, named ``Memcpy`` and ``Memset``): ``calls`` per encode is how many launches its per-call overhead pays
for, ``ms`` their device time per encode. On a CPU the rows are torch's
operators (every level: an operator that calls others counts each), with their self time on the host; gradstat's C
loops and numpy's are no operators and are not in the profile, so there the calls say how many operators an encode
dispatches and the times are those operators' only.

Per spec the first row, kernel ``(all)``, holds the totals and, on CUDA, ``vs_topk`` (the kernels' total time over
torch.topk's, same run; the host's waits and launch gaps are not in it: ``microbench`` times the whole encode);
then its ``top`` most expensive kernels by time, with their share of the total. The profiler's own overhead is in
the times (a few microseconds per operator on a CPU), so the times are for finding where an encode spends them,
``microbench`` for its speed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import pandas as pd
import torch

from gradstat.analysis.bench.microbench import _build, _laplace
from gradstat.analysis.bench.timing import bench_device, progress

OPTIONS = """
specs : str -- compressor specs separated by ';' (default: SIDCo's variants, DGC, the fixed threshold, top-k and the
    quantizers).
size : int -- vector length (default 2_600_000).
ratio : float -- target density of the sparsifiers and of torch.topk (default 0.001).
repeats : int -- profiled encodes per spec (default 3, after one untimed).
device : str -- 'cpu' or 'cuda' (default 'cpu').
top : int -- kernels listed per spec, most expensive first (default 8).
seed : int -- seed of the Laplace vector and of the encodes' contexts (default 0).
"""

DEFAULT_SPECS = (
    "sidco:dist=exp,stages=1;sidco:dist=exp,stages=3;sidco:dist=gamma,stages=3;sidco:dist=gp,stages=3;dgc;"
    "threshold;topk;qsgd;terngrad;dqsg;ndqsg;qcs"
)


def _self_time_us(event: object, cuda: bool) -> float:
    """An averaged event's self time in microseconds: on the device for a CUDA kernel (the attribute's name
    changed in torch 2.4), on the host otherwise."""
    if cuda:
        for name in ("self_device_time_total", "self_cuda_time_total"):
            value = getattr(event, name, None)
            if value is not None:
                return float(value)
        return 0.0
    return float(getattr(event, "self_cpu_time_total", 0.0))


def profile_calls(fn: Callable[[], object], repeats: int, device: torch.device) -> pd.DataFrame:
    """``fn`` run ``repeats`` times under torch.profiler: one row per kernel (CUDA) or operator (CPU) with its calls
    and self time (ms) per call of ``fn``, most expensive first."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(repeats):
            fn()
        if cuda:
            torch.cuda.synchronize(device)
    rows = []
    for event in prof.key_averages():
        on_device = getattr(event, "device_type", DeviceType.CPU) == DeviceType.CUDA
        if on_device != cuda:
            continue
        rows.append(
            {
                "kernel": event.key,
                "calls": event.count / repeats,
                "ms": _self_time_us(event, cuda) / 1e3 / repeats,
            }
        )
    table = pd.DataFrame(rows, columns=["kernel", "calls", "ms"])
    return table.sort_values("ms", ascending=False, kind="stable").reset_index(drop=True)


def run(
    specs: str = DEFAULT_SPECS,
    size: int = 2_600_000,
    ratio: float = 0.001,
    repeats: int = 3,
    device: str = "cpu",
    top: int = 8,
    seed: int = 0,
) -> pd.DataFrame:
    """The profile table: per spec a row ``(all)`` (kernel launches or operator calls per encode, their time and
    ``vs_topk``) and its ``top`` kernels; first the same for ``torch.topk``.

    Columns: ``spec``, ``kernel``, ``calls`` (per encode), ``ms`` (self time per encode), ``share`` (of the spec's
    total), ``vs_topk`` (the ``(all)`` rows on CUDA: total kernel time over torch.topk's)."""
    from gradstat.compressors.context import Context

    if size < 2 or repeats < 1 or top < 0:
        raise ValueError(f"size must be >= 2, repeats >= 1 and top >= 0, got size={size}, repeats={repeats}, top={top}")
    if not (0.0 < ratio < 1.0):
        raise ValueError(f"ratio must lie in (0, 1), got {ratio}")
    dev = bench_device(device)
    chosen = [s.strip() for s in specs.split(";") if s.strip()]
    if not chosen:
        raise ValueError("specs is empty: give compressor specs separated by ';'")
    g = _laplace(size, seed, dev)
    abs_g = g.abs()
    k = math.ceil(ratio * size)
    built = {spec: _build(spec, ratio, abs_g) for spec in chosen}  # (unknown specs fail here, before any profiling)

    def topk() -> object:
        return torch.topk(abs_g, k, sorted=False)

    work: list[tuple[str, Callable[[], object]]] = [("torch.topk", topk)]
    for spec, c in built.items():
        ctx = Context(seed=seed).but(state=c.new_state(g))
        work.append((spec, functools.partial(c.encode, g, ctx)))
    rows: list[dict] = []
    interrupted = False
    try:
        _profile_each(work, rows, repeats, top, dev, size)
    except KeyboardInterrupt:  # (Ctrl-C, or the command's SIGTERM: a time limit) the encodes profiled so far
        interrupted = True
        progress(f"bench profile: interrupted; the table holds the {len(rows)} rows profiled before")
    table = pd.DataFrame(rows, columns=["spec", "kernel", "calls", "ms", "share", "vs_topk"])
    table.attrs["interrupted"] = interrupted
    return table


def _profile_each(
    work: list[tuple[str, Callable[[], object]]], rows: list[dict], repeats: int, top: int, dev: torch.device, size: int
) -> None:
    """Append each encode's rows to ``rows`` as soon as it is profiled (an interrupted run keeps them)."""
    baseline = math.nan
    for spec, fn in work:
        progress(f"bench profile: size {size:,}, device {dev.type}: {spec}")
        fn()  # untimed: builds what compiles, warms caches
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        table = profile_calls(fn, repeats, dev)
        total = float(table["ms"].sum())
        if dev.type == "cuda" and table.empty:
            raise RuntimeError(
                f"bench profile: torch.profiler recorded no CUDA kernel for {spec} (is CUPTI available to torch?)"
            )
        if spec == "torch.topk":
            baseline = total
        comparable = dev.type == "cuda" and baseline > 0  # (on a CPU the C loops' time is not in the profile)
        rows.append(
            {
                "spec": spec,
                "kernel": "(all)",
                "calls": float(table["calls"].sum()),
                "ms": total,
                "share": 1.0,
                "vs_topk": total / baseline if comparable else math.nan,
            }
        )
        for item in table.head(top).itertuples(index=False):
            share = item.ms / total if total > 0 else math.nan
            rows.append({"spec": spec, "kernel": item.kernel, "calls": item.calls, "ms": item.ms, "share": share})

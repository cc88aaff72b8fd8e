"""Encode+decode time, exact bits and gain of every registered compressor, next to torch.topk in the same run.

The SIDCo micro-benchmark (Abdelmoniem et al., Sec. 1 Fig. 1 and App. E.2: synthetic vectors of 0.26M-260M
elements, speed-up over Top-k): one Laplace(0, 1) vector of ``size`` elements on ``device``; each compressor built
with its defaults and, where it has a ``ratio``, ``ratio``; a fixed threshold gets the exact (1 - ratio) quantile
of |g| (an offline-tuned threshold). Compressors that decode with side information (NDQSG) are timed as a
second-group worker decoding with the gradient itself as side information.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd
import torch

from gradstat.analysis.bench.timing import bench_device, median_ms, progress

if TYPE_CHECKING:
    from gradstat.compressors.base import Compressor

OPTIONS = """
size : int -- vector length (default 2_600_000, the paper's 2.6M).
ratio : float -- target density delta of the sparsifiers and of the torch.topk baseline (default 0.01).
repeats : int -- timed repetitions per compressor; the median is reported (default 5, after one warm-up).
device : str -- 'cpu' or 'cuda' (default 'cpu').
names : str -- comma-separated registry names to run (default '': all registered).
seed : int -- seed of the Laplace vector and of the compressors' contexts (default 0).
"""


def _build(name: str, ratio: float, abs_g: torch.Tensor) -> Compressor:
    from gradstat import compressors
    from gradstat.compressors.base import hyper_fields

    cls = compressors.get(name)
    fields = {f.name for f in hyper_fields(cls)}
    if "ratio" in fields:
        return compressors.create(name, ratio=ratio)
    if name == "threshold":
        k = math.ceil(ratio * abs_g.numel())
        return compressors.create(name, eta=float(torch.topk(abs_g, k).values[-1]))
    return compressors.create(name)


def run(
    size: int = 2_600_000, ratio: float = 0.01, repeats: int = 5, device: str = "cpu", names: str = "", seed: int = 0
) -> pd.DataFrame:
    """Benchmark table, one row per compressor plus the ``torch.topk`` baseline.

    Columns: ``compressor``, ``spec``, ``ms`` (median encode+decode), ``vs_topk`` (ms / torch.topk ms, same run),
    ``bits`` (exact payload bits), ``gain`` (32 d / bits), ``entropy_gain`` (32 d / entropy-coded bits),
    ``k_hat/k`` (nonzeros decoded over ceil(ratio d), sparsifiers only), ``rel_error`` (||C(g) - g||^2/||g||^2).
    """
    from gradstat import compressors
    from gradstat.compressors.context import Context

    if size < 1 or repeats < 1:
        raise ValueError(f"size and repeats must be >= 1, got size={size}, repeats={repeats}")
    if not (0.0 < ratio < 1.0):
        raise ValueError(f"ratio must lie in (0, 1), got {ratio}")
    dev = bench_device(device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    u = torch.rand(size, generator=gen, dtype=torch.float64) - 0.5
    g = (-torch.sign(u) * torch.log1p(-2 * u.abs())).float().to(dev)
    abs_g = g.abs()
    k = math.ceil(ratio * size)
    selected = [n.strip() for n in names.split(",") if n.strip()] or compressors.names()
    unknown = sorted(set(selected) - set(compressors.names()))
    if unknown:
        raise ValueError(f"unknown compressor(s) {', '.join(unknown)}; known: {', '.join(compressors.names())}")

    topk_ms = median_ms(lambda: torch.topk(abs_g, k, sorted=False), repeats, dev)
    dense_bits = 32 * size
    rows = [
        {
            "compressor": "torch.topk",
            "spec": f"torch.topk(|g|, k={k})",
            "ms": topk_ms,
            "vs_topk": 1.0,
            "bits": None,
            "gain": None,
            "entropy_gain": None,
            "k_hat/k": 1.0,
            "rel_error": None,
        }
    ]
    energy = float((g.double() ** 2).sum())
    for name in selected:
        progress(f"bench compressors: {name} at size {size}")
        c = _build(name, ratio, abs_g)
        side = g if c.properties.needs_side else None
        ctx = Context(seed=seed, worker=1 if side is not None else 0)
        ctx = ctx.but(state=c.new_state(g))

        def step(c=c, ctx=ctx, side=side):
            payload = c.encode(g, ctx)
            return payload, c.decode(payload, ctx, side=side)

        ms = median_ms(step, repeats, dev)
        payload, out = step()
        rows.append(
            {
                "compressor": name,
                "spec": c.spec(),
                "ms": ms,
                "vs_topk": ms / topk_ms,
                "bits": payload.bits,
                "gain": dense_bits / payload.bits,
                "entropy_gain": dense_bits / payload.entropy_bits(),
                "k_hat/k": int((out != 0).sum()) / k if c.properties.kind == "sparsifier" else None,
                "rel_error": float(((out.double() - g.double()) ** 2).sum()) / energy,
            }
        )
    columns = ["compressor", "ms", "vs_topk", "bits", "gain", "entropy_gain", "k_hat/k", "rel_error", "spec"]
    return pd.DataFrame(rows)[columns]

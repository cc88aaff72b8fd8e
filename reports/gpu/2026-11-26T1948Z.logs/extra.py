"""The script behind extra.log (run on the GPU machine right after the check of 2026-11-26T1948Z, from the
repository root): 26M Laplace float32 elements on CUDA, each encode 3 times to warm up (the graph is captured at the
second), then the mean of 20 encodes with the device synchronised before and after, with CUDA graphs and without
(GRADSTAT_CUDA_GRAPHS), the growth of torch.cuda.memory_reserved() and the captures and replays of the
compressor's graph cache."""

import time

import torch

import gradstat.compressors  # noqa: F401
from gradstat.compressors import graphs
from gradstat.compressors.context import Context
from gradstat.compressors.registry import create

g = torch.distributions.Laplace(0.0, 1.0).sample((26_000_000,)).cuda()
for spec in ["sidco:ratio=0.001,dist=exp,stages=1", "sidco:ratio=0.001,dist=gamma,stages=3", "qsgd", "dgc:ratio=0.001"]:
    for mode in ("auto", "never"):
        c = create(spec)
        torch.cuda.synchronize()
        before = torch.cuda.memory_reserved()
        with graphs.forced(mode):
            for step in range(3):
                c.encode(g, Context(step=step))
            torch.cuda.synchronize()
            t = time.perf_counter()
            for step in range(20):
                c.encode(g, Context(step=step))
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t) / 20 * 1e3
        cache = graphs._CACHES.get(id(c))
        caps = (cache.captures, cache.replays) if cache else None
        grown = (torch.cuda.memory_reserved() - before) / 1e6
        print(f"{spec:40s} graphs={mode:5s} {ms:7.3f} ms/encode  reserved +{grown:8.1f} MB  captures,replays={caps}")

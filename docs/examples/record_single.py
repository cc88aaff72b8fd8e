"""Record a model's gradients from your own single-process training loop, then read them back and compress them.

Run: ``python docs/examples/record_single.py my-dump`` (the folder must not exist).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

import gradstat
from gradstat.analysis.training.recorder import Recorder


def train_and_record(path: str, steps: int = 6, every: int = 2) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder = Recorder.create(path, model, workload="my-mlp", every=every)
    recorder.attach(model, optimizer)  # writes the gradients before every recorded optimizer.step()
    for _ in range(steps):
        x, y = torch.randn(32, 20), torch.randint(0, 3, (32,))
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def analyse(path: str) -> None:
    dump = gradstat.open_dump(path)
    print("steps", dump.steps, "workers", dump.workers, "parameters", dump.numel)
    g = dump.flat(dump.steps[-1])  # the whole step in model order, 1-D
    print("gamma MLE fit of |g|:", gradstat.fit(g.abs(), "gamma", "mle").params)
    c = gradstat.create("topk:ratio=0.05")
    payload = c.encode(g, gradstat.Context(seed=0, step=0))
    error = (c.decode(payload) - g).norm() ** 2 / g.norm() ** 2
    print(f"top-k: {payload.bits} bits, relative error {float(error):.4f}")


if __name__ == "__main__":
    train_and_record(sys.argv[1])
    analyse(sys.argv[1])

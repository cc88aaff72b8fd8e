"""The site's DDP examples, run on the ranks of one process group (one launch for all: starting ranks is the slow
part). Called by ``tests/distributed/_ranks.run_ranks`` with ``docs/examples`` on the path."""

from __future__ import annotations

import re
import textwrap
from typing import Any

import torch
from torch import nn


def docstring_code(doc: str) -> str:
    """The first literal block (after a line ending in ``::``) of a docstring, dedented."""
    match = re.search(r"::\n\n((?:[ \t]+.*\n|\n)+)", doc)
    if match is None:
        raise ValueError("no literal block in the docstring")
    return textwrap.dedent(match.group(1)).strip()


def hook_usage_step() -> int:
    """The usage example of ``gradstat.compressors.ddp.hook``'s docstring (rendered in the API reference), run on a
    small DDP model for one step; the bits the hook sent."""
    from gradstat.compressors.ddp import hook

    ddp = nn.parallel.DistributedDataParallel(nn.Linear(64, 4))  # 260 parameters: top-k at 1 % keeps 3
    scope: dict[str, Any] = {"make_hook": hook.make_hook, "ddp": ddp}
    exec(docstring_code(hook.__doc__ or ""), scope)
    ddp(torch.randn(8, 64)).square().mean().backward()
    return scope["state"].take_metrics().bits


def run_examples(rank: int, world: int, out: str) -> dict[str, Any]:
    """``my_ddp.train`` (the "Add your own compressor" page), ``ddp_record_train.run`` (the DDP guide pages) and the
    DDP hook module's docstring example (the API reference)."""
    import ddp_record_train
    import my_ddp

    return {
        "my_ddp": my_ddp.train(3),
        "ddp_record_train": ddp_record_train.run(out),
        "hook_docstring_bits": hook_usage_step(),
    }

"""The site's two DDP examples, run on the ranks of one process group (one launch for both: starting ranks is the
slow part). Called by ``tests/distributed/_ranks.run_ranks`` with ``docs/examples`` on the path."""

from __future__ import annotations

from typing import Any


def run_examples(rank: int, world: int, out: str) -> dict[str, Any]:
    """``my_ddp.train`` (the "Add your own compressor" page) and ``ddp_record_train.run`` (the DDP guide pages)."""
    import ddp_record_train
    import my_ddp

    return {"my_ddp": my_ddp.train(3), "ddp_record_train": ddp_record_train.run(out)}

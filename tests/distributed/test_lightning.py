"""gradstat's hook under Lightning's DDP strategy, on 2 gloo ranks (CPU), where Lightning is installed
(``pip install "gradstat[lightning]"``; the tests skip without it).

Lightning's own option, ``DDPStrategy(ddp_comm_hook=hook, ddp_comm_state=state)``, registers the hook only when the
strategy's device is a CUDA device: on CPU it trains with DDP's default all-reduce and says nothing, and
``HookWatch.check`` in ``on_before_optimizer_step`` raises ``HookNeverRan`` at the first step. The callback
``GradstatHook`` (in tests/distributed/_lightning_recipe.py: the recipe docs/guide/launchers.md includes) registers
the hook in ``on_fit_start`` on the model that Lightning has wrapped and trains through it on any device, every step
checked.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.distributed._ranks import run_ranks

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="Lightning is not installed")

STEPS = 3
"""Optimizer steps of each run (tests/distributed/_lightning_recipe.py's STEPS)."""


@pytest.fixture(scope="module")
def lightning_ddp() -> list[tuple[str, tuple[list[int], list[torch.Tensor]]]]:
    """Both recipes on the same 2 ranks (one start of the ranks)."""
    from tests.distributed import _lightning_recipe as recipe  # (imports Lightning: only when the tests run)

    assert recipe.STEPS == STEPS
    return run_ranks(recipe._both, world=2)


def test_lightnings_hook_option_is_dropped_on_cpu_and_the_watch_says_so(lightning_ddp):
    for message, _ in lightning_ddp:
        assert message.startswith("gradstat's communication hook did not run during the backward pass"), message
        assert "Lightning's DDPStrategy(ddp_comm_hook=...) on CPU" in message and "on_fit_start" in message


def test_the_recipes_callback_compresses_every_step_and_the_ranks_agree(lightning_ddp):
    (_, (bits0, params0)), (_, (bits1, params1)) = lightning_ddp
    assert len(bits0) == len(bits1) == STEPS and all(b > 0 for b in bits0 + bits1)
    # DDP applied the same averaged (compressed) gradient on both ranks: their parameters stay equal
    for p0, p1 in zip(params0, params1, strict=True):
        torch.testing.assert_close(p0, p1, rtol=0, atol=0)

"""The compiled kernels' variant limit is raised under every supported torch (the setting's name changed in 2.6)."""

from __future__ import annotations

import torch

from gradstat.theory import fused


def test_the_limit_is_raised_while_a_kernel_runs_and_restored_after():
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    before = getattr(config, name)
    with fused.recompile_limit():
        assert getattr(config, name) == fused.RECOMPILE_LIMIT
    assert getattr(config, name) == before

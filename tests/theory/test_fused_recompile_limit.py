"""The compiled kernels under every supported torch: the variant limit (its setting was renamed in 2.6) and the
oldest torch that compiles them (below it, `auto` stays eager)."""

from __future__ import annotations

import pytest
import torch

from gradstat.theory.kernels import fused, policy


def test_the_limit_is_raised_while_a_kernel_runs_and_restored_after():
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    before = getattr(config, name)
    with fused.recompile_limit():
        assert getattr(config, name) == fused.RECOMPILE_LIMIT
    assert getattr(config, name) == before


@pytest.mark.parametrize(
    ("version", "parsed"), [("2.13.0+cpu", (2, 13)), ("2.1.0+cu121", (2, 1)), ("2.10.0a0+git1234", (2, 10))]
)
def test_the_torch_version_is_read_as_major_and_minor(monkeypatch, version, parsed):
    monkeypatch.setattr(torch, "__version__", version)
    assert policy.torch_version() == parsed


def test_auto_does_not_compile_below_the_torch_whose_kernels_equal_eager(monkeypatch):
    """torch 2.1-2.5 compile the counter hash's kernels to other values than eager: auto stays eager there."""
    major, minor = policy.COMPILE_TORCH
    monkeypatch.setattr(torch, "__version__", f"{major}.{minor - 1}.0")
    policy.can_compile.cache_clear()
    try:
        assert not policy.can_compile()
        monkeypatch.setenv(policy.ENV, "auto")
        assert not fused.Fused(torch.abs).compiled_for(torch.zeros(policy.MIN_ELEMENTS))
    finally:
        monkeypatch.undo()
        policy.can_compile.cache_clear()


def test_auto_compiles_cuda_tensors_only_where_triton_builds_them(monkeypatch):
    """Under ``auto`` a CUDA tensor of MIN_ELEMENTS or more runs compiled exactly when torch can build CUDA kernels
    here (torch 2.9 or newer with Triton); smaller ones and other devices stay eager. Checked on meta tensors (the
    decision reads only the device type and the size)."""
    monkeypatch.setenv(policy.ENV, "auto")
    big = torch.empty(policy.MIN_ELEMENTS, device="meta")
    for present in (True, False):
        monkeypatch.setattr(policy, "can_compile_cuda", lambda present=present: present)
        assert policy.compiler_for("cuda") is present
        monkeypatch.setattr(policy, "cache_problem", lambda: None)
        cuda_like = type("CudaLike", (), {"device": torch.device("cuda"), "numel": lambda self: big.numel()})()
        assert policy.compiles(cuda_like) is present
        small = type("CudaLike", (), {"device": torch.device("cuda"), "numel": lambda self: big.numel() - 1})()
        assert policy.compiles(small) is False
    assert policy.compiler_for("meta") is False

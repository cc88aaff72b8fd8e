"""The bounded selection (theory/kernels/bounded.py): no host read in its eager form, clear errors, the kept prefix
when the selection overflows its buffers, the fallback from a failed Triton build, and the Triton kernels' CUDA
build checked without a GPU. The equivalence of every form with the reference is in test_equivalence.py."""

from __future__ import annotations

import warnings

import pytest
import torch

from gradstat.theory.kernels import bounded, peaks, policy, triton_runtime, triton_select

needs_triton = pytest.mark.skipif(not triton_select.available(), reason="no Triton 3.0 or newer here")


def _laplace(n: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).to(dtype)


# -- no host read: the eager form runs on meta tensors, where any read of a value raises ----------------------------


def test_a_host_read_raises_on_the_meta_device_so_the_proof_below_can_fail():
    x = torch.empty(100, device="meta")
    with pytest.raises((RuntimeError, NotImplementedError)):
        bounded.reference(x, torch.tensor(1.0, device="meta"), True, 10)  # (it reads the count: nonzero)
    with pytest.raises((RuntimeError, NotImplementedError)):
        x.sum().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("capacity", [0, 7, 1000])
@pytest.mark.parametrize("scattered", [False, True], ids=["nonzero_static", "cumsum-scatter"])
def test_the_eager_form_never_reads_a_value_back_to_the_host(dtype, signed, capacity, scattered, monkeypatch):
    if scattered:
        monkeypatch.setattr(bounded, "_first_true", bounded._first_true_scattered)
    x = torch.empty(1000, dtype=dtype, device="meta")
    for threshold in (torch.tensor(1.0, device="meta"), torch.tensor(1.0, dtype=torch.float32, device="meta")):
        for select in (bounded.eager, bounded.select_bounded):
            got = select(x, threshold, signed, capacity)
            assert got.indices.shape == (capacity,) and got.indices.dtype == torch.int64
            assert got.values.shape == (capacity,) and got.values.dtype == dtype
            assert got.count.shape == () and got.count.dtype == torch.int64
            assert {got.indices.device.type, got.values.device.type, got.count.device.type} == {"meta"}


def test_an_empty_vector_selects_nothing_on_the_meta_device_too():
    got = bounded.eager(torch.empty(0, device="meta"), torch.tensor(1.0, device="meta"), True, 3)
    assert got.indices.shape == (3,) and got.count.shape == ()


# -- the kept prefix: by hand ------------------------------------------------------------------------------------------

X = torch.tensor([0.0, 3.0, -1.0, 5.0, 0.0, -7.0, 2.0, 9.0, float("nan"), -2.0])
"""|x| >= 2 at 1, 3, 5, 6, 7, 9 (six elements; zeros and NaN never selected); x >= 2 at 1, 3, 6, 7 (four)."""


def _forms() -> list[tuple[str, object]]:
    forms = [("reference", bounded.reference), ("eager", bounded.eager), ("select_bounded", bounded.select_bounded)]
    return forms + ([("triton", bounded.triton)] if triton_select.available() else [])


@pytest.mark.parametrize(("name", "select"), _forms(), ids=[name for name, _ in _forms()])
def test_an_overflow_keeps_the_first_selected_in_order_and_the_whole_count(name, select, device):
    x = X.to(device)
    got = select(x, torch.tensor(2.0, device=device), True, 4)
    assert got.indices.tolist() == [1, 3, 5, 6]
    assert got.values.tolist() == [3.0, 5.0, -7.0, 2.0]  # x's own signed values
    assert int(got.count) == 6
    got = select(x, torch.tensor(2.0, dtype=torch.float64, device=device), False, 3)
    assert (got.indices.tolist(), got.values.tolist(), int(got.count)) == ([1, 3, 6], [3.0, 5.0, 2.0], 4)


@pytest.mark.parametrize(("name", "select"), _forms(), ids=[name for name, _ in _forms()])
def test_room_to_spare_is_filled_with_minus_one_and_zero(name, select, device):
    got = select(X.to(device), torch.tensor(2.0, device=device), False, 6)
    assert got.indices.tolist() == [1, 3, 6, 7, -1, -1]
    assert got.values.tolist() == [3.0, 5.0, 2.0, 9.0, 0.0, 0.0]
    assert int(got.count) == 4


@pytest.mark.parametrize("capacity", [0, 1, 50, 400])
def test_the_scatter_form_for_devices_without_nonzero_static_equals_the_reference(capacity, monkeypatch):
    monkeypatch.setattr(bounded, "_first_true", bounded._first_true_scattered)
    for seed, dtype in ((1, torch.float32), (2, torch.float64)):
        x = _laplace(1000, seed, dtype)
        x[::9] = 0.0
        threshold = torch.tensor(1.5)
        want, got = bounded.reference(x, threshold, True, capacity), bounded.eager(x, threshold, True, capacity)
        assert torch.equal(got.indices, want.indices) and torch.equal(got.values, want.values)
        assert torch.equal(got.count, want.count) and int(want.count) > 50  # (capacities below and above the count)


# -- errors ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "threshold", "capacity", "message"),
    [
        (torch.ones(2, 3), torch.tensor(1.0), 1, "x must be a 1-D float32 or float64 tensor"),
        (torch.ones(4, dtype=torch.float16), torch.tensor(1.0), 1, "x must be a 1-D float32 or float64 tensor"),
        (torch.ones(4, dtype=torch.int64), torch.tensor(1.0), 1, "x must be a 1-D float32 or float64 tensor"),
        ([1.0, 2.0], torch.tensor(1.0), 1, "got list"),
        (torch.ones(4), 1.0, 1, "threshold must be a 0-d floating tensor"),
        (torch.ones(4), torch.tensor([1.0]), 1, "threshold must be a 0-d floating tensor"),
        (torch.ones(4), torch.tensor(1), 1, "threshold must be a 0-d floating tensor"),
        (torch.ones(4), torch.tensor(1.0, device="meta"), 1, "threshold is on meta, x on cpu"),
        (torch.ones(4), torch.tensor(1.0), -1, "capacity must be a host int >= 0, got -1"),
        (torch.ones(4), torch.tensor(1.0), 2.0, "capacity must be a host int >= 0, got 2.0"),
        (torch.ones(4), torch.tensor(1.0), True, "capacity must be a host int >= 0, got True"),
        (torch.ones(4), torch.tensor(1.0), torch.tensor(3), "capacity must be a host int >= 0"),
    ],
)
def test_a_bad_argument_is_refused_by_name(x, threshold, capacity, message):
    for _, select in _forms():
        with pytest.raises(ValueError, match=message):
            select(x, threshold, True, capacity)


# -- which form runs, and the fallback from a failed Triton build ------------------------------------------------------


def test_a_cpu_tensor_runs_the_eager_form_whatever_the_policy():
    for mode in policy.POLICIES:
        with policy.forced(mode):
            assert bounded.form_for(torch.ones(3)) == "eager"


@pytest.mark.cuda
def test_a_cuda_tensor_runs_triton_where_installed_and_the_policy_allows():
    x = torch.ones(3, device="cuda")
    assert bounded.form_for(x) == ("triton" if triton_select.available() else "eager")
    with policy.forced("never"):
        assert bounded.form_for(x) == "eager"


@pytest.mark.cuda
def test_the_selection_on_cuda_waits_for_nothing_on_the_host():
    x = _laplace(1 << 20, 3).cuda()
    threshold = torch.tensor(2.5, device="cuda")
    bounded.select_bounded(x, threshold, True, 4096)  # (a first call builds the kernels)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = bounded.select_bounded(x, threshold, True, 4096)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = bounded.reference(x, threshold, True, 4096)
    assert torch.equal(got.indices, want.indices) and torch.equal(got.count, want.count)


def test_a_failed_triton_build_warns_once_and_the_eager_form_runs(monkeypatch):
    def broken_build(interpret: bool) -> None:
        raise RuntimeError("no compiler here\nsecond line")

    monkeypatch.setattr(triton_select, "build", broken_build)
    monkeypatch.setattr(triton_select, "available", lambda: True)
    monkeypatch.setattr(bounded, "_BROKEN", triton_runtime.Fallback("the Triton bounded selection", policy.ENV))
    monkeypatch.setattr(bounded, "form_for", lambda x: "eager" if bounded._BROKEN.is_set() else "triton")
    want = bounded.reference(X, torch.tensor(2.0), True, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [bounded.select_bounded(X, torch.tensor(2.0), True, 4) for _ in range(2)]
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "(RuntimeError: no compiler here)" in messages[0], messages
    assert bounded._BROKEN.is_set()
    for g in got:
        assert torch.equal(g.indices, want.indices) and torch.equal(g.values, want.values)
        assert torch.equal(g.count, want.count)


def test_a_triton_failure_during_a_graph_capture_fails_the_capture_and_turns_nothing_off(monkeypatch):
    """CUDA refuses some things only while a stream is captured (loading a kernel Triton has just built): a Triton
    form that fails then raises, so the capture fails and that input launches directly, and the form stays on for
    the rest of the process; outside a capture the same failure turns it off, warning once."""
    broken = triton_runtime.Fallback("the Triton bounded selection", policy.ENV)
    monkeypatch.setattr(triton_runtime, "capturing", lambda: True)
    with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
        broken.report(RuntimeError("operation not permitted when stream is capturing"))
    assert not broken.is_set() and not broken.failed
    monkeypatch.setattr(triton_runtime, "capturing", lambda: False)
    with pytest.warns(RuntimeWarning, match="the Triton bounded selection failed"):
        broken.report(RuntimeError("no compiler here"))
    assert broken.is_set() and broken.failed


def test_the_triton_form_itself_raises_rather_than_falls_back(monkeypatch):
    def broken_build(interpret: bool) -> None:
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(triton_select, "build", broken_build)
    with pytest.raises(RuntimeError, match="no compiler here"):
        bounded.triton(X, torch.tensor(2.0), True, 4)


def test_the_package_imports_and_selects_without_triton(monkeypatch):
    monkeypatch.setattr(triton_runtime, "_installed", lambda: False)
    assert not triton_select.available()
    assert bounded.form_for(X) == "eager"
    got = bounded.select_bounded(X, torch.tensor(2.0), True, 4)
    assert got.indices.tolist() == [1, 3, 5, 6] and int(got.count) == 6


# -- the Triton kernels' CUDA build, checked on a machine without a GPU ------------------------------------------------


@needs_triton
@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
def test_the_triton_kernels_compile_for_cuda_without_a_gpu(dtype, tmp_path, monkeypatch):
    """Triton's own compiler down to the GPU's machine code (sm_90), for the three kernels: a CI machine without a GPU
    checks that the CUDA build (the form a GPU runs) goes through; the interpreter checks what it computes."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    count_blocks, write_blocks = triton_select.build(interpret=False)
    finish = triton_runtime.build(triton_select._finish, interpret=False)
    constants = {"SIGNED": True, "WIDE": dtype == "fp64", "BLOCK": triton_select.BLOCK}
    plain, skipping = {"PEAKS": False, "SUB": 1}, {"PEAKS": True, "SUB": peaks.SUB}
    storing = {"PEAKS": False, "STORE": True, "SUB": peaks.SUB}
    builds = []
    for threshold in sorted({dtype, "fp64"}):  # (a queued encode's threshold is float64 whatever x's dtype)
        common = {"x_ptr": f"*{dtype}", "t_ptr": f"*{threshold}", "peaks_ptr": f"*{dtype}", "n": "i32",
                  "n_peaks": "i32", "SIGNED": "constexpr", "WIDE": "constexpr", "PEAKS": "constexpr",
                  "SUB": "constexpr", "BLOCK": "constexpr"}  # fmt: skip
        counting = {**common, "counts_ptr": "*i64", "tops_ptr": f"*{dtype}", "EXTREMES": "constexpr",
                    "STORE": "constexpr"}  # fmt: skip
        builds.append((count_blocks, counting, {**constants, **plain, "STORE": False, "EXTREMES": False}))
        builds.append((count_blocks, counting, {**constants, **plain, "STORE": False, "EXTREMES": True}))
        builds.append((count_blocks, counting, {**constants, **skipping, "STORE": False, "EXTREMES": False}))
        builds.append((count_blocks, counting, {**constants, **storing, "EXTREMES": True}))  # (DGC's: no peaks)
        builds.append((count_blocks, counting, {**constants, **storing, "EXTREMES": False}))  # (a random subset's)
        writing = {**common, "ends_ptr": "*i64", "counts_ptr": "*i64", "indices_ptr": "*i64",
                   "values_ptr": f"*{dtype}", "lows_ptr": f"*{dtype}", "tied_ptr": "*i32", "capacity": "i32",
                   "TIES": "constexpr"}  # fmt: skip
        builds += [(write_blocks, writing, {**constants, **skipping, "TIES": ties}) for ties in (False, True)]
        builds.append((write_blocks, {**writing, "n": "i64"}, {**constants, **skipping, "TIES": True}))  # (2^31+)
    finishing = {"ends_ptr": "*i64", "tops_ptr": f"*{dtype}", "lows_ptr": f"*{dtype}", "tied_ptr": "*i32",
                 "indices_ptr": "*i64", "values_ptr": f"*{dtype}", "tally_ptr": "*fp64", "blocks": "i32",
                 "capacity": "i32", "EXTREMES": "constexpr", "TIES": "constexpr", "CHUNK": "constexpr",
                 "STEPS": "constexpr", "FILL": "constexpr"}  # fmt: skip
    for extremes, ties in ((False, False), (True, True)):
        sizes = {"CHUNK": triton_select.CHUNK, "STEPS": 16, "FILL": triton_select.FILL}
        builds.append((finish, finishing, {"EXTREMES": extremes, "TIES": ties, **sizes}))
    for kernel, signature, values in builds:
        names = kernel.arg_names
        ordered = {name: signature[name] for name in names}
        target = GPUTarget("cuda", 90, 32)  # (with the launches' own options: no fused multiply-add)
        compiled = triton.compile(
            ASTSource(kernel, ordered, values), target=target, options=dict(triton_runtime.COMPILE_OPTIONS)
        )
        ptx = compiled.asm["ptx"]
        assert ".ftz" not in ptx  # subnormals compared as they are (the threshold may be the smallest one)
        assert compiled.asm["cubin"]

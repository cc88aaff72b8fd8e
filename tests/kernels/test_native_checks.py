"""The stage statistics' C loops check their buffers before they read: element type, and the range inside the
buffer, with a message naming the loop."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradstat.theory.kernels import native

pytestmark = pytest.mark.skipif(not native.built(), reason="the C extension is not built here")


def test_a_range_past_the_buffer_is_refused():
    ext = native.extension()
    x = np.ones(10, dtype=np.float32)
    with pytest.raises(ValueError, match=r"tail_f32: range \[0, 11\) of 10 elements"):
        ext.tail_f32(x, 0, 11, 0.0, 0.0, 1.0, True)
    with pytest.raises(ValueError, match=r"summary_f32: range \[4, 3\) of 10 elements"):
        ext.summary_f32(x, 4, 3, True, True, True)


def test_another_element_type_is_refused():
    ext = native.extension()
    with pytest.raises(TypeError, match="summary_f32: needs float32 elements"):
        ext.summary_f32(np.ones(3), 0, 3, True, True, True)
    with pytest.raises(TypeError, match="tail_f32: needs float32 elements"):
        ext.tail_f32(np.ones(3, dtype=np.int8), 0, 3, 0.0, 0.0, 1.0, False)


def test_an_empty_range_gives_the_neutral_results():
    ext = native.extension()
    x = np.ones(4, dtype=np.float32)
    assert ext.tail_f32(x, 2, 2, 0.0, 0.0, 1.0, True) == (0, 0.0, 0.0, 0.0)
    assert ext.tail_f32(x, 2, 2, 0.0, 0.0, 1.0, True, True) == (0, 0.0, 0.0, 0.0)
    for logs in (False, True):
        assert ext.summary_f32(x, 1, 1, True, True, True, logs) == (
            float("inf"),
            float("-inf"),
            0,
            0.0,
            0.0,
            float("inf"),
            False,
            0.0,
        )


@pytest.mark.parametrize("n", [1, 65_536, 65_537, 1_000_003])
def test_the_statistics_do_not_depend_on_the_thread_count(monkeypatch, n):
    """Fixed blocks and exactly rounded joins: one thread and five give the same bits (a recorded run and its
    replay on another machine's thread count choose the same thresholds)."""
    import torch

    from gradstat.theory.kernels import stage_stats

    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * torch.rand(n, generator=g).pow(8) * 1e3
    t = torch.tensor(0.5, dtype=torch.float64)
    results = []
    for threads in (1, 5):
        monkeypatch.setattr(native, "PARALLEL_MIN", 64)
        monkeypatch.setattr(native.torch, "get_num_threads", lambda threads=threads: threads)
        results.append(
            (
                stage_stats._native_summary(x, True),
                stage_stats._native_summary(x, True, True, True, True),  # with the sum of logarithms
                stage_stats._native_tail(x, t, t, torch.tensor(0.25, dtype=torch.float64), False),
                stage_stats._native_tail(x, t, t * 0, torch.tensor(0.25, dtype=torch.float64), True),
            )
        )
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


EDGES = [1e-45, 1.2e-38, 1.1754944e-38, 0.70710677, 0.70710683, 1.0, 1.0000001, 1.4142135, 1.4142137, 2.0, 3.0, 1e10,
         3.4028235e38]  # fmt: skip
"""float32 magnitudes at the log's edges: subnormals, the smallest normal, both sides of sqrt(1/2) and sqrt(2)
(where the mantissa is halved), 1 and its neighbour, powers of two, float32's largest."""


@pytest.mark.parametrize("avx2", [True, False])
def test_the_sum_of_logarithms_is_the_float64_log_of_each_magnitude(avx2: bool) -> None:
    # each edge value alone in a range of 8 (one AVX2 step) and of 3 (the scalar loop): the sum is 8 (3) times the
    # float64 logarithm of the float32 magnitude plus log(inv_unit), to 2 float64 ulps of each term
    ext = native.extension()
    before = ext.set_avx2(avx2)
    try:
        for value in EDGES:
            for n in (8, 3):
                x = np.full(n, np.float32(value))
                x[::2] *= -1  # magnitudes: the signs must not matter
                count, _, _, sum_log = ext.tail_f32(x, 0, n, 0.0, 0.0, 0.125, False, True)
                want = n * (math.log(float(np.float32(value))) + math.log(0.125))
                assert count == n and sum_log == pytest.approx(want, rel=4e-16 * n, abs=1e-300), (value, n)
    finally:
        ext.set_avx2(before)


def test_the_sum_of_logarithms_leaves_out_unused_elements_and_follows_zero_and_infinity() -> None:
    ext = native.extension()
    x = np.array([0.0, 0.5, -4.0, np.nan, 2.0, 0.0, 0.25, 8.0, 16.0], dtype=np.float32)
    _, _, _, sum_log = ext.tail_f32(x, 0, x.size, 1.0, 0.0, 1.0, False, True)  # |x| > 1: 4, 2, 8, 16
    assert sum_log == pytest.approx(math.log(4 * 2 * 8 * 16), rel=1e-15)
    assert ext.tail_f32(x, 0, x.size, -1.0, 0.0, 1.0, False, True)[3] == -math.inf  # zeros used: log 0
    y = np.array([1.0] * 7 + [np.inf], dtype=np.float32)
    assert ext.tail_f32(y, 0, 8, 0.0, 0.0, 1.0, False, True)[3] == math.inf


@pytest.mark.parametrize("avx2", [True, False])
def test_the_summary_sums_the_logarithms_of_the_nonzero_magnitudes(avx2: bool) -> None:
    # the same product-of-mantissas sum as tail_f32's, over |x| != 0 (NaN flagged, not summed), 8 + 3 elements so
    # that both the AVX2 step and the scalar remainder hold edge values
    ext = native.extension()
    before = ext.set_avx2(avx2)
    try:
        x = np.array(EDGES[:11], dtype=np.float32)
        x[1::2] *= -1
        x = np.insert(x, 3, 0.0)[:11]
        want = math.fsum(math.log(abs(float(v))) for v in x if v != 0)
        result = ext.summary_f32(x, 0, x.size, True, True, True, True)
        assert result[2] == np.count_nonzero(x) and result[7] == pytest.approx(want, rel=1e-15, abs=1e-13)
        x[5] = np.nan
        assert ext.summary_f32(x, 0, x.size, True, True, True, True)[6] is True  # the caller sets the sums to NaN
    finally:
        ext.set_avx2(before)

"""The stage statistics' C loops check their buffers before they read: element type, and the range inside the
buffer, with a message naming the loop."""

from __future__ import annotations

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
    assert ext.tail_f32(x, 2, 2, 0.0, 0.0, 1.0, True) == (0, 0.0, 0.0)
    lo, hi, count, total, sum_sq, smallest, nan = ext.summary_f32(x, 1, 1, True, True, True)
    assert (lo, hi, count, total, sum_sq, smallest, nan) == (
        float("inf"),
        float("-inf"),
        0,
        0.0,
        0.0,
        float("inf"),
        False,
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
                stage_stats._native_tail(x, t, t, torch.tensor(0.25, dtype=torch.float64), False),
            )
        )
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))

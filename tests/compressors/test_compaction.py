"""The compaction kernel (theory/kernels/compaction.py) against the plain mask: indices, gathered values and the
largest magnitude, on every kind of float32 and float64 value, across its 16-element steps, its scalar tail and its
buffer growth; the switch that turns it off (``GRADSTAT_COMPILE=never``); and the threads it runs on."""

from __future__ import annotations

import math
import os
import threading
import time

import pytest
import torch

from gradstat.theory.kernels import compaction, native

FMAX = torch.finfo(torch.float32).max

built = pytest.mark.skipif(not native.built(), reason=f"gradstat's C extension is absent: {native.absent_reason()}")


def _values(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Laplace values with zeros, signed zeros, ties, denormals and near-overflow magnitudes mixed in."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.empty(n, dtype=torch.float64).exponential_(generator=gen) * (torch.rand(n, generator=gen) - 0.5).sign()
    x = x.to(dtype)  # Laplace(0, 1) from the seeded generator (torch.distributions draws from the global one)
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-45, -3e-39, FMAX, -FMAX / 3, 2.0, -2.0], dtype=dtype)
    where = torch.randint(0, n, (n // 7,), generator=gen)
    x[where] = special[torch.randint(0, len(special), (len(where),), generator=gen)]
    return x


def _plain(x: torch.Tensor, t: float, absolute: bool) -> tuple[torch.Tensor, torch.Tensor]:
    v = x.abs() if absolute else x
    bound = torch.tensor(t, dtype=x.dtype)
    indices = torch.nonzero(v >= bound).squeeze(1)
    return indices, v[indices]


@built
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("absolute", [True, False])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 31, 33, 1000, 100_003])
def test_selection_equals_the_plain_mask(dtype, absolute, n, native_split):
    """Lengths around the 16-element step (the scalar tail alone, one step, a step and a tail), thresholds from
    below every value (all selected: the buffers grow from 4096) to above the largest (none), ties at 1 and 2."""
    x = _values(n, dtype)
    v = x.abs() if absolute else x
    for t in (1e-45, 0.5, 1.0, 2.0, 6.0, float(v.max()), float(v.max()) * 2 if float(v.max()) < 1e300 else 1e308):
        indices, values, top = compaction.select(x, t, absolute, gather=True)
        want, want_values = _plain(x, t, absolute)
        assert indices.dtype == torch.int64 and torch.equal(indices, want), t
        assert values is not None and torch.equal(values, want_values), t
        assert top == float(v.max())
        assert torch.equal(compaction.select(x, t, absolute)[0], want)


@built
def test_buffers_grow_and_are_reused_without_stale_entries(native_split):
    """An expected count far below the real one grows the (reused) buffers several times mid-scan; a later, smaller
    selection must not return entries of the earlier one."""
    x = _values(300_001, torch.float32, seed=1)
    for t, expected in ((0.01, 1), (3.0, 10), (0.5, None), (8.0, 1)):
        indices, values, _ = compaction.select(x, t, True, gather=True, expected=expected)
        want, want_values = _plain(x, t, True)
        assert torch.equal(indices, want) and torch.equal(values, want_values), t


@built
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nan_reaches_the_largest_value_and_is_never_selected_inf_is_both(dtype, native_split):
    x = _values(1000, dtype)
    for where in (0, 7, 15, 16, 500, 999):  # in a step's first or second half, and in the scalar tail
        y = x.clone()
        y[where] = math.nan
        indices, _, top = compaction.select(y, 0.5, True)
        assert math.isnan(top) and where not in indices.tolist()
        assert torch.equal(indices, _plain(y, 0.5, True)[0])
        y[where] = -math.inf
        indices, _, top = compaction.select(y, 0.5, True)
        assert top == math.inf and where in indices.tolist()


def test_compile_policy_never_turns_it_off(monkeypatch):
    monkeypatch.setenv("GRADSTAT_COMPILE", "never")
    assert not compaction.available(torch.zeros(10))


def test_only_contiguous_float_cpu_vectors_qualify():
    assert not compaction.available(torch.zeros(10, dtype=torch.float16))
    assert not compaction.available(torch.zeros(10, 2)[:, 0])


def test_pieces_cover_the_range_in_order_one_per_thread(monkeypatch):
    monkeypatch.setattr(native.torch, "get_num_threads", lambda: 3)
    for n in (0, 1, native.PARALLEL_MIN - 1, native.PARALLEL_MIN, 10 * native.PARALLEL_MIN + 7):
        parts = native.pieces(n)
        assert (
            parts[0][0] == 0 and parts[-1][1] == n and all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False))
        )
        assert len(parts) == (1 if n < native.PARALLEL_MIN else 2 if n < 3 * native.PARALLEL_MIN // 2 else 3)
    assert native.run_all([lambda i=i: i * i for i in range(5)]) == [0, 1, 4, 9, 16]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_gets_a_pool_of_its_own(monkeypatch):
    """A child forked after the pool started (a data loader's worker) must not hand work to threads it does not
    have: it would wait forever."""
    assert native.run_all([lambda: 1, lambda: 2]) == [1, 2]  # the parent's pool exists
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the pool runs
        os._exit(0 if native.run_all([lambda: 3, lambda: 4]) == [3, 4] else 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's pool hung")


@built
def test_concurrent_callers_do_not_share_buffers(native_split):
    """Two threads selecting at once through the shared pool (3 pieces each): every result is its own vector's
    (buffers keyed by caller and piece; one pool thread may serve both callers before either joins)."""
    xs = [_values(200_000, torch.float32, seed=s) for s in (3, 4)]
    want = [_plain(x, 0.5, True)[0] for x in xs]
    wrong = [0, 0]

    def work(j: int) -> None:
        for _ in range(60):
            wrong[j] += not torch.equal(compaction.select(xs[j], 0.5, True)[0], want[j])

    threads = [threading.Thread(target=work, args=(j,)) for j in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [0, 0]

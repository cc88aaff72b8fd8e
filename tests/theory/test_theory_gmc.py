"""GMC Theorem 9 and the communication ratio (004_8d479783bc85b5d8.txt)."""

from __future__ import annotations

import numpy as np
import pytest

from gradstat.theory import gmc


def test_theorem9_value_and_zero_when_everything_is_sent():
    assert gmc.memory_bound(100, 10, 2.0, 0.9, 5.0) == pytest.approx(4 * 90 * 210 * (4 + 0.81 * 5) / 100)
    assert gmc.memory_bound(100, 100, 2.0, 0.9, 5.0) == 0.0


def test_communication_ratio_hand_example():
    # T = 2 steps, p = 2 workers, d = 10
    masks = np.array([[1, 2], [3, 0]])
    updates = np.array([2, 3])
    expected = np.mean([(3 + 2 * 2) / 20, (3 + 2 * 3) / 20])
    assert gmc.communication_ratio(masks, updates, 10) == pytest.approx(expected)


def test_simulated_ratio_respects_the_bound():
    """Random top-s masks on p workers; the update's support is the union of the masks (<= p s)."""
    rng = np.random.default_rng(31)
    d, p, s, T = 1000, 4, 10, 50
    masks = np.zeros((T, p), dtype=int)
    updates = np.zeros(T, dtype=int)
    for t in range(T):
        support = [rng.choice(d, size=s, replace=False) for _ in range(p)]
        masks[t] = s
        updates[t] = np.unique(np.concatenate(support)).size
    cr = gmc.communication_ratio(masks, updates, d)
    assert cr <= gmc.communication_ratio_bound(p, s, d)
    assert gmc.communication_ratio_bound(4, 10, 1000) == pytest.approx(5 * 10 / 1000)


@pytest.mark.parametrize(
    "call, word",
    [
        (lambda: gmc.memory_bound(10, 11, 1.0, 0.5, 1.0), "s"),
        (lambda: gmc.memory_bound(10, 5, 1.0, 1.0, 1.0), "momentum"),
        (lambda: gmc.communication_ratio(np.ones(3), np.ones(3), 10), "shape"),
        (lambda: gmc.communication_ratio(np.ones((3, 2)), np.ones(2), 10), "update_nnz"),
        (lambda: gmc.communication_ratio(np.full((1, 1), 11), np.ones(1), 10), "counts"),
    ],
)
def test_bad_arguments_are_named(call, word):
    with pytest.raises(ValueError, match=word):
        call()

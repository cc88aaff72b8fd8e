"""DGC local momentum correction and GMC global momentum memory (004_8d479783bc85b5d8.txt)."""

from __future__ import annotations

import pytest
import torch
from _sparse_checks import laplace

from gradstat.compressors import create
from gradstat.compressors.memory.momentum import GlobalMomentumCompression, LocalMomentumCorrection

A, E, C = 1.0, 0.3, 1.2  # 0 < e < a < c < a + e (GMC Sec. 3.2)
WORKER_GRADS = [torch.tensor([-A, E]), torch.tensor([A + E, C])]  # f(w; xi_1) = (-a, e).w, f(w; xi_2) = (a+e, c).w


def run_counter_example(memory: bool, momentum: float = 0.0, steps: int = 40) -> list[torch.Tensor]:
    gmc = GlobalMomentumCompression(create("topk:ratio=0.5"), lr=0.05, momentum=momentum, memory=memory)
    states, shared, w, path = gmc.new_states(2), gmc.new_shared(), torch.zeros(2), []
    for _ in range(steps):
        w = w + gmc.round(WORKER_GRADS, states, shared).info["update"]
        path.append(w.clone())
    return path


def test_gmc_counter_example_without_memory_never_moves_the_second_coordinate():
    path = run_counter_example(memory=False)
    assert all(float(w[1]) == 0.0 for w in path)
    assert float(path[-1][0]) < 0  # only w^(1) moves, by -eta e/2 per step
    assert float(path[-1][0]) == pytest.approx(-40 * 0.05 * E / 2, rel=1e-5)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_gmc_counter_example_with_memory_moves_both_coordinates(momentum):
    path = run_counter_example(memory=True, momentum=momentum)
    assert float(path[-1][1]) < 0 and float(path[-1][0]) != 0
    # the true gradient (e/2, (c+e)/2) is larger along w^(2): with memory that is where most of the descent goes
    assert float(path[-1][1]) < float(path[-1][0])


def test_gmc_with_everything_sent_is_momentum_sgd():
    """m = 1: w_{t+1} = w_t - eta mean_k grad_k + beta (w_t - w_{t-1}) (GMC eq. (3), (7)-(8) with u = 0)."""
    gmc = GlobalMomentumCompression(create("topk:ratio=0.999"), lr=0.1, momentum=0.9)
    states, shared = gmc.new_states(3), gmc.new_shared()
    w, w_ref, prev_ref = torch.zeros(50), torch.zeros(50), torch.zeros(50)
    for t in range(6):
        grads = [laplace(50, 10 * t + k) for k in range(3)]
        w = w + gmc.round(grads, states, shared).info["update"]
        w_ref, prev_ref = w_ref - 0.1 * torch.stack(grads).mean(0) + 0.9 * (w_ref - prev_ref), w_ref
        torch.testing.assert_close(w, w_ref, rtol=1e-5, atol=1e-6)


def test_gmc_memory_holds_exactly_what_was_not_sent():
    """sum_t sent + u_T = sum_t g_t per worker (eq. (4)); beta = 0 so g_{t,k} = grad / p."""
    gmc = GlobalMomentumCompression(create("topk:ratio=0.1"), lr=1.0, momentum=0.0)
    states, shared = gmc.new_states(2), gmc.new_shared()
    sent, total = torch.zeros(2, 100), torch.zeros(2, 100)
    for t in range(5):
        grads = [laplace(100, 7 * t + k) for k in range(2)]
        result = gmc.round(grads, states, shared)
        for k in range(2):
            sent[k] += result.decoded[k]
            total[k] += grads[k] / 2
    for k in range(2):
        torch.testing.assert_close(sent[k] + states[k].feedback.residual, total[k], rtol=1e-5, atol=1e-5)


def test_dgc_without_masking_and_full_send_is_local_momentum_sgd():
    dgc = LocalMomentumCorrection(create("topk:ratio=0.999"), momentum=0.9, masking=False)
    states = dgc.new_states(2)
    velocity = [torch.zeros(40), torch.zeros(40)]
    for t in range(5):
        grads = [laplace(40, 3 * t + k) for k in range(2)]
        result = dgc.round(grads, states)
        velocity = [0.9 * v + g for v, g in zip(velocity, grads, strict=True)]
        torch.testing.assert_close(result.mean, torch.stack(velocity).mean(0), rtol=1e-5, atol=1e-6)


def test_dgc_momentum_factor_masking_clears_the_velocity_where_it_sent():
    for masking in (True, False):
        dgc = LocalMomentumCorrection(create("topk:ratio=0.05"), momentum=0.9, masking=masking)
        states = dgc.new_states(1)
        result = dgc.round([laplace(200, 1)], states)
        sent = result.decoded[0] != 0
        assert int(sent.sum()) == 10
        assert bool((states[0].velocity[sent] == 0).all()) == masking
        assert bool((states[0].velocity[~sent] != 0).all())
        assert bool((states[0].feedback.residual[sent] == 0).all())  # accumulated v cleared where sent


@pytest.mark.parametrize("bad", [{"momentum": 1.0}, {"momentum": -0.1}, {"lr": 0.0}])
def test_momentum_wrappers_reject_bad_hyper_parameters(bad):
    with pytest.raises(ValueError):
        GlobalMomentumCompression(create("topk"), **{"lr": 0.1, **bad})
    if "momentum" in bad:
        with pytest.raises(ValueError):
            LocalMomentumCorrection(create("topk"), momentum=bad["momentum"])


@pytest.mark.parametrize("workers", [2, 4])
def test_dgc_refuses_a_round_whose_gradients_and_worker_states_differ_in_number(workers):
    """Three gradients and two states once averaged two workers and dropped the third gradient without a word."""
    dgc = LocalMomentumCorrection(create("topk:ratio=0.5"), momentum=0.0, masking=False)
    grads = [torch.ones(4), torch.ones(4), torch.full((4,), 100.0)]
    with pytest.raises(ValueError, match=f"3 gradients but {workers} worker states"):
        dgc.round(grads, dgc.new_states(workers))

"""The worker send step with error feedback and its round over P workers."""

from __future__ import annotations

import torch
from _sparse_checks import laplace

from gradstat.compressors import create
from gradstat.compressors.context import Context
from gradstat.compressors.memory.feedback import ErrorFeedback
from gradstat.compressors.memory.send import WorkerState, feedback_round, new_worker_states, send_step


def test_plain_feedback_conserves_the_gradient_sum():
    """sum_t C(z_t) + h_T = sum_t g_t for plain error feedback (h = z - C(z))."""
    c, state = create("topk:ratio=0.05"), WorkerState()
    sent, total = torch.zeros(300), torch.zeros(300)
    for t in range(8):
        g = laplace(300, t)
        _, z_hat = send_step(c, ErrorFeedback.plain(), g, state, Context(step=t))
        sent += z_hat
        total += g
    torch.testing.assert_close(sent + state.feedback.residual, total, rtol=1e-5, atol=1e-5)


def test_without_feedback_the_step_is_the_compressor_alone():
    c, state = create("topk:ratio=0.05"), WorkerState()
    for t in range(3):
        g = laplace(300, t)
        _, z_hat = send_step(c, ErrorFeedback.none(), g, state, Context(step=t))
        torch.testing.assert_close(z_hat, c(g, Context(step=t)))


def test_round_goes_through_the_compressor_round_so_side_information_works():
    """NDQSG decodes its second-group workers with side information inside its own round."""
    c = create("ndqsg")
    states = new_worker_states(c, 3)
    grads = [laplace(256, 10 + k) for k in range(3)]
    result = feedback_round(c, ErrorFeedback.plain(), grads, states, Context())
    assert "decoding_failures" in result.info
    for g, z_hat, s in zip(grads, result.decoded, states, strict=True):
        torch.testing.assert_close(s.feedback.residual, g - z_hat.float())


def test_round_holds_one_compressor_state_per_worker():
    c = create("sidco:ratio=0.01")
    states = new_worker_states(c, 2)
    assert states[0].compressor is not states[1].compressor
    feedback_round(c, ErrorFeedback.plain(), [laplace(5000, 1), laplace(5000, 2)], states, Context())
    assert states[0].compressor.calls == 1 and states[1].compressor.calls == 1

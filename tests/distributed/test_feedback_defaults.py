"""Feedback with unbiased quantizers: each compressor's paper's feedback by default, a feedback whose residual grows
without bound refused before training (the exit status 1 of a diverged run: test_train_safety). Their training with
their papers' feedback through ``gradstat train`` is checked in the two-node launch of test_multinode."""

from __future__ import annotations

import pytest

from gradstat.analysis.cli.main import main
from gradstat.analysis.training.feedback_check import error_factors
from gradstat.compressors import create, parse_feedback
from gradstat.compressors.memory.defaults import paper_feedback
from gradstat.theory.qcs import gamma, residual_bound_unbiased


@pytest.mark.parametrize("gamma_, beta", [(0.5, 0.9), (3.0, 0.2), (3.0, 0.45), (10.0, 0.05)])
def test_residual_growth_is_the_denominator_of_qcs_lemma_4(gamma_, beta):
    growth = parse_feedback(f"qcs:beta={beta}").residual_growth(gamma_)
    bound = residual_bound_unbiased(gamma_, beta)  # eta = gamma / (1 - growth) where it exists (eq. (15))
    assert (growth < 1) == (beta < 2 / (1 + gamma_))
    if growth < 1:
        assert bound.value == pytest.approx(gamma_ / (1 - growth), rel=1e-12)


def test_plain_error_feedback_grows_by_the_error_factor():
    assert parse_feedback("ef").residual_growth(2.5) == 2.5 and parse_feedback("none").residual_growth(2.5) == 0


def test_paper_feedback_of_the_unbiased_quantizers():
    assert paper_feedback(create("qsgd"))[0] == "none" and paper_feedback(create("ndqsg"))[0] == "none"
    qcs = paper_feedback(create("qcs:k=64,Q=4,block=256"))[0]  # Remark 2 eq. (17): beta* = 1/(gamma + 1)
    assert parse_feedback(qcs).compensation == pytest.approx(1 / (gamma(256, 64, 4) + 1), rel=1e-5)
    assert paper_feedback(create("qcs:alpha=mmse"))[0] == "ef" and paper_feedback(create("topk"))[0] == "ef"


def test_unbiased_quantizers_err_by_more_than_the_gradient_on_lenet():
    factors = error_factors("lenet", 2, ["qsgd", "qcs", "ndqsg", "topk"], layer=False)
    assert min(factors["qsgd"], factors["qcs"], factors["ndqsg"]) > 1 > factors["topk"]


@pytest.mark.parametrize("spec", ["qsgd", "qcs", "ndqsg"])
def test_error_feedback_on_an_unbiased_quantizer_is_refused_before_training(tmp_path, capsys, spec):
    assert main(["train", "--workload", "lenet", "--compressor", spec, "--feedback", "ef", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{spec} with feedback ef diverges" in err and "error factor" in err and ">= 1 every step" in err
    assert not any(tmp_path.iterdir())


def test_layer_wise_the_factor_is_measured_as_the_hook_sends_and_a_diverging_feedback_is_refused(tmp_path, capsys):
    """lenet's 10-element bias is below what Wangni's and random-k's sparsifiers can compress: the hook sends it
    dense, and so does the measurement, which therefore still covers them layer-wise (it used to leave them out,
    and their error feedback launched)."""
    factors = error_factors("lenet", 2, ["wangni", "randk_unbiased"], layer=True)
    assert set(factors) == {"wangni", "randk_unbiased"} and min(factors.values()) > 1
    args = ["train", "--workload", "lenet", "--compressor", "wangni", "--feedback", "ef", "--granularity", "layer"]
    assert main([*args, "--out", str(tmp_path)]) == 2
    assert "wangni with feedback ef diverges" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())

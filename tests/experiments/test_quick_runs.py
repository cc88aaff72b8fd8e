"""Every experiment at its --quick size, run once per module, held to numbers that follow from the setting (hand
counts of bits, exact top-k counts, the counter-example's algebra) and to the trends each paper states."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from gradstat.analysis.experiments.base import run_experiment
from gradstat.analysis.experiments.registry import get_experiment


def quick(name: str, tmp_path_factory, workloads=None):
    out = tmp_path_factory.mktemp(name)
    result, readme = run_experiment(get_experiment(name), out, quick=True, workloads=workloads)
    text = readme.read_text()
    assert "**Verdict:**" in text
    for f in result.figures:
        assert (out / f).stat().st_size > 0
    return result, out


# -- QCS Fig. 2 -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fig2(tmp_path_factory):
    return quick("qcs-fig2", tmp_path_factory)


def test_fig2_uncompressed_sgd_converges_at_small_mu_and_diverges_far_above_one_over_lambda_max(fig2):
    t = fig2[0].tables["convergence"].set_index(["method", "mu"])
    assert t.loc[("none", 0.05), "converged"] == 1.0
    assert t.loc[("none", 0.40), "converged"] == 0.0


def test_fig2_mmse_qcs_converges_where_qsgd_and_wangni_do_not(fig2):
    t = fig2[0].tables["convergence"].set_index(["method", "mu"])
    assert t.loc[("qcs-mmse", 0.10), "converged"] == 1.0
    assert t.loc[("qsgd", 0.10), "converged"] == 0.0
    assert t.loc[("wangni", 0.10), "converged"] == 0.0


def test_fig2_qcs_bits_are_the_hand_count_at_gain_21(fig2):
    gains = fig2[0].tables["gains"].set_index("method")
    blocks = 50 * 64 // 64
    assert gains.loc["qcs", "bits"] == blocks * (32 * 2 + 32) + 64  # 2-bit codes + a scale per block, one seed
    assert gains.loc["qcs-mmse-fewer-bits", "bits"] == blocks * (13 * 2 + 32) + 64
    assert 20 < gains.loc["qcs", "gain"] < 22


# -- ECQ-SGD Syn --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ecq(tmp_path_factory):
    return quick("ecq-syn", tmp_path_factory)


def test_ecq_error_compensation_closes_most_of_qsgds_gap_to_full_precision(ecq):
    s = ecq[0].tables["ecq_summary"].set_index("method")
    gap_q = s.loc["qsgd", "final_distance"] - s.loc["fp32", "final_distance"]
    gap_e = s.loc["ecq-sgd", "final_distance"] - s.loc["fp32", "final_distance"]
    assert gap_q > 0 and gap_e < 0.5 * gap_q
    assert s.loc["qsgd", "final_loss"] > s.loc["ecq-sgd", "final_loss"] >= s.loc["fp32", "loss_star"]


def test_ecq_bits_are_32_plus_d_times_4(ecq):
    s = ecq[0].tables["ecq_summary"].set_index("method")
    assert s.loc["ecq-sgd", "bits_per_step"] == 32 + 256 * 4
    assert s.loc["qsgd", "bits_per_step"] == 32 + 256 * 4


# -- GMC ----------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gmc(tmp_path_factory):
    return quick("gmc", tmp_path_factory)


def test_gmc_counter_example_w2_is_stuck_without_memory_and_reaches_the_optimum_with_it(gmc):
    ex = gmc[0].tables["gmc_counter_example"]
    assert (ex[~ex["memory"]]["w2"] == 0.0).all()
    last = ex[ex["memory"]].iloc[-1]
    assert last["w1"] == pytest.approx(-1.0, abs=1e-6) and last["w2"] == pytest.approx(-1.0, abs=1e-6)


def test_gmc_communication_ratio_lies_between_s_over_d_and_its_bound(gmc):
    t = gmc[0].tables["gmc_logreg"]
    sparse = t[t["method"] != "dmsgd"]
    assert (t[t["method"] == "dmsgd"]["CR"] == 1.0).all()
    # each worker sends exactly ceil(s d) values (top-K), so CR >= that share; the server's update adds at most p s d
    d = 7850
    assert (sparse["CR"] >= sparse["s_over_d"].map(lambda s: math.ceil(s * d) / d) - 1e-12).all()
    assert (sparse["CR"] <= 5 * sparse["s_over_d"].map(lambda s: math.ceil(s * d) / d) + 1e-12).all()


# -- SIDCo estimation quality -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def quality(tmp_path_factory):
    return quick("sidco-quality", tmp_path_factory)


def test_quality_topk_selects_exactly_k_and_every_estimator_saw_every_step(quality):
    s = quality[0].tables["quality_summary"]
    assert (s["steps"] == 40).all()
    assert (s[s["estimator"] == "topk"]["mean"] == 1.0).all()


def test_quality_gradstat_estimator_holds_mean_k_ratio_within_ten_percent(quality):
    s = quality[0].tables["quality_summary"]
    own = s[s["estimator"] == "tailcount (gradstat)"]
    assert len(own) == 2
    assert own["mean"].between(0.9, 1.1).all()


def test_quality_adaptive_sidco_reports_where_its_search_stands(quality):
    s = quality[0].tables["quality_summary"]
    steps = quality[0].tables["quality_steps"]
    adaptive = s[s["estimator"].isin(["sidco-exp", "sidco-gamma", "sidco-gp"])]
    assert adaptive["adaptation"].str.contains("meets|no M meets|searching").all()
    m = steps[steps["estimator"].str.startswith("sidco")]["stages"]
    assert m.between(1, 8).all()


# -- layer-wise vs whole-model ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def layerwise(tmp_path_factory):
    return quick("layerwise", tmp_path_factory)


def test_layerwise_bits_of_one_scale_per_tensor_are_the_hand_count(layerwise):
    s = layerwise[0].tables["layerwise_summary"]
    q = s[s["compressor"] == "qsgd:s=4,bucket=0"].set_index("mode")
    d, tensors = 266_610, 6  # fc300: three weight matrices and three biases
    assert q.loc["whole", "bits"] == 32 + 4 * d
    assert q.loc["per-layer", "bits"] == 32 * tensors + 4 * d
    assert q.loc["per-layer", "tensors"] == tensors


def test_layerwise_topk_sends_exactly_k_on_the_whole_vector(layerwise):
    s = layerwise[0].tables["layerwise_summary"]
    top = s[s["compressor"] == "topk:ratio=0.01"].set_index("mode")
    assert top.loc["whole", "k_ratio"] == 1.0
    per = pd.Series(top.loc["per-layer", ["k_ratio", "k_target"]])
    assert per["k_ratio"] == pytest.approx(per["k_target"] / math.ceil(0.01 * 266_610))


# -- QCS Fig. 4 ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fig4(tmp_path_factory):
    return quick("qcs-fig4", tmp_path_factory)


def test_fig4_qcs_error_stays_below_theorem_2s_gamma_and_gains_are_the_hand_count(fig4):
    s = fig4[0].tables["qcs_fig4_summary"].set_index("method")
    for label in ("qcs gain 28", "qcs gain 64"):
        assert s.loc[label, "mean"] <= s.loc[label, "gamma_bound"]
    blocks = math.ceil(266_610 / 256)
    assert s.loc["qcs gain 28", "gain"] == pytest.approx(32 * 266_610 / (blocks * (64 * 4 + 32) + 64))
    assert s.loc["qcs gain 64", "gain"] == pytest.approx(32 * 266_610 / (blocks * (32 * 3 + 32) + 64))


def test_fig4_fewer_qsgd_levels_give_a_larger_error(fig4):
    s = fig4[0].tables["qcs_fig4_summary"].set_index("method")
    assert s.loc["qsgd s=1", "mean"] > 2 * s.loc["qsgd s=4", "mean"]


# -- NDQSG Tables 1-2 ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ndqsg(tmp_path_factory):
    return quick("ndqsg-bits", tmp_path_factory)


def test_ndqsg_paper_packing_reproduces_the_fc300_cells_and_payloads_are_the_hand_count(ndqsg):
    t = ndqsg[0].tables["ndqsg_bits"].set_index("method")
    n, tensors, columns = 266_610, 6, 784 + 300 + 100 + 3
    assert t.loc["QSGD", "closed_form_kbits"] == pytest.approx((n * math.log2(3) + tensors * 32) / 1e3)
    assert round(t.loc["DQSGD", "closed_form_kbits"], 1) == 422.8  # Table 1
    assert round(t.loc["One-Bit", "closed_form_kbits"], 1) == 342.6  # Table 1
    assert t.loc["QSGD", "measured_raw_kbits"] == pytest.approx((2 * n + tensors * 32) / 1e3)
    assert t.loc["One-Bit", "measured_raw_kbits"] == pytest.approx((n + 2 * 32 * columns) / 1e3)
    assert (t.drop(index="Baseline")["measured_entropy_kbits"] < t.drop(index="Baseline")["measured_raw_kbits"]).all()

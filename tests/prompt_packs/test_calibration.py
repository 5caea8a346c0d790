"""Calibration maps and metrics on synthetic data where the right answer is known."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest

from prompt_packs import calibration as cal
from prompt_packs import calibration_choice as cc


def _tempered(true_temperature: float, num_rows: int, seed: int = 0):
    """Labels drawn from sigmoid(z); the model reports sigmoid(z * T): over-confident by T."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 2.0, num_rows)
    y = (rng.random(num_rows) < cal.sigmoid(z)).astype(float)
    return cal.sigmoid(z * true_temperature), y


@pytest.mark.parametrize("true_temperature", [0.5, 1.0, 2.5])
def test_temperature_is_recovered(true_temperature):
    p, y = _tempered(true_temperature, 20000)
    fitted = cal.fit_temperature(p, y).params["temperature"]
    assert fitted == pytest.approx(true_temperature, rel=0.06)


def test_temperature_never_moves_a_row_across_one_half():
    p, y = _tempered(3.0, 2000, seed=1)
    after = cal.fit_temperature(p, y).apply(p)
    assert cal.num_flipped(p, after) == 0
    assert cal.auc(after, y) == pytest.approx(cal.auc(p, y), abs=1e-12)


def test_platt_recovers_a_known_slope_and_bias():
    rng = np.random.default_rng(2)
    z = rng.normal(0.0, 2.0, 30000)
    y = (rng.random(len(z)) < cal.sigmoid(0.7 * z - 1.2)).astype(float)
    fitted = cal.fit_platt(cal.sigmoid(z), y).params
    assert fitted["a"] == pytest.approx(0.7, abs=0.05)
    assert fitted["b"] == pytest.approx(-1.2, abs=0.06)


def _logistic_log_loss(x: np.ndarray, y: np.ndarray) -> float:
    """Unpenalised maximum-likelihood logistic regression of y on the columns of x (Newton
    steps written here, independent of the module): its mean log-loss."""
    w = np.zeros(x.shape[1])
    for _ in range(100):
        q = 1.0 / (1.0 + np.exp(-(x @ w)))
        w -= np.linalg.solve((x.T * (q * (1 - q))) @ x, x.T @ (q - y))
    q = 1.0 / (1.0 + np.exp(-(x @ w)))
    return float(-np.mean(y * np.log(q) + (1 - y) * np.log(1 - q)))


def test_platt_keeps_its_bias_only_where_a_likelihood_ratio_test_supports_it():
    chi2_95 = NormalDist().inv_cdf(0.975) ** 2  # chi-square, 1 degree of freedom, 95th percentile
    kept = dropped = 0
    for seed in range(16):
        rng = np.random.default_rng(100 + seed)
        z = rng.normal(0.0, 2.0, 300)
        y = (rng.random(len(z)) < cal.sigmoid(0.6 * z + 0.15 * (seed % 4))).astype(float)
        p = cal.sigmoid(z)
        statistic = 2 * len(y) * (_logistic_log_loss(z[:, None], y)
                                  - _logistic_log_loss(np.stack([z, np.ones_like(z)], 1), y))
        fitted = cal.fit_platt(p, y)
        if abs(statistic - chi2_95) < 0.2:
            continue  # the module's fit is lightly penalised: too close to call here
        if statistic >= chi2_95:
            kept += 1
            assert fitted.params == cal.fit_platt(p, y, test_bias=False).params
        else:
            dropped += 1
            assert fitted.params["b"] == 0.0
            temperature = cal.fit_temperature(p, y).params["temperature"]
            assert fitted.params["a"] == pytest.approx(1 / temperature, rel=1e-12)
            assert cal.num_flipped(p, fitted.apply(p)) == 0
    assert kept >= 3 and dropped >= 3, (kept, dropped)


def test_pool_adjacent_violators_is_monotone_and_keeps_the_mean():
    rng = np.random.default_rng(3)
    y = rng.random(500)
    means, weights, sizes = cal.pool_adjacent_violators(y, np.ones_like(y))
    assert np.all(np.diff(means) >= 0)
    assert sum(sizes) == 500
    assert np.sum(means * weights) == pytest.approx(y.sum())


def test_pool_adjacent_violators_small_known_case():
    means, _, sizes = cal.pool_adjacent_violators(np.array([1.0, 3.0, 2.0, 4.0, 4.0]), np.ones(5))
    assert means.tolist() == [1.0, 2.5, 4.0]
    assert sizes == [1, 2, 2]  # the two equal 4.0 rows pool into one block


def test_isotonic_is_monotone_and_fixes_a_bent_map():
    rng = np.random.default_rng(4)
    p = rng.random(20000)
    y = (rng.random(len(p)) < p**3).astype(float)  # true rate is p cubed: badly calibrated
    calibrator = cal.fit_isotonic(p, y)
    grid = np.linspace(0, 1, 1001)
    assert np.all(np.diff(calibrator.apply(grid)) >= 0)
    assert cal.ece(p, y) > 0.15
    held_p = rng.random(20000)
    held_y = (rng.random(len(held_p)) < held_p**3).astype(float)
    assert cal.ece(calibrator.apply(held_p), held_y) < 0.02


def test_ece_of_perfectly_calibrated_samples_is_near_zero():
    rng = np.random.default_rng(5)
    p = rng.random(100000)
    y = (rng.random(len(p)) < p).astype(float)
    assert cal.ece(p, y) < 0.01
    assert cal.ece(np.full(1000, 0.9), np.zeros(1000)) == pytest.approx(0.9)


def test_auc_known_values():
    assert cal.auc(np.array([0.1, 0.2, 0.8, 0.9]), np.array([0, 0, 1, 1])) == 1.0
    assert cal.auc(np.array([0.9, 0.8, 0.2, 0.1]), np.array([0, 0, 1, 1])) == 0.0
    assert cal.auc(np.array([0.5, 0.5, 0.5, 0.5]), np.array([0, 1, 0, 1])) == 0.5
    assert np.isnan(cal.auc(np.array([0.1, 0.2]), np.array([1, 1])))


def test_binary_metrics_known_values():
    m = cal.binary_metrics(np.array([0.9, 0.2, 0.6, 0.4]), np.array([1, 0, 0, 1]))
    assert m["accuracy"] == 0.5
    assert m["brier"] == pytest.approx((0.01 + 0.04 + 0.36 + 0.36) / 4)
    assert m["log_loss"] == pytest.approx(-np.mean(np.log([0.9, 0.8, 0.4, 0.4])))


def test_multiclass_metrics_perfect_and_uniform():
    labels = np.array([0, 1, 2, 0])
    perfect = np.eye(3)[labels]
    m = cal.multiclass_metrics(perfect, labels)
    assert m["accuracy"] == 1.0 and m["auc_ovr"] == 1.0 and m["ece"] == pytest.approx(0.0)
    uniform = cal.multiclass_metrics(np.ones((4, 3)), labels)
    assert uniform["log_loss"] == pytest.approx(np.log(3))


def test_choose_method_improves_ece_and_keeps_accuracy_and_auc():
    rng = np.random.default_rng(6)
    z = rng.normal(0.0, 2.0, 1500)
    y = (rng.random(len(z)) < cal.sigmoid(z)).astype(float)
    raw = cal.sigmoid(2.5 * z + 1.5)  # over-confident and biased towards "yes"
    choice = cc.choose_method(raw, y)
    assert choice.after["ece"] < choice.before["ece"] / 3
    assert choice.after["ece"] < 0.05
    assert choice.after["accuracy"] >= choice.before["accuracy"]
    assert choice.after["auc"] >= choice.before["auc"] - cc.AUC_TOLERANCE
    assert choice.method in cc.CANDIDATE_METHODS
    assert set(choice.candidates) == set(cc.CANDIDATE_METHODS)


def test_stratified_folds_spread_the_positives():
    y = np.array([1] * 10 + [0] * 90)
    folds = cc.stratified_folds(y, 5)
    assert sorted(np.bincount(folds[y == 1]).tolist()) == [2, 2, 2, 2, 2]


def test_calibrator_rejects_an_unknown_method():
    with pytest.raises(ValueError, match="unknown calibration method"):
        cal.Calibrator("magic").apply([0.5])


def test_reliability_diagram_is_written(tmp_path):
    from prompt_packs.reliability import save_reliability_diagram

    p, y = _tempered(2.0, 500)
    path = save_reliability_diagram(tmp_path / "r.png", "test", [("raw", p, y)])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_temperature_softmax_keeps_the_argmax_and_matches_the_binary_map():
    logprobs = np.log([0.6, 0.3, 0.1])
    for temperature in (0.3, 1.0, 4.0):
        assert np.argmax(cal.temperature_softmax(logprobs, temperature)) == 0
    assert cal.temperature_softmax(logprobs, 1.0) == pytest.approx([0.6, 0.3, 0.1])
    two = cal.temperature_softmax(np.log([0.8, 0.2]), 2.0)[0]
    assert two == pytest.approx(float(cal.Calibrator("temperature", {"temperature": 2.0}).apply(0.8)))


def test_sigmoid_keeps_tiny_probabilities_distinct():
    z = np.array([-40.0, -39.0, -20.0, -19.0, 0.0, 19.0])
    p = cal.sigmoid(z)
    assert np.all(np.diff(p) > 0)
    assert p[0] == pytest.approx(np.exp(-40.0), rel=1e-9)
    assert cal.logit(p[2:4]) == pytest.approx(z[2:4], abs=1e-6)  # logit clips below 1e-12 only

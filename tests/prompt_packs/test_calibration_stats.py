"""ECE intervals, the perfect-calibration band and paired differences, against numpy written here."""

from __future__ import annotations

import numpy as np
import pytest

from prompt_packs import calibration_stats as stats


def _ece(p, y):
    total = 0.0
    for b in range(10):
        lo, hi = b / 10, (b + 1) / 10
        inside = (p >= lo) & ((p < hi) if b < 9 else (p <= hi))
        if inside.any():
            total += inside.mean() * abs(y[inside].mean() - p[inside].mean())
    return total


def test_ece_interval_is_the_percentile_bootstrap_of_the_ece():
    rng = np.random.default_rng(0)
    p = rng.random(300)
    y = (rng.random(300) < p**1.5).astype(float)
    value, lo, hi = stats.ece_interval(p, y, num_draws=500, seed=3)
    draws = np.random.default_rng(3).integers(0, 300, size=(500, 300))
    reference = np.array([_ece(p[i], y[i]) for i in draws])
    assert value == pytest.approx(_ece(p, y), abs=1e-12)
    assert lo == pytest.approx(np.quantile(reference, 0.025), abs=1e-12)
    assert hi == pytest.approx(np.quantile(reference, 0.975), abs=1e-12)


def test_perfect_band_is_the_ece_of_labels_drawn_from_the_predictions():
    rng = np.random.default_rng(1)
    p = rng.beta(0.5, 3.0, 200)  # a low positive rate
    band = stats.perfect_band(p, num_sims=400, seed=7)
    sims = np.random.default_rng(7)
    reference = np.array([_ece(p, (sims.random(200) < p).astype(float)) for _ in range(400)])
    assert band["mean"] == pytest.approx(reference.mean(), abs=1e-12)
    assert band["q95"] == pytest.approx(np.quantile(reference, 0.95), abs=1e-12)


def test_the_band_shrinks_with_n_and_a_calibrated_predictor_falls_inside():
    rng = np.random.default_rng(2)
    small, large = rng.random(100), rng.random(4000)
    assert stats.perfect_band(large, num_sims=200)["q95"] < stats.perfect_band(small, num_sims=200)["q95"] / 3
    inside = 0
    for seed in range(40):
        y = (np.random.default_rng(100 + seed).random(100) < small).astype(float)
        inside += stats.ece_summary(small, y, seed=seed)["within_band"]
    assert 30 <= inside <= 40  # about 95% of calibrated draws


def test_paired_difference_resamples_both_predictions_on_the_same_rows():
    rng = np.random.default_rng(3)
    y = (rng.random(250) < 0.4).astype(float)
    a, b = rng.random(250), np.clip(y * 0.8 + 0.1, 0, 1)

    def brier(p, t):
        return float(np.mean((p - t) ** 2))

    out = stats.paired_difference(brier, a, b, y, num_draws=300, seed=5)
    draws = np.random.default_rng(5).integers(0, 250, size=(300, 250))
    deltas = np.array([brier(b[i], y[i]) - brier(a[i], y[i]) for i in draws])
    assert out["delta"] == pytest.approx(brier(b, y) - brier(a, y))
    assert out["lo"] == pytest.approx(np.quantile(deltas, 0.025)) and out["hi"] == pytest.approx(np.quantile(deltas, 0.975))
    assert out["excludes_zero"] and out["hi"] < 0


@pytest.mark.parametrize(("num_rows", "documented"), [(300, 0.033), (3000, 0.011)])
def test_the_documented_band_at_a_constant_prediction(num_rows, documented):
    """docs/calibration.md: rows all at p = 0.9 have a band (q95) of 0.033 at n = 300 and 0.011
    at n = 3,000. One bin holds every row, so the ECE is |K / n - 0.9| with K ~ Binomial(n, 0.9):
    its exact 95th percentile, from the binomial distribution written out here, is the reference."""
    from math import exp, lgamma, log

    center = round(0.9 * num_rows)
    pmf = [exp(lgamma(num_rows + 1) - lgamma(k + 1) - lgamma(num_rows - k + 1) + k * log(0.9)
               + (num_rows - k) * log(0.1)) for k in range(num_rows + 1)]
    covered, distance = pmf[center], 0
    while covered < 0.95:
        distance += 1
        covered += pmf[center - distance] + (pmf[center + distance] if center + distance <= num_rows else 0.0)
    band = stats.perfect_band(np.full(num_rows, 0.9))["q95"]
    assert abs(band - distance / num_rows) <= 1.0 / num_rows  # 2,000 simulations: within one count
    assert round(band, 3) == documented

"""Thresholds by target and the Clopper-Pearson interval, against numpy written here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from prompt_packs import thresholds


def _beta_quantile(q: float, a: float, b: float) -> float:
    """The q-quantile of Beta(a, b) by integrating its density on a fine grid (numpy)."""
    x = np.linspace(0.0, 1.0, 400001)[1:-1]
    log_pdf = (a - 1) * np.log(x) + (b - 1) * np.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    cdf = np.cumsum(np.exp(log_pdf)) * (x[1] - x[0])
    return float(np.interp(q, cdf / cdf[-1], x))


@pytest.mark.parametrize(("k", "n"), [(0, 12), (3, 10), (10, 10), (45, 50), (170, 200)])
def test_clopper_pearson_is_the_beta_quantile_interval(k, n):
    lower, upper = thresholds.clopper_pearson(k, n)
    expected_lower = 0.0 if k == 0 else _beta_quantile(0.025, k, n - k + 1)
    expected_upper = 1.0 if k == n else _beta_quantile(0.975, k + 1, n - k)
    assert lower == pytest.approx(expected_lower, abs=2e-4)
    assert upper == pytest.approx(expected_upper, abs=2e-4)


def _brute_force(score, y, metric, target):
    best = None
    for t in sorted(set(score.tolist())):
        flagged = score >= t
        tp = np.sum(flagged & (y > 0.5))
        if metric == "precision" and flagged.sum() and tp / flagged.sum() >= target:
            return t  # lowest threshold reaching the precision
        if metric == "recall" and tp / np.sum(y > 0.5) >= target:
            best = t  # keep the highest threshold reaching the recall
    return best


@pytest.mark.parametrize(("metric", "target"), [("precision", 0.9), ("recall", 0.8)])
def test_threshold_is_picked_on_pick_rows_and_judged_on_the_others(metric, target):
    rng = np.random.default_rng(0)
    y = (rng.random(600) < 0.3).astype(float)
    score = np.clip(0.35 * y + rng.random(600) * 0.65, 0, 1)
    fit = thresholds.fit_threshold(score, y, metric, target, seed=4)
    pick = thresholds.split_pick_check(y, seed=4)
    assert fit.num_pick_rows + fit.num_check_rows == 600 and abs(fit.num_pick_rows - 300) <= 1
    assert fit.at_least == _brute_force(score[pick], y[pick], metric, target)
    check_flagged = score[~pick] >= fit.at_least
    tp = int(np.sum(check_flagged & (y[~pick] > 0.5)))
    trials = int(check_flagged.sum()) if metric == "precision" else int(np.sum(y[~pick] > 0.5))
    assert (fit.successes, fit.trials) == (tp, trials)
    assert fit.achieved == pytest.approx(tp / trials)
    assert fit.interval == pytest.approx(thresholds.clopper_pearson(tp, trials))
    assert fit.interval[0] <= fit.achieved <= fit.interval[1]


def test_an_unreachable_target_gives_no_threshold():
    y = np.array([0, 1] * 50, dtype=float)
    fit = thresholds.fit_threshold(np.full(100, 0.5), y, "precision", 0.99)
    assert fit.at_least is None and fit.achieved is None

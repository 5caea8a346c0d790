"""How far to trust an ECE: bootstrap intervals and the perfect-calibration band (numpy only).

    p [N], y [N]  --ece_interval--> (ece, lo, hi)               percentile bootstrap over rows
    p [N]         --perfect_band--> {mean, q95}                  ECE of labels drawn from p itself
    (a, b, y)     --paired_difference--> (delta, lo, hi)         metric(b) - metric(a), same resampled rows

ECE is biased upward at small n: even a perfectly calibrated predictor has a positive ECE,
because each bin's observed rate scatters around its mean prediction. `perfect_band`
measures that floor by simulation: labels are drawn as y ~ Bernoulli(p) from the
predictions themselves (so the predictor is calibrated by construction, at this n and this
spread of predictions, hence this positive rate), and the ECE of each draw is taken. An
ECE under the band's 95th percentile is one a calibrated predictor would show at that n.
For a top-label (multiclass) ECE pass the top confidence as p and whether the top class was
right as y: drawing the label from the calibrated distribution makes "top is right" a
Bernoulli(top confidence) draw, so the same simulation applies.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from prompt_packs.calibration import ece

NUM_BOOTSTRAP = 2000
NUM_SIMULATIONS = 2000


def bootstrap_indices(num_rows: int, num_draws: int, seed: int) -> np.ndarray:
    """[num_draws, num_rows] row indices drawn with replacement."""
    return np.random.default_rng(seed).integers(0, num_rows, size=(num_draws, num_rows))


def ece_interval(p: np.ndarray, y: np.ndarray, *, num_draws: int = NUM_BOOTSTRAP,
                 seed: int = 0) -> tuple[float, float, float]:
    """(ECE, 2.5th and 97.5th percentile of the ECE over bootstrap resamples of the rows)."""
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    draws = np.array([ece(p[i], y[i]) for i in bootstrap_indices(len(p), num_draws, seed)])
    return ece(p, y), float(np.quantile(draws, 0.025)), float(np.quantile(draws, 0.975))


def perfect_band(p: np.ndarray, *, num_sims: int = NUM_SIMULATIONS, seed: int = 0) -> dict[str, float]:
    """ECE of a perfectly calibrated predictor with these predictions: mean and 95th percentile."""
    p = np.asarray(p, dtype=np.float64)
    rng = np.random.default_rng(seed)
    draws = np.array([ece(p, (rng.random(len(p)) < p).astype(np.float64)) for _ in range(num_sims)])
    return {"num_rows": len(p), "mean": float(draws.mean()), "q95": float(np.quantile(draws, 0.95))}


def paired_difference(metric: Callable[[np.ndarray, np.ndarray], float], a: np.ndarray, b: np.ndarray,
                      y: np.ndarray, *, num_draws: int = NUM_BOOTSTRAP, seed: int = 0) -> dict[str, float]:
    """metric(b, y) - metric(a, y) with a paired bootstrap 95% interval: each draw resamples
    the rows once and scores both predictions on them. `helpful` (for a metric where lower is
    better, pass the negated difference's sign yourself) is left to the caller; `excludes_zero`
    says whether the interval lies on one side of 0."""
    a, b, y = (np.asarray(v) for v in (a, b, y))
    deltas = np.array([metric(b[i], y[i]) - metric(a[i], y[i])
                       for i in bootstrap_indices(len(y), num_draws, seed)])
    lo, hi = float(np.quantile(deltas, 0.025)), float(np.quantile(deltas, 0.975))
    return {"delta": float(metric(b, y) - metric(a, y)), "lo": lo, "hi": hi, "excludes_zero": bool(lo > 0 or hi < 0)}


def ece_summary(p: np.ndarray, y: np.ndarray, *, seed: int = 0) -> dict[str, float]:
    """What every reported ECE carries: n, the ECE, its bootstrap 95% interval and the
    perfect-calibration band at this n (mean and 95th percentile)."""
    value, lo, hi = ece_interval(p, y, seed=seed)
    band = perfect_band(p, seed=seed)
    return {"num_rows": len(p), "ece": value, "ece_lo": lo, "ece_hi": hi,
            "perfect_mean": band["mean"], "perfect_q95": band["q95"], "within_band": bool(value <= band["q95"])}

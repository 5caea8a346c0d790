"""Thresholds by target: the score at which a category reaches a precision (or recall).

    score [N] (held-out calibrated category scores) + y [N] + target (metric, value)
      --split_pick_check--> pick rows | check rows (stratified halves, seeded)
      --pick_threshold(pick rows)--> at_least
      --evaluate(check rows)--> achieved precision / recall with a Clopper-Pearson 95% interval

The threshold is chosen on the pick rows only and judged on the check rows only, so the
reported precision is an honest estimate of what the rule does on new rows:
- precision target: the lowest threshold whose pick-row precision (rows with score >=
  threshold) is >= target (the most recall that still meets the target);
- recall target: the highest threshold whose pick-row recall is >= target.
Clopper-Pearson: the exact binomial interval for k successes in n trials, lower = the p at
which P(X >= k) = alpha/2, upper = the p at which P(X <= k) = alpha/2 (0 and 1 at k = 0, n),
solved by bisection on the binomial tail (log-gamma terms, no scipy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

TARGET_METRICS = ("precision", "recall")


def _binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
             for i in range(k + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def _bisect(f, lo: float = 0.0, hi: float = 1.0, steps: int = 60) -> float:
    """The root of a function increasing from < 0 to > 0 on [lo, hi]."""
    for _ in range(steps):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2.0


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact (1 - alpha) interval for a binomial proportion k / n."""
    if n == 0:
        return 0.0, 1.0
    lower = 0.0 if k == 0 else _bisect(lambda p: (1.0 - _binomial_cdf(k - 1, n, p)) - alpha / 2.0)
    upper = 1.0 if k == n else _bisect(lambda p: alpha / 2.0 - _binomial_cdf(k, n, p))
    return lower, upper


@dataclass(slots=True)
class ThresholdFit:
    metric: str  # "precision" | "recall"
    target: float
    at_least: float | None  # None: no threshold reaches the target on the pick rows
    num_pick_rows: int
    num_check_rows: int
    achieved: float | None  # the metric on the check rows
    successes: int  # precision: true positives; recall: positives caught
    trials: int  # precision: rows flagged; recall: positives
    interval: tuple[float, float]  # Clopper-Pearson 95% interval of `achieved`
    other: float | None  # the other metric (recall for a precision target) on the check rows


def split_pick_check(y: np.ndarray, seed: int = 0) -> np.ndarray:
    """True for the pick half: positives and negatives each split in half after a shuffle."""
    y = np.asarray(y) > 0.5
    rng = np.random.default_rng(seed)
    pick = np.zeros(len(y), dtype=bool)
    for group in (np.flatnonzero(y), np.flatnonzero(~y)):
        pick[rng.permutation(group)[: (len(group) + 1) // 2]] = True
    return pick


def counts(score: np.ndarray, y: np.ndarray, at_least: float) -> dict[str, int]:
    flagged = np.asarray(score) >= at_least
    positive = np.asarray(y) > 0.5
    return {"tp": int(np.sum(flagged & positive)), "flagged": int(flagged.sum()), "positives": int(positive.sum())}


def pick_threshold(score: np.ndarray, y: np.ndarray, metric: str, target: float) -> float | None:
    if metric not in TARGET_METRICS:
        raise ValueError(f"unknown target metric {metric!r}; expected one of {TARGET_METRICS}")
    candidates = np.unique(np.asarray(score, dtype=np.float64))  # ascending
    for at_least in candidates if metric == "precision" else candidates[::-1]:
        c = counts(score, y, at_least)
        if metric == "precision" and c["flagged"] and c["tp"] / c["flagged"] >= target:
            return float(at_least)
        if metric == "recall" and c["positives"] and c["tp"] / c["positives"] >= target:
            return float(at_least)
    return None


def fit_threshold(score: np.ndarray, y: np.ndarray, metric: str, target: float, *, seed: int = 0) -> ThresholdFit:
    score, y = np.asarray(score, dtype=np.float64), np.asarray(y, dtype=np.float64)
    pick = split_pick_check(y, seed)
    at_least = pick_threshold(score[pick], y[pick], metric, target)
    fit = ThresholdFit(metric, target, at_least, int(pick.sum()), int((~pick).sum()), None, 0, 0, (0.0, 1.0), None)
    if at_least is None:
        return fit
    c = counts(score[~pick], y[~pick], at_least)
    precision = (c["tp"], c["flagged"])
    recall = (c["tp"], c["positives"])
    fit.successes, fit.trials = precision if metric == "precision" else recall
    other = recall if metric == "precision" else precision
    fit.achieved = fit.successes / fit.trials if fit.trials else None
    fit.other = other[0] / other[1] if other[1] else None
    fit.interval = clopper_pearson(fit.successes, fit.trials)
    return fit

"""Calibration maps and the metrics that judge them (numpy only).

    raw scores p (a probability the engine gave, one per labelled row) + labels y in {0, 1}
      --fit_temperature / fit_platt / fit_isotonic (on the fit rows)--> Calibrator
      --Calibrator.apply(p_held_out)--> calibrated_p
      --binary_metrics(calibrated_p, y_held_out)--> accuracy, auc, ece, brier, log_loss

Every map works on the logit z = log(p / (1 - p)) of a probability:
- temperature: p' = sigmoid(z / T). T > 0, so the side of 0.5 (the argmax of a two-way
  question) never changes and ranks never change.
- platt: p' = sigmoid(a * z + b). Monotone (a >= 0 is enforced), but b can move rows
  across 0.5: the report counts how often it did. The intercept b is kept only where a
  likelihood-ratio test on the fit rows supports it (`bias_is_supported`); else b = 0 and
  the map is a temperature (a = 1 / T), which moves no row across 0.5.
- isotonic: pool-adjacent-violators on p, then linear interpolation between the pooled
  block centres: monotone non-decreasing, can create ties and move rows across 0.5.
Our own small implementations; no scikit-learn.

ECE (expected calibration error), as used everywhere in this project: 10 equal-width bins
on the predicted probability of the positive class, [0, 0.1), [0.1, 0.2), ..., [0.9, 1.0];
ECE = sum over non-empty bins of (rows in bin / rows) * |mean(y in bin) - mean(p in bin)|.
For several classes (`multiclass_metrics`) the same bins are applied to the top-class
confidence against whether the top class was right.
Log-loss clips p to [1e-12, 1 - 1e-12] so a confident mistake costs about 27.6, not infinity.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

NUM_ECE_BINS = 10
EPS = 1e-12  # probability clip for logits and log-loss
METHODS = ("identity", "temperature", "platt", "isotonic")


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), EPS, 1.0 - EPS)
    return np.log(p) - np.log1p(-p)


def sigmoid(z: np.ndarray) -> np.ndarray:
    """exp(-|z|) never overflows, and small probabilities keep their relative precision
    (0.5 * (1 + tanh(z / 2)) would round distinct tiny values to ties, moving AUC)."""
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@dataclass(slots=True)
class Calibrator:
    """A fitted map from a raw probability to a calibrated one."""

    method: str  # one of METHODS
    params: dict[str, float | list[float]] = field(default_factory=dict)

    def apply(self, p: np.ndarray | list[float] | float) -> np.ndarray:
        p = np.asarray(p, dtype=np.float64)
        if self.method == "identity":
            return p.copy()
        if self.method == "temperature":
            return sigmoid(logit(p) / float(self.params["temperature"]))
        if self.method == "platt":
            return sigmoid(float(self.params["a"]) * logit(p) + float(self.params["b"]))
        if self.method == "isotonic":
            return np.interp(p, np.asarray(self.params["x"]), np.asarray(self.params["y"]))
        raise ValueError(f"unknown calibration method {self.method!r}; expected one of {METHODS}")


def temperature_softmax(logprobs: list[float] | np.ndarray, temperature: float) -> np.ndarray:
    """Several options: softmax(logprob / T) over the options. Never changes the argmax;
    for two options it equals the binary temperature map on p(first option)."""
    z = np.asarray(logprobs, dtype=np.float64) / temperature
    z -= z.max()
    return np.exp(z) / np.exp(z).sum()


# ---- fitting ---------------------------------------------------------------------------


def _nll(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, EPS, 1.0 - EPS)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def best_temperature(loss_at, *, min_log_t: float = -4.0, max_log_t: float = 4.0) -> float:
    """The T minimising loss_at(T), by golden-section search over log T (the log-loss of a
    temperature-scaled answer is unimodal in it); shared by the binary and n-way fits."""
    lo, hi = min_log_t, max_log_t
    ratio = (np.sqrt(5.0) - 1.0) / 2.0
    for _ in range(100):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if loss_at(np.exp(a)) < loss_at(np.exp(b)):
            hi = b
        else:
            lo = a
    return float(np.exp((lo + hi) / 2.0))


def fit_temperature(p: np.ndarray, y: np.ndarray, *, min_log_t: float = -4.0, max_log_t: float = 4.0) -> Calibrator:
    """T minimising log-loss (best_temperature)."""
    z, y = logit(p), np.asarray(y, dtype=np.float64)
    temperature = best_temperature(lambda t: _nll(sigmoid(z / t), y), min_log_t=min_log_t, max_log_t=max_log_t)
    return Calibrator("temperature", {"temperature": temperature})


def fit_platt(p: np.ndarray, y: np.ndarray, *, test_bias: bool = True, l2: float = 1e-3,
              num_steps: int = 50) -> Calibrator:
    """Logistic regression of y on logit(p) with a bias, by Newton steps (2 parameters).

    A tiny L2 penalty keeps the fit finite when the fit rows are perfectly separable. With
    `test_bias`, the bias b stays only where `bias_is_supported`; otherwise the map is the
    temperature fit written as Platt, a = 1 / T and b = 0: a bias the rows do not support
    would move rows across 0.5 on noise.
    """
    full = _fit_platt_newton(p, y, l2=l2, num_steps=num_steps)
    if not test_bias:
        return full
    slope_only = Calibrator("platt", {"a": 1.0 / fit_temperature(p, y).params["temperature"], "b": 0.0})
    return full if bias_is_supported(p, y, slope_only, full) else slope_only


BIAS_TEST_CHI2 = 3.841458820694124  # the 95th percentile of chi-square with 1 degree of freedom


def bias_is_supported(p: np.ndarray, y: np.ndarray, without: Calibrator, with_bias: Calibrator) -> bool:
    """Likelihood-ratio test of Platt's bias on the fit rows: 2 N (log-loss without b - log-loss
    with b) >= BIAS_TEST_CHI2 (the one extra parameter is significant at 5%)."""
    y = np.asarray(y, dtype=np.float64)
    statistic = 2.0 * len(y) * (_nll(without.apply(p), y) - _nll(with_bias.apply(p), y))
    return bool(statistic >= BIAS_TEST_CHI2)


def _fit_platt_newton(p: np.ndarray, y: np.ndarray, *, l2: float, num_steps: int) -> Calibrator:
    z, y = logit(p), np.asarray(y, dtype=np.float64)
    x = np.stack([z, np.ones_like(z)], axis=1)  # [N, 2]

    def loss(w: np.ndarray) -> float:
        return _nll(sigmoid(x @ w), y) + 0.5 * l2 * float(w @ w)

    w = np.zeros(2)
    for _ in range(num_steps):
        q = sigmoid(x @ w)
        grad = x.T @ (q - y) / len(y) + l2 * w
        hess = (x.T * (q * (1.0 - q))) @ x / len(y) + l2 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        scale = 1.0
        while loss(w - scale * step) > loss(w) and scale > 1e-6:  # damped: saturated rows overshoot
            scale /= 2.0
        w -= scale * step
        if np.max(np.abs(scale * step)) < 1e-10:
            break
    a = max(float(w[0]), 0.0)  # a negative slope would invert the question: refuse it
    return Calibrator("platt", {"a": a, "b": float(w[1])})


def pool_adjacent_violators(y: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Non-decreasing least-squares fit of y (already in x order): block means, weights, sizes.

    Blocks are maximal: neighbours with equal means are pooled as well.
    """
    means: list[float] = []
    block_weights: list[float] = []
    sizes: list[int] = []
    for value, weight in zip(y.tolist(), weights.tolist(), strict=True):
        means.append(value)
        block_weights.append(weight)
        sizes.append(1)
        # merge violators, and equal neighbours too: blocks come out strictly increasing
        while len(means) > 1 and means[-2] >= means[-1]:
            total = block_weights[-2] + block_weights[-1]
            merged = (means[-2] * block_weights[-2] + means[-1] * block_weights[-1]) / total
            means[-2:] = [merged]
            block_weights[-2:] = [total]
            sizes[-2:] = [sizes[-2] + sizes[-1]]
    return np.array(means), np.array(block_weights), sizes


def fit_isotonic(p: np.ndarray, y: np.ndarray, *, prior_weight: float = 1.0) -> Calibrator:
    """Isotonic regression of y on p, kept as interpolation knots (x, y).

    Rows with equal p are pooled first. `prior_weight` pseudo-rows at the overall base rate
    are mixed into each block mean, so a block of 1-2 rows does not map to exactly 0 or 1.
    """
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    unique_p, inverse = np.unique(p[order], return_inverse=True)
    counts = np.bincount(inverse).astype(np.float64)
    sums = np.bincount(inverse, weights=y[order])
    means, weights, sizes = pool_adjacent_violators(sums / counts, counts)
    base_rate = float(y.mean())
    smoothed = (means * weights + prior_weight * base_rate) / (weights + prior_weight)
    knots_x, knots_y, start = [], [], 0
    for mean, size in zip(smoothed.tolist(), sizes, strict=True):
        block = unique_p[start : start + size]
        knots_x.append(float(block.mean()))  # the block centre: interpolation keeps ranks between blocks
        knots_y.append(mean)
        start += size
    knots_y = np.maximum.accumulate(np.array(knots_y)).tolist()  # smoothing can break ties' order
    return Calibrator("isotonic", {"x": knots_x, "y": knots_y})


def fit(method: str, p: np.ndarray, y: np.ndarray, *, test_bias: bool = True) -> Calibrator:
    """`test_bias`: Platt's bias only where the fit rows support it (fit_platt)."""
    if method == "identity":
        return Calibrator("identity")
    if method == "temperature":
        return fit_temperature(p, y)
    if method == "platt":
        return fit_platt(p, y, test_bias=test_bias)
    if method == "isotonic":
        return fit_isotonic(p, y)
    raise ValueError(f"unknown calibration method {method!r}; expected one of {METHODS}")


# ---- metrics ---------------------------------------------------------------------------


def auc(scores: np.ndarray, y: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties); nan if one class."""
    scores, y = np.asarray(scores, dtype=np.float64), np.asarray(y) > 0.5
    num_pos, num_neg = int(y.sum()), int((~y).sum())
    if num_pos == 0 or num_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    start = 0
    while start < len(scores):  # average ranks over runs of equal scores
        end = start
        while end + 1 < len(scores) and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2.0 + 1.0
        start = end + 1
    return float((ranks[y].sum() - num_pos * (num_pos + 1) / 2.0) / (num_pos * num_neg))


def ece(p: np.ndarray, y: np.ndarray, *, num_bins: int = NUM_ECE_BINS) -> float:
    """Expected calibration error with equal-width bins (see the module docstring)."""
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    bins = np.minimum((p * num_bins).astype(int), num_bins - 1)
    total = 0.0
    for b in range(num_bins):
        in_bin = bins == b
        if in_bin.any():
            total += in_bin.mean() * abs(y[in_bin].mean() - p[in_bin].mean())
    return float(total)


def reliability_bins(p: np.ndarray, y: np.ndarray, *, num_bins: int = NUM_ECE_BINS) -> list[dict[str, float]]:
    """Per non-empty bin: its range, row count, mean prediction and observed rate."""
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    bins = np.minimum((p * num_bins).astype(int), num_bins - 1)
    rows = []
    for b in range(num_bins):
        in_bin = bins == b
        if in_bin.any():
            rows.append({"lo": b / num_bins, "hi": (b + 1) / num_bins, "num_rows": int(in_bin.sum()),
                         "mean_p": float(p[in_bin].mean()), "observed": float(y[in_bin].mean())})
    return rows


def binary_metrics(p: np.ndarray, y: np.ndarray) -> dict[str, float]:
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    clipped = np.clip(p, EPS, 1.0 - EPS)
    return {
        "num_rows": len(y),
        "num_positive": int(y.sum()),
        "accuracy": float(np.mean((p >= 0.5) == (y > 0.5))),
        "auc": auc(p, y),
        "ece": ece(p, y),
        "brier": float(np.mean((p - y) ** 2)),
        "log_loss": float(-np.mean(y * np.log(clipped) + (1.0 - y) * np.log(1.0 - clipped))),
    }


def multiclass_metrics(probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """probs: [N, C] rows (renormalised here), labels: [N] class indices.

    accuracy of the argmax, macro one-vs-rest AUC, top-label ECE, multiclass Brier
    (sum over classes, mean over rows) and log-loss of the true class.
    """
    probs = np.asarray(probs, dtype=np.float64)
    probs = probs / np.clip(probs.sum(axis=1, keepdims=True), EPS, None)
    labels = np.asarray(labels, dtype=int)
    onehot = np.eye(probs.shape[1])[labels]
    top = probs.argmax(axis=1)
    aucs = [auc(probs[:, c], onehot[:, c]) for c in range(probs.shape[1])]
    aucs = [a for a in aucs if not np.isnan(a)]
    return {
        "num_rows": len(labels),
        "accuracy": float(np.mean(top == labels)),
        "auc_ovr": float(np.mean(aucs)) if aucs else float("nan"),
        "ece": ece(probs.max(axis=1), (top == labels).astype(np.float64)),
        "brier": float(np.mean(np.sum((probs - onehot) ** 2, axis=1))),
        "log_loss": float(-np.mean(np.log(np.clip(probs[np.arange(len(labels)), labels], EPS, None)))),
    }


def num_flipped(p_before: np.ndarray, p_after: np.ndarray) -> int:
    """Rows whose side of 0.5 changed: a two-way answer's argmax that calibration moved."""
    return int(np.sum((np.asarray(p_before) >= 0.5) != (np.asarray(p_after) >= 0.5)))

"""Calibration methods side by side on one labelled set (numpy only).

    p [N, C], floor_p [N, C], labels [N] (class index)
      --method_probabilities--> {"raw", "contextual", "batch"} -> q [N, C]
      --method_metrics--> per method: accuracy, AUC, ECE (with n, bootstrap 95% interval and
                          the perfect-calibration band), Brier, log-loss
      --compare_methods--> those + each method's change against raw (paired bootstrap 95%
                          interval; `helpful` only where the interval excludes zero)

The metrics follow the project's one definition (prompt_packs.calibration): with two
options the positive class is the first option, and ECE, AUC, Brier and accuracy are the
binary ones on its probability; with more, accuracy of the argmax, macro one-vs-rest AUC and
the top-label ECE. A labelled method can be added as one more [N, C] array (its rows held
out: cross-fitted, or fitted on another set).
"""

from __future__ import annotations

import numpy as np

from prompt_packs import calibration as cal
from prompt_packs import label_free
from prompt_packs.calibration_stats import ece_summary, paired_difference


def is_binary(probs: np.ndarray) -> bool:
    return np.asarray(probs).shape[1] == 2


def accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.asarray(probs).argmax(axis=1) == np.asarray(labels)))


def calibration_target(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the ECE bins: (positive-class p, is positive) with two options, else
    (top-label confidence, top label is right)."""
    probs, labels = np.asarray(probs, dtype=np.float64), np.asarray(labels)
    if is_binary(probs):
        return probs[:, 0], (labels == 0).astype(np.float64)
    return probs.max(axis=1), (probs.argmax(axis=1) == labels).astype(np.float64)


def ece_of(probs: np.ndarray, labels: np.ndarray) -> float:
    return cal.ece(*calibration_target(probs, labels))


def method_metrics(probs: np.ndarray, labels: np.ndarray, *, seed: int = 0) -> dict[str, float]:
    probs = np.asarray(probs, dtype=np.float64)
    probs = probs / probs.sum(axis=1, keepdims=True)
    if is_binary(probs):
        binary = cal.binary_metrics(probs[:, 0], (np.asarray(labels) == 0).astype(np.float64))
        metrics = {k: binary[k] for k in ("accuracy", "auc", "brier", "log_loss")}
    else:
        multi = cal.multiclass_metrics(probs, labels)
        metrics = {"accuracy": multi["accuracy"], "auc": multi["auc_ovr"], "brier": multi["brier"],
                   "log_loss": multi["log_loss"]}
    return metrics | ece_summary(*calibration_target(probs, labels), seed=seed)


def method_probabilities(p: np.ndarray, floor_p: np.ndarray | None,
                         prior: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """raw, contextual (when floors are given) and batch (the set's own mean, or `prior`)."""
    out = {"raw": label_free.label_free("raw", p)}
    if floor_p is not None:
        out["contextual"] = label_free.contextual(p, floor_p)
    out["batch"] = label_free.batch(p, prior)
    return out


def change(metric, base: np.ndarray, other: np.ndarray, labels: np.ndarray, *, lower_is_better: bool,
           seed: int = 0) -> dict[str, float]:
    """other - base with a paired bootstrap interval; helpful where it excludes zero on the good side."""
    delta = paired_difference(metric, base, other, labels, seed=seed)
    good_side = delta["hi"] < 0 if lower_is_better else delta["lo"] > 0
    bad_side = delta["lo"] > 0 if lower_is_better else delta["hi"] < 0
    return delta | {"helpful": bool(good_side), "harmful": bool(bad_side)}


def compare_methods(methods: dict[str, np.ndarray], labels: np.ndarray, *, baseline: str = "raw",
                    seed: int = 0) -> dict[str, dict]:
    """Metrics of every method, and its accuracy and ECE change against `baseline`."""
    labels = np.asarray(labels)
    out = {}
    for name, probs in methods.items():
        entry = {"metrics": method_metrics(probs, labels, seed=seed)}
        if name != baseline:
            base = methods[baseline]
            entry["accuracy_change"] = change(accuracy, base, probs, labels, lower_is_better=False, seed=seed)
            entry["ece_change"] = change(ece_of, base, probs, labels, lower_is_better=True, seed=seed)
        out[name] = entry
    return out


def transfer(fit_p: np.ndarray, fit_labels: np.ndarray, eval_p: np.ndarray, eval_floor_p: np.ndarray,
             eval_labels: np.ndarray, *, seed: int = 0) -> dict:
    """Two-option sets: maps fitted on one set (a labelled map chosen and refit on all its
    rows; its batch priors), judged on the rows of another set only, beside that set's own
    raw, contextual and batch answers."""
    from prompt_packs.calibration_choice import choose_method

    fit_p = np.asarray(fit_p, dtype=np.float64)
    positive = fit_p[:, 0] / fit_p.sum(axis=1)
    fitted = choose_method(positive, (np.asarray(fit_labels) == 0).astype(np.float64), seed=seed)
    priors = label_free.batch_priors(fit_p / fit_p.sum(axis=1, keepdims=True))
    eval_raw = label_free.label_free("raw", eval_p)
    mapped = fitted.calibrator.apply(eval_raw[:, 0])
    methods = method_probabilities(eval_p, eval_floor_p) | {
        "batch, priors of the fit set": label_free.batch(eval_p, priors),
        f"labelled {fitted.method} fitted on the fit set": np.stack([mapped, 1.0 - mapped], axis=1)}
    return {"methods": compare_methods(methods, eval_labels, seed=seed),
            "fitted": {"method": fitted.method, "params": fitted.calibrator.params, "priors": priors.tolist()}}

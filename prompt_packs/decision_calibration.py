"""Calibrated probabilities for a decision: what /v1/decide, /v1/decisions and packs apply.

    option_logits [C] (mean log-prob per option over orderings) + workload temperature T
      --workload_probabilities--> softmax(logit / T)                       (SPINF_WORKLOADS)
    category scores {id: score} + DecisionCalibration (a pack's joint map)
      --joint_probabilities--> {class: p}  (the map over the scores renormalised over classes)

Pure functions (numpy only), so the API, the workers and `apply_pack` compute the same
numbers from the same fitted parameters. `fit_workload_temperature` fits T from labelled
decisions (option_logits + the right option): the temperature minimising the log-loss of
the right option, the same search as a joint temperature map.
"""

from __future__ import annotations

import numpy as np

from prompt_packs.format import DecisionCalibration
from prompt_packs.joint import MulticlassCalibrator, fit_multiclass_temperature, softmax


def workload_probabilities(option_logits: list[float], temperature: float) -> list[float]:
    """softmax(option_logits / T): a fitted workload's calibrated option probabilities."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (got {temperature})")
    return softmax(np.asarray(option_logits, dtype=np.float64) / temperature).tolist()


def fit_workload_temperature(option_logits: np.ndarray, labels: np.ndarray) -> float:
    """T minimising -mean log softmax(logits / T)[label] over labelled decisions.

    softmax of the logits is the uncalibrated answer, so the fit is the joint temperature
    map on those probabilities (log-probs equal the logits up to a per-row constant)."""
    probs = softmax(np.asarray(option_logits, dtype=np.float64))
    return float(fit_multiclass_temperature(probs, np.asarray(labels, dtype=int)).params["temperature"])


def joint_probabilities(calibration: DecisionCalibration, scores: dict[str, float]) -> dict[str, float]:
    """A pack's joint decision map applied to one content's category scores."""
    values = np.array([scores[c] for c in calibration.classes], dtype=np.float64)
    calibrated = MulticlassCalibrator(calibration.method, dict(calibration.params)).apply(values[None, :])[0]
    return dict(zip(calibration.classes, calibrated.tolist(), strict=True))


def workload_fit(option_logits: np.ndarray, labels: np.ndarray, *, num_folds: int = 5, seed: int = 0) -> dict:
    """The workload temperature refit on every row, and what it does on held-out rows:
    each fold's rows calibrated by a temperature fitted on the other folds (before = the
    raw softmax); top-label ECE with its bootstrap interval and perfect-calibration band."""
    from prompt_packs.calibration import multiclass_metrics
    from prompt_packs.calibration_stats import ece_summary
    from prompt_packs.joint_choice import class_folds

    logits, labels = np.asarray(option_logits, dtype=np.float64), np.asarray(labels, dtype=int)
    folds = class_folds(labels, num_folds, seed)
    held_out = np.empty_like(logits)
    for fold in np.unique(folds):
        held = folds == fold
        held_out[held] = softmax(logits[held] / fit_workload_temperature(logits[~held], labels[~held]))
    right = (held_out.argmax(axis=1) == labels).astype(np.float64)
    return {"temperature": fit_workload_temperature(logits, labels), "num_rows": len(labels),
            "held_out": f"{num_folds}-fold cross-fit by class (seed {seed})",
            "before": multiclass_metrics(softmax(logits), labels), "after": multiclass_metrics(held_out, labels),
            "ece": ece_summary(held_out.max(axis=1), right, seed=seed)}

"""Choosing a joint (multiclass) map on held-out rows, the choice itself nested (numpy only).

    inputs {"raw": [N, C], "calibrated": [N, C]} (e.g. an argmax decision's category scores,
           raw or after the one-vs-rest category maps) + labels [N] + baseline [N, C]
      --choose_joint--> JointChoice: the (input, method) kept, refit on every row (what a
                        pack stores), and its nested held-out probabilities

Candidates are every input with every method of MULTICLASS_METHODS: "identity" on the raw
input is the uncalibrated answer, "identity" on the calibrated input is the one-vs-rest
maps renormalised, "temperature" and "vector" are the joint maps (prompt_packs.joint). The
kept candidate has the lowest out-of-fold log-loss among those whose out-of-fold accuracy
is no lower than the baseline's; "identity" on the first input (argmax unchanged) is the
fallback. Nested as in calibration_choice: each outer fold's rows are predicted by the
candidate a choice made without them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from prompt_packs.calibration import multiclass_metrics
from prompt_packs.calibration_choice import nested_held_out
from prompt_packs.joint import MULTICLASS_METHODS, MulticlassCalibrator, fit_multiclass


@dataclass(slots=True)
class JointChoice:
    reads: str  # the input the map reads ("raw" | "calibrated")
    method: str  # one of MULTICLASS_METHODS
    calibrator: MulticlassCalibrator  # refit on every row: what goes into the pack
    held_out: np.ndarray  # [N, C] nested out-of-fold probabilities of the kept candidate
    before: dict[str, float]  # multiclass_metrics of the baseline
    after: dict[str, float]  # multiclass_metrics of held_out
    candidates: dict[str, dict[str, float]]  # "method (input)" -> out-of-fold metrics on every row
    fold_choices: list[str] = field(default_factory=list)  # the candidate each outer fold's choice kept


def class_folds(labels: np.ndarray, num_folds: int, seed: int = 0) -> np.ndarray:
    """Fold per row; each class's rows are dealt round-robin after a shuffle."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    folds = np.empty(len(labels), dtype=int)
    for value in np.unique(labels):
        shuffled = rng.permutation(np.flatnonzero(labels == value))
        folds[shuffled] = (np.arange(len(shuffled)) + rng.integers(num_folds)) % num_folds
    return folds


def cross_fit_joint(method: str, probs: np.ndarray, labels: np.ndarray, folds: np.ndarray) -> np.ndarray:
    """Each row mapped by a fit on the other folds only."""
    out = np.empty_like(probs, dtype=np.float64)
    for fold in np.unique(folds):
        held = folds == fold
        out[held] = fit_multiclass(method, probs[~held], labels[~held]).apply(probs[held])
    return out


def _select(inputs: dict[str, np.ndarray], labels: np.ndarray, baseline: np.ndarray, rows: np.ndarray,
            num_folds: int, seed: int) -> tuple[tuple[str, str], dict[str, dict[str, float]]]:
    folds = class_folds(labels[rows], num_folds, seed)
    floor = multiclass_metrics(baseline[rows], labels[rows])["accuracy"]
    scores = {}
    for name, probs in inputs.items():
        for method in MULTICLASS_METHODS:
            held = cross_fit_joint(method, probs[rows], labels[rows], folds)
            scores[(name, method)] = multiclass_metrics(held, labels[rows])
    eligible = [k for k, m in scores.items() if m["accuracy"] >= floor] or [(next(iter(inputs)), "identity")]
    best = min(eligible, key=lambda k: scores[k]["log_loss"])
    return best, {f"{m} ({n})": v for (n, m), v in scores.items()}


def choose_joint(inputs: dict[str, np.ndarray], labels: np.ndarray, *, baseline: np.ndarray | None = None,
                 num_folds: int = 5, seed: int = 0) -> JointChoice:
    inputs = {name: np.asarray(x, dtype=np.float64) for name, x in inputs.items()}
    labels = np.asarray(labels, dtype=int)
    baseline = next(iter(inputs.values())) if baseline is None else np.asarray(baseline, dtype=np.float64)
    everything = np.arange(len(labels))
    (reads, method), candidates = _select(inputs, labels, baseline, everything, num_folds, seed)
    outer = class_folds(labels, num_folds, seed + 1)

    def fit_and_predict(train: np.ndarray, held: np.ndarray) -> tuple[np.ndarray, str]:
        (name, inner_method), _ = _select(inputs, labels, baseline, train, num_folds, seed)
        fitted = fit_multiclass(inner_method, inputs[name][train], labels[train])
        return fitted.apply(inputs[name][held]), f"{inner_method} ({name})"

    held_out = np.empty_like(baseline)
    fold_choices = nested_held_out(outer, num_folds, held_out, fit_and_predict)
    return JointChoice(reads=reads, method=method, calibrator=fit_multiclass(method, inputs[reads], labels),
                       held_out=held_out, before=multiclass_metrics(baseline, labels),
                       after=multiclass_metrics(held_out, labels), candidates=candidates, fold_choices=fold_choices)

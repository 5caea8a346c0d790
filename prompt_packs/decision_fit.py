"""Fits on a pack's decisions: joint maps for argmax decisions, thresholds for targeted rules.

    raw category scores + per-category nested held-out scores + labels
      --fit_joint_decisions--> {decision id: JointDecision} (single-label rows over argmax_of)
      --category_outcomes--> per category: the held-out scores the pack will serve (the joint
                             map's class probability where a joint map covers the category,
                             else its one-vs-rest map) with before/after metrics and ECE band
      --fit_thresholds--> {"<decision>/<rule index>": ThresholdFit} for rules with a target

Everything reported is held out: the joint map's probabilities are nested out-of-fold
(joint_choice), the thresholds are picked on one half of the rows and judged on the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prompt_packs import calibration as cal
from prompt_packs.calibration_choice import MethodChoice, fold_auc
from prompt_packs.calibration_stats import ece_summary
from prompt_packs.format import Pack
from prompt_packs.joint_choice import JointChoice, choose_joint, class_folds
from prompt_packs.thresholds import ThresholdFit, fit_threshold


@dataclass(slots=True)
class JointDecision:
    classes: list[str]
    rows: np.ndarray  # indices of the single-label rows the map was fitted and judged on
    labels: np.ndarray  # class index per fitted row
    choice: JointChoice
    one_vs_rest: dict[str, float]  # multiclass metrics of the per-category maps renormalised
    ece: dict[str, float]  # ece_summary of the joint map's top-label confidence


@dataclass(slots=True)
class CategoryOutcome:
    source: str  # "one-vs-rest" or "joint <decision id>"
    held_out_p: np.ndarray  # [N] the score the pack serves, held out
    before: dict[str, float]
    after: dict[str, float]
    ece: dict[str, float]  # ece_summary of held_out_p
    num_flipped: int  # rows whose side of 0.5 differs from the raw category score


def single_label_rows(classes: list[str], labels_of: list[list[str]]) -> np.ndarray:
    """The rows labelled with exactly one of `classes`: what a joint map is fitted and judged on."""
    return np.array([i for i, labels in enumerate(labels_of) if len(set(labels) & set(classes)) == 1], dtype=int)


def joint_served(pack: Pack, labels_of: list[list[str]], *, num_folds: int) -> set[str]:
    """The categories a joint map will serve (category_outcomes): those of an argmax decision
    whose single-label rows are every row. Known from the labels alone, before any fit."""
    return {c for d in pack.decisions if d.argmax_of and len(labels_of) >= 2 * num_folds
            and len(single_label_rows(d.argmax_of, labels_of)) == len(labels_of) for c in d.argmax_of}


def fit_joint_decisions(pack: Pack, labels_of: list[list[str]], raw: dict[str, np.ndarray],
                        fitted: dict[str, MethodChoice], *, num_folds: int, seed: int) -> dict[str, JointDecision]:
    out = {}
    for decision in pack.decisions:
        classes = decision.argmax_of
        rows = single_label_rows(classes, labels_of)
        if not classes or len(rows) < 2 * num_folds:
            continue
        labels = np.array([classes.index(next(c for c in labels_of[i] if c in classes)) for i in rows])
        before = np.stack([raw[c][rows] for c in classes], axis=1)
        calibrated = np.stack([fitted[c].held_out_p[rows] for c in classes], axis=1)
        choice = choose_joint({"raw": before, "calibrated": calibrated}, labels, baseline=before,
                              num_folds=num_folds, seed=seed)
        top = choice.held_out.max(axis=1), (choice.held_out.argmax(axis=1) == labels).astype(float)
        out[decision.id] = JointDecision(classes, rows, labels, choice, cal.multiclass_metrics(calibrated, labels),
                                         ece_summary(*top, seed=seed))
    return out


def category_outcomes(pack: Pack, labels_of: list[list[str]], raw: dict[str, np.ndarray],
                      fitted: dict[str, MethodChoice], joint: dict[str, JointDecision], *,
                      num_folds: int, seed: int) -> dict[str, CategoryOutcome]:
    """A category whose joint map covers every row is served (and judged) by that map."""
    by_class = {c: (d, j) for d, j in joint.items() if len(j.rows) == len(labels_of) for c in j.classes}
    out = {}
    for category in pack.categories:
        y = np.array([float(category.id in labels) for labels in labels_of])
        if category.id in by_class:
            decision_id, j = by_class[category.id]
            p = np.empty(len(y))
            p[j.rows] = j.choice.held_out[:, j.classes.index(category.id)]
            folds = np.empty(len(y), dtype=int)
            folds[j.rows] = class_folds(j.labels, num_folds, seed + 1)  # the joint map's outer folds
            before = cal.binary_metrics(raw[category.id], y) | {"auc": fold_auc(raw[category.id], y, folds)}
            after = cal.binary_metrics(p, y) | {"auc": fold_auc(p, y, folds)}
            out[category.id] = CategoryOutcome(f"joint {decision_id}", p, before, after, ece_summary(p, y, seed=seed),
                                               cal.num_flipped(raw[category.id], p))
        else:
            c = fitted[category.id]
            out[category.id] = CategoryOutcome("one-vs-rest", c.held_out_p, c.before, c.after,
                                               ece_summary(c.held_out_p, y, seed=seed), c.num_flipped)
    return out


def fit_thresholds(pack: Pack, labels_of: list[list[str]], outcomes: dict[str, CategoryOutcome], *,
                   seed: int) -> dict[str, ThresholdFit]:
    out = {}
    for decision in pack.decisions:
        for index, rule in enumerate(decision.rules):
            if rule.target is None:
                continue
            y = np.array([float(rule.category in labels) for labels in labels_of])
            out[f"{decision.id}/{index}"] = fit_threshold(outcomes[rule.category].held_out_p, y, rule.target.metric,
                                                          rule.target.value, seed=seed)
    return out

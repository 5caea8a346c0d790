"""Fit a pack's calibration from scored labelled rows (pure: no engine, no files).

    ScoredRow(id, labels, question p, choice p, per-ordering p)   one per labelled row
      --fit_pack--> PackFit: per question and per category a MethodChoice (nested
                    out-of-fold metrics before/after, calibration_choice), per argmax
                    decision a joint map, per targeted rule a threshold (decision_fit),
                    and ordering summaries
      --to_pack_calibration--> PackCalibration (what is written into the pack file)

Targets: a question's label is 1 when the row's labels hold any category that lists the
question as a member. A category's input is the pack's combine rule over the members'
*out-of-fold* calibrated question scores (choice members use the raw choice p), so the
category fit never sees a question map fitted on its own held-out row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date

import numpy as np

from prompt_packs import calibration_choice as choice_
from prompt_packs.apply import combine_scores
from prompt_packs.decision_fit import (
    CategoryOutcome,
    JointDecision,
    category_outcomes,
    fit_joint_decisions,
    fit_thresholds,
    joint_served,
)
from prompt_packs.format import (
    Calibration,
    DecisionCalibration,
    Pack,
    PackCalibration,
    Provenance,
    Threshold,
)
from prompt_packs.thresholds import ThresholdFit

NUM_BOOTSTRAP = 2000


@dataclass(slots=True)
class ScoredRow:
    id: str
    labels: list[str]  # category ids that apply
    questions: dict[str, float]  # question id -> raw positive p (questions with `positive`)
    choices: dict[str, float]  # "question/choice" -> raw p averaged over orderings
    orderings: dict[str, list[list[float]]] = field(default_factory=dict)  # question -> [ordering][choice] p


@dataclass(slots=True)
class PackFit:
    questions: dict[str, choice_.MethodChoice]
    categories: dict[str, choice_.MethodChoice]
    orderings: dict[str, dict] = field(default_factory=dict)  # lettered question id -> one vs all
    held_out: str = ""
    category_inputs: dict[str, str] = field(default_factory=dict)  # category -> "calibrated" | "raw"
    joint: dict[str, JointDecision] = field(default_factory=dict)  # argmax decision -> joint map
    outcomes: dict[str, CategoryOutcome] = field(default_factory=dict)  # category -> what the pack serves
    thresholds: dict[str, ThresholdFit] = field(default_factory=dict)  # "<decision>/<rule>" -> fitted threshold


def question_targets(pack: Pack, rows: list[ScoredRow]) -> dict[str, np.ndarray]:
    members: dict[str, set[str]] = {}
    for category in pack.categories:
        for member in category.questions:
            if "/" not in member:
                members.setdefault(member, set()).add(category.id)
    return {q: np.array([float(bool(cats & set(r.labels))) for r in rows]) for q, cats in members.items()}


def fit_pack(pack: Pack, rows: list[ScoredRow], *, num_folds: int = 5, seed: int = 0) -> PackFit:
    questions = {
        q: choice_.choose_method(np.array([r.questions[q] for r in rows]), y, num_folds=num_folds, seed=seed)
        for q, y in question_targets(pack, rows).items()
    }
    categories: dict[str, choice_.MethodChoice] = {}
    category_inputs: dict[str, str] = {}
    raw_category: dict[str, np.ndarray] = {}
    labels_of = [r.labels for r in rows]
    # a category its joint map serves is only that map's input: no row is judged at its 0.5,
    # so its Platt fits keep their bias untested (the joint map's log-loss decides)
    inputs_only = joint_served(pack, labels_of, num_folds=num_folds)
    for category in pack.categories:
        y = np.array([float(category.id in r.labels) for r in rows])
        raw = np.array([combine_scores(category, pack, {**r.choices, **r.questions}) for r in rows])
        merged = np.array([
            combine_scores(category, pack, {**r.choices, **r.questions,
                                            **{q: float(c.held_out_p[i]) for q, c in questions.items()}})
            for i, r in enumerate(rows)
        ])
        # the category map may read the combine of calibrated question scores or of raw
        # ones; both are judged against the uncalibrated pack, inside the nested choice
        best, chosen = choice_.choose_among_inputs({"raw": raw, "calibrated": merged}, y, num_folds=num_folds,
                                                   seed=seed, baseline=raw,
                                                   test_bias=category.id not in inputs_only)
        categories[category.id], category_inputs[category.id] = chosen, best
        raw_category[category.id] = raw
    fit = PackFit(questions, categories, held_out=f"{num_folds}-fold stratified cross-fit (seed {seed})",
                  category_inputs=category_inputs)
    where = {"num_folds": num_folds, "seed": seed}
    fit.joint = fit_joint_decisions(pack, labels_of, raw_category, categories, **where)
    fit.outcomes = category_outcomes(pack, labels_of, raw_category, categories, fit.joint, **where)
    fit.thresholds = fit_thresholds(pack, labels_of, fit.outcomes, seed=seed)
    fit.orderings = ordering_summaries(pack, rows, seed=seed)
    return fit


def ordering_summaries(pack: Pack, rows: list[ScoredRow], *, seed: int = 0) -> dict[str, dict]:
    """Lettered questions asked in several orderings whose choice ids are category ids:
    accuracy of the first ordering alone vs the average, with a bootstrap 95% interval of
    the difference, and the share (and accuracy) of rows where every ordering agreed."""
    out = {}
    for question in pack.questions:
        choice_ids = [c.id for c in question.choices]
        if question.orderings == "one" or not choice_ids:
            continue
        labelled = [r for r in rows if len(set(r.labels) & set(choice_ids)) == 1 and question.id in r.orderings]
        if not labelled:
            continue
        truth = np.array([choice_ids.index(next(c for c in r.labels if c in choice_ids)) for r in labelled])
        per = np.array([r.orderings[question.id] for r in labelled])  # [N, K, C]
        first_right = per[:, 0, :].argmax(axis=1) == truth
        mean_right = per.mean(axis=1).argmax(axis=1) == truth
        unanimous = np.all(per.argmax(axis=2) == per.argmax(axis=2)[:, :1], axis=1)
        rng = np.random.default_rng(seed)
        draws = rng.integers(0, len(truth), size=(NUM_BOOTSTRAP, len(truth)))
        deltas = mean_right[draws].mean(axis=1) - first_right[draws].mean(axis=1)
        out[question.id] = {
            "num_rows": len(truth), "num_orderings": int(per.shape[1]),
            "accuracy_one_ordering": float(first_right.mean()),
            "accuracy_averaged": float(mean_right.mean()),
            "accuracy_change": float(mean_right.mean() - first_right.mean()),
            "accuracy_change_ci95": [float(np.quantile(deltas, 0.025)), float(np.quantile(deltas, 0.975))],
            "share_unanimous": float(unanimous.mean()),
            "accuracy_unanimous": float(mean_right[unanimous].mean()) if unanimous.any() else None,
            "accuracy_split": float(mean_right[~unanimous].mean()) if (~unanimous).any() else None,
        }
    return out


def _provenance(choice: choice_.MethodChoice, *, data: str, data_sha256: str, model: str,
                fingerprint: str, held_out: str) -> Provenance:
    def rounded(metrics: dict[str, float]) -> dict[str, float]:
        return {k: round(float(v), 5) for k, v in metrics.items()}

    return Provenance(
        data=data, data_sha256=data_sha256, num_rows=choice.before["num_rows"],
        num_positive=choice.before["num_positive"], held_out=held_out, model=model,
        system_fingerprint=fingerprint, date=date.today().isoformat(),
        before=rounded(choice.before), after=rounded(choice.after), num_flipped=choice.num_flipped,
    )


def _calibration(choice: choice_.MethodChoice, provenance: Provenance, reads: str = "calibrated") -> Calibration:
    def rounded(value):
        return [round(v, 6) for v in value] if isinstance(value, list) else round(float(value), 6)

    params = {k: rounded(v) for k, v in choice.calibrator.params.items()}
    return Calibration(method=choice.method, params=params, reads=reads, provenance=provenance)


def to_pack_calibration(fit: PackFit, *, data: str, data_sha256: str, model: str, fingerprint: str,
                        report: str | None = None) -> PackCalibration:
    where = {"data": data, "data_sha256": data_sha256, "model": model, "fingerprint": fingerprint,
             "held_out": fit.held_out}
    return PackCalibration(
        questions={q: _calibration(c, _provenance(c, **where)) for q, c in fit.questions.items()},
        categories={k: _calibration(c, _provenance(c, **where), fit.category_inputs.get(k, "calibrated"))
                    for k, c in fit.categories.items()},
        decisions={d: _decision_calibration(j, **where) for d, j in fit.joint.items()},
        thresholds={k: _threshold(t) for k, t in fit.thresholds.items() if t.at_least is not None},
        report=report,
    )


def _decision_calibration(joint: JointDecision, *, data: str, data_sha256: str, model: str, fingerprint: str,
                          held_out: str) -> DecisionCalibration:
    params = {k: [round(x, 6) for x in v] if isinstance(v, list) else round(float(v), 6)
              for k, v in joint.choice.calibrator.params.items()}
    rounded = {k: round(float(v), 5) for k, v in joint.ece.items()}
    provenance = {"data": data, "data_sha256": data_sha256, "num_rows": len(joint.rows),
                  "held_out": f"nested {held_out}", "model": model, "system_fingerprint": fingerprint,
                  "date": date.today().isoformat(),
                  "before": {k: round(float(v), 5) for k, v in joint.choice.before.items()},
                  "after": {k: round(float(v), 5) for k, v in joint.choice.after.items()}, "ece": rounded}
    return DecisionCalibration(method=joint.choice.method, params=params, reads=joint.choice.reads,
                               classes=joint.classes, provenance=provenance)


def _threshold(t: ThresholdFit) -> Threshold:
    return Threshold(at_least=round(t.at_least, 6), metric=t.metric, target=t.target, achieved=t.achieved,
                     interval=[round(x, 5) for x in t.interval], successes=t.successes, trials=t.trials,
                     other=t.other, num_pick_rows=t.num_pick_rows, num_check_rows=t.num_check_rows)

"""Joint decision maps, thresholds by target and contextual pack scores, end to end on a
small pack (synthetic scores; no model): fitted, written into the file, applied."""

from __future__ import annotations

import math

import numpy as np
import pytest

from contract.scoring_results import Combination, OptionScore, QueryResult
from prompt_packs.apply import apply_pack
from prompt_packs.calibration_choice import choose_among_inputs
from prompt_packs.calibration_fit import ScoredRow, fit_pack, to_pack_calibration
from prompt_packs.decision_calibration import (
    joint_probabilities,
    workload_probabilities,
)
from prompt_packs.decision_fit import joint_served
from prompt_packs.registry import load_pack, write_calibration

ROUTE = """\
format: 1
id: test/route
version: 0.1.0
label_free: contextual
questions:
  - {id: is_a, template: "\\n\\nA?{?}", options: [" yes", " no"], positive: [" yes"]}
  - {id: is_b, template: "\\n\\nB?{?}", options: [" yes", " no"], positive: [" yes"]}
  - {id: is_c, template: "\\n\\nC?{?}", options: [" yes", " no"], positive: [" yes"]}
categories:
  - {id: a, questions: [is_a]}
  - {id: b, questions: [is_b]}
  - {id: c, questions: [is_c]}
decisions:
  - {id: route, argmax_of: [a, b, c]}
  - id: flag
    rules: [{category: a, at_least: 0.5, label: urgent, target: {metric: precision, value: 0.9}}]
    default: normal
"""


def _rows(num_rows: int, seed: int = 0) -> list[ScoredRow]:
    """One label per row; each question says yes too easily and its own evidence is noisy."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(num_rows):
        label = "abc"[rng.choice(3, p=[0.5, 0.3, 0.2])]
        p = {f"is_{c}": float(1 / (1 + math.exp(-(rng.normal(2.0 if c == label else -0.5, 1.2) + 1.0)))) for c in "abc"}
        rows.append(ScoredRow(id=str(i), labels=[label], questions=p, choices={}))
    return rows


@pytest.fixture
def route(tmp_path):
    path = tmp_path / "route.yaml"
    path.write_text(ROUTE)
    return path


def _results(p: dict[str, float], floor: float = 0.7) -> list[QueryResult]:
    def one(qid, yes):
        options = [OptionScore(text=" yes", logprob=math.log(yes), p=yes, floor_p=floor),
                   OptionScore(text=" no", logprob=math.log(1 - yes), p=1 - yes, floor_p=1 - floor)]
        return QueryResult(id=f"test/route:{qid}", combinations=[Combination(values={}, options=options, residual=0.0)])
    return [one(q, v) for q, v in p.items()]


def test_joint_map_serves_the_decision_and_its_categories(route):
    pack = load_pack(route)
    fit = fit_pack(pack, _rows(600))
    joint = fit.joint["route"]
    assert joint.choice.after["ece"] < joint.choice.before["ece"] / 3
    assert joint.choice.after["accuracy"] >= joint.choice.before["accuracy"]
    assert {fit.outcomes[c].source for c in "abc"} == {"joint route"}
    fitted = write_calibration(route, to_pack_calibration(fit, data="x", data_sha256="0" * 64, model="m", fingerprint="f"))
    results = _results({"is_a": 0.9, "is_b": 0.6, "is_c": 0.2})
    out = apply_pack(fitted, results)
    calibration = fitted.calibration.decisions["route"]
    scores = {c: out["categories"][c]["calibrated_score"] for c in "abc"}
    # the decision's probabilities are the written map applied to the categories' inputs, by hand
    without = fitted.model_copy(update={"calibration": fitted.calibration.model_copy(update={"decisions": {}})})
    one_vs_rest = apply_pack(without, results)["categories"]
    key = "score" if calibration.reads == "raw" else "calibrated_score"
    inputs = np.array([one_vs_rest[c][key] for c in "abc"])
    z = np.log(inputs / inputs.sum())
    logits = z / calibration.params["temperature"] if calibration.method == "temperature" else \
        np.asarray(calibration.params["w"]) * z + np.asarray(calibration.params["b"])
    expected = np.exp(logits) / np.exp(logits).sum()
    assert [out["decision_probabilities"]["route"][c] for c in "abc"] == pytest.approx(expected.tolist())
    assert sum(out["decision_probabilities"]["route"].values()) == pytest.approx(1.0)
    assert scores == pytest.approx(out["decision_probabilities"]["route"])
    assert out["decisions"]["route"] == max(scores, key=scores.get)


def test_threshold_by_target_is_written_and_used(route):
    pack = load_pack(route)
    fit = fit_pack(pack, _rows(600))
    threshold = fit.thresholds["flag/0"]
    assert threshold.at_least is not None and threshold.metric == "precision"
    assert threshold.interval[0] <= threshold.achieved <= threshold.interval[1]
    fitted = write_calibration(route, to_pack_calibration(fit, data="x", data_sha256="0" * 64, model="m", fingerprint="f"))
    assert fitted.calibration.thresholds["flag/0"].at_least == pytest.approx(threshold.at_least, abs=1e-6)
    low = {"is_a": 0.55, "is_b": 0.5, "is_c": 0.5}
    score = apply_pack(fitted, _results(low))["categories"]["a"]["calibrated_score"]
    expected = "urgent" if score >= fitted.calibration.thresholds["flag/0"].at_least else "normal"
    assert apply_pack(fitted, _results(low))["decisions"]["flag"] == expected


def test_contextual_pack_scores_divide_by_the_floor(route):
    out = apply_pack(load_pack(route), _results({"is_a": 0.8, "is_b": 0.5, "is_c": 0.3}, floor=0.7))
    for q, yes in (("is_a", 0.8), ("is_b", 0.5), ("is_c", 0.3)):
        ratio_yes, ratio_no = yes / 0.7, (1 - yes) / 0.3
        assert out["questions"][q]["contextual_p"] == pytest.approx(ratio_yes / (ratio_yes + ratio_no))
    assert all(q.calibrate == "contextual" for q in __import__("prompt_packs.apply").apply.expand_pack(load_pack(route)))


def test_decision_functions_are_the_formulas():
    logits = [-0.2, -1.5, -3.0]
    z = np.array(logits) / 1.8
    assert workload_probabilities(logits, 1.8) == pytest.approx((np.exp(z) / np.exp(z).sum()).tolist())
    with pytest.raises(ValueError, match="temperature"):
        workload_probabilities(logits, 0.0)
    from prompt_packs.format import DecisionCalibration

    joint = DecisionCalibration(method="temperature", params={"temperature": 2.0}, classes=["x", "y"])
    s = np.array([0.6, 0.2]) / 0.8
    expected = s ** 0.5 / (s ** 0.5).sum()
    assert list(joint_probabilities(joint, {"x": 0.6, "y": 0.2}).values()) == pytest.approx(expected.tolist())


def _weakly_biased_rows(num_rows: int, seed: int = 0) -> list[ScoredRow]:
    """One label per row; each question over-confident and only slightly biased, so some
    Platt biases are significant on these rows and some are not."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(num_rows):
        label = "abc"[rng.choice(3, p=[0.4, 0.3, 0.3])]
        p = {f"is_{c}": float(1 / (1 + math.exp(-2.0 * rng.normal(1.5 if c == label else -1.5, 1.5)))) for c in "abc"}
        rows.append(ScoredRow(id=str(i), labels=[label], questions=p, choices={}))
    return rows


def test_a_category_its_joint_map_serves_is_fitted_as_an_input(route):
    """Categories a joint map serves (every row single-label among its classes) keep Platt's
    bias untested: they are only the joint map's input; other maps test it (fit_platt)."""
    pack = load_pack(route)
    rows = _weakly_biased_rows(200)
    assert joint_served(pack, [r.labels for r in rows], num_folds=5) == {"a", "b", "c"}
    two_labels = rows[:-1] + [ScoredRow(id="x", labels=["a", "b"], questions=rows[-1].questions, choices={})]
    assert joint_served(pack, [r.labels for r in two_labels], num_folds=5) == set()
    fit = fit_pack(pack, rows)
    assert fit.outcomes["a"].source == "joint route"
    num_differing = 0
    for category in "abc":
        y = np.array([float(category in r.labels) for r in rows])
        raw = np.array([r.questions[f"is_{category}"] for r in rows])
        inputs = {"raw": raw, "calibrated": fit.questions[f"is_{category}"].held_out_p}
        _, untested = choose_among_inputs(inputs, y, baseline=raw, test_bias=False)
        _, tested = choose_among_inputs(inputs, y, baseline=raw, test_bias=True)
        assert fit.categories[category].method == untested.method
        np.testing.assert_array_equal(fit.categories[category].held_out_p, untested.held_out_p)
        num_differing += not np.array_equal(tested.held_out_p, untested.held_out_p)
    assert num_differing >= 1  # the test above tells the two apart on these rows

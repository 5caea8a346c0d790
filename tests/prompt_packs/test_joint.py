"""Joint (multiclass) maps and their nested choice, against numpy written here."""

from __future__ import annotations

import numpy as np
import pytest

from prompt_packs import joint
from prompt_packs.joint_choice import choose_joint, class_folds


def _softmax_rows(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _draw(num_rows: int, w_true: np.ndarray, b_true: np.ndarray, seed: int):
    """Labels from softmax(z); the model reports softmax((z - b) / w): mis-scaled per class."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 2.0, size=(num_rows, len(w_true)))
    truth = _softmax_rows(z)
    labels = np.array([rng.choice(len(w_true), p=row) for row in truth])
    reported = _softmax_rows((z - b_true) / w_true)
    return reported, labels


def test_maps_are_the_formulas():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(4), size=30)
    z = np.log(probs)
    t = joint.MulticlassCalibrator("temperature", {"temperature": 1.7}).apply(probs)
    np.testing.assert_allclose(t, _softmax_rows(z / 1.7), rtol=1e-12)
    w, b = np.array([0.5, 1.0, 2.0, 1.5]), np.array([0.1, -0.2, 0.0, 0.3])
    v = joint.MulticlassCalibrator("vector", {"w": w.tolist(), "b": b.tolist()}).apply(probs)
    np.testing.assert_allclose(v, _softmax_rows(w * z + b), rtol=1e-12)
    assert np.array_equal(t.argmax(axis=1), probs.argmax(axis=1))  # temperature keeps the argmax


def test_temperature_fit_minimises_the_log_loss():
    probs, labels = _draw(4000, np.full(3, 0.5), np.zeros(3), seed=1)  # over-confident by 2
    fitted = joint.fit_multiclass("temperature", probs, labels).params["temperature"]
    assert fitted == pytest.approx(2.0, rel=0.08)
    grid = np.exp(np.linspace(np.log(0.5), np.log(8), 400))
    losses = [-np.mean(np.log(_softmax_rows(np.log(probs) / t)[np.arange(len(labels)), labels])) for t in grid]
    assert fitted == pytest.approx(grid[int(np.argmin(losses))], rel=0.02)


def test_vector_fit_recovers_per_class_scales_and_biases():
    w_true, b_true = np.array([0.5, 1.0, 2.0]), np.array([1.0, 0.0, -1.0])
    rng = np.random.default_rng(2)
    probs = rng.dirichlet(np.full(3, 0.7), size=20000)  # the model's answers
    truth = _softmax_rows(w_true * np.log(probs) + b_true)  # what the labels follow
    labels = (rng.random((20000, 1)) > np.cumsum(truth, axis=1)).sum(axis=1)
    fitted = joint.fit_vector(probs, labels, l2=1e-6)
    assert np.asarray(fitted.params["w"]) == pytest.approx(w_true, rel=0.08)
    b = np.asarray(fitted.params["b"])
    assert b - b.mean() == pytest.approx(b_true - b_true.mean(), abs=0.12)  # b is defined up to a constant


def test_joint_choice_is_nested_and_beats_one_vs_rest_renormalised():
    probs, labels = _draw(900, np.array([0.4, 0.6, 1.5]), np.array([0.8, 0.0, -0.5]), seed=3)
    choice = choose_joint({"raw": probs}, labels)
    assert choice.after["log_loss"] < choice.before["log_loss"]
    assert choice.after["ece"] < choice.before["ece"]
    assert len(choice.fold_choices) == 5
    folds = class_folds(labels, 5, seed=1)  # the outer folds
    for fold in range(5):  # each outer fold's rows are predicted by a map fitted without them
        held = folds == fold
        method = choice.fold_choices[fold].split(" ")[0]
        refit = joint.fit_multiclass(method, probs[~held], labels[~held]).apply(probs[held])
        np.testing.assert_allclose(choice.held_out[held], refit, rtol=1e-9)


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="unknown multiclass method"):
        joint.fit_multiclass("matrix", np.full((3, 2), 0.5), np.array([0, 1, 0]))

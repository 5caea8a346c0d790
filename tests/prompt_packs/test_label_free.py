"""Contextual and batch calibration against the formulas written out in numpy here."""

from __future__ import annotations

import numpy as np
import pytest

from contract.probability import reweight
from prompt_packs import label_free


def _reference(p: np.ndarray, prior: np.ndarray) -> np.ndarray:
    # q_i = (p_i / prior_i) / sum_j (p_j / prior_j), one row at a time
    out = np.empty_like(p)
    for n in range(p.shape[0]):
        ratios = [p[n, i] / prior[n, i] if prior.ndim == 2 else p[n, i] / prior[i] for i in range(p.shape[1])]
        out[n] = np.array(ratios) / sum(ratios)
    return out


def _rows(num_rows: int, num_options: int, seed: int):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(num_options), size=num_rows)
    floor_p = rng.dirichlet(np.ones(num_options) * 2, size=num_rows)
    return p, floor_p


@pytest.mark.parametrize("num_options", [2, 5])
def test_contextual_is_p_over_floor_renormalised(num_options):
    p, floor_p = _rows(50, num_options, 1)
    np.testing.assert_allclose(label_free.contextual(p, floor_p), _reference(p, floor_p), rtol=1e-12)


@pytest.mark.parametrize("num_options", [2, 5])
def test_batch_divides_by_the_mean_answer_of_the_rows(num_options):
    p, _ = _rows(80, num_options, 2)
    prior = np.array([sum(p[n, i] for n in range(len(p))) / len(p) for i in range(num_options)])
    np.testing.assert_allclose(label_free.batch_priors(p), prior, rtol=1e-12)
    np.testing.assert_allclose(label_free.batch(p), _reference(p, prior), rtol=1e-12)


def test_the_pure_python_reweight_matches_numpy():
    p, floor_p = _rows(20, 3, 3)
    for n in range(20):
        assert reweight(p[n].tolist(), floor_p[n].tolist()) == pytest.approx(_reference(p, floor_p)[n], rel=1e-12)


def test_batch_centres_a_biased_set_and_keeps_ranks():
    rng = np.random.default_rng(4)
    truth = rng.random(400) < 0.5
    logit = np.where(truth, 1.0, -1.0) + rng.normal(0, 1.0, 400) + 2.0  # a model that leans to "yes"
    yes = 1 / (1 + np.exp(-logit))
    p = np.stack([yes, 1 - yes], axis=1)
    q = label_free.batch(p)
    assert abs(q[:, 0].mean() - 0.5) < abs(p[:, 0].mean() - 0.5) / 2  # most of the lean is gone
    assert np.mean((q[:, 0] > 0.5) == truth) > np.mean((p[:, 0] > 0.5) == truth)
    assert np.array_equal(np.argsort(q[:, 0] / q[:, 1]), np.argsort(p[:, 0] / p[:, 1]))


def test_contextual_needs_floors_and_methods_are_named():
    p, _ = _rows(3, 2, 5)
    with pytest.raises(ValueError, match="floor_p"):
        label_free.label_free("contextual", p)
    with pytest.raises(ValueError, match="unknown label-free method"):
        label_free.label_free("magic", p)


def test_the_worked_examples_of_docs_calibration():
    """docs/calibration.md's examples, through the code the service runs."""
    from prompt_packs.joint import MulticlassCalibrator
    from prompt_packs.thresholds import clopper_pearson

    row = np.array([[0.8, 0.2]])
    assert label_free.contextual(row, np.array([[0.7, 0.3]])).round(3).tolist() == [[0.632, 0.368]]
    assert label_free.batch(row, np.array([0.6, 0.4])).round(3).tolist() == [[0.727, 0.273]]
    joint = MulticlassCalibrator("temperature", {"temperature": 2.0}).apply(np.array([0.7, 0.2, 0.1]))
    assert joint.round(3).tolist() == [0.523, 0.279, 0.198]
    assert [round(x, 3) for x in clopper_pearson(8, 9)] == [0.518, 0.997]

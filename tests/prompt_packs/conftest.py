"""Shared fixtures for the pack tests: a small pack file and hand-built engine results."""

from __future__ import annotations

import math

import pytest

from contract.scoring_results import Combination, OptionScore, QueryResult

MINI = """\
# a hand-written comment that must survive a calibration write
format: 1
id: test/mini
version: 0.1.0
presentation: {template: "Post:\\n{content}"}
questions:
  - {id: rude, template: "\\n\\nRude?{?}", options: [" yes", " no"], positive: [" yes"], weight: 3}
  - {id: mean, template: "\\n\\nMean?{?}", options: [" yes", " no"], positive: [" yes"]}
  - id: kind
    template: "\\n\\nKind?\\n{choices}\\nAnswer:{?}"
    choices: [{id: warm, text: Warm}, {id: cold, text: Cold}]
    orderings: rotations
    positive: [cold]
categories:
  - {id: hostile, questions: [rude, mean], combine: weighted_mean}
  - {id: harsh, questions: [rude, mean], combine: noisy_or}
  - {id: chilly, questions: [kind/cold], combine: max}
decisions:
  - id: action
    rules: [{category: hostile, at_least: 0.5, label: block}]
    default: allow
"""


def _result(query_id: str, ps: list[float], texts: list[str]) -> QueryResult:
    options = [OptionScore(text=t, logprob=math.log(p), p=p, floor_p=0.5) for t, p in zip(texts, ps)]
    return QueryResult(id=query_id, combinations=[Combination(values={}, options=options, residual=0.0)])


@pytest.fixture
def mini(tmp_path):
    path = tmp_path / "mini.yaml"
    path.write_text(MINI)
    return path


@pytest.fixture
def mini_results() -> list[QueryResult]:
    return [
        _result("test/mini:rude", [0.8, 0.2], [" yes", " no"]),
        _result("test/mini:mean", [0.4, 0.6], [" yes", " no"]),
        _result("test/mini:kind", [0.9, 0.1], [" A", " B"]),  # A=warm, B=cold
        _result("test/mini:kind~o1", [0.7, 0.3], [" A", " B"]),  # A=cold, B=warm
    ]



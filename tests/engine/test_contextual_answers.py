"""Contextual calibration in the engine's answers: contextual_p = p / floor_p renormalised,
computed from the same read (no extra pass), only for queries that ask for it."""

from __future__ import annotations

import numpy as np
import pytest

from contract.protocol import Message, Query, ScoringRequest, ScoringSpec


def _request(calibrate: str | None) -> ScoringRequest:
    query = Query(id="q", template="\n\nTopic?{?}", options=[" sport", " music", " news"], calibrate=calibrate)
    return ScoringRequest(messages=[Message(role="user", content="The match ended two all.")],
                          scoring=ScoringSpec(queries=[query]))


def test_contextual_p_is_the_floor_divided_answer_and_opt_in(tiny_engine):
    engine = tiny_engine("qwen2")
    plain, contextual = engine.score_requests([_request(None), _request("contextual")]).results
    raw = plain.results[0].combinations[0].options
    options = contextual.results[0].combinations[0].options
    assert all(o.contextual_p is None for o in raw)
    assert [o.p for o in options] == [o.p for o in raw]  # the raw values are unchanged
    p, floor = np.array([o.p for o in options]), np.array([o.floor_p for o in options])
    expected = (p / floor) / (p / floor).sum()
    assert [o.contextual_p for o in options] == pytest.approx(expected.tolist(), rel=1e-12)
    assert contextual.usage.floors_computed + contextual.usage.floors_cached >= 1


def test_the_request_level_calibrate_reaches_every_option_query_without_its_own(tiny_engine):
    """`scoring.calibrate` (a request's or a job's opt-in): each option query that sets no
    `calibrate` of its own answers with it; one that sets its own keeps it."""
    spec = ScoringSpec.model_validate({"calibrate": "contextual", "queries": [
        {"id": "topic", "template": "\n\nTopic?{?}", "options": [" sport", " music", " news"]},
        {"id": "own", "template": "\n\nSport?{?}", "options": [" yes", " no"], "calibrate": "batch"},
        {"id": "name", "template": '\n\nTeam: "{*}"'},
    ]})
    assert [q.calibrate for q in spec.queries] == ["contextual", "batch", None]
    request = ScoringRequest(messages=[Message(role="user", content="The match ended two all.")], scoring=spec)
    response = tiny_engine("qwen2").score_requests([request]).results[0]
    topic, own, _ = response.results
    options = topic.combinations[0].options
    p, floor = np.array([o.p for o in options]), np.array([o.floor_p for o in options])
    assert [o.contextual_p for o in options] == pytest.approx(((p / floor) / (p / floor).sum()).tolist(), rel=1e-12)
    assert (topic.calibrate, own.calibrate) == ("contextual", "batch")
    assert all(o.contextual_p is None for o in own.combinations[0].options)

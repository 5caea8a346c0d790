"""ScoringRequest.packs rules, and the floor frame a named pack puts on the content."""

import pytest
from pydantic import ValidationError

from contract.protocol import ScoringRequest
from prompt_packs.apply import with_packs
from prompt_packs.registry import PackRegistry

MESSAGES = [{"role": "user", "content": "Customer support message:\nMy parcel never arrived."}]
QUERY = {"id": "q", "template": "\n\nLate?{?}", "options": [" yes", " no"]}


def test_a_request_needs_queries_or_packs():
    with pytest.raises(ValidationError, match="give at least one query, or name a pack"):
        ScoringRequest.model_validate({"messages": MESSAGES})
    request = ScoringRequest.model_validate({"messages": MESSAGES, "packs": [{"id": "spinf/support-triage"}]})
    assert request.scoring.queries == []
    with pytest.raises(ValidationError, match="named more than once"):
        ScoringRequest.model_validate({"messages": MESSAGES, "packs": [{"id": "a/b"}, {"id": "a/b"}]})
    with pytest.raises(ValidationError, match="extra"):
        ScoringRequest.model_validate({"messages": MESSAGES, "packs": [{"id": "a/b", "version": "1"}]})


def test_with_packs_frames_the_floor_of_a_presented_content_only():
    registry = PackRegistry.load()
    triage, news = registry.get("spinf/support-triage"), registry.get("spinf/news-topics")
    request = ScoringRequest.model_validate({"messages": MESSAGES, "scoring": {"queries": [QUERY]}})
    framed = with_packs(request, [news, triage])  # news does not frame this content; triage does
    assert framed.messages[-1].floor_content == "Customer support message:\n"
    assert framed.messages[-1].content == MESSAGES[0]["content"]
    assert with_packs(request, [news]).messages[-1].floor_content is None
    chosen = {**MESSAGES[0], "floor_content": "Customer:"}
    kept = ScoringRequest.model_validate({"messages": [chosen], "scoring": {"queries": [QUERY]}})
    assert with_packs(kept, [triage]).messages[-1].floor_content == "Customer:"
    assert triage.presentation.messages("x")[-1].floor_content == "Customer support message:\n"

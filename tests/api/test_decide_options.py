"""/v1/decide's options are lettered A to Z: the 27th is refused by the model and stated in its
schema (maxItems), so a schema-valid body is never refused for its number of options."""

import pytest
from pydantic import ValidationError

from api.decisions import DecideRequest, SharedDecideRequest
from prompt_packs.orderings import LETTERS


def _options(n: int) -> list[dict]:
    return [{"id": f"o{i}", "description": f"option {i}"} for i in range(n)]


def test_26_options_are_accepted_and_27_refused_naming_options():
    DecideRequest.model_validate({"state": "s", "question": "q", "options": _options(len(LETTERS))})
    with pytest.raises(ValidationError) as refused:
        DecideRequest.model_validate({"state": "s", "question": "q", "options": _options(len(LETTERS) + 1)})
    assert refused.value.errors()[0]["loc"] == ("options",)
    with pytest.raises(ValidationError) as shared:
        SharedDecideRequest.model_validate({"state": "s", "decisions": [{"question": "q", "options": _options(27)}]})
    assert shared.value.errors()[0]["loc"][-1] == "options"


def test_the_schema_states_the_lettered_bound():
    for model in (DecideRequest, SharedDecideRequest):
        schema = model.model_json_schema()
        spec = schema["$defs"]["DecisionSpec"] if model is SharedDecideRequest else schema
        assert spec["properties"]["options"]["maxItems"] == len(LETTERS) == 26

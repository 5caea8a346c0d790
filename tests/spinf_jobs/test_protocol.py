import pytest
from pydantic import ValidationError

from spinf_jobs.protocol import ScoringRequest


def request(**query):
    base = {"id": "q", "template": "Answer:{?}", "options": [" yes", " no"]}
    base.update(query)
    return {"messages": [{"role": "user", "content": "hello"}], "scoring": {"queries": [base]}}


def test_valid_request_parses():
    parsed = ScoringRequest.model_validate(request())
    assert parsed.scoring.queries[0].answer_in == "user"


@pytest.mark.parametrize(
    "query, field_fragment",
    [
        ({"options": [" yes"]}, "at least 2 options"),
        ({"options": [" yes", " yes"]}, "duplicate option"),
        ({"options": [" yes", ""]}, "an option is empty"),
        ({"options": [str(i) for i in range(256)]}, "at most 255"),
        ({"template": "no slot"}, "no slot"),
        ({"template": "{?}{?}"}, "two slots"),
        ({"template": "Q {x}?{?}"}, "have no values"),
        ({"values": {"x": ["1"]}}, "not used in the template"),
        ({"template": 'A: "{*}"'}, "not served yet"),
        ({"template": "Q {x}{?}", "values": {"x": []}}, "at least one value"),
        ({"answer_in": "robot"}, "answer_in"),
    ],
)
def test_bad_queries_are_rejected_with_a_reason(query, field_fragment):
    with pytest.raises(ValidationError) as error:
        ScoringRequest.model_validate(request(**query))
    assert field_fragment in str(error.value)


def test_duplicate_query_ids_rejected():
    body = request()
    body["scoring"]["queries"].append(dict(body["scoring"]["queries"][0]))
    with pytest.raises(ValidationError, match="duplicate query id"):
        ScoringRequest.model_validate(body)


def test_unknown_fields_rejected():
    body = request()
    body["scoring"]["queries"][0]["optionz"] = []
    with pytest.raises(ValidationError, match="optionz"):
        ScoringRequest.model_validate(body)

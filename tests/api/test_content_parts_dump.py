"""Bodies with content parts dump as they came in (the sync-attach digest and the stored job
body are made from the dump), with no pydantic serializer warning: each part by its own model."""

import json
import warnings

from api.routes.chat import ChatRequest
from contract.decisions import DecisionCreate

CHAT = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": " there"}]},
                     {"role": "system", "content": "plain"}],
        "scoring": {"queries": [{"id": "q", "template": "x{?}", "options": [" a", " b"]}]}}
DECISION = {"model": "m",
            "input": [{"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": "hello"}, {"type": "input_json", "data": {"a": [1, 2]}}]}],
            "questions": [{"type": "predicate", "instructions": "Is it?"},
                          {"type": "choice", "instructions": [{"type": "input_text", "text": "Pick"}],
                           "choices": [{"value": "a"}, {"value": True}]}]}


def test_content_parts_dump_without_warnings_and_round_trip():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a PydanticSerializationUnexpectedValue warning fails the test
        chat = json.loads(ChatRequest.model_validate(CHAT).model_dump_json())
        decision = json.loads(DecisionCreate.model_validate(DECISION).model_dump_json(exclude_none=True))
    assert chat["messages"] == CHAT["messages"]
    assert decision["input"] == DECISION["input"]
    assert [q["instructions"] for q in decision["questions"]] == [q["instructions"] for q in DECISION["questions"]]
    assert decision["questions"][1]["choices"] == DECISION["questions"][1]["choices"]
    assert DecisionCreate.model_validate(decision) == DecisionCreate.model_validate(DECISION)

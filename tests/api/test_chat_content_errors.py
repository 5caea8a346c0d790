"""A chat message's `content` is a string or a list of text parts, picked by its type: an error
in a part names that part (it was reported as the string branch's "should be a valid string")."""

import pydantic
import pytest

from api.routes.chat import ChatRequest


@pytest.mark.parametrize("content, location, message", [
    ([{"type": "text", "text": "fine"}, {"type": "text", "text": "a\u0000b"}], ("messages", 0, "content", 1, "text"), "U+0000"),
    ("a\ud800", ("messages", 0, "content"), "unicode"),
    (5, ("messages", 0, "content"), "valid list"),
])
def test_a_content_error_names_what_is_wrong(content, location, message):
    with pytest.raises(pydantic.ValidationError) as error:
        ChatRequest.model_validate({"messages": [{"role": "user", "content": content}]})
    [found] = error.value.errors()
    assert found["loc"] == location and message in found["msg"], found


def test_parts_are_joined_and_the_schema_still_offers_both_forms():
    request = ChatRequest.model_validate({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                                    {"type": "text", "text": "b"}]}]})
    assert request.messages[0].to_message().content == "ab"
    schema = ChatRequest.model_json_schema()
    content = schema["$defs"]["ChatMessage"]["properties"]["content"]
    assert {branch.get("type") for branch in content["anyOf"]} == {"string", "array"}, content

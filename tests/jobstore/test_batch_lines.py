"""Batch input lines: each malformed kind gets its own code; the first line that names a custom_id owns it."""

import orjson
import pytest

from jobstore.batch_lines import LineCall, RefusedLine, parse_line

GOOD = {"custom_id": "a", "method": "POST", "url": "/v1/score", "body": {"messages": []}}


@pytest.mark.parametrize(("raw", "code", "custom_id", "param"), [
    (b'{"custom_id": "x", "method": ', "invalid_json", "x", None),
    (b"{nope", "invalid_json", None, None),
    (b"[1, 2]", "invalid_line", None, None),
    (b'"text"', "invalid_line", None, None),
    (orjson.dumps(GOOD | {"extra": 1}), "invalid_line", "a", "extra"),
    (orjson.dumps({k: v for k, v in GOOD.items() if k != "custom_id"}), "missing_custom_id", None, "custom_id"),
    (orjson.dumps(GOOD | {"custom_id": 7}), "missing_custom_id", None, "custom_id"),
    (orjson.dumps(GOOD | {"custom_id": ""}), "missing_custom_id", None, "custom_id"),
    (orjson.dumps(GOOD | {"method": "GET"}), "invalid_method", "a", "method"),
    (orjson.dumps(GOOD | {"url": "/v1/chat/completions"}), "invalid_url", "a", "url"),
    (orjson.dumps(GOOD | {"body": [1]}), "invalid_body", "a", "body"),
])
def test_each_kind_of_bad_line(raw, code, custom_id, param):
    refused = parse_line(7, raw, "/v1/score", set())
    assert isinstance(refused, RefusedLine)
    assert (refused.error.code, refused.custom_id, refused.error.param, refused.error.line) == (code, custom_id, param, 7)


def test_the_first_line_owns_a_custom_id():
    seen: set[str] = set()
    assert parse_line(1, b'{"custom_id": "a", "method": ', "/v1/score", seen).custom_id == "a"  # broken, named
    again = parse_line(2, orjson.dumps(GOOD), "/v1/score", seen)
    assert isinstance(again, RefusedLine) and again.error.code == "duplicate_custom_id" and again.custom_id is None
    call = parse_line(3, orjson.dumps(GOOD | {"custom_id": "b"}), "/v1/score", seen)
    assert call == LineCall(3, "b", {"messages": []}) and seen == {"a", "b"}

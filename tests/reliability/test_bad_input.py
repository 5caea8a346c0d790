"""The bad-input corpus on every route that takes a body: a 4xx that says what to fix, never a
5xx, and nothing written to Redis (the app on a real Redis; refused requests never reach a worker).

    corpus: a lone surrogate (JSON escape, and its CESU-8 bytes), a UTF-8 BOM, invalid UTF-8,
    NUL, a field past its limit, wrong types, broken JSON, a body nested 100,000 deep;
    free-form JSON values (input_json's `data`) nested or sized past their limits
    routes: /v1/score, /v1/chat/completions, /v1/jobs, /v1/decide, /v1/decide/shared, /v1/decisions,
    /v1/batches, /v1/files
Each valid body is first shown to pass validation (the control), so a refusal is the corpus's doing.
"""

from __future__ import annotations

import pytest
import redis
from fastapi.testclient import TestClient

from api.app import create_app
from contract.settings import LIMITS

pytestmark = pytest.mark.redis

QUERY = b'{"id": "q", "template": "Is it @T@?{?}", "options": [" yes", "@O@"]}'
BODIES = {  # @S@: the text under test (inside a JSON string); @T@ / @O@: a template / an option
    "/v1/score": b'{"messages": [{"role": "user", "content": "@S@"}], "scoring": {"queries": [' + QUERY + b"]}}",
    "/v1/chat/completions": b'{"model": "m", "messages": [{"role": "user", "content": "@S@"}],'
                            b' "scoring": {"queries": [' + QUERY + b"]}}",
    "/v1/jobs": b'{"items": [{"custom_id": "a", "text": "@S@"}], "scoring": {"queries": [' + QUERY + b"]}}",
    "/v1/decide": b'{"state": "@S@", "question": "Which @T@?", "options": [{"id": "a", "description": "one"},'
                  b' {"id": "b", "description": "@O@"}]}',
    "/v1/decide/shared": b'{"state": "@S@", "decisions": [{"question": "Which @T@?", "options": [{"id": "a",'
                         b' "description": "one"}, {"id": "b", "description": "@O@"}]}]}',
    "/v1/decisions": b'{"model": "m", "input": "@S@", "questions": [{"type": "choice", "instructions": "Which @T@?",'
                     b' "choices": [{"value": "a"}, {"value": "@O@"}]}]}',
    "/v1/batches": b'{"input_file_id": "@FILE@", "endpoint": "/v1/score", "completion_window": "24h",'
                   b' "metadata": {"note": "@S@"}}',
}
CONTROL = {"@S@": b"hello", "@T@": b"it", "@O@": b" no"}
HUGE = b"x" * (LIMITS.max_content_chars + 1)
TEXT_CASES = {  # name -> what replaces one marker
    "lone surrogate escape": b"x \\ud800",
    "low surrogate escape": b"\\udc00 x",
    "surrogate as CESU-8 bytes": b"x \xed\xa0\x80",
    "invalid UTF-8": b"x \xff\xfe",
    "truncated UTF-8": b"caf\xc3",
    "NUL": b"x\\u0000y",
    "huge": HUGE,
}
WHOLE_BODY_CASES = {  # name -> body(valid body)
    "UTF-8 BOM": lambda body: b"\xef\xbb\xbf" + body,
    "broken JSON": lambda body: body[:-3],
    "not an object": lambda body: b"[" + body + b"]",
    "a number": lambda body: b"5",
    "wrong type for the text": lambda body: body.replace(b'"@S@"', b"12345"),
    "a list for the text": lambda body: body.replace(b'"@S@"', b'["a"]'),
    "null body": lambda body: b"null",
    "nested 100,000 deep": lambda body: b"[" * 100_000 + b"]" * 100_000,
}
JSON_BODIES = {  # @J@: a free-form JSON value
    "/v1/decisions": b'{"model": "m", "input": [{"role": "user", "content": [{"type": "input_json", "data": @J@}]}],'
                     b' "questions": [{"type": "predicate", "instructions": "Is it late?"}]}',
}
JSON_CONTROL = b'{"order": 17, "items": [{"sku": "a"}]}'
JSON_CASES = {  # name -> the value; the limits: 32 levels, 10,000 values, 256 KiB
    "10,000 nested lists": b'{"a": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
    "40 nested objects": b'{"a": ' * 39 + b"{}" + b"}" * 39,
    "10,001 values": b'{"a": [' + b",".join(b"1" for _ in range(10_000)) + b"]}",
    "past 256 KiB": b'{"a": "' + b"x" * (256 * 1024) + b'"}',
}


def _fill(body: bytes, file_id: str, **markers: bytes) -> bytes:
    for marker, value in (CONTROL | markers).items():
        body = body.replace(marker.encode(), value)
    return body.replace(b"@FILE@", file_id.encode())


@pytest.fixture
def client(make_settings, bearer):
    settings = make_settings(default_model="m", sync_timeout_s=0.2)
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        test_client.headers.update(bearer("alice"))
        yield test_client, redis.Redis.from_url(settings.redis_url)


@pytest.fixture
def file_id(client) -> str:
    test_client, _ = client
    line = b'{"custom_id": "r1", "method": "POST", "url": "/v1/score", "body": {"messages": [{"role": "user",' \
           b' "content": "hi"}], "scoring": {"queries": [' + _fill(QUERY, "") + b"]}}}\n"
    response = test_client.post("/v1/files", files={"file": ("in.jsonl", line)}, data={"purpose": "batch"})
    assert response.status_code == 200, response.text
    return response.json()["id"]


def _snapshot(r: redis.Redis) -> dict:
    return {key: r.dump(key) for key in sorted(r.keys("*"))}


def _post(test_client, path: str, body: bytes):
    return test_client.post(path, content=body, headers={"content-type": "application/json"})


def _assert_refused(response, r, before: dict, what: str) -> None:
    assert 400 <= response.status_code < 500, (what, response.status_code, response.text[:300])
    error = response.json()["error"]
    assert error["message"], what
    assert not (error["param"] or "").isdigit(), (what, error)  # a field, never a character offset
    assert _snapshot(r) == before, f"{what}: a refused request wrote to Redis"


def _cases(path: str):
    markers = [m for m in ("@S@", "@T@", "@O@") if m.encode() in BODIES[path]]
    for name, value in TEXT_CASES.items():
        for marker in markers:
            yield f"{name} in {marker}", {marker: value}, None
    for name, rewrite in WHOLE_BODY_CASES.items():
        yield name, {}, rewrite


@pytest.mark.parametrize("path", sorted(BODIES))
def test_the_corpus_is_refused_on_every_route(client, file_id, path):
    test_client, r = client
    control = _post(test_client, path, _fill(BODIES[path], file_id))
    assert control.status_code in (200, 201, 504), control.text  # 504: validated, queued, no worker here
    before = _snapshot(r)
    for name, markers, rewrite in _cases(path):
        if name.startswith("huge in @T@") or name.startswith("huge in @O@"):
            markers = {next(iter(markers)): b"y" * (LIMITS.max_template_chars + 1)}
        body = _fill(BODIES[path], file_id, **markers) if rewrite is None else rewrite(BODIES[path])
        if rewrite is not None:
            body = _fill(body, file_id)
        _assert_refused(_post(test_client, path, body), r, before, f"{path}: {name}")


def test_a_body_nested_too_deeply_to_parse_is_a_422_on_body(client, file_id):
    """Past the JSON parser's recursion limit: a 422 naming `body` and the nesting, not the
    generic 400 of a body that could not be read."""
    test_client, _ = client
    for path in sorted(BODIES):
        for body in (b"[" * 100_000 + b"]" * 100_000, _fill(BODIES[path], file_id).replace(
                b'"hello"', b"[" * 5_000 + b"]" * 5_000)):
            response = _post(test_client, path, body)
            assert response.status_code == 422, (path, response.status_code, response.text[:300])
            error = response.json()["error"]
            assert error["param"] == "body" and "nested too deeply" in error["message"], (path, error)


@pytest.mark.parametrize("path", sorted(JSON_BODIES))
def test_json_values_past_their_limits_are_refused(client, path):
    test_client, r = client
    control = _post(test_client, path, JSON_BODIES[path].replace(b"@J@", JSON_CONTROL))
    assert control.status_code in (200, 201, 504), control.text
    before = _snapshot(r)
    for name, value in JSON_CASES.items():
        response = _post(test_client, path, JSON_BODIES[path].replace(b"@J@", value))
        _assert_refused(response, r, before, f"{path}: {name}")
        assert response.json()["error"]["param"] in ("body", "input.0.content.0.data"), (name, response.text[:300])


def test_the_corpus_is_refused_on_files(client):
    test_client, r = client
    before = _snapshot(r)
    for name, value in TEXT_CASES.items():
        if b"\\u" in value:  # escapes mean nothing in a form field
            continue
        response = test_client.post("/v1/files", files={"file": ("in.jsonl", b"{}\n")}, data={"purpose": value})
        _assert_refused(response, r, before, f"/v1/files purpose: {name}")
    for name, rewrite in WHOLE_BODY_CASES.items():  # a JSON body where a multipart form belongs
        _assert_refused(_post(test_client, "/v1/files", rewrite(b'{"purpose": "batch"}')), r, before,
                        f"/v1/files: {name}")


def test_bad_lines_in_a_batch_file_are_error_lines_not_5xx(client):
    test_client, _ = client
    lines = [b'{"custom_id": "s", "method": "POST", "url": "/v1/score", "body": {"messages": [{"role": "user",'
             b' "content": "' + value + b'"}], "scoring": {"queries": [' + _fill(QUERY, "") + b"]}}}"
             for value in TEXT_CASES.values()]
    lines = [line.replace(b'"s"', f'"s{i}"'.encode()) for i, line in enumerate(lines)]
    upload = test_client.post("/v1/files", files={"file": ("bad.jsonl", b"\n".join(lines) + b"\n")},
                              data={"purpose": "batch"})
    assert upload.status_code == 200, upload.text
    created = test_client.post("/v1/batches", json={"input_file_id": upload.json()["id"], "endpoint": "/v1/score",
                                                    "completion_window": "24h"})
    assert created.status_code == 200, created.text
    batch = test_client.get(f"/v1/batches/{created.json()['id']}").json()
    for _ in range(100):
        if batch["status"] != "validating":
            break
        batch = test_client.get(f"/v1/batches/{created.json()['id']}").json()
    assert batch["status"] == "failed", batch  # every line is bad: nothing to score
    assert len(batch["errors"]["data"]) == len(lines), batch["errors"]


def test_invalid_utf8_is_named_by_its_byte_offset(client):
    """The 422 names the first byte that is not UTF-8 and where it sits, counted in bytes (the two-byte
    "é" before it counts twice), on the same body the control accepts."""
    test_client, r = client
    prefix = b'{"messages": [{"role": "user", "content": "caf\xc3\xa9 '
    suffix = b' ok"}], "scoring": {"queries": [' + _fill(QUERY, "") + b"]}}"
    assert _post(test_client, "/v1/score", prefix + b"x" + suffix).status_code in (200, 504)  # the control
    before = _snapshot(r)
    for bad, reason in ((b"\xff", "invalid start byte"), (b"\xc3(", "invalid continuation byte")):
        response = _post(test_client, "/v1/score", prefix + bad + suffix)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["param"] == "body"
        assert error["message"] == (f"body: not valid UTF-8: byte 0x{bad[:1].hex()} at byte offset {len(prefix)}"
                                    f" ({reason}); send UTF-8 text"), error
        assert _snapshot(r) == before

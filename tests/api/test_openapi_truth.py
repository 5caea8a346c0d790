"""/openapi.json against the app's behaviour, for the points Schemathesis found: a 405 lists
every method of its path, the closed sets are enums, a list's unknown cursor is a declared 404."""

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.line_endpoints import ENDPOINTS
from contract.payloads import JobCreate

pytestmark = pytest.mark.redis


@pytest.fixture
def client(make_settings):
    with TestClient(create_app(make_settings(default_model="m"))) as client:
        yield client


def test_a_405_allows_every_method_served_at_its_path(client, bearer):
    for path, allowed in [("/v1/jobs", "GET, POST"), ("/v1/files", "GET, POST"), ("/v1/batches", "GET, POST"),
                          ("/v1/files/file-x", "DELETE, GET"), ("/v1/jobs/job-x/cancel", "POST")]:
        response = client.request("PUT", path, headers=bearer("alice"))
        assert response.status_code == 405 and response.headers["allow"] == allowed, (path, response.headers)


def test_an_unknown_cursor_is_a_declared_404(client, bearer):
    spec = client.get("/openapi.json").json()
    for path in ("/v1/jobs", "/v1/files", "/v1/batches"):
        response = client.get(f"{path}?after=nope", headers=bearer("alice"))
        assert response.status_code == 404 and response.json()["error"]["param"] == "after", path
        assert "404" in spec["paths"][path]["get"]["responses"], path


def test_closed_sets_are_enums_and_limits_hold(client):
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    assert schemas["BatchCreate"]["properties"]["endpoint"]["enum"] == sorted(ENDPOINTS)
    packs = schemas["PackRef"]["properties"]["id"]["enum"]
    assert packs == client.app.state.packs.ids() and "spinf/moderation" in packs
    assert schemas["ScoringRequest"]["properties"]["packs"]["maxItems"] == len(packs)
    limit = next(p for p in spec["paths"]["/v1/files"]["get"]["parameters"] if p["name"] == "limit")
    assert limit["schema"]["maximum"] == 10_000  # the files route's own bound, not max_list_limit
    assert spec["paths"]["/v1/files/{file_id}/content"]["get"]["responses"]["200"]["content"] == {
        "application/octet-stream": {"schema": {"type": "string"}}}


def test_a_job_naming_a_pack_twice_is_refused():
    body = {"scoring": {"queries": []}, "packs": [{"id": "spinf/moderation"}] * 2,
            "items": [{"custom_id": "a", "text": "x"}]}
    with pytest.raises(ValueError, match="named more than once"):
        JobCreate.model_validate(body)


@pytest.mark.parametrize("workloads", [{}, {"support": 1.5, "triage": None}])
def test_every_workload_field_is_the_configured_set(make_settings, workloads):
    """/v1/decide's decisions and every /v1/decisions question type take `workload`: each is an
    enum of the configured workloads (or null), so a schema-valid request never names one the
    service refuses as unknown."""
    with TestClient(create_app(make_settings(default_model="m", workloads=workloads))) as client:
        schemas = client.get("/openapi.json").json()["components"]["schemas"]
    fields = {name: schema["properties"]["workload"] for name, schema in schemas.items()
              if "workload" in schema.get("properties", {})}
    assert {"DecideRequest", "DecisionSpec", "PredicateQuestion", "ChoiceQuestion", "ScoreQuestion"} <= set(fields)
    named = [{"enum": sorted(workloads)}] if workloads else []
    assert all(field["anyOf"] == [*named, {"type": "null"}] for field in fields.values()), fields


def test_an_uploaded_files_part_is_bytes_of_any_spelling(client):
    """Any bytes are a file (its lines are checked at batch creation), so the spec holds the part
    to the scalars a form part carries as text: a fuzzer's number sent there is a file of those
    bytes, not a schema-violating request; an object or list sends no part (refused: required)."""
    part = client.get("/openapi.json").json()["components"]["schemas"]["Body_upload_file_v1_files_post"]
    file = part["properties"]["file"]
    assert file["type"] == ["string", "number", "boolean"]  # a form part's text; no container sends anything
    assert file["contentMediaType"] == "application/octet-stream"
    assert part["required"] == ["file", "purpose"]


def test_a_file_sent_as_a_plain_form_field_is_stored_as_its_text(client, bearer):
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/score", "body": {}}\n'
    as_part = client.post("/v1/files", files={"file": ("in.jsonl", line)}, data={"purpose": "batch"},
                          headers=bearer("alice"))
    as_field = client.post("/v1/files", data={"file": line.decode(), "purpose": "batch"}, headers=bearer("alice"))
    assert (as_part.status_code, as_field.status_code) == (200, 200), (as_part.text, as_field.text)
    assert as_field.json()["bytes"] == as_part.json()["bytes"] == len(line)
    content = client.get(f"/v1/files/{as_field.json()['id']}/content", headers=bearer("alice"))
    assert content.content == line

"""Auth, ownership, S3 allow-lists, backpressure and body limits, on a real Redis (no worker)."""

import orjson
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from contract import queues

pytestmark = pytest.mark.redis

SCORING = {"queries": [{"id": "q", "template": "\n\nYes or no?{?}", "options": [" yes", " no"]}]}
JOB = {"model": "m", "scoring": SCORING, "items": [{"custom_id": "a", "text": "hello"}]}


@pytest.fixture
def client(make_settings):
    with TestClient(create_app(make_settings(default_model="m", max_queue=5, max_body_bytes=4096))) as c:
        yield c


def test_every_route_but_health_needs_a_key(client, bearer):
    health = client.get("/health")  # open; 503 here: no worker serves the default model "m"
    assert health.status_code == 503 and health.json()["problems"] == [
        "model 'm': no live worker (none checked in within worker_ttl_s=60 s)"]
    for method, path in [("get", "/v1/models"), ("get", "/metrics"), ("get", "/v1/jobs/job-x"),
                         ("post", "/v1/jobs"), ("post", "/v1/score"), ("post", "/v1/chat/completions")]:
        response = getattr(client, method)(path)
        assert response.status_code == 401, path
        assert response.headers["www-authenticate"] == "Bearer"
    assert client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/v1/models", headers=bearer("alice")).status_code == 200


def test_a_job_is_visible_only_to_its_key(client, bearer):
    created = client.post("/v1/jobs", json=JOB, headers=bearer("alice"))
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    assert client.get(f"/v1/jobs/{job_id}", headers=bearer("alice")).json()["status"] == "queued"
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/results"):
        assert client.get(path, headers=bearer("bob")).status_code == 404
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=bearer("bob")).status_code == 404
    assert client.get(f"/v1/jobs/{job_id}/results", headers=bearer("alice")).status_code == 409


def test_idempotency_key_returns_the_same_job(client, bearer):
    headers = bearer("alice") | {"Idempotency-Key": "submit-1"}
    first = client.post("/v1/jobs", json=JOB, headers=headers)
    again = client.post("/v1/jobs", json=JOB, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    documented = client.get("/openapi.json").json()["paths"]["/v1/jobs"]["post"]["responses"]
    assert {"200", "201"} <= set(documented)  # both answers are in the spec, with the job's schema
    assert documented["200"]["content"] == documented["201"]["content"]
    other_body = JOB | {"items": [{"custom_id": "b", "text": "bye"}]}
    assert client.post("/v1/jobs", json=other_body, headers=headers).status_code == 409
    # the same key string from another API key is another job
    assert client.post("/v1/jobs", json=JOB, headers=bearer("bob") | {"Idempotency-Key": "submit-1"}).json()["id"] \
        != first.json()["id"]


def test_s3_locations_outside_the_allow_list_are_403(client, bearer):
    body = {"model": "m", "scoring": SCORING, "input": {"s3": "s3://nobody/in/"}, "output": {"s3": "s3://nobody/o/"}}
    response = client.post("/v1/jobs", json=body, headers=bearer("bob"))
    assert response.status_code == 403 and response.json()["error"]["param"] == "input.s3"


def test_malformed_bodies_are_422_naming_the_field(client, bearer):
    cases = {
        "scoring.queries.0.options": {"queries": [{"id": "q", "template": "x{?}", "options": [" only"]}]},
        "scoring.queries.0": {"queries": [{"id": "q", "template": "x{?} tail", "options": ["a", "b"]}]},
        "scoring.queries.0.allow_empty": {"queries": [{"id": "q", "template": "Summary:{*}", "mode": "generate",
                                                       "allow_empty": "maybe"}]},
    }
    for field, scoring in cases.items():
        response = client.post("/v1/jobs", json=JOB | {"scoring": scoring}, headers=bearer("alice"))
        assert response.status_code == 422
        assert response.json()["error"]["param"].startswith(field), response.json()
    extract = {"queries": [{"id": "q", "template": 'A: "{*}"', "allow_empty": True}]}  # generate only
    response = client.post("/v1/score", json={"messages": [{"role": "user", "content": "hi"}], "scoring": extract},
                           headers=bearer("alice"))
    assert response.status_code == 422 and "allow_empty: only mode 'generate'" in response.text, response.text
    missing = client.post("/v1/score", json={"scoring": SCORING}, headers=bearer("alice"))
    assert missing.status_code == 422 and missing.json()["error"]["param"] == "messages"
    unknown = client.post("/v1/jobs", json=JOB | {"model": "nope"}, headers=bearer("alice"))
    assert unknown.status_code == 422 and unknown.json()["error"]["param"] == "model"


def test_flood_past_max_queue_gets_429_before_the_body_is_read(client, bearer):
    statuses = []
    for i in range(8):  # each job queues one row; max_queue is 5
        statuses.append(client.post("/v1/jobs", json=JOB, headers=bearer("alice")).status_code)
    assert statuses == [201] * 5 + [429] * 3
    refused = client.post("/v1/score", content=b"not even json", headers=bearer("alice"))
    assert refused.status_code == 429 and refused.headers["retry-after"] == "5"
    assert int(client.app.state.redis.get(queues.QUEUED_ROWS_KEY)) == 5


def test_large_bodies_are_413(client, bearer):
    big = JOB | {"items": [{"custom_id": str(i), "text": "x" * 100} for i in range(100)]}
    assert client.post("/v1/jobs", json=big, headers=bearer("alice")).status_code == 413

    def chunks():  # no Content-Length: counted while read
        yield orjson.dumps(big)[:3000]
        yield orjson.dumps(big)[3000:]

    response = client.post("/v1/jobs", content=chunks(), headers=bearer("alice") | {"content-type": "application/json"})
    assert response.status_code == 413


def test_health_and_metrics_report_queues(client, bearer):
    client.post("/v1/jobs", json=JOB, headers=bearer("alice"))
    health = client.get("/health").json()
    assert health["queues"]["m"]["batch"] == 1 and health["queued_rows"] == 1
    assert health["default_model"] == "m" and health["limits"]["max_queue"] == 5
    text = client.get("/metrics", headers=bearer("alice")).text
    assert 'spinf_queue_depth{queue="spinf:m:batch"} 1.0' in text
    assert "spinf_http_request_seconds_bucket" in text

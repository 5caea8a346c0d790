"""Tenant isolation on S3 and on ids, checked on the S3 server's side.

    key "bob": s3_read ["data/b"], s3_write ["out/b"]; the bucket also holds data/b-secret/,
    data/b-other.jsonl and data/bb/ (names that start with "b" but are not under "b/")
    POST /v1/jobs input s3://data/b | s3://data/b/ -> worker (plan, chunks, results, manifest)
      -> the results hold b/'s rows only, and the S3 server's own log (s3_audit) shows every
         listing was of a folder inside data/b/ and returned only keys inside it, every read
         inside data/b, every write inside out/b
    the listing of before (Prefix="b", no re-check of the listed keys) run through the same
    check: it flags the leak (so the check can fail)
    query strings, fragments, percent-encodings, '..' -> 422 naming the field; b-secret -> 403
    alice's job, file and batch ids asked for by bob -> 404; so is her labelled job's calibration report
"""

from __future__ import annotations

import time

import orjson
import pytest
import redis
from fastapi.testclient import TestClient

from api.app import create_app
from contract.payloads import ByteRange, ChunkPayload
from contract.protocol import ScoringSpec
from contract.s3_uri import S3Access, S3AccessDenied, S3Uri
from contract.settings import ApiKey, hash_api_key
from jobstore import chunks, lifecycle, records
from jobstore.s3 import list_keys, make_client
from reliability import s3_audit
from workers.loop import GreedyWorker

pytestmark = [pytest.mark.redis, pytest.mark.s3, pytest.mark.slow]

SCORING = {"queries": [{"id": "q", "template": "\n\nIs it about a refund?{?}", "options": [" yes", " no"]}]}
TOKENS = {"alice": "sk-iso-alice", "bob": "sk-iso-bob"}
READ, WRITE = ("data", "b"), ("out", "b")
OBJECTS = {
    "b/rows.jsonl": [{"custom_id": "b-1", "text": "refund please"}, {"custom_id": "b-2", "text": "thanks"}],
    "b/more/rows.jsonl": [{"custom_id": "b-3", "text": "where is my parcel"}],
    "b-secret/secret.jsonl": [{"custom_id": "SECRET", "text": "the secret row"}],
    "b-other.jsonl": [{"custom_id": "OTHER", "text": "another tenant"}],
    "bb/rows.jsonl": [{"custom_id": "BB", "text": "another tenant"}],
}
B_ROWS = {"b-1", "b-2", "b-3"}


@pytest.fixture(scope="module")
def weed(weed_factory):
    weed = weed_factory(verbose=True)
    client = weed.server.client()
    for bucket in ("data", "out"):
        client.create_bucket(Bucket=bucket)
    for key, rows in OBJECTS.items():
        client.put_object(Bucket="data", Key=key, Body=b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return weed


@pytest.fixture
def service(make_settings, weed, service_engine):
    keys = [ApiKey(name="alice", sha256=hash_api_key(TOKENS["alice"]), s3_read=["data"], s3_write=["out"]),
            ApiKey(name="bob", sha256=hash_api_key(TOKENS["bob"]), s3_read=["data/b"], s3_write=["out/b"])]
    settings = make_settings(api_keys=keys, s3_endpoint_url=weed.server.endpoint_url, s3_access_key_id="test",
                             s3_secret_access_key="test", files_s3="s3://out/files/", chunk_num_rows=2,
                             default_model=service_engine.model_name)
    worker = GreedyWorker(redis.Redis.from_url(settings.redis_url), {service_engine.model_name: service_engine},
                          settings, s3=make_client(settings), name="iso-worker")
    worker.publish()
    with TestClient(create_app(settings)) as api:
        yield api, worker, settings


def _headers(name: str) -> dict:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


def _run(api, worker, name: str, body: dict, timeout_s: float = 120) -> dict:
    created = api.post("/v1/jobs", json=body, headers=_headers(name))
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = api.get(f"/v1/jobs/{job_id}", headers=_headers(name)).json()
        if view["status"] in ("succeeded", "failed", "cancelled"):
            return view
        worker.maintain_if_due()
        worker.drain_once(block_s=1)
    raise AssertionError(f"job {job_id} did not end in {timeout_s}s: {view}")


def _result_ids(api, job_id: str, name: str) -> list[str]:
    response = api.get(f"/v1/jobs/{job_id}/results", headers=_headers(name))
    assert response.status_code == 200, response.text
    return [orjson.loads(line)["custom_id"] for line in response.content.splitlines()]


def _bobs_job(api, worker, weed, input_uri: str, run: str) -> tuple[dict, list[s3_audit.S3Request]]:
    offset = s3_audit.log_offset(weed.log)
    view = _run(api, worker, "bob", {"scoring": SCORING, "input": {"s3": input_uri},
                                     "output": {"s3": f"s3://out/b/{run}/"}})
    time.sleep(0.5)  # the server's last log lines
    return view, s3_audit.requests_since(weed.log, offset)


@pytest.mark.parametrize("input_uri", ["s3://data/b", "s3://data/b/"])
def test_a_grant_for_data_b_reads_nothing_of_b_secret(service, weed, input_uri):
    api, worker, _ = service
    view, requests = _bobs_job(api, worker, weed, input_uri, run=input_uri.rstrip("/")[-1] + "-run")
    assert view["status"] == "succeeded", view
    assert sorted(_result_ids(api, view["id"], "bob")) == sorted(B_ROWS)
    assert s3_audit.violations(requests, READ, WRITE) == []
    # the check saw the job's traffic: the folder listed, its objects read, the results written
    listings = [request for request in requests if request.method == "LIST"]
    assert [request.list_prefix for request in listings] == ["b/"]
    assert sorted(listings[0].listed) == ["b/more/rows.jsonl", "b/rows.jsonl"]
    assert {request.key for request in requests if request.method == "GET" and request.bucket == "data"} == \
        {"b/more/rows.jsonl", "b/rows.jsonl"}
    assert any(request.method == "PUT" and request.key.endswith("manifest.json") for request in requests)


def _listing_of_before(client, uri: S3Uri) -> list[str]:
    return list_keys(client, uri)  # Prefix="b": a string prefix, matching b-secret/ and b-other.jsonl


def test_the_listing_of_before_is_caught_by_the_same_check(service, weed, monkeypatch):
    """Revert the listing (Prefix="b"): the server-side check flags what was listed outside b/;
    the worker's re-check of each listed key still refuses to read it (the job fails, nothing read)."""
    api, worker, _ = service
    monkeypatch.setattr(lifecycle, "list_dataset_keys", _listing_of_before)
    view, requests = _bobs_job(api, worker, weed, "s3://data/b", run="before")
    problems = s3_audit.violations(requests, READ, WRITE)
    assert "LIST data prefix 'b': not a folder inside the read grant ('data', 'b')" in problems
    assert any("'b-secret/secret.jsonl'" in problem for problem in problems)
    assert view["status"] == "failed" and "outside this job's read grants" in view["error"]
    assert not any(request.method == "GET" and not request.key.startswith("b/") for request in requests)


def test_without_the_re_check_the_leak_reaches_the_results_and_the_check_sees_the_read(service, weed, monkeypatch):
    """Both fixes reverted (old listing, listed keys not re-checked): the secret row is in bob's
    results, and the server-side check names the read of b-secret."""
    api, worker, _ = service
    monkeypatch.setattr(lifecycle, "list_dataset_keys", _listing_of_before)
    monkeypatch.setattr(S3Access, "check_read", lambda self, uri: uri)
    view, requests = _bobs_job(api, worker, weed, "s3://data/b", run="no-recheck")
    assert "SECRET" in _result_ids(api, view["id"], "bob")
    problems = s3_audit.violations(requests, READ, WRITE)
    assert any(problem.startswith("GET data/b-secret/secret.jsonl: outside the read grant") for problem in problems)


def test_every_read_and_write_is_checked_in_the_worker(service, weed):
    """A chunk payload naming objects outside the job's grants (as a tampered or stale payload
    would): refused before any request is sent."""
    api, worker, settings = service
    access = S3Access.for_job("s3://data/b", "s3://out/b/run/", ["data/b"], ["out/b"])
    spec = {"model": "m", "scoring": ScoringSpec.model_validate(SCORING), "num_rows": 1}
    offset = s3_audit.log_offset(weed.log)
    outside_read = ChunkPayload(job_id="j", chunk_index=0, **spec, access=access, output="s3://out/b/run/",
                                source=ByteRange(uri="s3://data/b-secret/secret.jsonl", start=0, end=100, first_line=1))
    with pytest.raises(S3AccessDenied):
        chunks.read_rows(worker.s3, outside_read)
    outside_write = ChunkPayload(job_id="j", chunk_index=0, **spec, access=access, output="s3://out/b-secret/",
                                 source=ByteRange(uri="s3://data/b/rows.jsonl", start=0, end=100, first_line=1))
    rows = chunks.read_rows(worker.s3, outside_write)
    for slot in rows:
        slot.response = {"results": []}
    with pytest.raises(S3AccessDenied):
        chunks.write_rows(worker.connection, worker.s3, outside_write, rows)
    time.sleep(0.5)
    requests = s3_audit.requests_since(weed.log, offset)
    assert [(request.method, request.key) for request in requests] == [("GET", "b/rows.jsonl")]


@pytest.mark.parametrize(("field", "uri", "what"), [
    ("input", "s3://data/b/rows.jsonl?versionId=abc", "query string"),
    ("input", "s3://data/b/?x=1", "query string"),
    ("input", "s3://data/b/rows.jsonl#frag", "fragment"),
    ("input", "s3://data/b/%2e%2e/b-secret/", "percent-encoding"),
    ("input", "s3://data/b%2Fsecret", "percent-encoding"),
    ("input", "s3://data/b/../b-secret/", "'..'"),
    ("input", "s3://data/b/./x", "'.'"),
    ("input", "s3://data/b//x", "empty path segments"),
    ("output", "s3://out/b/run?acl", "query string"),
    ("output", "s3://out/b/../b-secret/", "'..'"),
])
def test_uris_with_queries_fragments_encodings_or_dot_segments_are_422s(service, field, uri, what):
    api, _, settings = service
    body = {"scoring": SCORING, "input": {"s3": "s3://data/b/"}, "output": {"s3": "s3://out/b/run/"}}
    body[field] = {"s3": uri}
    response = api.post("/v1/jobs", json=body, headers=_headers("bob"))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == f"{field}.s3" and what in error["message"], error
    assert api.get("/v1/jobs", headers=_headers("bob")).json()["data"] == []  # nothing was queued


OUTSIDE_BOBS_GRANT = {  # field -> URIs outside bob's grant: sharing its first letters, not a whole segment, or above it
    "input": ["s3://data/b-secret/", "s3://data/b-secret", "s3://data/bb/rows.jsonl", "s3://data/"],
    "output": ["s3://out/b-secret/", "s3://out/bb"],
}


@pytest.mark.parametrize(("field", "uri"), [(f, u) for f, uris in OUTSIDE_BOBS_GRANT.items() for u in uris])
def test_a_grant_covers_whole_segments_only_at_the_api(service, field, uri):
    api, _, _ = service
    body = {"scoring": SCORING, "input": {"s3": "s3://data/b/"}, "output": {"s3": "s3://out/b/run/"}}
    body[field] = {"s3": uri}
    response = api.post("/v1/jobs", json=body, headers=_headers("bob"))
    assert response.status_code == 403 and response.json()["error"]["param"] == f"{field}.s3", response.text


def test_another_keys_ids_are_404s(service):
    api, worker, _ = service
    job = api.post("/v1/jobs", json={"scoring": SCORING, "items": [{"custom_id": "a", "text": "hi"}]},
                   headers=_headers("alice")).json()
    lines = b'{"custom_id": "x", "body": {"messages": [{"role": "user", "content": "hi"}], "scoring": %s}}\n' % (
        orjson.dumps(SCORING))
    file = api.post("/v1/files", files={"file": ("in.jsonl", lines)}, data={"purpose": "batch"},
                    headers=_headers("alice"))
    assert file.status_code == 200, file.text
    batch = api.post("/v1/batches", json={"input_file_id": file.json()["id"], "endpoint": "/v1/score",
                                          "completion_window": "24h"}, headers=_headers("alice"))
    assert batch.status_code == 200, batch.text
    job_id, file_id, batch_id = job["id"], file.json()["id"], batch.json()["id"]
    calls = [("GET", f"/v1/jobs/{job_id}"), ("GET", f"/v1/jobs/{job_id}/results"),
             ("POST", f"/v1/jobs/{job_id}/cancel"), ("GET", f"/v1/files/{file_id}"),
             ("GET", f"/v1/files/{file_id}/content"), ("DELETE", f"/v1/files/{file_id}"),
             ("GET", f"/v1/batches/{batch_id}"), ("POST", f"/v1/batches/{batch_id}/cancel")]
    for method, path in calls:
        response = api.request(method, path, headers=_headers("bob"))
        assert response.status_code == 404, (method, path, response.text)
        assert job_id not in response.text or "no job" in response.text
    for method, path in calls[:1] + calls[3:5] + calls[6:7]:  # still there, and alice's
        assert api.request(method, path, headers=_headers("alice")).status_code == 200, path
    assert api.get("/v1/jobs", headers=_headers("bob")).json()["data"] == []
    assert records.load_view(worker.connection, job_id).status.value == "queued"  # bob's cancel did nothing


def test_another_keys_job_calibration_is_a_404(service):
    """GET /v1/jobs/{id}/calibration of a labelled job that has its report: 200 for its key, 404 for another."""
    api, worker, _ = service
    items = [{"custom_id": f"r{i}", "text": text, "labels": ["q"] if i % 2 == 0 else []}
             for i, text in enumerate(["refund please", "thanks", "I want my money back", "where is my parcel"])]
    view = _run(api, worker, "alice", {"scoring": SCORING, "items": items})
    assert view["status"] == "succeeded", view
    path = f"/v1/jobs/{view['id']}/calibration"
    own = api.get(path, headers=_headers("alice"))
    assert own.status_code == 200 and own.json(), own.text
    other = api.get(path, headers=_headers("bob"))
    assert other.status_code == 404, other.text
    assert other.json()["error"]["message"] == f"no job {view['id']!r}"  # as for an id that does not exist

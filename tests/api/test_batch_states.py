"""A batch that fails, and batch files kept on S3, through the API on a real Redis and S3 (no worker):
every body validated strictly into the openai 3.57 wheel's Batch / FileObject."""

import orjson
import pytest
from fastapi.testclient import TestClient
from openai.types import Batch, FileObject

from api import batch_steps
from api.app import create_app
from contract.batches import BatchCreate
from jobstore import batches
from jobstore.s3 import make_client

pytestmark = pytest.mark.redis

SCORING = {"queries": [{"id": "q", "template": "\n\nYes or no?{?}", "options": [" yes", " no"]}]}


def _line(custom_id: str, url: str = "/v1/score") -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url,
                         "body": {"messages": [{"role": "user", "content": f"hi {custom_id}"}], "scoring": SCORING}})


def _upload(client, headers, content: bytes) -> dict:
    response = client.post("/v1/files", headers=headers, files={"file": ("in.jsonl", content)},
                           data={"purpose": "batch"})
    assert response.status_code == 200, response.text
    return FileObject.model_validate(response.json(), strict=True).model_dump()


def _batch(client, headers, batch_id: str) -> Batch:
    return Batch.model_validate(client.get(f"/v1/batches/{batch_id}", headers=headers).json(), strict=True)


def _create(client, headers, file_id: str, **extra) -> Batch:
    response = client.post("/v1/batches", headers=headers, json={
        "input_file_id": file_id, "endpoint": "/v1/score", "completion_window": "24h", **extra})
    assert response.status_code == 200, response.text
    return Batch.model_validate(response.json(), strict=True)


@pytest.fixture
def client(make_settings):
    with TestClient(create_app(make_settings(default_model="m"))) as c:
        yield c


def test_a_batch_with_no_line_that_can_run_fails(client, bearer):
    alice = bearer("alice")
    lines = [_line(f"r{i}", url="/v1/chat/completions") for i in range(11)] + [b"{broken"]
    file_id = _upload(client, alice, b"\n".join(lines))["id"]
    expiry = {"anchor": "created_at", "seconds": 7200}
    batch = _batch(client, alice, _create(client, alice, file_id, output_expires_after=expiry).id)
    assert batch.status == "failed" and batch.failed_at is not None and batch.output_file_id is None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (12, 0, 12)
    shown = [(error.code, error.line) for error in batch.errors.data]
    assert shown == [("invalid_url", n) for n in range(1, 11)]  # the first ten
    error_file = FileObject.model_validate(client.get(f"/v1/files/{batch.error_file_id}", headers=alice).json(),
                                           strict=True)
    assert error_file.purpose == "batch_output" and error_file.expires_at - error_file.created_at in (7199, 7200)
    errors = [orjson.loads(line) for line in
              client.get(f"/v1/files/{batch.error_file_id}/content", headers=alice).content.splitlines()]
    assert [(row["custom_id"], row["error"]["code"]) for row in errors] == (
        [(f"r{i}", "invalid_url") for i in range(11)] + [(None, "invalid_json")])
    assert client.get("/v1/jobs", headers=alice).json()["data"] == []  # nothing queued
    on_output = client.post("/v1/batches", headers=alice, json={"input_file_id": batch.error_file_id,
                                                                "endpoint": "/v1/score", "completion_window": "24h"})
    assert on_output.status_code == 422 and on_output.json()["error"]["param"] == "input_file_id"
    assert "'batch_output'" in on_output.json()["error"]["message"]  # an output file is not batch input


def test_an_input_file_gone_before_validation_fails_the_batch(client, bearer):
    """The batch was made and its API process died before validating; the file was deleted meanwhile:
    the next read validates and ends it failed, `file_not_found`, counts 0."""
    alice = bearer("alice")
    file_id = _upload(client, alice, _line("a"))["id"]
    record = batches.create_batch(client.app.state.redis, "alice",
                                  BatchCreate(input_file_id=file_id, endpoint="/v1/score", completion_window="24h"), 1)
    assert client.delete(f"/v1/files/{file_id}", headers=alice).status_code == 200
    client.get(f"/v1/batches/{record.id}", headers=alice)  # starts the validation
    batch = _batch(client, alice, record.id)
    assert batch.status == "failed" and [e.code for e in batch.errors.data] == ["file_not_found"]
    assert batch.errors.data[0].param == "input_file_id"
    assert (batch.request_counts.completed, batch.request_counts.failed) == (0, 0)


@pytest.mark.s3
def test_a_large_upload_lives_on_s3_and_a_batch_reads_it(make_settings, s3_server, s3_bucket, bearer):
    settings = make_settings(s3_bucket=s3_bucket, default_model="m", files_s3=f"s3://{s3_bucket}/files/",
                             file_redis_max_bytes=200)
    content = b"\n".join(_line(f"r{i}") for i in range(40)) + b"\n"
    with TestClient(create_app(settings)) as client:
        alice = bearer("alice")
        uploaded = _upload(client, alice, content)
        s3 = make_client(settings)
        key = f"files/{uploaded['id']}"
        assert s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read() == content  # on S3, not in Redis
        assert not client.app.state.redis.exists(f"spinf:file:{uploaded['id']}:bytes")
        assert client.get(f"/v1/files/{uploaded['id']}/content", headers=alice).content == content
        small = _upload(client, alice, _line("s"))  # at most file_redis_max_bytes: Redis
        with pytest.raises(s3.exceptions.ClientError):
            s3.head_object(Bucket=s3_bucket, Key=f"files/{small['id']}")
        batch = _batch(client, alice, _create(client, alice, uploaded["id"]).id)
        assert batch.status == "in_progress" and batch.request_counts.total == 40  # validated from S3
        job = client.get(f"/v1/jobs/{batch.id.replace('batch_', 'job-')}", headers=alice).json()
        assert job["progress"]["total"] == 40
        assert client.delete(f"/v1/files/{uploaded['id']}", headers=alice).status_code == 200
        with pytest.raises(s3.exceptions.ClientError):
            s3.head_object(Bucket=s3_bucket, Key=key)


def test_one_model_per_batch(make_settings, bearer):
    """The first valid line's model is the batch's; another served model is `model_mismatch`, one not
    served `model_not_found`, each naming body.model."""
    with TestClient(create_app(make_settings(default_model="m", models=["m2"]))) as client:
        alice = bearer("alice")
        bodies = [{"model": "m2"}, {}, {"model": "m2"}, {"model": "nope"}]
        lines = [orjson.loads(_line(f"r{i}")) for i in range(4)]
        content = b"\n".join(orjson.dumps(line | {"body": line["body"] | extra}) for line, extra in zip(lines, bodies))
        batch = _batch(client, alice, _create(client, alice, _upload(client, alice, content)["id"]).id)
        assert batch.status == "in_progress" and batch.model == "m2" and batch.request_counts.failed == 2
        job = client.get(f"/v1/jobs/{batch.id.replace('batch_', 'job-')}", headers=alice).json()
        assert job["model"] == "m2" and job["progress"]["total"] == 2
        assert [j["id"] for j in client.get("/v1/jobs", headers=alice).json()["data"]] == [job["id"]]  # listed
        client.post(f"/v1/batches/{batch.id}/cancel", headers=alice)
        batch = _batch(client, alice, batch.id)
        errors = [orjson.loads(line) for line in
                  client.get(f"/v1/files/{batch.error_file_id}/content", headers=alice).content.splitlines()]
        refused = [(row["custom_id"], row["error"]["code"], row["error"]["param"]) for row in errors
                   if row["error"]["code"] != "batch_cancelled"]
        assert refused == [("r1", "model_mismatch", "body.model"), ("r3", "model_not_found", "body.model")]


def _nested(line: dict, levels: int) -> bytes:
    """The line's JSON with its "@DEEP@" string replaced by lists nested `levels` deep (past what
    orjson writes, so built as text)."""
    return orjson.dumps(line).replace(b'"@DEEP@"', b"[" * levels + b"]" * levels)


def _error_lines(client, headers, batch: Batch) -> dict[str | None, dict]:
    content = client.get(f"/v1/files/{batch.error_file_id}/content", headers=headers).content
    return {row["custom_id"]: row["error"] for row in map(orjson.loads, content.splitlines())}


def test_a_line_nested_too_deeply_is_an_error_line_for_its_custom_id(client, bearer):
    """Bodies nested past orjson's 255 levels (the shared scoring spec's key) and near its 1,024
    (what a line may hold): each an `invalid_body` line naming its custom_id; the batch runs the rest."""
    alice = bearer("alice")
    good = orjson.loads(_line("ok"))
    deep_spec = good | {"custom_id": "deep-spec", "body": good["body"] | {"scoring": SCORING | {"x": "@DEEP@"}}}
    deep_content = good | {"custom_id": "deep-content",
                           "body": good["body"] | {"messages": [{"role": "user", "content": "@DEEP@"}]}}
    content = b"\n".join([_line("ok"), _nested(deep_spec, 300), _nested(deep_content, 1000)])
    batch = _batch(client, alice, _create(client, alice, _upload(client, alice, content)["id"]).id)
    assert batch.status == "in_progress" and batch.request_counts.failed == 2, batch
    client.post(f"/v1/batches/{batch.id}/cancel", headers=alice)
    errors = _error_lines(client, alice, _batch(client, alice, batch.id))
    assert errors["deep-spec"]["code"] == errors["deep-content"]["code"] == "invalid_body", errors
    assert errors["deep-spec"]["param"] == "body.scoring.x"
    assert errors["deep-content"]["param"].startswith("body.messages.0.content")


def test_a_decisions_line_with_input_json_nested_too_deeply_is_an_error_line(client, bearer):
    alice = bearer("alice")
    question = [{"type": "predicate", "instructions": "Is it late?"}]
    lines = [{"custom_id": name, "method": "POST", "url": "/v1/decisions",
              "body": {"model": "m", "questions": question,
                       "input": [{"role": "user", "content": [{"type": "input_json", "data": data}]}]}}
             for name, data in (("ok", {"order": 1}), ("deep", {"a": "@DEEP@"}))]
    file_id = _upload(client, alice, b"\n".join(_nested(line, 1000) for line in lines))["id"]
    batch = _batch(client, alice, _create(client, alice, file_id, endpoint="/v1/decisions").id)
    assert batch.status == "in_progress" and batch.request_counts.failed == 1, batch
    client.post(f"/v1/batches/{batch.id}/cancel", headers=alice)
    error = _error_lines(client, alice, _batch(client, alice, batch.id))["deep"]
    assert (error["code"], error["param"]) == ("invalid_body", "body.input.0.content.0.data"), error
    assert "32 levels" in error["message"]


def test_a_step_that_raises_ends_the_batch_failed_with_the_error(client, bearer, monkeypatch):
    """An error no check foresaw (here, injected into the submit and then into the file writer):
    the batch ends failed, naming it, instead of staying validating (or cancelling) for ever."""
    alice = bearer("alice")

    def broken(*args, **kwargs):
        raise RuntimeError("injected fault")

    with monkeypatch.context() as patch:
        patch.setattr(batch_steps, "submit_requests", broken)
        batch = _batch(client, alice, _create(client, alice, _upload(client, alice, _line("a"))["id"]).id)
    assert batch.status == "failed" and batch.failed_at is not None, batch
    assert [e.code for e in batch.errors.data] == ["validation_failed"]
    assert "RuntimeError: injected fault" in batch.errors.data[0].message

    running = _batch(client, alice, _create(client, alice, _upload(client, alice, _line("b"))["id"]).id)
    assert running.status == "in_progress"
    monkeypatch.setattr(batch_steps, "write_outputs", broken)
    client.post(f"/v1/batches/{running.id}/cancel", headers=alice)  # its rows settle; finalizing raises
    batch = _batch(client, alice, running.id)
    assert batch.status == "failed" and [e.code for e in batch.errors.data] == ["finalization_failed"], batch
    assert client.get(f"/v1/jobs/{running.id.replace('batch_', 'job-')}", headers=alice).json()["status"] == "cancelled"

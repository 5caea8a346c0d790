"""The documented limits of files and batches (docs/batches.md, "Limits"), on a real Redis (no worker):
OpenAI's 50,000 requests and 200 MiB by default; past a limit, a 4xx that names it, before anything is
stored or queued."""

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.middleware import MULTIPART_OVERHEAD_BYTES
from contract import queues
from contract.settings import Settings

pytestmark = pytest.mark.redis

SCORING = {"queries": [{"id": "q", "template": "\n\nYes or no?{?}", "options": [" yes", " no"]}]}
OPENAI_MAX_REQUESTS = 50_000  # openai 3.57 batch_create_params.py: "up to 50,000 requests ... up to 200 MB"
OPENAI_MAX_BYTES = 200 * 1024 * 1024


def _line(i: int) -> bytes:
    return orjson.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/score",
                         "body": {"messages": [{"role": "user", "content": f"hi {i}"}], "scoring": SCORING}})


def _upload(client, headers, content: bytes):
    return client.post("/v1/files", headers=headers, files={"file": ("in.jsonl", content)}, data={"purpose": "batch"})


def _create(client, headers, file_id: str):
    return client.post("/v1/batches", headers=headers,
                       json={"input_file_id": file_id, "endpoint": "/v1/score", "completion_window": "24h"})


def _stored_files(client) -> int:
    """File records in Redis (their byte strings are `...:bytes`)."""
    keys = client.app.state.redis.scan_iter(match=queues.file_key("*"))
    return sum(1 for key in keys if not key.endswith(b":bytes"))


def test_the_defaults_are_at_least_openais():
    defaults = Settings(redis_url="redis://127.0.0.1:1/0")
    assert defaults.max_batch_lines >= OPENAI_MAX_REQUESTS and defaults.max_file_bytes >= OPENAI_MAX_BYTES


def test_an_upload_past_max_file_bytes_is_a_413_naming_the_limit(make_settings, bearer):
    limit = 4096
    with TestClient(create_app(make_settings(default_model="m", max_file_bytes=limit))) as client:
        alice = bearer("alice")
        at_limit = _upload(client, alice, b"x" * limit)
        assert at_limit.status_code == 200 and at_limit.json()["bytes"] == limit
        for size in (limit + 1, limit + MULTIPART_OVERHEAD_BYTES + 1):  # the route's check, the middleware's
            refused = _upload(client, alice, b"x" * size)
            assert refused.status_code == 413, (size, refused.text)
            error = refused.json()["error"]
            assert f"the limit is {limit} bytes" in error["message"] and "SPINF_MAX_FILE_BYTES" in error["message"]
            assert error["param"] == "file"
        # no Content-Length (chunked): counted as it arrives, the same 413
        framed = httpx.Request("POST", "http://x/v1/files", files={"file": ("in.jsonl", b"x" * (limit * 20))},
                               data={"purpose": "batch"})
        body = framed.read()
        streamed = client.post("/v1/files", content=(body[i:i + 1024] for i in range(0, len(body), 1024)),
                               headers=alice | {"content-type": framed.headers["content-type"]})
        assert streamed.status_code == 413, streamed.text
        assert "larger than" in streamed.json()["error"]["message"]  # counted, not read from a header
        assert "SPINF_MAX_FILE_BYTES" in streamed.json()["error"]["message"]
        assert streamed.json()["error"]["param"] == "file"
        assert _stored_files(client) == 1  # only the file at the limit


def test_a_batch_past_max_batch_lines_is_a_422_naming_the_limit(make_settings, bearer):
    with TestClient(create_app(make_settings(default_model="m", max_batch_lines=5))) as client:
        alice = bearer("alice")
        five = _upload(client, alice, b"\n".join(_line(i) for i in range(5)) + b"\n\n").json()["id"]
        six = _upload(client, alice, b"\n".join(_line(i) for i in range(6))).json()["id"]
        refused = _create(client, alice, six)
        assert refused.status_code == 422
        error = refused.json()["error"]
        assert error["param"] == "input_file_id" and "6 requests" in error["message"]
        assert "1 to 5" in error["message"] and "SPINF_MAX_BATCH_LINES" in error["message"]
        assert client.get("/v1/batches", headers=alice).json()["data"] == []  # nothing made
        assert _create(client, alice, five).json()["status"] == "validating"  # blank lines are not requests


@pytest.mark.slow
def test_openais_largest_batch_is_taken_with_the_defaults(make_settings, bearer):
    """50,000 requests: uploaded, validated into one job of 50,000 rows; one more is refused."""
    settings = make_settings(default_model="m")
    assert settings.max_batch_lines == OPENAI_MAX_REQUESTS
    lines = [_line(i) for i in range(OPENAI_MAX_REQUESTS + 1)]
    with TestClient(create_app(settings)) as client:
        alice = bearer("alice")
        over = _upload(client, alice, b"\n".join(lines)).json()["id"]
        assert _create(client, alice, over).status_code == 422
        full = _upload(client, alice, b"\n".join(lines[:-1]))
        assert full.status_code == 200, full.text
        created = _create(client, alice, full.json()["id"])
        assert created.status_code == 200, created.text
        batch = client.get(f"/v1/batches/{created.json()['id']}", headers=alice).json()  # validated by now
        assert batch["status"] == "in_progress", batch
        assert batch["request_counts"] == {"total": OPENAI_MAX_REQUESTS, "completed": 0, "failed": 0}
        job = client.get(f"/v1/jobs/{batch['id'].replace('batch_', 'job-')}", headers=alice).json()
        assert job["progress"]["total"] == OPENAI_MAX_REQUESTS


def test_a_full_queue_refuses_a_batch_with_429_and_retry_after(make_settings, bearer):
    """POST /v1/batches queues rows: past max_queue it is a 429 + Retry-After, before any batch is made;
    uploads and reads still answer."""
    with TestClient(create_app(make_settings(default_model="m", max_queue=10, retry_after_s=7))) as client:
        alice = bearer("alice")
        file_id = _upload(client, alice, _line(0)).json()["id"]
        client.app.state.redis.set(queues.QUEUED_ROWS_KEY, 10)
        refused = _create(client, alice, file_id)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "7"
        assert "limit 10" in refused.json()["error"]["message"]
        assert _upload(client, alice, _line(1)).status_code == 200
        assert client.get("/v1/batches", headers=alice).json()["data"] == []
        client.app.state.redis.set(queues.QUEUED_ROWS_KEY, 9)
        assert _create(client, alice, file_id).status_code == 200

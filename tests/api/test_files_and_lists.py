"""Files, batch creation refusals and GET /v1/jobs on a real Redis (no worker): 4xx before anything is queued."""

import orjson
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from contract import queues

pytestmark = pytest.mark.redis

SCORING = {"queries": [{"id": "q", "template": "\n\nYes or no?{?}", "options": [" yes", " no"]}]}
LINE = orjson.dumps({"custom_id": "a", "method": "POST", "url": "/v1/score",
                     "body": {"messages": [{"role": "user", "content": "hi"}], "scoring": SCORING}})


@pytest.fixture
def client(make_settings):
    settings = make_settings(default_model="m", max_file_bytes=2048, max_batch_lines=3, max_list_limit=50)
    with TestClient(create_app(settings)) as c:
        yield c


def _upload(client, headers, content: bytes, purpose: str = "batch", **form):
    return client.post("/v1/files", headers=headers, files={"file": ("in.jsonl", content)},
                       data={"purpose": purpose, **form})


def test_uploads_are_checked(client, bearer):
    alice = bearer("alice")
    assert _upload(client, alice, LINE, purpose="fine-tune").json()["error"]["param"] == "purpose"
    too_big = _upload(client, alice, b"x" * 200_000)
    assert too_big.status_code == 413
    bad_expiry = _upload(client, alice, LINE, **{"expires_after[anchor]": "created_at", "expires_after[seconds]": "5"})
    assert bad_expiry.status_code == 422 and bad_expiry.json()["error"]["param"] == "expires_after.seconds"
    made = _upload(client, alice, LINE, **{"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"})
    assert made.status_code == 200 and made.json()["expires_at"] - made.json()["created_at"] in (3599, 3600, 3601)
    file_id = made.json()["id"]
    assert client.get(f"/v1/files/{file_id}/content", headers=alice).content == LINE
    assert client.get(f"/v1/files/{file_id}", headers=bearer("bob")).status_code == 404
    assert client.delete(f"/v1/files/{file_id}", headers=alice).json() == {"id": file_id, "deleted": True,
                                                                            "object": "file"}
    assert client.get(f"/v1/files/{file_id}", headers=alice).status_code == 404


def test_batch_creation_refusals_name_the_field(client, bearer):
    alice = bearer("alice")
    good = _upload(client, alice, LINE).json()["id"]
    empty = _upload(client, alice, b"\n\n").json()["id"]
    four = _upload(client, alice, b"\n".join([LINE] * 4)).json()["id"]
    cases = [
        ({"input_file_id": good, "endpoint": "/v1/embeddings", "completion_window": "24h"}, "endpoint"),
        ({"input_file_id": good, "endpoint": "/v1/score", "completion_window": "1h"}, "completion_window"),
        ({"input_file_id": empty, "endpoint": "/v1/score", "completion_window": "24h"}, "input_file_id"),
        ({"input_file_id": four, "endpoint": "/v1/score", "completion_window": "24h"}, "input_file_id"),
        ({"input_file_id": good, "endpoint": "/v1/score", "completion_window": "24h",
          "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ]
    for body, param in cases:
        response = client.post("/v1/batches", json=body, headers=alice)
        assert response.status_code == 422 and response.json()["error"]["param"] == param, response.json()
    unknown = client.post("/v1/batches", json=cases[0][0] | {"endpoint": "/v1/score", "input_file_id": "file-nope"},
                          headers=alice)
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "input_file_id"
    bobs = client.post("/v1/batches", json=cases[0][0] | {"endpoint": "/v1/score"}, headers=bearer("bob"))
    assert bobs.status_code == 404 and bobs.json()["error"]["param"] == "input_file_id"  # alice's file
    assert client.get("/v1/batches", headers=alice).json()["data"] == []
    assert client.get("/v1/batches?limit=51", headers=alice).json()["error"]["param"] == "limit"


def test_get_jobs_lists_the_callers_jobs_paged(client, bearer):
    alice = bearer("alice")
    job = {"model": "m", "scoring": SCORING, "items": [{"custom_id": "a", "text": "hello"}]}
    made = [client.post("/v1/jobs", json=job, headers=alice).json()["id"] for _ in range(5)]
    client.post("/v1/jobs", json=job, headers=bearer("bob"))
    first = client.get("/v1/jobs?limit=2", headers=alice).json()
    assert [j["id"] for j in first["data"]] == made[:-3:-1] and first["has_more"] and first["object"] == "list"
    seen = [j["id"] for j in first["data"]]
    after = first["last_id"]
    while True:
        page = client.get(f"/v1/jobs?limit=2&after={after}", headers=alice).json()
        seen += [j["id"] for j in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert seen == made[::-1]
    client.app.state.redis.delete(queues.job_key(made[0]))  # expired
    assert [j["id"] for j in client.get("/v1/jobs", headers=alice).json()["data"]] == made[:0:-1]
    unknown_cursor = client.get("/v1/jobs?after=job-nope", headers=alice)
    assert unknown_cursor.status_code == 404 and unknown_cursor.json()["error"]["param"] == "after"
    too_many = client.get("/v1/jobs?limit=51", headers=alice)  # max_list_limit=50
    assert too_many.status_code == 422 and too_many.json()["error"]["param"] == "limit"
    assert len(client.get("/v1/jobs?limit=50", headers=alice).json()["data"]) == 4
    assert len(client.get("/v1/jobs", headers=bearer("bob")).json()["data"]) == 1


def test_a_batch_past_its_window_expires_with_every_row_an_error_line(client, bearer):
    """No worker serves model m: the batch's job waits; a read past expires_at cancels it and
    the batch ends expired, every valid row an error line `batch_expired`, each custom_id once."""
    alice = bearer("alice")
    lines = [LINE, LINE.replace(b'"a"', b'"b"', 1), b"{broken"]
    file_id = _upload(client, alice, b"\n".join(lines)).json()["id"]
    created = client.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/score",
                                               "completion_window": "24h"}, headers=alice).json()
    assert created["status"] == "validating" and created["expires_at"] == created["created_at"] + 24 * 3600
    batch = client.get(f"/v1/batches/{created['id']}", headers=alice).json()
    assert batch["status"] == "in_progress" and batch["request_counts"] == {"total": 3, "completed": 0, "failed": 1}
    client.app.state.redis.hset(queues.batch_key(created["id"]), "expires_at", 1)
    client.get(f"/v1/batches/{created['id']}", headers=alice)  # cancels the job, then finalizes
    batch = client.get(f"/v1/batches/{created['id']}", headers=alice).json()
    assert batch["status"] == "expired" and batch["expired_at"] and "output_file_id" not in batch
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    errors = [orjson.loads(line) for line in
              client.get(f"/v1/files/{batch['error_file_id']}/content", headers=alice).content.splitlines()]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        ("a", "batch_expired"), ("b", "batch_expired"), (None, "invalid_json")]
    job = client.get(f"/v1/jobs/{batch['id'].replace('batch_', 'job-')}", headers=alice).json()
    assert job["status"] == "cancelled"


def test_lines_sharing_a_spec_and_a_bad_spec(client, bearer):
    """Lines with the same scoring spec share one validated spec; a bad spec still names its field."""
    alice = bearer("alice")
    bad = {"queries": [{"id": "q", "template": "x{?}", "options": [" only"]}]}
    lines = [LINE, LINE.replace(b'"a"', b'"b"', 1),
             orjson.dumps({"custom_id": "c", "method": "POST", "url": "/v1/score",
                           "body": {"messages": [{"role": "user", "content": "hi"}], "scoring": bad}})]
    file_id = _upload(client, alice, b"\n".join(lines)).json()["id"]
    batch_id = client.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/score",
                                                "completion_window": "24h"}, headers=alice).json()["id"]
    r = client.app.state.redis
    [refused] = [orjson.loads(v) for v in r.hgetall(queues.batch_invalid_key(batch_id)).values()]
    assert refused["custom_id"] == "c" and refused["error"]["param"] == "body.scoring.queries.0.options"
    assert refused["error"]["message"].startswith("give at least 2 options")
    assert client.get(f"/v1/batches/{batch_id}", headers=alice).json()["request_counts"]["failed"] == 1

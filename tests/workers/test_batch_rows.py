"""A batch's rows are job rows like any other: one greedy worker scores them in the same passes as
another job's rows, with the same scores as that job's rows."""

import io

import orjson
import pytest
import redis
from fastapi.testclient import TestClient
from worker_helpers import SCORING, make_worker

from api.app import create_app
from contract import queues

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_batch_rows_pack_into_passes_with_another_job(make_settings, service_engine, bearer):
    settings = make_settings(default_model=service_engine.model_name)
    r = redis.Redis.from_url(settings.redis_url)
    texts = [f"Customer {i}: please refund order {i}." for i in range(3)]
    lines = [orjson.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/score",
                           "body": {"messages": [{"role": "user", "content": t}], "scoring": SCORING}})
             for i, t in enumerate(texts)]
    with TestClient(create_app(settings)) as client:
        alice = bearer("alice")
        file_id = client.post("/v1/files", headers=alice, files={"file": ("b.jsonl", io.BytesIO(b"\n".join(lines)))},
                              data={"purpose": "batch"}).json()["id"]
        batch_id = client.post("/v1/batches", headers=alice, json={"input_file_id": file_id, "endpoint": "/v1/score",
                                                                   "completion_window": "24h"}).json()["id"]
        assert client.get(f"/v1/batches/{batch_id}", headers=alice).json()["status"] == "in_progress"
        items = [{"custom_id": f"j{i}", "text": t} for i, t in enumerate(texts)]
        job_id = client.post("/v1/jobs", headers=alice, json={"scoring": SCORING, "items": items}).json()["id"]

        worker = make_worker(settings, service_engine)
        assert worker.drain_once(block_s=1)  # one greedy batch: both jobs' chunks
        batch_job = "job-" + batch_id.removeprefix("batch_")
        shared = r.smembers(queues.passes_key(batch_job)) & r.smembers(queues.passes_key(job_id))
        assert shared, "the batch's rows and the job's rows were not in one pass"

        client.get(f"/v1/batches/{batch_id}", headers=alice)  # finalizes
        batch = client.get(f"/v1/batches/{batch_id}", headers=alice).json()
        assert batch["status"] == "completed" and batch["request_counts"]["completed"] == 3
        output = client.get(f"/v1/files/{batch['output_file_id']}/content", headers=alice).content.splitlines()
        job_rows = client.get(f"/v1/jobs/{job_id}/results", headers=alice).content.splitlines()
        for line, row in zip(output, job_rows, strict=True):
            assert orjson.loads(line)["response"]["body"]["results"] == orjson.loads(row)["response"]["results"]

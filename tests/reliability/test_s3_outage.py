"""S3 goes away in the middle of a dataset job: the job still ends, every row is accounted
for, and the worker lives on to serve the next job.

    embedded service (API + worker thread, a slowed tiny engine: one 2-row chunk at a time)
    dataset job of 6 rows (3 chunks) on a SeaweedFS of this module's own
      -> chunk 0 settled -> SeaweedFS killed -> the next chunks' reads or writes fail after
         the client's retries (SPINF_S3_MAX_ATTEMPTS) -> their rows settle as error rows naming
         the S3 failure (kept in Redis) -> the manifest cannot be written -> job failed, 6 of 6
         rows counted
      -> the worker thread is alive, never restarted, and an inline job succeeds
      -> GET /results while SeaweedFS is down: 503 + Retry-After
      -> SeaweedFS back: GET /results has exactly one row per input row
"""

from __future__ import annotations

import time

import httpx
import orjson
import pytest

from contract.settings import ApiKey, hash_api_key

pytestmark = [pytest.mark.redis, pytest.mark.s3, pytest.mark.slow]

SCORING = {"queries": [{"id": "q", "template": "\n\nIs it about a refund?{?}", "options": [" yes", " no"]}]}
HEADERS = {"Authorization": "Bearer sk-outage"}
NUM_ROWS = 6


def _wait_for(client: httpx.Client, job_id: str, done, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = client.get(f"/v1/jobs/{job_id}").json()
        if done(view):
            return view
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not get there in {timeout_s}s: {view}")


def test_a_dataset_job_ends_when_s3_dies_mid_job_and_the_worker_serves_the_next(
        weed_factory, make_settings, live_service, slow_engine):
    weed = weed_factory()
    s3 = weed.server.client()
    for bucket in ("data", "out"):
        s3.create_bucket(Bucket=bucket)
    rows = [{"custom_id": f"r{i}", "text": f"Order {i}: please refund it."} for i in range(NUM_ROWS)]
    s3.put_object(Bucket="data", Key="in/rows.jsonl", Body=b"".join(orjson.dumps(row) + b"\n" for row in rows))
    engine = slow_engine(1.0)
    key = ApiKey(name="ops", sha256=hash_api_key("sk-outage"), s3_read=["data/in"], s3_write=["out/run"])
    settings = make_settings(api_keys=[key], s3_endpoint_url=weed.server.endpoint_url, s3_access_key_id="test",
                             s3_secret_access_key="test", chunk_num_rows=2, s3_max_attempts=2, max_num_retries=1,
                             default_model=engine.model_name)
    service = live_service(settings, engine)
    with httpx.Client(base_url=service.base_url, headers=HEADERS, timeout=30) as client:
        body = {"scoring": SCORING, "input": {"s3": "s3://data/in/"}, "output": {"s3": "s3://out/run/"}}
        job_id = client.post("/v1/jobs", json=body).raise_for_status().json()["id"]
        _wait_for(client, job_id, lambda view: view["progress"]["done"] >= 2, 120)
        weed.stop()  # S3 is gone mid-job

        view = _wait_for(client, job_id, lambda view: view["status"] not in ("queued", "running"), 240)
        assert view["status"] == "failed" and "S3" in view["error"], view
        assert view["progress"]["total"] == view["progress"]["done"] == NUM_ROWS
        assert view["progress"]["failed"] >= 2, view  # the chunks after the outage
        assert service.worker_alive() and service.worker_thread.num_restarts == 0

        inline = {"scoring": SCORING, "items": rows[:2]}
        next_id = client.post("/v1/jobs", json=inline).raise_for_status().json()["id"]
        next_view = _wait_for(client, next_id, lambda view: view["status"] not in ("queued", "running"), 120)
        assert next_view["status"] == "succeeded" and next_view["progress"]["failed"] == 0

        unreadable = client.get(f"/v1/jobs/{job_id}/results")  # chunk 0 is on S3, which is down
        assert unreadable.status_code == 503 and unreadable.headers["Retry-After"] == str(settings.retry_after_s)
        assert "S3" in unreadable.json()["error"]["message"]

        weed.start()  # back, same data: the rows written before the outage are there
        deadline = time.monotonic() + 60  # a store just started may answer 500 for a moment: a 503 to retry
        while (back := client.get(f"/v1/jobs/{job_id}/results")).status_code == 503 and time.monotonic() < deadline:
            time.sleep(1)
        assert back.status_code == 200, back.text
        results = [orjson.loads(line) for line in back.content.splitlines()]
    assert len(results) == NUM_ROWS
    scored = [row["custom_id"] for row in results if "response" in row]
    failed = [row for row in results if "error" in row]
    assert len(failed) == view["progress"]["failed"] and len(scored) == NUM_ROWS - len(failed)
    assert set(scored) <= {row["custom_id"] for row in rows} and len(set(scored)) == len(scored)
    named = {row["custom_id"] for row in failed if row["custom_id"] is not None}
    assert not named & set(scored)  # no row both scored and failed
    for row in failed:  # each names the S3 failure
        message = row["error"]["message"]
        assert "writing the results to s3://out/run/ failed" in message or "reading its input failed" in message, row

"""The API's S3 reads on a real S3: a job's results and calibration report are read back only
inside its own output (S3Access.check_read_back, as every worker call is checked), and an S3
call that fails on a route is a 503 + Retry-After in the error shape, never a 500.

    dataset job planned and settled through the job store (no engine) -> GET /results 200
      record's `output` pointed elsewhere (a tampered or stale record) -> 403 for results and
      calibration, and the job's calibration step refuses the read: nothing outside is read
    a SeaweedFS of this module's own stopped -> POST /v1/files (an upload kept on S3) and
      DELETE /v1/files/{id} -> 503 + Retry-After; started again -> the delete succeeds
"""

from __future__ import annotations

import orjson
import pytest
import redis
from fastapi.testclient import TestClient
from rq.job import Job

from api.app import create_app
from contract import queues
from contract.payloads import ChunkPayload, PlanPayload
from contract.s3_uri import S3AccessDenied
from jobstore import lifecycle, records
from jobstore.s3 import make_client
from jobstore.submit import chunk_rq_id
from workers.job_calibration import calibrate_finished_job

pytestmark = [pytest.mark.redis, pytest.mark.s3]

SCORING = {"queries": [{"id": "q", "template": "\n\nIs it about a refund?{?}", "options": [" yes", " no"]}]}


def _payload(r, rq_id: str) -> dict:
    return Job.fetch(rq_id, connection=r, serializer=queues.JsonSerializer).kwargs["payload"]


def _finished_dataset_job(api, settings, bucket: str, headers) -> str:
    """A dataset job of two rows, its plan and chunk run through the job store (responses by hand)."""
    r, s3 = redis.Redis.from_url(settings.redis_url), make_client(settings)
    rows = b"".join(orjson.dumps({"custom_id": f"r{i}", "text": f"refund {i}"}) + b"\n" for i in range(2))
    s3.put_object(Bucket=bucket, Key="in/rows.jsonl", Body=rows)
    body = {"scoring": SCORING, "input": {"s3": f"s3://{bucket}/in/"}, "output": {"s3": f"s3://{bucket}/out/"}}
    job_id = api.post("/v1/jobs", json=body, headers=headers).raise_for_status().json()["id"]
    lifecycle.plan_dataset(r, s3, settings, PlanPayload.model_validate(_payload(r, f"{job_id}-plan")))
    work = lifecycle.load_chunk(r, s3, ChunkPayload.model_validate(_payload(r, chunk_rq_id(job_id, 0))))
    for slot in work.rows:
        slot.response = {"usage": {}}
    lifecycle.settle_chunk(r, s3, settings, work, "w")
    return job_id


def test_results_and_reports_are_read_back_only_inside_the_jobs_output(make_settings, s3_server, s3_bucket, bearer):
    settings = make_settings(s3_bucket=s3_bucket, default_model="m", chunk_num_rows=10)
    s3 = make_client(settings)
    s3.put_object(Bucket=s3_bucket, Key="secret/results/part-00000.jsonl", Body=b'{"custom_id": "SECRET"}\n')
    s3.put_object(Bucket=s3_bucket, Key="secret/calibration/report.json", Body=b'{"secret": true}')
    with TestClient(create_app(settings), raise_server_exceptions=False) as api:
        alice = bearer("alice")
        job_id = _finished_dataset_job(api, settings, s3_bucket, alice)
        results = api.get(f"/v1/jobs/{job_id}/results", headers=alice)
        assert results.status_code == 200 and [orjson.loads(x)["custom_id"] for x in results.content.splitlines()] \
            == ["r0", "r1"]
        r = api.app.state.redis
        r.hset(queues.job_key(job_id), "output", f"s3://{s3_bucket}/secret/")  # inside alice's grants, not the job's
        for path in ("results", "calibration"):
            refused = api.get(f"/v1/jobs/{job_id}/{path}", headers=alice)
            assert refused.status_code == 403 and "SECRET" not in refused.text and "secret\": true" not in refused.text
            error = refused.json()["error"]
            assert error["type"] == "permission_error" and "outside this job's output grants" in error["message"]
        with pytest.raises(S3AccessDenied):
            calibrate_finished_job(r, s3, job_id, records.load_job(r, job_id))


def test_results_deleted_from_the_output_are_a_410_naming_the_object(make_settings, s3_server, s3_bucket, bearer):
    """Retrying cannot bring back an object someone deleted: a 410 that says so, not a 503."""
    settings = make_settings(s3_bucket=s3_bucket, default_model="m", chunk_num_rows=10)
    with TestClient(create_app(settings), raise_server_exceptions=False) as api:
        alice = bearer("alice")
        job_id = _finished_dataset_job(api, settings, s3_bucket, alice)
        s3 = make_client(settings)
        [key] = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="out/results/")["Contents"]]
        s3.delete_object(Bucket=s3_bucket, Key=key)
        gone = api.get(f"/v1/jobs/{job_id}/results", headers=alice)
        assert gone.status_code == 410, gone.text
        assert f"s3://{s3_bucket}/{key}" in gone.json()["error"]["message"] and "retry-after" not in gone.headers


def test_an_s3_call_failing_on_a_route_is_a_503_with_retry_after(weed_factory, make_settings, bearer):
    weed = weed_factory()
    weed.server.client().create_bucket(Bucket="files")
    settings = make_settings(s3_endpoint_url=weed.server.endpoint_url, s3_access_key_id="test",
                             s3_secret_access_key="test", files_s3="s3://files/f/", file_redis_max_bytes=10,
                             s3_max_attempts=1, default_model="m")
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/score", "body": {}}\n'
    with TestClient(create_app(settings), raise_server_exceptions=False) as api:
        alice = bearer("alice")

        def upload():
            return api.post("/v1/files", headers=alice, files={"file": ("in.jsonl", line)}, data={"purpose": "batch"})

        file_id = upload().raise_for_status().json()["id"]  # past file_redis_max_bytes: kept on S3
        weed.stop()
        try:
            for response in (upload(), api.delete(f"/v1/files/{file_id}", headers=alice)):
                assert response.status_code == 503, response.text
                assert response.headers["Retry-After"] == str(settings.retry_after_s)
                error = response.json()["error"]
                assert error["type"] == "service_unavailable" and "S3 call failed" in error["message"], error
        finally:
            weed.start()
        assert api.delete(f"/v1/files/{file_id}", headers=alice).status_code == 200

"""Must show 1: an S3 dataset job end to end (API + worker + real Redis + real S3).

200 rows with 5 malformed -> 195 result rows + 5 error rows, an errors object naming line
and custom_id, a manifest with the right counts; running the job again writes the same keys.
"""

import orjson
import pytest
from fastapi.testclient import TestClient
from worker_helpers import SCORING, drain_until_settled, make_worker

from api.app import create_app
from jobstore import datasets

pytestmark = [pytest.mark.redis, pytest.mark.s3, pytest.mark.slow]

NUM_ROWS = 200
BAD_LINES = {17: b'{"custom_id": "bad-json", "text": ', 60: b'{"custom_id": "no-text"}',
             101: b'{"custom_id": "bad-role", "messages": [{"role": "robot", "content": "hi"}]}',
             150: b"[1, 2, 3]", 199: b'{"text": "no custom id"}'}


def _dataset() -> tuple[bytes, bytes]:
    """Two objects, 200 non-blank lines in all (plus blank lines, which are not rows)."""
    lines = []
    for number in range(1, NUM_ROWS + 1):
        lines.append(BAD_LINES.get(number) or orjson.dumps({"custom_id": f"row-{number}",
                                                            "text": f"Order {number} arrived broken, refund it."}))
    first, second = lines[:120], lines[120:]
    return b"\n".join(first) + b"\n\n", b"\n".join(second)


def _objects(client, bucket: str, prefix: str) -> dict[str, bytes]:
    keys = [item["Key"] for item in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    return {key: client.get_object(Bucket=bucket, Key=key)["Body"].read() for key in keys}


def _run_job(api: TestClient, worker, headers, bucket: str) -> dict:
    body = {"scoring": SCORING, "input": {"s3": f"s3://{bucket}/in/"}, "output": {"s3": f"s3://{bucket}/out/"}}
    created = api.post("/v1/jobs", json=body, headers=headers)
    assert created.status_code == 201, created.text
    drain_until_settled(worker, [created.json()["id"]])
    return api.get(f"/v1/jobs/{created.json()['id']}", headers=headers).json()


def test_s3_dataset_gives_one_row_per_input_row(make_settings, s3_server, s3_bucket, service_engine, bearer):
    settings = make_settings(s3_bucket=s3_bucket, chunk_num_rows=40, default_model=service_engine.model_name)
    s3 = s3_server.client()
    first, second = _dataset()
    s3.put_object(Bucket=s3_bucket, Key="in/part-0.jsonl", Body=first)
    s3.put_object(Bucket=s3_bucket, Key="in/part-1.jsonl", Body=second)
    worker = make_worker(settings, service_engine)
    with TestClient(create_app(settings)) as api:
        job = _run_job(api, worker, bearer("alice"), s3_bucket)
        assert job["status"] == "succeeded", job
        assert job["progress"] == {"total": 200, "done": 200, "failed": 5}
        streamed = [orjson.loads(line) for line in api.get(f"/v1/jobs/{job['id']}/results",
                                                           headers=bearer("alice")).iter_lines() if line]
        outputs = _objects(s3, s3_bucket, "out/")

        rows = [orjson.loads(line) for key in sorted(outputs) if "/results/" in key
                for line in outputs[key].splitlines()]
        assert len(rows) == 200 and rows == streamed
        assert sum("response" in row for row in rows) == 195
        errors = [row for row in rows if "error" in row]
        assert len(errors) == 5
        assert [row["custom_id"] for row in errors] == ["bad-json", "no-text", "bad-role", None, None]
        assert [row["custom_id"] for row in rows if "response" in row][:3] == ["row-1", "row-2", "row-3"]
        error_lines = [orjson.loads(line) for key in sorted(outputs) if "/errors/" in key
                       for line in outputs[key].splitlines()]
        assert [(e["line"], e.get("custom_id")) for e in error_lines] == \
            [(17, "bad-json"), (60, "no-text"), (101, "bad-role"), (30, None), (79, None)]  # line in its object
        manifest = orjson.loads(outputs["out/manifest.json"])
        assert (manifest["num_rows"], manifest["num_succeeded"], manifest["num_failed"]) == (200, 195, 5)
        assert manifest["num_chunks"] == 5  # 120 rows -> 3 chunks, 80 rows -> 2: chunks never span objects
        assert sorted(manifest["results"] + manifest["errors"] + [f"s3://{s3_bucket}/out/manifest.json"]) == \
            sorted(f"s3://{s3_bucket}/{key}" for key in outputs)

        again = _run_job(api, worker, bearer("alice"), s3_bucket)
        assert again["status"] == "succeeded" and again["id"] != job["id"]
        rerun = _objects(s3, s3_bucket, "out/")
        assert sorted(rerun) == sorted(outputs)  # the same keys: overwritten, nothing added
        for key in outputs:
            if "/errors/" in key:
                assert rerun[key] == outputs[key]
        rerun_rows = [orjson.loads(line) for key in sorted(rerun) if "/results/" in key
                      for line in rerun[key].splitlines()]
        assert [_without_ids(row) for row in rerun_rows] == [_without_ids(row) for row in rows]


def _without_ids(row: dict) -> dict:
    """The scores of a row (its response id and floor-cache usage differ from run to run)."""
    if "response" in row:
        row = row | {"response": row["response"]["results"]}
    return row


def test_missing_input_fails_the_job_with_a_reason(make_settings, s3_server, s3_bucket, service_engine, bearer):
    settings = make_settings(s3_bucket=s3_bucket, default_model=service_engine.model_name)
    worker = make_worker(settings, service_engine)
    with TestClient(create_app(settings)) as api:
        job = _run_job(api, worker, bearer("alice"), s3_bucket)
    assert job["status"] == "failed" and "no objects" in job["error"]
    assert datasets.MANIFEST_NAME not in str(_objects(s3_server.client(), s3_bucket, "out/"))

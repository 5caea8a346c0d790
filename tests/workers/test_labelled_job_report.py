"""A job whose rows carry `labels` has its calibration report as an output: GET
/v1/jobs/{id}/calibration (inline: from the job's record; dataset: `<output>/calibration/`
on S3, beside report.md and the diagrams). API + worker + real Redis (+ real S3) + tiny
engine. The raw column is checked against accuracy and ECE written out here in numpy on the
rows the job returned: positive = the first option, ECE over 10 equal-width bins of p."""

import numpy as np
import orjson
import pytest
from fastapi.testclient import TestClient
from worker_helpers import drain_until_settled, make_worker

from api.app import create_app

pytestmark = [pytest.mark.redis, pytest.mark.slow]
SCORING = {"queries": [{"id": "refund", "template": "\n\nRefund?\nAnswer:{?}", "options": [" yes", " no"],
                        "calibrate": "contextual"}]}


def _items(num_rows: int = 30, labelled: bool = True) -> list[dict]:
    return [{"custom_id": f"r{i}", "text": f"Order {i}: {'please refund me' if i % 3 else 'where is it'}.",
             **({"labels": ["refund"] if i % 3 else []} if labelled else {})} for i in range(num_rows)]


def _ece(p: np.ndarray, y: np.ndarray) -> float:
    bins = np.minimum((p * 10).astype(int), 9)
    return float(sum((bins == b).mean() * abs(y[bins == b].mean() - p[bins == b].mean())
                     for b in range(10) if (bins == b).any()))


def _check_raw(report: dict, rows: list[dict]) -> None:
    p = np.array([[o["p"] for o in row["response"]["results"][0]["combinations"][0]["options"]] for row in rows])
    first = p[:, 0] / p.sum(axis=1)
    y = np.array([float("refund" in row["labels"]) for row in rows])
    raw = report["queries"]["refund"]["methods"]["raw"]["metrics"]
    assert report["queries"]["refund"]["num_rows"] == len(rows) and report["num_labelled_rows"] == len(rows)
    assert raw["accuracy"] == pytest.approx(np.mean((first >= 0.5) == (y > 0.5)), abs=1e-12)
    assert raw["ece"] == pytest.approx(_ece(first, y), abs=1e-12)
    assert {"raw", "contextual", "batch"} <= set(report["queries"]["refund"]["methods"])


def _run(api: TestClient, worker, headers, body: dict) -> str:
    created = api.post("/v1/jobs", json=body, headers=headers)
    assert created.status_code == 201, created.text
    drain_until_settled(worker, [created.json()["id"]])
    return created.json()["id"]


def _rows(api: TestClient, job_id: str, headers) -> list[dict]:
    return [orjson.loads(line) for line in api.get(f"/v1/jobs/{job_id}/results", headers=headers).iter_lines() if line]


def test_an_inline_labelled_job_serves_its_report(make_settings, service_engine, bearer):
    settings = make_settings(chunk_num_rows=8, default_model=service_engine.model_name)
    worker = make_worker(settings, service_engine)
    with TestClient(create_app(settings)) as api:
        job_id = _run(api, worker, bearer("alice"), {"scoring": SCORING, "items": _items()})
        report = api.get(f"/v1/jobs/{job_id}/calibration", headers=bearer("alice"))
        assert report.status_code == 200 and report.headers["content-type"] == "application/json"
        _check_raw(report.json(), _rows(api, job_id, bearer("alice")))
        assert api.get(f"/v1/jobs/{job_id}/calibration", headers=bearer("bob")).status_code == 404
        unlabelled = _run(api, worker, bearer("alice"), {"scoring": SCORING, "items": _items(labelled=False)})
        missing = api.get(f"/v1/jobs/{unlabelled}/calibration", headers=bearer("alice"))
        assert missing.status_code == 404 and "labels" in missing.json()["error"]["message"]


@pytest.mark.s3
def test_a_dataset_labelled_job_writes_its_report_beside_its_results(make_settings, s3_server, s3_bucket,
                                                                      service_engine, bearer):
    settings = make_settings(s3_bucket=s3_bucket, chunk_num_rows=8, default_model=service_engine.model_name)
    s3 = s3_server.client()
    s3.put_object(Bucket=s3_bucket, Key="in/part-0.jsonl", Body=b"\n".join(orjson.dumps(i) for i in _items()))
    worker = make_worker(settings, service_engine)
    body = {"scoring": SCORING, "input": {"s3": f"s3://{s3_bucket}/in/"}, "output": {"s3": f"s3://{s3_bucket}/out/"}}
    with TestClient(create_app(settings)) as api:
        job_id = _run(api, worker, bearer("alice"), body)
        report = api.get(f"/v1/jobs/{job_id}/calibration", headers=bearer("alice"))
        assert report.status_code == 200, report.text
        _check_raw(report.json(), _rows(api, job_id, bearer("alice")))
    stored = s3.get_object(Bucket=s3_bucket, Key="out/calibration/report.json")["Body"].read()
    assert orjson.loads(stored) == report.json()
    keys = {item["Key"] for item in s3.list_objects_v2(Bucket=s3_bucket, Prefix="out/calibration/")["Contents"]}
    assert {"out/calibration/report.md", "out/calibration/reliability-refund.png"} <= keys

"""A job that asks for batch calibration and carries labels: when its last chunk settles,
every result row gets batch_p (the job's mean answer divided out), the job keeps its
priors, and its labelled calibration report is stored (real Redis, tiny real engine)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
import redis
from worker_helpers import drain_until_settled, make_worker

from contract import queues
from contract.payloads import JobItem, JobStatus
from contract.protocol import ScoringSpec
from jobstore import records
from jobstore.lifecycle import submit_inline

pytestmark = [pytest.mark.redis, pytest.mark.slow]
SPEC = ScoringSpec.model_validate({"queries": [
    {"id": "refund", "template": "\n\nRefund?\nAnswer:{?}", "options": [" yes", " no"], "calibrate": "batch"},
    {"id": "urgent", "template": "\n\nUrgent?\nAnswer:{?}", "options": [" yes", " no"], "calibrate": "contextual"},
]})


def test_batch_columns_priors_and_report_when_the_job_ends(make_settings, service_engine):
    settings = make_settings(chunk_num_rows=9)  # several chunks: the priors span all of them
    r = redis.Redis.from_url(settings.redis_url)
    items = [JobItem(custom_id=f"r{i}", text=f"Order {i}: {'please refund me' if i % 3 else 'where is it'}.",
                     labels=["refund"] if i % 3 else []) for i in range(30)]
    job_id = submit_inline(r, settings, "alice", service_engine.model_name, SPEC, items)
    drain_until_settled(make_worker(settings, service_engine), [job_id])
    assert records.load_view(r, job_id).status == JobStatus.SUCCEEDED
    rows = [orjson.loads(line) for chunk in records.iter_inline_results(r, job_id, 10) for line in chunk.splitlines()]
    assert len(rows) == 30 and all(row["labels"] == items[i].labels for i, row in enumerate(rows))
    refund = np.array([[o["p"] for o in row["response"]["results"][0]["combinations"][0]["options"]] for row in rows])
    prior = refund.mean(axis=0)
    expected = (refund / prior) / (refund / prior).sum(axis=1, keepdims=True)
    got = np.array([[o["batch_p"] for o in row["response"]["results"][0]["combinations"][0]["options"]] for row in rows])
    np.testing.assert_allclose(got, expected, rtol=1e-9)
    urgent = [row["response"]["results"][1]["combinations"][0]["options"] for row in rows]
    assert all("batch_p" not in o and o["contextual_p"] is not None for options in urgent for o in options)
    stored = orjson.loads(r.hget(queues.job_key(job_id), "batch_priors"))
    assert stored["refund/0"] == pytest.approx(prior.tolist()) and "urgent/0" not in stored
    report = orjson.loads(r.hget(queues.job_key(job_id), "calibration_report"))
    assert report["num_labelled_rows"] == 30
    assert report["queries"]["refund"]["num_rows"] == 30
    assert {"raw", "contextual", "batch"} <= set(report["queries"]["refund"]["methods"])

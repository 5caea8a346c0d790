"""Label-free calibration through the live service (uvicorn + worker thread + real Redis +
tiny engine): a job asking for batch calibration returns batch_p on every row once it has
ended, and a later /v1/score naming that job gets the job's priors applied."""

import time

import httpx
import numpy as np
import orjson
import pytest


pytestmark = [pytest.mark.redis, pytest.mark.slow]
SCORING = {"queries": [{"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"], "calibrate": "batch"}]}


@pytest.fixture
def live(make_settings, service_engine, live_service):
    return live_service(make_settings(default_model=service_engine.model_name), service_engine)


def _options(response: dict) -> list[dict]:
    return response["results"][0]["combinations"][0]["options"]


def test_batch_columns_and_a_sync_call_naming_the_jobs_priors(live, bearer):
    items = [{"custom_id": f"r{i}", "text": f"Order {i}: {'refund please' if i % 2 else 'thanks'}."} for i in range(8)]
    created = httpx.post(f"{live.base_url}/v1/jobs", json={"scoring": SCORING, "items": items},
                         headers=bearer("alice"), timeout=60)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    deadline = time.monotonic() + 120
    while httpx.get(f"{live.base_url}/v1/jobs/{job_id}", headers=bearer("alice")).json()["status"] != "succeeded":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    text = httpx.get(f"{live.base_url}/v1/jobs/{job_id}/results", headers=bearer("alice"), timeout=60).text
    rows = [orjson.loads(line) for line in text.splitlines() if line.strip()]
    p = np.array([[o["p"] for o in _options(row["response"])] for row in rows])
    prior = p.mean(axis=0)
    expected = (p / prior) / (p / prior).sum(axis=1, keepdims=True)
    np.testing.assert_allclose([[o["batch_p"] for o in _options(row["response"])] for row in rows], expected, rtol=1e-9)

    body = {"messages": [{"role": "user", "content": "Order 99: refund please."}], "scoring": SCORING,
            "priors_from_job": job_id}
    reply = httpx.post(f"{live.base_url}/v1/score", json=body, headers=bearer("alice"), timeout=60)
    assert reply.status_code == 200, reply.text
    one = np.array([o["p"] for o in _options(reply.json())])
    ratio = one / prior
    assert [o["batch_p"] for o in _options(reply.json())] == pytest.approx((ratio / ratio.sum()).tolist())

    other_key = httpx.post(f"{live.base_url}/v1/score", json=body, headers=bearer("bob"), timeout=60)
    assert other_key.status_code == 404 and other_key.json()["error"]["param"] == "priors_from_job"

"""A cancelled job's and a cancelled batch's finished rows come back with batch_p computed from
those rows alone (live service: uvicorn + worker thread + real Redis + tiny engine, slowed so
the cancel lands mid-job). The reference is the formula written out here in numpy:
prior_i = mean over the answered rows of p_i; batch_p_i = (p_i / prior_i) / sum_j (p_j / prior_j)."""

import io
import time

import httpx
import numpy as np
import openai
import orjson
import pytest
import redis

from contract import queues

pytestmark = [pytest.mark.redis, pytest.mark.slow]
SCORING = {"queries": [{"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"], "calibrate": "batch"},
                       {"id": "urgent", "template": "\n\nUrgent?{?}", "options": [" yes", " no"]}]}


def _expected_batch_p(p: np.ndarray) -> np.ndarray:
    prior = p.mean(axis=0)
    return (p / prior) / (p / prior).sum(axis=1, keepdims=True)


def _options(response: dict, query: int = 0) -> list[dict]:
    return response["results"][query]["combinations"][0]["options"]


def _text(i: int) -> str:
    return "refund " * 5000 if i == 1 else f"Customer {i}: {'please refund my order' if i % 3 else 'where is it'}."


def _check_columns(responses: list[dict]) -> None:
    p = np.array([[o["p"] for o in _options(response)] for response in responses])
    got = np.array([[o["batch_p"] for o in _options(response)] for response in responses])
    np.testing.assert_allclose(got, _expected_batch_p(p), rtol=1e-9)
    assert all("batch_p" not in o for response in responses for o in _options(response, 1))  # not asked


def _wait(check, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_cancelled_jobs_rows_carry_batch_p_from_their_own_priors(make_settings, slow_engine, live_service, bearer):
    settings = make_settings(default_model="tiny-llama", chunk_num_rows=2)
    live = live_service(settings, slow_engine(0.4))  # one 2-row chunk per pass, 0.4 s each
    items = [{"custom_id": f"r{i}", "text": _text(i)} for i in range(30)]
    created = httpx.post(f"{live.base_url}/v1/jobs", json={"scoring": SCORING, "items": items},
                         headers=bearer("alice"), timeout=60)
    assert created.status_code == 201, created.text
    job = f"{live.base_url}/v1/jobs/{created.json()['id']}"
    _wait(lambda: httpx.get(job, headers=bearer("alice")).json()["progress"]["done"] >= 6, "6 rows done")
    assert httpx.post(f"{job}/cancel", headers=bearer("alice")).json()["status"] == "cancelled"
    time.sleep(1.0)  # the chunk in its pass when the job was cancelled settles (rows in a pass finish)
    rows = [orjson.loads(line) for line in httpx.get(f"{job}/results", headers=bearer("alice"), timeout=60).text.splitlines()]
    assert 6 <= len(rows) < 30 and rows[1]["custom_id"] == "r1" and "error" in rows[1]  # the refused row
    answered = [row["response"] for row in rows if "response" in row]
    assert len(answered) == len(rows) - 1
    _check_columns(answered)
    stored = redis.Redis.from_url(settings.redis_url).hget(queues.results_key(created.json()["id"]), "0")
    assert b"batch_p" not in stored  # computed as the rows are returned, from exactly these rows


def test_a_cancelled_batchs_output_file_carries_batch_p_from_its_finished_rows(make_settings, slow_engine, live_service):
    settings = make_settings(default_model="tiny-llama", chunk_num_rows=2)
    live = live_service(settings, slow_engine(0.4))
    alice = openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="sk-test-alice", max_retries=0)
    lines = [orjson.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/score",
                           "body": {"messages": [{"role": "user", "content": _text(i)}], "scoring": SCORING}})
             for i in range(30)]
    uploaded = alice.files.create(file=("in.jsonl", io.BytesIO(b"\n".join(lines) + b"\n")), purpose="batch")
    batch = alice.batches.create(input_file_id=uploaded.id, endpoint="/v1/score", completion_window="24h")
    _wait(lambda: alice.batches.retrieve(batch.id).request_counts.completed >= 4, "4 lines done")
    alice.batches.cancel(batch.id)
    _wait(lambda: alice.batches.retrieve(batch.id).status == "cancelled", "the batch cancelled")
    batch = alice.batches.retrieve(batch.id)
    output = [orjson.loads(line) for line in alice.files.content(batch.output_file_id).content.splitlines() if line]
    assert 4 <= len(output) == batch.request_counts.completed < 30
    _check_columns([row["response"]["body"] for row in output])

"""/v1/decisions as a batch endpoint on a live service (uvicorn + worker thread + real Redis + tiny engine),
through the real `openai` SDK: one batch of decisions lines completes, each output body validates strictly
as the wheel's `Decision` and equals the sync POST /v1/decisions answer to the same body; a line the
Decisions API refuses is an error line naming its field."""

import io
import time

import httpx
import openai
import orjson
import pytest
from openai.types import Batch, Decision

pytestmark = [pytest.mark.redis, pytest.mark.slow]

QUESTIONS = [
    {"type": "predicate", "name": "refund", "instructions": "Is the customer asking for a refund?"},
    {"type": "choice", "name": "queue", "instructions": "Which queue?",
     "choices": [{"value": "billing", "description": "charges"}, {"value": "technical"}, {"value": False}]},
    {"type": "score", "name": "urgency", "instructions": "How urgent?", "levels": [{"label": "low"}, {"label": "high"}]},
]


@pytest.fixture
def live(make_settings, service_engine, live_service):
    return live_service(make_settings(default_model=service_engine.model_name, chunk_num_rows=4), service_engine)


def _line(custom_id: str, body: dict) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/decisions", "body": body})


def _until_done(client: openai.OpenAI, batch_id: str, timeout_s: float = 240) -> Batch:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = Batch.model_validate(client.batches.with_raw_response.retrieve(batch_id).http_response.json(),
                                     strict=True)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} still {batch.status}")


def _jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    return [orjson.loads(x) for x in client.files.content(file_id).content.splitlines() if x] if file_id else []


def test_a_batch_of_decisions_lines_completes_with_the_sync_answers(live, bearer):
    client = openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="sk-test-alice", max_retries=0)
    bodies = {f"d{i}": {"model": "tiny-llama", "input": f"Message {i}: I was charged twice, refund one please.",
                        "questions": QUESTIONS} for i in range(6)}
    bad = {"model": "tiny-llama", "input": "hi", "questions": [{"type": "choice", "instructions": "Which?",
                                                              "choices": [{"value": "a"}, {"value": "a"}]}]}
    lines = [_line(custom_id, body) for custom_id, body in bodies.items()] + [_line("repeated-choice", bad)]
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(b"\n".join(lines) + b"\n")), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/decisions", completion_window="24h")
    batch = _until_done(client, batch.id)
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (6, 1)
    output, errors = _jsonl(client, batch.output_file_id), _jsonl(client, batch.error_file_id)
    assert sorted(row["custom_id"] for row in output) == sorted(bodies)
    for row in output:
        assert row["response"]["status_code"] == 200
        body = row["response"]["body"]
        decision = Decision.model_validate(body, strict=True)
        assert [a.name for a in decision.answers] == ["refund", "queue", "urgency"]
        sync = httpx.post(f"{live.base_url}/v1/decisions", json=bodies[row["custom_id"]], headers=bearer("alice"),
                          timeout=60)
        assert sync.status_code == 200, sync.text
        assert body == sync.json()  # the same body, the same answer, floats and all
    [error] = errors
    assert (error["custom_id"], error["error"]["code"]) == ("repeated-choice", "invalid_body")
    assert error["error"]["param"].startswith("body.questions.0")

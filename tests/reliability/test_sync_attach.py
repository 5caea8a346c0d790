"""A retried sync call attaches to its job: the real `openai` SDK (which honours
`x-should-retry: false`) and a raw httpx loop that ignores it, against a live service whose
worker is slower than the sync deadline; one job per identical call, however often it is sent.
On every sync route the identical call sent again while its job runs attaches to that job; each
sync route's 504 job, polled, holds what that route would have replied."""

import time

import httpx
import openai
import orjson
import pytest
import redis

from contract import queues

pytestmark = [pytest.mark.redis, pytest.mark.slow]

MESSAGES = [{"role": "user", "content": "Customer support message:\nI was charged twice, please refund one."}]
SCORING = {"queries": [{"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"]}]}
OPTIONS = [{"id": "refund", "description": "Refund the charge"}, {"id": "escalate", "description": "Escalate"}]
DEADLINE_S = 1.0
WORKER_DELAY_S = 4.0  # every batch of the worker sleeps this long first: each job outlives a deadline


def _job_ids(r) -> set[str]:
    keys = (k.decode() for k in r.scan_iter(match=f"{queues.PREFIX}:job:job-*", count=1000))
    return {k.removeprefix(f"{queues.PREFIX}:job:") for k in keys if k.count(":") == 2}


def _wait_until_ended(base_url: str, headers: dict, job_id: str) -> dict:
    deadline = time.monotonic() + 120
    while True:
        view = httpx.get(f"{base_url}/v1/jobs/{job_id}", headers=headers, timeout=30).json()
        if view["status"] in ("succeeded", "failed", "cancelled"):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.1)


@pytest.fixture
def slow(make_settings, slow_engine, live_service, service_engine):
    settings = make_settings(default_model=service_engine.model_name, sync_timeout_s=DEADLINE_S)
    engine = slow_engine(WORKER_DELAY_S)
    return live_service(settings, engine), engine, redis.Redis.from_url(settings.redis_url)


def test_the_sdk_does_not_retry_a_504_and_a_second_call_attaches(slow, bearer):
    live, _, r = slow
    sent = []
    http_client = httpx.Client(event_hooks={"request": [sent.append]}, timeout=60)
    token = bearer("alice")["Authorization"].removeprefix("Bearer ")
    client = openai.OpenAI(base_url=f"{live.base_url}/v1", api_key=token, http_client=http_client)  # max_retries=2
    assert client.max_retries == 2

    def chat():
        with pytest.raises(openai.APIStatusError) as raised:
            client.chat.completions.create(model="tiny-llama", messages=MESSAGES, extra_body={"scoring": SCORING})
        error = raised.value
        assert error.status_code == 504 and error.response.headers["x-should-retry"] == "false"
        return error.response.json()["error"]["job_id"]

    started = time.monotonic()
    first = chat()
    assert len(sent) == 1 and time.monotonic() - started < 2 * DEADLINE_S + 1  # no retry
    assert _job_ids(r) == {first}
    second = chat()  # the same call while its job runs: the same job, nothing queued
    assert second == first and len(sent) == 2 and _job_ids(r) == {first}

    view = _wait_until_ended(live.base_url, bearer("alice"), first)
    assert view["status"] == "succeeded" and view["route"] == "/v1/chat/completions"
    assert chat() != first  # the job ended: the same call now is a new job
    assert len(_job_ids(r)) == 2


def test_a_client_that_ignores_x_should_retry_makes_one_job(slow, bearer):
    live, _, r = slow
    body = {"messages": MESSAGES, "scoring": SCORING}
    statuses, job_ids = [], set()
    with httpx.Client(base_url=live.base_url, headers=bearer("alice"), timeout=60) as client:
        for _ in range(20):  # retry every 504 at once, as a client deaf to the header does
            reply = client.post("/v1/score", json=body)
            statuses.append(reply.status_code)
            if reply.status_code != 504:
                break
            job_ids.add(reply.json()["error"]["job_id"])
        other = client.post("/v1/score", json=body, headers=bearer("bob"))  # another key: its own job
    assert statuses[-1] == 200 and statuses.count(504) >= 2, statuses
    assert len(job_ids) == 1 and _job_ids(r) >= job_ids
    assert other.status_code == 504, other.text
    bob_job = other.json()["error"]["job_id"]
    assert _job_ids(r) == job_ids | {bob_job} and r.hget(queues.job_key(bob_job), "owner") == b"bob"


ROUTE_BODIES = {
    "/v1/score": {"messages": MESSAGES, "scoring": SCORING},
    "/v1/chat/completions": {"model": "tiny-llama", "messages": MESSAGES, "scoring": SCORING},
    "/v1/decide": {"state": MESSAGES[0]["content"], "question": "What should support do?", "options": OPTIONS},
    "/v1/decide/shared": {"state": MESSAGES[0]["content"], "decisions": [
        {"id": "action", "question": "What should support do?", "options": OPTIONS},
        {"id": "urgent", "question": "Is it urgent?", "options": [{"id": "yes", "description": "Yes"},
                                                                  {"id": "no", "description": "No"}]}]},
    "/v1/decisions": {"model": "tiny-llama", "input": MESSAGES[0]["content"], "questions": [
        {"type": "predicate", "name": "refund", "instructions": "Is the customer asking for a refund?"},
        {"type": "choice", "name": "action", "instructions": "What should support do?",
         "choices": [{"value": "refund"}, {"value": "escalate", "description": "Escalate"}]}]},
}
VOLATILE = {"/v1/score": ("id",), "/v1/chat/completions": ("id", "created")}  # fresh per reply
FLOOR_USAGE = ("floor_tokens", "floors_cached", "floors_computed")  # the second read finds its floors cached


def _without_floor_usage(value):
    if isinstance(value, dict):
        return {k: _without_floor_usage(v) for k, v in value.items() if k not in FLOOR_USAGE}
    if isinstance(value, list):
        return [_without_floor_usage(v) for v in value]
    return value


@pytest.mark.parametrize("route", list(ROUTE_BODIES))
def test_a_polled_504_job_holds_the_routes_reply(slow, bearer, route):
    live, engine, _ = slow
    headers = bearer("alice")
    engine.delay_s = WORKER_DELAY_S
    late = httpx.post(f"{live.base_url}{route}", json=ROUTE_BODIES[route], headers=headers, timeout=60)
    assert late.status_code == 504, late.text
    job_id = late.json()["error"]["job_id"]
    engine.delay_s = 0.0  # the next call is answered in time
    view = _wait_until_ended(live.base_url, headers, job_id)
    assert view["status"] == "succeeded" and view["route"] == route
    results = httpx.get(f"{live.base_url}/v1/jobs/{job_id}/results", headers=headers, timeout=60)
    [row] = [orjson.loads(line) for line in results.content.splitlines() if line]
    polled = row["response"]
    direct = httpx.post(f"{live.base_url}{route}", json=ROUTE_BODIES[route], headers=headers, timeout=60)
    assert direct.status_code == 200, direct.text
    expected = direct.json()
    for field in VOLATILE.get(route, ()):
        assert field in polled
        polled.pop(field), expected.pop(field)
    assert polled["object"] == expected["object"] and _without_floor_usage(polled) == _without_floor_usage(expected)


@pytest.mark.parametrize("route", list(ROUTE_BODIES))
def test_the_identical_call_sent_again_attaches_to_the_running_job(slow, bearer, route):
    live, engine, r = slow
    engine.delay_s = WORKER_DELAY_S
    with httpx.Client(base_url=live.base_url, headers=bearer("alice"), timeout=60) as client:
        first = client.post(route, json=ROUTE_BODIES[route])
        assert first.status_code == 504, first.text
        job_id = first.json()["error"]["job_id"]
        again = client.post(route, json=ROUTE_BODIES[route])  # while the job runs
        assert again.status_code in (200, 504), again.text
        if again.status_code == 504:
            assert again.json()["error"]["job_id"] == job_id
    assert _job_ids(r) == {job_id}  # one job, however often the call was sent
    view = _wait_until_ended(live.base_url, bearer("alice"), job_id)
    assert view["status"] == "succeeded" and view["route"] == route and view["progress"]["total"] == 1

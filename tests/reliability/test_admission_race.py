"""Atomic admission: concurrent submits never take the queued rows past `max_queue`.

32 clients submit at once (threads, one connection each) to a live API with no worker and
`max_queue=20`: the rows admitted never exceed 20 (the gauge sampled all along, and the
rows of the 201s), every other submit is a 429 with Retry-After, and nothing of a refused
submit is left in Redis."""

import threading
import time

import httpx
import pytest
import redis

from contract import queues

pytestmark = pytest.mark.redis

MAX_QUEUE = 20
NUM_CLIENTS = 32
SCORING = {"queries": [{"id": "q", "template": "\n\nYes or no?{?}", "options": [" yes", " no"]}]}


def _job(index: int) -> dict:
    num_items = 1 if index % 2 else 3  # 1- and 3-row jobs: a reservation is of a job's rows
    return {"model": "m", "scoring": SCORING, "items": [{"custom_id": f"{index}-{i}", "text": "hi"} for i in range(num_items)]}


def _job_records(r) -> list[bytes]:
    return [k for k in r.scan_iter(match=f"{queues.PREFIX}:job:job-*", count=1000) if k.count(b":") == 2]


def test_concurrent_submits_never_pass_max_queue(make_settings, live_api, bearer):
    settings = make_settings(default_model="m", max_queue=MAX_QUEUE)
    base_url = live_api(settings)
    r = redis.Redis.from_url(settings.redis_url)
    sampled = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            sampled.append(int(r.get(queues.QUEUED_ROWS_KEY) or 0))
            time.sleep(0.001)

    barrier = threading.Barrier(NUM_CLIENTS)
    replies: dict[int, httpx.Response] = {}

    def submit(index: int) -> None:
        with httpx.Client(base_url=base_url, headers=bearer("alice"), timeout=60) as client:
            client.get("/v1/models")  # connected before the burst
            barrier.wait()
            replies[index] = client.post("/v1/jobs", json=_job(index))

    sampler = threading.Thread(target=sample)
    sampler.start()
    threads = [threading.Thread(target=submit, args=(i,)) for i in range(NUM_CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    stop.set()
    sampler.join()

    statuses = sorted({reply.status_code for reply in replies.values()})
    assert len(replies) == NUM_CLIENTS and statuses == [201, 429], statuses
    admitted = [i for i, reply in replies.items() if reply.status_code == 201]
    admitted_rows = sum(len(_job(i)["items"]) for i in admitted)
    queued = int(r.get(queues.QUEUED_ROWS_KEY))
    assert queued == admitted_rows <= MAX_QUEUE
    assert max(sampled) <= MAX_QUEUE, max(sampled)
    assert queued > MAX_QUEUE - 3  # refused only when the next job would not fit (3 rows at most)
    for i, reply in replies.items():
        if reply.status_code == 429:
            assert reply.headers["retry-after"] == str(settings.retry_after_s)
            assert reply.json()["error"]["code"] == 429
    assert len(_job_records(r)) == len(admitted)  # a refused submit leaves no record
    assert r.llen("rq:queue:spinf:m:batch") == len(admitted)


def test_a_job_larger_than_max_queue_is_413_naming_the_limit(make_settings, live_api, bearer):
    settings = make_settings(default_model="m", max_queue=MAX_QUEUE)
    base_url = live_api(settings)
    body = {"model": "m", "scoring": SCORING, "items": [{"custom_id": str(i), "text": "hi"} for i in range(MAX_QUEUE + 1)]}
    reply = httpx.post(f"{base_url}/v1/jobs", json=body, headers=bearer("alice"), timeout=60)
    assert reply.status_code == 413 and f"max_queue={MAX_QUEUE}" in reply.json()["error"]["message"]
    assert int(redis.Redis.from_url(settings.redis_url).get(queues.QUEUED_ROWS_KEY) or 0) == 0

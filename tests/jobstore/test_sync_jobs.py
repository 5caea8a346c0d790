"""A sync call's job on a real Redis: identical calls attach to the active job (one job however
many callers race), other keys, routes or bodies never do, and the job's end frees the digest."""

import threading

import pytest
import redis

from contract import queues
from contract.payloads import JobItem, JobSpec, JobStatus
from contract.protocol import ScoringSpec
from contract.settings import Settings
from jobstore import records
from jobstore.submit import QueueFull
from jobstore.sync_jobs import SyncCall, submit_sync

pytestmark = pytest.mark.redis

SPEC = JobSpec(model="m", scoring=ScoringSpec.model_validate(
    {"queries": [{"id": "q", "template": "Yes or no?{?}", "options": [" yes", " no"]}]}))
ITEM = JobItem(custom_id="0", text="hello")
CALL = SyncCall(route="/v1/score", body_json='{"messages": "hello"}')


def _job_records(r) -> list[bytes]:
    return [k for k in r.scan_iter(match=f"{queues.PREFIX}:job:job-*") if k.count(b":") == 2]


def test_identical_calls_attach_and_others_do_not(redis_url):
    r = redis.Redis.from_url(redis_url)
    settings = Settings(redis_url=redis_url)
    first, is_new = submit_sync(r, settings, "alice", SPEC, ITEM, CALL)
    assert is_new and submit_sync(r, settings, "alice", SPEC, ITEM, CALL) == (first, False)
    others = [submit_sync(r, settings, "bob", SPEC, ITEM, CALL),  # another key
              submit_sync(r, settings, "alice", SPEC, ITEM, SyncCall("/v1/chat/completions", CALL.body_json)),
              submit_sync(r, settings, "alice", SPEC, ITEM, SyncCall("/v1/score", '{"messages": "bye"}')),
              submit_sync(r, settings, "alice", SPEC.model_copy(update={"model": "n"}), ITEM, CALL)]
    assert all(is_new for _, is_new in others) and len({first, *(job for job, _ in others)}) == 5
    assert int(r.get(queues.QUEUED_ROWS_KEY)) == 5  # an attached call reserves nothing
    record = records.load_job(r, first)
    assert record["route"] == "/v1/score" and record["kind"] == "sync"
    records.finish(r, first, JobStatus.SUCCEEDED, 60)  # ended: the next identical call is a new job
    again, is_new = submit_sync(r, settings, "alice", SPEC, ITEM, CALL)
    assert is_new and again != first


def test_racing_identical_calls_make_one_job(redis_url):
    settings = Settings(redis_url=redis_url)
    barrier = threading.Barrier(16)
    got = []

    def call() -> None:
        r = redis.Redis.from_url(redis_url)
        barrier.wait()
        got.append(submit_sync(r, settings, "alice", SPEC, ITEM, CALL))

    threads = [threading.Thread(target=call) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    r = redis.Redis.from_url(redis_url)
    assert len(got) == 16 and len({job for job, _ in got}) == 1 and sum(is_new for _, is_new in got) == 1
    assert len(_job_records(r)) == 1 and int(r.get(queues.QUEUED_ROWS_KEY)) == 1
    assert r.llen(f"rq:queue:{queues.queue_pair('m').sync}") == 1


def test_a_full_queue_refuses_a_new_sync_job_but_not_an_attach(redis_url):
    r = redis.Redis.from_url(redis_url)
    settings = Settings(redis_url=redis_url, max_queue=1)
    first, _ = submit_sync(r, settings, "alice", SPEC, ITEM, CALL)
    assert submit_sync(r, settings, "alice", SPEC, ITEM, CALL) == (first, False)
    with pytest.raises(QueueFull):
        submit_sync(r, settings, "bob", SPEC, ITEM, CALL)
    assert int(r.get(queues.QUEUED_ROWS_KEY)) == 1 and len(_job_records(r)) == 1
    assert r.get(queues.sync_call_key(CALL.digest("bob", "m"))) is None  # nothing of the refused call


def test_every_caller_waiting_on_a_job_wakes_when_it_ends(redis_url):
    import asyncio

    from jobstore.connections import async_client, wait_for_element

    settings = Settings(redis_url=redis_url)
    r = redis.Redis.from_url(redis_url)
    job_id, _ = submit_sync(r, settings, "alice", SPEC, ITEM, CALL)

    async def run() -> list:
        client = async_client(settings)
        waiters = [asyncio.create_task(wait_for_element(client, queues.done_key(job_id), 10, settings))
                   for _ in range(3)]
        await asyncio.sleep(0.2)
        records.finish(r, job_id, JobStatus.SUCCEEDED, 60)
        woken = await asyncio.gather(*waiters)
        late = await wait_for_element(client, queues.done_key(job_id), 1, settings)  # came after the end
        await client.aclose()
        return [*woken, late]

    assert asyncio.run(run()) == [b"succeeded"] * 4

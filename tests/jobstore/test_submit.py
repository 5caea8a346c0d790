"""Submitting on a real Redis: chunked RQ jobs on the right queue, validated payloads, cancel."""

import pytest
import redis
from pydantic import ValidationError
from rq import Queue
from rq.job import Job

from contract import queues
from contract.payloads import ChunkPayload, JobItem, JobStatus
from contract.protocol import ScoringSpec
from contract.settings import Settings
from jobstore import records
from jobstore.lifecycle import cancel, submit_dataset, submit_inline
from jobstore.submit import chunk_rq_id

pytestmark = pytest.mark.redis

SPEC = ScoringSpec.model_validate({"queries": [{"id": "q", "template": "Yes or no?{?}", "options": [" yes", " no"]}]})


def _items(n):
    return [JobItem(custom_id=f"r{i}", text=f"text {i}") for i in range(n)]


def test_inline_job_is_chunked_onto_the_batch_queue(redis_url):
    r = redis.Redis.from_url(redis_url)
    settings = Settings(redis_url=redis_url, chunk_num_rows=4)
    job_id = submit_inline(r, settings, "owner", "model-x", SPEC, _items(10))
    batch = Queue(queues.queue_pair("model-x").batch, connection=r, serializer=queues.JsonSerializer)
    assert batch.job_ids == [chunk_rq_id(job_id, i) for i in range(3)]
    job = Job.fetch(batch.job_ids[2], connection=r, serializer=queues.JsonSerializer)
    payload = ChunkPayload.model_validate(job.kwargs["payload"])  # JSON round trip validates again
    assert [item.custom_id for item in payload.items] == ["r8", "r9"]
    assert job.retries_left == settings.max_num_retries
    assert int(r.get(queues.QUEUED_ROWS_KEY)) == 10
    view = records.load_view(r, job_id)
    assert (view.status, view.progress.total, view.progress.done) == (JobStatus.QUEUED, 10, 0)


def test_sync_calls_use_the_priority_queue(redis_url):
    r = redis.Redis.from_url(redis_url)
    job_id = submit_inline(r, Settings(redis_url=redis_url), "owner", "model-x", SPEC, _items(1), is_sync=True)
    assert Queue(queues.queue_pair("model-x").sync, connection=r).job_ids == [chunk_rq_id(job_id, 0)]


def test_dataset_job_enqueues_a_plan(redis_url):
    r = redis.Redis.from_url(redis_url)
    job_id = submit_dataset(r, Settings(redis_url=redis_url), "o", "m", SPEC, "s3://bkt/in/", "s3://bkt/out/")
    assert Queue(queues.queue_pair("m").batch, connection=r).job_ids == [f"{job_id}-plan"]
    assert records.load_view(r, job_id).progress.total is None


def test_payload_is_validated_before_enqueue():
    with pytest.raises(ValidationError):
        ChunkPayload(job_id="j", chunk_index=0, model="m", scoring=SPEC, items=_items(2), num_rows=3)
    with pytest.raises(ValidationError):
        ChunkPayload(job_id="j", chunk_index=0, model="m", scoring=SPEC, num_rows=0)


def test_cancel_removes_queued_chunks_and_settles_them(redis_url):
    r = redis.Redis.from_url(redis_url)
    settings = Settings(redis_url=redis_url, chunk_num_rows=2)
    job_id = submit_inline(r, settings, "owner", "m", SPEC, _items(6))
    assert cancel(r, settings, job_id)
    assert not cancel(r, settings, job_id)
    assert Queue(queues.queue_pair("m").batch, connection=r).count == 0
    assert int(r.get(queues.QUEUED_ROWS_KEY)) == 0
    assert records.load_view(r, job_id).status == JobStatus.CANCELLED

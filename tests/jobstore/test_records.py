"""Job records on a real Redis: chunks settle once, the queued-rows gauge, terminal states."""

import pytest
import redis

from contract import queues
from contract.payloads import JobStatus
from jobstore import records
from jobstore.records import ChunkSummary

pytestmark = pytest.mark.redis


def _summary(num_rows, num_failed=0):
    return ChunkSummary(num_rows=num_rows, num_succeeded=num_rows - num_failed, num_failed=num_failed,
                        usage={"content_tokens": 3 * (num_rows - num_failed)})


def test_chunk_settles_once_and_gauge_drops_once(redis_url):
    r = redis.Redis.from_url(redis_url)
    records.create_job(r, "job-a", {"owner": "k", "model": "m", "num_rows": 7, "num_chunks": 2})
    r.incrby(queues.QUEUED_ROWS_KEY, 7)
    assert records.mark_running(r, "job-a")
    assert not records.mark_running(r, "job-a")
    assert records.settle_chunk(r, "job-a", 0, _summary(4, num_failed=1))
    assert not records.settle_chunk(r, "job-a", 0, _summary(4, num_failed=1))  # a retried chunk
    assert int(r.get(queues.QUEUED_ROWS_KEY)) == 3
    assert not records.is_complete(r, "job-a")
    records.settle_chunk(r, "job-a", 1, _summary(3))
    assert records.is_complete(r, "job-a")
    view = records.load_view(r, "job-a")
    assert (view.progress.total, view.progress.done, view.progress.failed) == (7, 7, 1)
    assert view.usage.content_tokens == 18
    assert view.status == JobStatus.RUNNING and view.started_at is not None


def test_finish_is_terminal_and_starts_retention(redis_url):
    r = redis.Redis.from_url(redis_url)
    records.create_job(r, "job-b", {"owner": "k", "model": "m", "num_rows": 1, "num_chunks": 1})
    records.store_results(r, "job-b", 0, b'{"custom_id": "x"}\n')
    assert records.finish(r, "job-b", JobStatus.CANCELLED, ttl=100)
    assert not records.finish(r, "job-b", JobStatus.SUCCEEDED, ttl=100)  # terminal stays terminal
    assert records.load_view(r, "job-b").status == JobStatus.CANCELLED
    assert 0 < r.ttl(queues.job_key("job-b")) <= 100
    assert 0 < r.ttl(queues.results_key("job-b")) <= 100
    assert r.lpop(queues.done_key("job-b")) == b"cancelled"


def test_unknown_job_has_no_view(redis_url):
    assert records.load_view(redis.Redis.from_url(redis_url), "job-missing") is None


def test_a_chunk_summary_round_trips_in_the_shape_the_chunks_hash_holds():
    scored = _summary(4, num_failed=1)
    cancelled = ChunkSummary.for_cancelled(5)
    assert scored.to_json() == b'{"num_rows":4,"num_succeeded":3,"num_failed":1,"usage":{"content_tokens":9}}'
    assert cancelled.to_json() == b'{"num_rows":5,"num_succeeded":0,"num_failed":0,"cancelled":true}'
    for summary in (scored, cancelled, ChunkSummary(num_rows=0, num_succeeded=0, num_failed=0)):
        assert ChunkSummary.from_json(summary.to_json()) == summary
    assert (scored.num_done, scored.cancelled, cancelled.num_done, cancelled.usage) == (4, False, 0, {})


def test_a_cancelled_chunk_counts_its_rows_off_the_gauge_and_adds_no_progress(redis_url):
    r = redis.Redis.from_url(redis_url)
    records.create_job(r, "job-c", {"owner": "k", "model": "m", "num_rows": 5, "num_chunks": 1})
    r.incrby(queues.QUEUED_ROWS_KEY, 5)
    assert records.settle_chunk(r, "job-c", 0, ChunkSummary.for_cancelled(5))
    assert records.chunk_summaries(r, "job-c") == {0: ChunkSummary.for_cancelled(5)}
    assert int(r.get(queues.QUEUED_ROWS_KEY)) == 0 and records.is_complete(r, "job-c")
    view = records.load_view(r, "job-c")
    assert (view.progress.done, view.progress.failed, view.usage.content_tokens) == (0, 0, 0)

"""The batch state machine: each status only from the ones before it, stamped once, retention on ending."""

import pytest
import redis

from contract import queues
from contract.batches import BatchCreate, BatchStatus
from jobstore import batches

pytestmark = pytest.mark.redis
S = BatchStatus


def test_transitions_follow_the_state_machine(make_settings):
    r = redis.Redis.from_url(make_settings().redis_url)
    body = BatchCreate(input_file_id="file-x", endpoint="/v1/score", completion_window="24h", metadata={"k": "v"})
    record = batches.create_batch(r, "alice", body, num_lines=3)
    assert record.status is S.VALIDATING and batches.load_batch(r, record.id, owner="bob") is None
    assert not batches.transition(r, record.id, S.COMPLETED, 60)  # not from validating
    assert not batches.transition(r, record.id, S.CANCELLED, 60)
    assert batches.transition(r, record.id, S.IN_PROGRESS, 60, job_id="job-1")
    assert not batches.transition(r, record.id, S.IN_PROGRESS, 60)  # once
    assert batches.transition(r, record.id, S.CANCELLING, 60)
    assert not batches.transition(r, record.id, S.FINALIZING, 60)
    assert r.ttl(queues.batch_key(record.id)) == -1  # no retention clock before it ends
    assert batches.transition(r, record.id, S.CANCELLED, 60, num_completed=1, num_failed=2,
                              usage={"input_tokens": 5, "output_tokens": 0, "total_tokens": 5})
    view = batches.batch_view(r, batches.load_batch(r, record.id))
    assert view.status is S.CANCELLED and view.in_progress_at <= view.cancelling_at <= view.cancelled_at
    assert (view.request_counts.total, view.request_counts.completed, view.request_counts.failed) == (3, 1, 2)
    assert view.usage.input_tokens == 5 and view.metadata == {"k": "v"} and view.completed_at is None
    assert 0 < r.ttl(queues.batch_key(record.id)) <= 60
    assert not batches.transition(r, record.id, S.EXPIRED, 60)  # terminal stays terminal
    assert batches.job_id_of(record.id) == "job-" + record.id.removeprefix("batch_")

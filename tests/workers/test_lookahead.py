"""The look-ahead's states, step by step, on a real Redis with a real (tiny) engine."""

import pytest
import redis
from rq import Queue
from rq.registry import StartedJobRegistry
from worker_helpers import SCORING, make_worker, texts

from contract import queues
from contract.payloads import JobItem
from contract.protocol import ScoringRequest, ScoringSpec
from jobstore.lifecycle import submit_inline
from jobstore.submit import chunk_rq_id
from workers.lookahead import LookAhead

pytestmark = [pytest.mark.redis, pytest.mark.slow]
SPEC = ScoringSpec.model_validate(SCORING)


def _request(prefix: str) -> ScoringRequest:
    return ScoringRequest(messages=[{"role": "user", "content": texts(1, prefix)[0]["text"]}], scoring=SPEC)


def _one_row_jobs(make_settings, engine, num_jobs: int):
    """`num_jobs` one-row jobs on `engine`'s batch queue, and a worker for them: (redis, job ids, worker)."""
    settings = make_settings(chunk_num_rows=1)
    r = redis.Redis.from_url(settings.redis_url)
    job_ids = [submit_inline(r, settings, "alice", engine.model_name, SPEC,
                             [JobItem.model_validate(texts(1, f"j{i}-")[0])]) for i in range(num_jobs)]
    return r, job_ids, make_worker(settings, engine)


def test_a_step_holds_a_job_or_counts_a_row_until_the_budget_is_full(make_settings, service_engine,
                                                                      service_engine_factory):
    first_row, second_row = (service_engine.compile(_request(prefix)).num_tokens for prefix in ("j0-", "j1-"))
    engine = service_engine_factory(first_row + second_row)  # the first row leaves room, the second fills it
    r, job_ids, worker = _one_row_jobs(make_settings, engine, 3)
    ahead = LookAhead(worker.engines, worker._take)
    assert (ahead.model, ahead.held, ahead.num_tokens, ahead.is_full, ahead.is_done) == (None, [], 0, False, False)

    assert ahead.step()  # holds the first job: its model is the batch's; nothing counted yet
    assert ahead.model == engine.model_name and len(ahead.held) == 1 and ahead.num_tokens == 0
    started = StartedJobRegistry(queues.queue_pair(engine.model_name).batch, connection=r)
    assert chunk_rq_id(job_ids[0], 0) in started.get_job_ids()
    assert ahead.step()  # counts its row
    assert ahead.num_tokens == ahead.held[0].num_tokens == first_row and not ahead.is_full
    assert ahead.step() and len(ahead.held) == 2 and not ahead.is_full  # holds the second, uncounted
    assert ahead.step()  # counts it: full
    assert ahead.num_tokens == first_row + second_row and ahead.is_full and ahead.is_done
    assert not ahead.step()  # full: the third job stays queued
    assert [item.job.id for item in ahead.held] == [chunk_rq_id(job_id, 0) for job_id in job_ids[:2]]
    assert Queue(queues.queue_pair(engine.model_name).batch, connection=r).count == 1
    assert not ahead.is_drained


def test_a_look_ahead_that_finds_its_queues_empty_is_drained(make_settings, service_engine):
    _, _, worker = _one_row_jobs(make_settings, service_engine, 1)
    ahead = LookAhead(worker.engines, worker._take)
    ahead.finish()
    assert len(ahead.held) == 1 and ahead.num_tokens == service_engine.compile(_request("j0-")).num_tokens
    assert ahead.is_drained and not ahead.is_full and ahead.is_done


def test_a_closed_look_ahead_takes_no_step_and_keeps_what_it_holds(make_settings, service_engine):
    r, _, worker = _one_row_jobs(make_settings, service_engine, 2)
    ahead = LookAhead(worker.engines, worker._take)
    assert ahead.step()
    ahead.close()
    assert ahead.is_done and not ahead.step()
    assert len(ahead.held) == 1 and ahead.num_tokens == 0  # its row is scored uncounted
    assert Queue(queues.queue_pair(service_engine.model_name).batch, connection=r).count == 1
    ahead.count_rows()  # what the worker does for the sync jobs it adds after the batch is done
    assert ahead.num_tokens == service_engine.compile(_request("j0-")).num_tokens

"""Submitting to RQ: a job's payloads, validated, as RQ jobs on its model's queue pair.

    [ChunkPayload] --enqueue_chunks--> batch queue (sync queue for /v1/score), RQ ids <job id>-c<index>
    PlanPayload    --enqueue_plan-->   batch queue, RQ id <job id>-plan
    every RQ id also goes in the job's RQ ids set (cancel reads it); chunks raise the queued-rows gauge
    reserve_rows (API submits): check-and-raise the gauge in one Lua step, QueueFull past max_queue;
    release_rows gives a reservation back when what it was for was not enqueued

Every payload is validated (pydantic) before it is enqueued; RQ job ids are derived from
the job id and chunk index, so a chunk is the same RQ job across retries. Which payloads a
job is made of, and when, is `jobstore.lifecycle`'s. Pure python.
"""

from __future__ import annotations

import uuid
from contextlib import contextmanager

from redis import Redis
from rq import Callback, Queue, Retry

from contract import queues
from contract.payloads import ChunkPayload, PlanPayload
from contract.settings import Settings

# raise the queued-rows gauge by ARGV[1] only if it stays <= ARGV[2]: {1, rows after} or {0, rows now}
_RESERVE_LUA = """
local queued = tonumber(redis.call('get', KEYS[1]) or '0')
local num_rows = tonumber(ARGV[1])
if queued + num_rows > tonumber(ARGV[2]) then return {0, queued} end
return {1, redis.call('incrby', KEYS[1], num_rows)}
"""


class QueueFull(Exception):
    """Admitting `num_rows` more rows would take the queued rows past `max_queue` (the API's 429)."""

    def __init__(self, num_rows: int, num_queued: int, max_queue: int):
        super().__init__(f"{num_queued} rows are queued; {num_rows} more would pass the limit of {max_queue}")
        self.num_rows, self.num_queued, self.max_queue = num_rows, num_queued, max_queue


def reserve_rows(r: Redis, num_rows: int, max_queue: int) -> None:
    """Raise the queued-rows gauge by `num_rows`, checked against `max_queue` in the same
    step (one Lua script: concurrent submits never take it past the limit); QueueFull if not."""
    is_reserved, num_queued = r.register_script(_RESERVE_LUA)(keys=[queues.QUEUED_ROWS_KEY], args=[num_rows, max_queue])
    if not is_reserved:
        raise QueueFull(num_rows, int(num_queued), max_queue)


def release_rows(r: Redis, num_rows: int) -> None:
    """Give back a reservation whose rows were not enqueued (the submit failed or attached)."""
    r.decrby(queues.QUEUED_ROWS_KEY, num_rows)


def new_job_id() -> str:
    return "job-" + uuid.uuid4().hex


def chunk_rq_id(job_id: str, chunk_index: int) -> str:
    return f"{job_id}-c{chunk_index:05d}"


def make_queue(r: Redis, name: str) -> Queue:
    return Queue(name, connection=r, serializer=queues.JsonSerializer)


def enqueue_chunks(
    r: Redis, settings: Settings, chunks: list[ChunkPayload], queue_name: str, pipe=None, is_reserved: bool = False
) -> None:
    """Validate and enqueue chunk payloads; the queued-rows gauge rises by their rows (unless
    `is_reserved`: reserve_rows raised it already). With `pipe` (a transaction), they join it
    and the caller executes it: every entry or none."""
    if not chunks:
        return
    job_id = chunks[0].job_id
    queue = make_queue(r, queue_name)
    datas = [_job_data(settings, queues.CHUNK_FUNC, chunk_rq_id(job_id, c.chunk_index), c) for c in chunks]
    with _transaction(r, pipe) as tx:
        if not is_reserved:
            tx.incrby(queues.QUEUED_ROWS_KEY, sum(c.num_rows for c in chunks))
        tx.sadd(queues.rq_ids_key(job_id), *[d.job_id for d in datas])
        queue.enqueue_many(datas, pipeline=tx)


def enqueue_plan(r: Redis, settings: Settings, plan: PlanPayload, pipe=None) -> None:
    """Validate and enqueue a dataset's plan step on its model's batch queue (`pipe`: as enqueue_chunks)."""
    data = _job_data(settings, queues.PLAN_FUNC, f"{plan.job_id}-plan", plan)
    with _transaction(r, pipe) as tx:
        tx.sadd(queues.rq_ids_key(plan.job_id), data.job_id)
        make_queue(r, queues.queue_pair(plan.model).batch).enqueue_many([data], pipeline=tx)


@contextmanager
def _transaction(r: Redis, pipe):
    """The caller's pipeline as it is, else a new transaction executed on leaving (discarded on an error)."""
    if pipe is not None:
        yield pipe
        return
    with r.pipeline() as tx:
        yield tx
        tx.execute()


def _job_data(settings: Settings, func: str, rq_id: str, payload: ChunkPayload | PlanPayload):
    # only the fields the caller set travel: a default re-sent as if given can change meaning
    checked = type(payload).model_validate(payload.model_dump(mode="json", exclude_unset=True))
    return Queue.prepare_data(
        func,
        kwargs={"payload": checked.model_dump(mode="json", exclude_unset=True)},
        job_id=rq_id,
        timeout=-1,  # the worker's heartbeat, not a wall clock, decides when a job is lost
        result_ttl=settings.result_ttl_s,
        failure_ttl=settings.result_ttl_s,
        retry=Retry(max=settings.max_num_retries) if settings.max_num_retries > 0 else None,
        on_failure=Callback(queues.FAILURE_CALLBACK),
    )

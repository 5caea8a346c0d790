"""Submitting and cancelling jobs: job record first, then RQ jobs on the model's queue pair.

    inline items --chunk by chunk_num_rows--> ChunkPayload x N --> batch queue (sync queue for /v1/score)
    batch lines (RequestItem: each its own request) --> ChunkPayload(requests) x N --> batch queue
    S3 input     --> PlanPayload --> batch queue --worker lists and cuts--> ChunkPayload x N

Every payload is validated (pydantic) before it is enqueued; RQ job ids are derived from
the job id and chunk index, so a chunk is the same RQ job across retries. Pure python.
"""

from __future__ import annotations

import uuid

from redis import Redis
from rq import Callback, Queue, Retry
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.job import JobStatus as RqStatus

from contract import queues
from contract.payloads import ChunkPayload, JobItem, JobStatus, PlanPayload, RequestItem
from contract.protocol import PackRef, ScoringSpec
from contract.settings import Settings
from jobstore import owner_index, records


def new_job_id() -> str:
    return "job-" + uuid.uuid4().hex


def chunk_rq_id(job_id: str, chunk_index: int) -> str:
    return f"{job_id}-c{chunk_index:05d}"


def make_queue(r: Redis, name: str) -> Queue:
    return Queue(name, connection=r, serializer=queues.JsonSerializer)


def enqueue_chunks(r: Redis, settings: Settings, chunks: list[ChunkPayload], queue_name: str) -> None:
    """Validate and enqueue chunk payloads; the queued-rows gauge rises by their rows."""
    if not chunks:
        return
    job_id = chunks[0].job_id
    queue = make_queue(r, queue_name)
    datas = [_job_data(settings, queues.CHUNK_FUNC, chunk_rq_id(job_id, c.chunk_index), c) for c in chunks]
    with r.pipeline() as pipe:
        pipe.incrby(queues.QUEUED_ROWS_KEY, sum(c.num_rows for c in chunks))
        pipe.sadd(queues.rq_ids_key(job_id), *[d.job_id for d in datas])
        queue.enqueue_many(datas, pipeline=pipe)
        pipe.execute()


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


def submit_inline(
    r: Redis,
    settings: Settings,
    owner: str,
    model: str,
    scoring: ScoringSpec,
    items: list[JobItem],
    debug: bool = False,
    is_sync: bool = False,
    job_id: str | None = None,
    packs: list[PackRef] = (),
) -> str:
    """One job of inline rows; sync jobs (/v1/score, chat) go to the priority queue."""
    job_id = job_id or new_job_id()
    size = settings.chunk_num_rows
    chunks = [
        ChunkPayload(
            job_id=job_id,
            chunk_index=index,
            model=model,
            scoring=scoring,
            **({"packs": list(packs)} if packs else {}),  # unset when none: payloads travel exclude_unset
            debug=debug,
            items=items[start : start + size],
            num_rows=len(items[start : start + size]),
        )
        for index, start in enumerate(range(0, len(items), size))
    ]
    fields = {"owner": owner, "model": model, "kind": "sync" if is_sync else "inline"}
    fields |= {"num_rows": len(items), "num_chunks": len(chunks)}
    records.create_job(r, job_id, fields)
    if not is_sync:  # /v1/score and chat calls are not listed in GET /v1/jobs
        owner_index.add(r, owner_index.JOBS, owner, job_id)
    pair = queues.queue_pair(model)
    enqueue_chunks(r, settings, chunks, pair.sync if is_sync else pair.batch)
    return job_id


def submit_requests(
    r: Redis, settings: Settings, owner: str, model: str, rows: list[RequestItem], job_id: str, batch_id: str,
) -> str:
    """One job of rows that carry their own requests (a batch's valid lines), on the model's batch queue."""
    size = settings.chunk_num_rows
    chunks = [
        ChunkPayload(job_id=job_id, chunk_index=index, model=model, requests=rows[start : start + size],
                     num_rows=len(rows[start : start + size]))
        for index, start in enumerate(range(0, len(rows), size))
    ]
    fields = {"owner": owner, "model": model, "kind": "batch", "batch_id": batch_id}
    records.create_job(r, job_id, fields | {"num_rows": len(rows), "num_chunks": len(chunks)})
    owner_index.add(r, owner_index.JOBS, owner, job_id)
    enqueue_chunks(r, settings, chunks, queues.queue_pair(model).batch)
    return job_id


def submit_dataset(
    r: Redis, settings: Settings, owner: str, model: str, scoring: ScoringSpec, input_uri: str, output_uri: str,
    debug: bool = False, job_id: str | None = None, packs: list[PackRef] = (),
) -> str:
    """One dataset job: a plan step lists the input and enqueues the chunks."""
    job_id = job_id or new_job_id()
    plan = PlanPayload(
        job_id=job_id, model=model, scoring=scoring, debug=debug, input=input_uri, output=output_uri,
        chunk_num_rows=settings.chunk_num_rows,
        **({"packs": list(packs)} if packs else {}),  # unset when none: payloads travel exclude_unset
    )
    fields = {"owner": owner, "model": model, "kind": "dataset", "input": input_uri, "output": output_uri}
    records.create_job(r, job_id, fields)
    owner_index.add(r, owner_index.JOBS, owner, job_id)
    data = _job_data(settings, queues.PLAN_FUNC, f"{job_id}-plan", plan)
    with r.pipeline() as pipe:
        pipe.sadd(queues.rq_ids_key(job_id), data.job_id)
        make_queue(r, queues.queue_pair(model).batch).enqueue_many([data], pipeline=pipe)
        pipe.execute()
    return job_id


def cancel(r: Redis, settings: Settings, job_id: str) -> bool:
    """Cancel an active job: queued chunks leave their queue and settle as cancelled."""
    if not records.finish(r, job_id, JobStatus.CANCELLED, settings.result_ttl_s):
        return False
    rq_ids = sorted(member.decode() for member in r.smembers(queues.rq_ids_key(job_id)))
    for rq_id in rq_ids:
        try:
            job = Job.fetch(rq_id, connection=r, serializer=queues.JsonSerializer)
        except NoSuchJobError:
            continue
        if job.get_status() != RqStatus.QUEUED:
            continue  # running chunks finish; the worker skips chunks of a cancelled job
        job.cancel()
        settle_cancelled(r, job.kwargs["payload"])
    return True


def settle_cancelled(r: Redis, payload: dict) -> None:
    if "chunk_index" not in payload:
        return  # a plan step: nothing was counted for it
    summary = {"num_rows": payload["num_rows"], "num_succeeded": 0, "num_failed": 0, "cancelled": True}
    records.settle_chunk(r, payload["job_id"], payload["chunk_index"], summary)

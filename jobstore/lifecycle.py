"""A job's life in the store: create, plan, settle each chunk (scored, dead or cancelled),
finalize, cancel. Every step that moves a job or a chunk is here; no engine.

    (a job's record, its owner index entry and its queue entries are one MULTI/EXEC: a
    payload that cannot be serialized or a failed write leaves no record behind)
    submit_inline:  rows reserved under max_queue (submit.reserve_rows, QueueFull; given back if
                    the write fails) -> record (queued) -> ChunkPayload x N (chunk_num_rows rows
                    each) -> batch | sync queue (a sync call's own path: jobstore.sync_jobs)
    submit_requests: record (queued) -> ChunkPayload(requests: each row its own request, a
                    batch's valid lines) x N -> batch queue (counted, not refused: the batch
                    was admitted when it was created)
    submit_dataset: record (queued) -> PlanPayload -> batch queue
    plan_dataset:   running -> list the input, cut it (datasets.plan_chunks) -> ChunkPayload x N
                    -> batch queue (counted, not refused: the job was admitted at submit); an
                    S3 error ends the job failed, with the reason
    load_chunk:     cancelled? -> running -> ChunkWork (chunks.read_rows)
                      ... a worker fills each row's response or error (workers.tasks.score_rows) ...
    settle_chunk:   rows -> results (chunks.write_rows) -> ChunkSummary, recorded once
                    -> finalize_if_complete: every chunk settled -> on_complete (the workers
                       pass the job's calibration) -> manifest (datasets) -> succeeded
                    an S3 write that fails after the client's retries: the rows settle as
                    error rows naming the failure, kept in Redis (chunks.keep_unwritten); the
                    manifest failing: the job ends failed, its counts kept
    record_dead_chunk (RQ gave up on a chunk) -> dead list -> settle_dead_chunks: an error row
                    per input row -> settle_chunk (a dead plan step: the job ends failed)
    cancel:         cancelled -> queued chunks leave their queue and settle as never run

A chunk settles once (records.settle_chunk): a chunk re-run after a dead worker rewrites its
rows but never counts twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import orjson
from botocore.exceptions import BotoCoreError, ClientError
from redis import Redis
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.job import JobStatus as RqStatus

from contract import queues
from contract.payloads import ChunkPayload, JobItem, JobSpec, JobStatus, PlanPayload, RequestItem
from contract.protocol import PackRef, ScoringSpec
from contract.s3_uri import S3Access, S3AccessDenied, S3Uri
from contract.settings import Settings
from jobstore import chunks, datasets, owner_index, records
from jobstore.chunks import ChunkWork
from jobstore.records import ChunkSummary
from jobstore.s3 import iter_lines, list_dataset_keys, put_bytes
from jobstore.submit import enqueue_chunks, enqueue_plan, new_job_id, release_rows, reserve_rows

log = logging.getLogger(__name__)

S3_ERRORS = (ClientError, BotoCoreError, S3AccessDenied)  # an S3 call that failed after the client's retries, or refused
PLAN_ENQUEUE_BATCH = 256  # chunk jobs per Redis round trip while planning
OnComplete = Callable[[Redis, object, str, dict], None]
"""(redis, s3 client, job id, job record): run once a job's last chunk has settled, before the
job is marked succeeded (workers.job_calibration.calibrate_finished_job)."""

# ---- create --------------------------------------------------------------------------------


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
    spec = _spec(model, scoring, debug, packs).spec_fields()
    size = settings.chunk_num_rows
    payloads = [
        ChunkPayload(job_id=job_id, chunk_index=index, **spec, items=items[start : start + size],
                     num_rows=len(items[start : start + size]))
        for index, start in enumerate(range(0, len(items), size))
    ]
    fields = {"owner": owner, "model": model, "kind": "sync" if is_sync else "inline"}
    fields |= {"num_rows": len(items), "num_chunks": len(payloads)}
    pair = queues.queue_pair(model)
    reserve_rows(r, len(items), settings.max_queue)  # QueueFull past max_queue: nothing written
    try:
        with r.pipeline() as pipe:  # the record with its queue entries, or nothing
            records.create_job(r, job_id, fields, pipe)
            if not is_sync:  # /v1/score and chat calls are not listed in GET /v1/jobs
                owner_index.add(r, owner_index.JOBS, owner, job_id, pipe)
            enqueue_chunks(r, settings, payloads, pair.sync if is_sync else pair.batch, pipe, is_reserved=True)
            pipe.execute()
    except BaseException:
        release_rows(r, len(items))
        raise
    return job_id


def submit_requests(
    r: Redis, settings: Settings, owner: str, model: str, rows: list[RequestItem], job_id: str, batch_id: str,
) -> str:
    """One job of rows that carry their own requests (a batch's valid lines), on the model's batch queue."""
    size = settings.chunk_num_rows
    payloads = [
        ChunkPayload(job_id=job_id, chunk_index=index, model=model, requests=rows[start : start + size],
                     num_rows=len(rows[start : start + size]))
        for index, start in enumerate(range(0, len(rows), size))
    ]
    fields = {"owner": owner, "model": model, "kind": "batch", "batch_id": batch_id}
    with r.pipeline() as pipe:  # the record with its queue entries, or nothing
        records.create_job(r, job_id, fields | {"num_rows": len(rows), "num_chunks": len(payloads)}, pipe)
        owner_index.add(r, owner_index.JOBS, owner, job_id, pipe)
        enqueue_chunks(r, settings, payloads, queues.queue_pair(model).batch, pipe)
        pipe.execute()
    return job_id


def submit_dataset(
    r: Redis, settings: Settings, owner: str, model: str, scoring: ScoringSpec, input_uri: str, output_uri: str,
    debug: bool = False, job_id: str | None = None, packs: list[PackRef] = (), grants: S3Access | None = None,
) -> str:
    """One dataset job: a plan step lists the input and enqueues the chunks. `grants`: the
    submitting key's S3 grants, checked again at every S3 call of the job."""
    job_id = job_id or new_job_id()
    access = grants and S3Access.for_job(input_uri, output_uri, list(grants.read), list(grants.write))
    plan = PlanPayload(job_id=job_id, **_spec(model, scoring, debug, packs).spec_fields(), input=input_uri,
                       output=output_uri, chunk_num_rows=settings.chunk_num_rows,
                       **({"access": access} if access else {}))
    fields = {"owner": owner, "model": model, "kind": "dataset", "input": input_uri, "output": output_uri,
              "s3_access": plan.s3_access().to_json()}
    with r.pipeline() as pipe:  # the record with its plan step, or nothing
        records.create_job(r, job_id, fields, pipe)
        owner_index.add(r, owner_index.JOBS, owner, job_id, pipe)
        enqueue_plan(r, settings, plan, pipe)
        pipe.execute()
    return job_id


def _spec(model: str, scoring: ScoringSpec, debug: bool, packs: list[PackRef]) -> JobSpec:
    # packs unset when none: payloads travel exclude_unset
    return JobSpec(model=model, scoring=scoring, debug=debug, **({"packs": list(packs)} if packs else {}))


# ---- plan ----------------------------------------------------------------------------------


def plan_dataset(r: Redis, s3, settings: Settings, payload: PlanPayload, on_complete: OnComplete | None = None) -> dict:
    """List the input, cut it into chunks, enqueue them; S3 errors fail the job with a reason."""
    record = records.load_job(r, payload.job_id)
    if record is None or records.status_of(record) == JobStatus.CANCELLED:
        return {"cancelled": True}
    records.mark_running(r, payload.job_id)
    try:
        payloads, num_rows = _cut(s3, payload)
    except S3_ERRORS as error:
        records.finish(r, payload.job_id, JobStatus.FAILED, settings.result_ttl_s, f"reading the input: {error}")
        return {"error": str(error)}
    records.set_plan(r, payload.job_id, num_rows, len(payloads))
    # a re-run plan (its worker died) resumes after the chunks it already enqueued
    num_enqueued = int(record.get("num_enqueued") or 0)
    queue_name = queues.queue_pair(payload.model).batch
    for start in range(num_enqueued, len(payloads), PLAN_ENQUEUE_BATCH):
        enqueue_chunks(r, settings, payloads[start : start + PLAN_ENQUEUE_BATCH], queue_name)
        r.hset(queues.job_key(payload.job_id), "num_enqueued", min(start + PLAN_ENQUEUE_BATCH, len(payloads)))
    finalize_if_complete(r, s3, settings, payload.job_id, on_complete)
    return {"num_rows": num_rows, "num_chunks": len(payloads)}


def _cut(s3, payload: PlanPayload) -> tuple[list[ChunkPayload], int]:
    """The input's objects (every listed key checked against the grants before it is read), cut."""
    access = payload.s3_access()
    input_uri = access.check_read(S3Uri.from_stored(payload.input))
    keys = list_dataset_keys(s3, input_uri)
    if not keys:
        raise ClientError({"Error": {"Code": "NoObjects", "Message": f"no objects at {payload.input}"}}, "List")
    spec = payload.spec_fields()
    payloads: list[ChunkPayload] = []
    owners: dict[str, tuple[str, int]] = {}  # custom_id -> the row that owns it (datasets.mark_repeats)
    for key in keys:
        uri = access.check_read(S3Uri(input_uri.bucket, key))
        repeats: dict[int, str] = {}
        lines = datasets.mark_repeats(uri, iter_lines(s3, uri), owners, repeats)
        cut = list(datasets.plan_chunks(uri, lines, payload.chunk_num_rows))
        for source, num_rows in datasets.with_repeats(cut, repeats):
            payloads.append(ChunkPayload(job_id=payload.job_id, chunk_index=len(payloads), **spec, source=source,
                                         output=payload.output, num_rows=num_rows, access=access))
    return payloads, sum(c.num_rows for c in payloads)


# ---- a chunk: load, settle, finalize -------------------------------------------------------


def load_chunk(r: Redis, s3, payload: ChunkPayload) -> ChunkWork:
    """The chunk's rows to score, and its job marked running; none for a cancelled job."""
    record = records.load_job(r, payload.job_id)
    if record is None or records.status_of(record) == JobStatus.CANCELLED:
        return ChunkWork(payload, is_cancelled=True)
    records.mark_running(r, payload.job_id)
    return ChunkWork(payload, chunks.read_rows(s3, payload))


def settle_chunk(
    r: Redis, s3, settings: Settings, work: ChunkWork, worker_name: str, on_complete: OnComplete | None = None
) -> ChunkSummary:
    """Write the chunk's rows, record its summary once, finish the job when it was the last."""
    payload = work.payload
    if work.is_cancelled:
        summary = ChunkSummary.for_cancelled(payload.num_rows)
        records.settle_chunk(r, payload.job_id, payload.chunk_index, summary)
        return summary
    try:
        chunks.write_rows(r, s3, payload, work.rows)
    except S3_ERRORS as error:  # after the client's retries: the rows settle as errors, kept in Redis
        log.warning("job %s chunk %d: writing its rows failed: %s", payload.job_id, payload.chunk_index, error)
        chunks.keep_unwritten(r, payload, work.rows, f"writing the results to {payload.output} failed: {error}")
    summary = chunks.summarize(work.rows)
    records.add_passes(r, payload.job_id, chunks.pass_names(work.rows, worker_name))
    records.settle_chunk(r, payload.job_id, payload.chunk_index, summary)
    finalize_if_complete(r, s3, settings, payload.job_id, on_complete)
    return summary


def finalize_if_complete(r: Redis, s3, settings: Settings, job_id: str, on_complete: OnComplete | None = None) -> bool:
    """When every chunk settled: `on_complete` (the job's calibration, from the workers), the
    manifest (datasets), then the job succeeded; a client never sees it succeeded before them."""
    if not records.is_complete(r, job_id):
        return False
    record = records.load_job(r, job_id)
    if record is None or records.status_of(record).is_terminal:
        return False
    ttl = settings.sync_result_ttl_s if record.get("kind") == "sync" else settings.result_ttl_s
    try:
        if on_complete is not None:
            on_complete(r, s3, job_id, record)
        if record.get("output"):
            _write_manifest(r, s3, job_id, record)
    except S3_ERRORS as error:  # the rows are settled and counted; the job ends, failed, saying why
        log.warning("job %s: finishing on S3 failed: %s", job_id, error)
        return records.finish(r, job_id, JobStatus.FAILED, ttl, f"writing the job's S3 output failed: {error}")
    if records.kept_chunks(r, job_id) and record.get("output"):
        return records.finish(r, job_id, JobStatus.FAILED, ttl, "some chunks could not be written to S3; their"
                              " rows are error rows in the service's results (GET /v1/jobs/{id}/results)")
    return records.finish(r, job_id, JobStatus.SUCCEEDED, ttl)


def _write_manifest(r: Redis, s3, job_id: str, record: dict) -> None:
    output = S3Uri.from_stored(record["output"])
    manifest = datasets.build_manifest(job_id, record["input"], output, records.chunk_summaries(r, job_id),
                                       records.kept_chunks(r, job_id))
    body = orjson.dumps(manifest, option=orjson.OPT_INDENT_2)
    put_bytes(s3, records.s3_access_of(record).check_write(datasets.manifest_uri(output)), body, "application/json")


# ---- dead chunks: RQ gave up on them, they still settle ------------------------------------


def record_dead_chunk(r: Redis, payload: dict, reason: str) -> None:
    """Hand a chunk that will never run again to the next worker's maintenance (only Redis:
    RQ's registry cleanup calls this wherever it runs)."""
    r.rpush(queues.DEAD_CHUNKS_KEY, orjson.dumps({"payload": payload, "reason": reason}))


def settle_dead_chunks(r: Redis, s3, settings: Settings, worker_name: str, on_complete: OnComplete | None = None) -> int:
    """Settle every recorded dead chunk (a plan step's entry is dropped); how many were taken."""
    num_taken = 0
    while (entry := r.lindex(queues.DEAD_CHUNKS_KEY, 0)) is not None:
        try:
            item = orjson.loads(entry)
            payload = ChunkPayload.model_validate(item["payload"]) if "chunk_index" in item["payload"] else None
        except (ValueError, KeyError, TypeError):  # an entry no payload model reads: dropped, not retried forever
            log.exception("dropping a dead-chunk entry that cannot be read: %r", entry[:200])
            payload = item = None
        if payload is not None:
            settle_dead_chunk(r, s3, settings, payload, item["reason"], worker_name, on_complete)
        elif item is not None and "job_id" in item["payload"]:
            _end_unplanned(r, settings, item["payload"]["job_id"], item["reason"])
        r.lrem(queues.DEAD_CHUNKS_KEY, 1, entry)
        num_taken += 1
    return num_taken


def _end_unplanned(r: Redis, settings: Settings, job_id: str, reason: str) -> None:
    """A plan step that will never run again: its job, if it never got a plan, ends failed
    (a planned job's chunks settle it)."""
    record = records.load_job(r, job_id)
    if record is not None and not record.get("num_chunks"):
        records.finish(r, job_id, JobStatus.FAILED, settings.result_ttl_s, f"planning the job failed: {reason}")


def settle_dead_chunk(
    r: Redis, s3, settings: Settings, payload: ChunkPayload, reason: str, worker_name: str,
    on_complete: OnComplete | None = None,
) -> None:
    """One error row per input row of a chunk that could not be scored (input unreadable: one
    per row counted at planning, without its custom_id)."""
    try:
        rows = chunks.unscored_rows(s3, payload, reason)
    except S3_ERRORS as error:
        rows = chunks.unread_rows(payload, f"{reason}; reading its input failed: {error}")
    work = ChunkWork(payload, rows)
    settle_chunk(r, s3, settings, work, worker_name, on_complete)


# ---- cancel --------------------------------------------------------------------------------


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
        _settle_cancelled(r, job.kwargs["payload"])
    return True


def _settle_cancelled(r: Redis, payload: dict) -> None:
    if "chunk_index" not in payload:
        return  # a plan step: nothing was counted for it
    records.settle_chunk(r, payload["job_id"], payload["chunk_index"], ChunkSummary.for_cancelled(payload["num_rows"]))

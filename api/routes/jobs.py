"""Jobs: submit (inline rows or an S3 dataset), status, streamed JSONL results, cancel.

    POST /v1/jobs [Idempotency-Key] -> 201 JobView (200 with the same job on a retried key)
    GET  /v1/jobs?after&limit       -> JobList (the caller's jobs, newest first)
    GET  /v1/jobs/{id}              -> JobView (404 for another key's job)
    GET  /v1/jobs/{id}/calibration  -> the labelled rows' calibration report (JSON; 404 without labels)
    GET  /v1/jobs/{id}/results      -> JSONL rows {custom_id, response} | {custom_id, error}
                                       (a sync call's job: `response` is its route's reply, api.sync_replies;
                                       a cancelled job: batch_p from its returned rows, api.cancelled_results)
    POST /v1/jobs/{id}/cancel       -> JobView
S3 locations are checked against the key's allow-lists (403) before any S3 call; results and
reports are read back only inside the job's own output (S3Access.check_read_back).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator

import orjson
from botocore.exceptions import BotoCoreError, ClientError
from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import StreamingResponse

from api.cancelled_results import own_batch_columns
from api.deps import KeyDep, PacksDep, RedisDep, S3Dep, SettingsDep
from api.errors import ApiError
from api.json_body import StrictJsonRoute
from api.served import resolve_model
from api.sync_calls import check_packs
from api.sync_replies import ReplyContext, sync_row
from contract import queues
from contract.payloads import JobCreate, JobList, JobStatus, JobView
from contract.s3_uri import S3Access, S3Uri, is_allowed, parse_s3_uri
from contract.settings import ApiKey, Settings
from jobstore import datasets, owner_index, records
from jobstore.lifecycle import cancel, submit_dataset, submit_inline
from jobstore.s3 import get_bytes, is_missing
from jobstore.submit import new_job_id

router = APIRouter(route_class=StrictJsonRoute)


@router.post("/v1/jobs", status_code=201, response_model=JobView,
             responses={200: {"model": JobView, "description": "The job an earlier submit with this"
                              " Idempotency-Key made (the same body): nothing new is queued"}})
def create_job(
    body: JobCreate, key: KeyDep, r: RedisDep, settings: SettingsDep, packs: PacksDep, response: Response,
    idempotency_key: str | None = Header(default=None, max_length=256),
) -> JobView:
    """Submit a job; a retried submit with the same Idempotency-Key returns the same job."""
    _check_s3_access(key, body)
    check_packs(packs, body)
    if body.items is not None and len(body.items) > settings.max_num_inline_items:
        raise ApiError(413, f"items: {len(body.items)} items; at most {settings.max_num_inline_items} inline,"
                       " use an S3 input for more", param="items")
    model = resolve_model(r, settings, body.model)
    job_id = new_job_id()
    if idempotency_key:
        existing = _claim_idempotency_key(r, settings, key.name, idempotency_key, body, job_id)
        if existing is not None:
            response.status_code = 200
            return _view_or_404(r, existing, key)
    try:
        if body.items is not None:
            submit_inline(r, settings, key.name, model, body.scoring, body.items, body.debug, job_id=job_id,
                          packs=body.packs)
        else:
            submit_dataset(r, settings, key.name, model, body.scoring, body.input.s3, body.output.s3, body.debug,
                           job_id=job_id, packs=body.packs,
                           grants=S3Access.for_job(None, None, key.s3_read, key.s3_write))
    except BaseException:  # e.g. the queue is full (429): the key names no job, a retry may submit
        if idempotency_key:
            r.delete(queues.idempotency_key(key.name, idempotency_key))
        raise
    return records.load_view(r, job_id)


def _check_s3_access(key: ApiKey, body: JobCreate) -> None:
    if body.input is not None and not is_allowed(parse_s3_uri(body.input.s3), key.s3_read):
        raise ApiError(403, f"input: this key may not read {body.input.s3}", param="input.s3")
    if body.output is not None and not is_allowed(parse_s3_uri(body.output.s3), key.s3_write):
        raise ApiError(403, f"output: this key may not write {body.output.s3}", param="output.s3")


def _claim_idempotency_key(r, settings: Settings, owner: str, idem: str, body: JobCreate, job_id: str) -> str | None:
    """None when this call owns the key (go on with `job_id`), else the job it already names."""
    digest = hashlib.sha256(body.model_dump_json().encode()).hexdigest()
    redis_key = queues.idempotency_key(owner, idem)
    if r.set(redis_key, f"{job_id} {digest}", nx=True, ex=settings.idempotency_ttl_s):
        return None
    existing_id, existing_digest = r.get(redis_key).decode().split(" ")
    if existing_digest != digest:
        raise ApiError(409, "Idempotency-Key was used with a different body", param="Idempotency-Key")
    return existing_id


def _load_owned(r, job_id: str, key: ApiKey) -> dict:
    record = records.load_job(r, job_id)
    if record is None or record.get("owner") != key.name:
        raise ApiError(404, f"no job {job_id!r}")
    return record


def _view_or_404(r, job_id: str, key: ApiKey) -> JobView:
    _load_owned(r, job_id, key)
    return records.load_view(r, job_id)


@router.get("/v1/jobs", response_model=JobList)
def list_jobs(key: KeyDep, r: RedisDep, settings: SettingsDep, after: str | None = None,
              limit: int = Query(default=20, ge=1)) -> JobList:
    """The caller's jobs, newest first (not its /v1/score calls); `after=last_id` pages on."""
    if limit > settings.max_list_limit:
        raise ApiError(422, f"limit: at most {settings.max_list_limit}", param="limit")
    try:
        return owner_index.list_jobs(r, key.name, after, limit)
    except owner_index.UnknownCursorError:
        raise ApiError(404, f"after: no job {after!r} of this key", param="after") from None


@router.get("/v1/jobs/{job_id}", response_model=JobView)
def get_job(job_id: str, key: KeyDep, r: RedisDep) -> JobView:
    """Status, progress (total/done/failed), timestamps and usage."""
    return _view_or_404(r, job_id, key)


@router.post("/v1/jobs/{job_id}/cancel", response_model=JobView)
def cancel_job(job_id: str, key: KeyDep, r: RedisDep, settings: SettingsDep) -> JobView:
    """Stop the remaining chunks; rows already settled stay."""
    _load_owned(r, job_id, key)
    cancel(r, settings, job_id)
    return records.load_view(r, job_id)


@router.get("/v1/jobs/{job_id}/calibration",
            responses={200: {"content": {"application/json": {"schema": {"type": "object"}}},
                             "description": "prompt_packs.job_calibration.job_report's JSON"}})
def job_calibration(job_id: str, key: KeyDep, r: RedisDep, s3: S3Dep, settings: SettingsDep) -> Response:
    """The calibration report of a job whose rows carried `labels`, once it has ended: per
    two-option query, raw, contextual, batch and a nested labelled fit side by side. A dataset
    job's is `<output>/calibration/report.json` (its Markdown and diagrams beside it)."""
    record = _load_owned(r, job_id, key)
    status = records.status_of(record)
    if not status.is_terminal:
        raise ApiError(409, f"job {job_id} is {status.value}; its calibration report is written when it has ended")
    if record.get("calibration_report"):
        return Response(record["calibration_report"], media_type="application/json")
    if record.get("output"):
        uri = S3Uri.from_stored(record["output"]).join("calibration/report.json")
        report = _s3_report(s3, records.s3_access_of(record).check_read_back(uri), settings)
        if report is not None:
            return Response(report, media_type="application/json")
    raise ApiError(404, f"job {job_id} has no calibration report: none of its rows carried labels, or it"
                        " ended before every row was scored")


def _s3_report(s3, uri: S3Uri, settings: Settings) -> bytes | None:
    """The object's bytes; None when there is none (503 while S3 cannot be read)."""
    try:
        return get_bytes(s3, uri)
    except ClientError as error:
        if is_missing(error):
            return None
        failure = error
    except BotoCoreError as error:
        failure = error
    raise ApiError(503, f"the report cannot be read from S3 now ({failure}); try again",
                   headers={"Retry-After": str(settings.retry_after_s)})


@router.get("/v1/jobs/{job_id}/results")
def job_results(job_id: str, key: KeyDep, r: RedisDep, s3: S3Dep, settings: SettingsDep) -> StreamingResponse:
    """The result rows as JSONL, streamed chunk by chunk in input order (503 while S3 cannot be read)."""
    record = _load_owned(r, job_id, key)
    status = records.status_of(record)
    if not status.is_terminal:
        raise ApiError(409, f"job {job_id} is {status.value}; results are ready when it has ended")
    num_chunks = int(record.get("num_chunks") or 0)
    if record.get("route"):  # a sync call's job: its one row holds the route's reply
        rows = [_sync_row(r, settings, record, key, b"".join(records.iter_inline_results(r, job_id, num_chunks)))]
        return StreamingResponse(rows, media_type="application/jsonl")
    if record.get("output"):
        output = S3Uri.from_stored(record["output"])
        summaries = records.chunk_summaries(r, job_id)
        written = [index for index in sorted(summaries) if not summaries[index].cancelled]

        access = records.s3_access_of(record)

        def read() -> Iterator[bytes]:
            return _dataset_rows(r, s3, settings, job_id, access, output, written)
    else:
        def read() -> Iterator[bytes]:
            return records.iter_inline_results(r, job_id, num_chunks)
    # a cancelled job's rows get batch_p from their own priors, each time they are returned
    rows = own_batch_columns(read, settings.retry_after_s) if status == JobStatus.CANCELLED else read()
    return StreamingResponse(rows, media_type="application/jsonl")


def _sync_row(r, settings: Settings, record: dict, key: ApiKey, jsonl: bytes) -> bytes:
    """The row of a sync call's job with, as its `response`, what the route would have replied."""
    if not jsonl.strip():
        return jsonl
    row = orjson.loads(jsonl.splitlines()[0])
    return orjson.dumps(sync_row(record, row, ReplyContext(r, settings, key.name))) + b"\n"


def _dataset_rows(r, s3, settings: Settings, job_id: str, access: S3Access, output: S3Uri,
                  written: list[int]) -> Iterator[bytes]:
    """Each chunk's rows: from S3 (inside the job's output, `check_read_back`), or from Redis for a
    chunk S3 could not take. The first chunk is read before the response starts, so an S3
    outage is a 503, not a broken stream."""
    def read(index: int) -> bytes:
        return records.stored_results(r, job_id, index) or get_bytes(
            s3, access.check_read_back(datasets.results_uri(output, index)))

    try:
        first = read(written[0]) if written else b""
    except (ClientError, BotoCoreError) as error:
        if isinstance(error, ClientError) and is_missing(error):  # retrying will not help
            uri = datasets.results_uri(output, written[0])
            raise ApiError(410, f"job {job_id}'s results object {uri} is no longer in its output (deleted or"
                                " moved after the job wrote it); its rows cannot be returned") from None
        raise ApiError(503, f"the results cannot be read from S3 now ({error}); try again",
                       headers={"Retry-After": str(settings.retry_after_s)}) from None
    return itertools.chain([first], (read(index) for index in written[1:]))

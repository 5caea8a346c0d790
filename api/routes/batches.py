"""Batches (the OpenAI Batch API) on top of jobs: a batch's valid lines are the rows of one job.

    POST /v1/batches {input_file_id, endpoint, completion_window "24h", metadata?} -> Batch (validating)
    GET  /v1/batches/{id}                -> Batch (404 for another key's batch)
    GET  /v1/batches?after&limit         -> BatchList {data, first_id, last_id, has_more}
    POST /v1/batches/{id}/cancel         -> Batch (cancelling, then cancelled with the finished rows)
Every read also starts the step the batch waits for (api/batch_steps.py), in the background.
"""

from __future__ import annotations

from fastapi import APIRouter, BackgroundTasks, Query, Request

from api.batch_steps import advance, steps_of
from api.deps import KeyDep, SettingsDep
from api.errors import ApiError
from api.json_body import StrictJsonRoute
from api.line_endpoints import ENDPOINTS
from contract.batches import Batch, BatchCreate, BatchList, BatchStatus
from jobstore import batches, files
from jobstore.batches import BatchRecord
from jobstore.owner_index import UnknownCursorError
from jobstore.lifecycle import cancel

router = APIRouter(route_class=StrictJsonRoute)
DEFAULT_LIST_LIMIT = 20  # OpenAI's default for GET /v1/batches


@router.post("/v1/batches", response_model=Batch, response_model_exclude_none=True)
def create_batch(body: BatchCreate, key: KeyDep, request: Request, background: BackgroundTasks) -> Batch:
    """Check the endpoint and the input file (422 naming the field), then validate its lines in the background."""
    steps = steps_of(request.app.state)
    if body.endpoint not in ENDPOINTS:
        raise ApiError(422, f"endpoint: {body.endpoint!r} is not served in batches; give one of {sorted(ENDPOINTS)}",
                       param="endpoint")
    stored = files.load_file(steps.r, body.input_file_id, key.name)
    if stored is None:
        raise ApiError(404, f"input_file_id: no file {body.input_file_id!r} of this key", param="input_file_id")
    if stored.object.purpose != "batch":
        raise ApiError(422, f"input_file_id: the file's purpose is {stored.object.purpose!r}; upload it with"
                       " purpose 'batch'", param="input_file_id")
    limit = steps.settings.max_batch_lines
    if not 0 < stored.num_lines <= limit:
        raise ApiError(422, f"input_file_id: the file has {stored.num_lines} requests; a batch takes 1 to {limit}"
                       " (SPINF_MAX_BATCH_LINES)",
                       param="input_file_id")
    record = batches.create_batch(steps.r, key.name, body, stored.num_lines)
    advance(steps, record, background)
    return batches.batch_view(steps.r, record)


def _owned(request: Request, batch_id: str, owner: str) -> BatchRecord:
    record = batches.load_batch(request.app.state.redis, batch_id, owner)
    if record is None:
        raise ApiError(404, f"no batch {batch_id!r}")
    return record


@router.get("/v1/batches/{batch_id}", response_model=Batch, response_model_exclude_none=True)
def retrieve_batch(batch_id: str, key: KeyDep, request: Request, background: BackgroundTasks) -> Batch:
    record = _owned(request, batch_id, key.name)
    advance(steps_of(request.app.state), record, background)
    return batches.batch_view(request.app.state.redis, record)


@router.get("/v1/batches", response_model=BatchList, response_model_exclude_none=True)
def list_batches(
    key: KeyDep, request: Request, background: BackgroundTasks, settings: SettingsDep, after: str | None = None,
    limit: int = Query(default=DEFAULT_LIST_LIMIT, ge=1),
) -> BatchList:
    if limit > settings.max_list_limit:
        raise ApiError(422, f"limit: at most {settings.max_list_limit}", param="limit")
    steps = steps_of(request.app.state)
    try:
        page, loaded = batches.list_batches(steps.r, key.name, after, limit)
    except UnknownCursorError:
        raise ApiError(404, f"after: no batch {after!r} of this key", param="after") from None
    for record in loaded:
        advance(steps, record, background)
    return page


@router.post("/v1/batches/{batch_id}/cancel", response_model=Batch, response_model_exclude_none=True)
def cancel_batch(batch_id: str, key: KeyDep, request: Request, background: BackgroundTasks) -> Batch:
    """Queued rows are not run; rows in a pass finish; the batch ends `cancelled` with the finished rows."""
    steps = steps_of(request.app.state)
    record = _owned(request, batch_id, key.name)
    status = record.status
    if status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS):
        batches.transition(steps.r, batch_id, BatchStatus.CANCELLING, steps.settings.result_ttl_s)
        if record.get("job_id"):
            cancel(steps.r, steps.settings, record.fields["job_id"])
    elif status not in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
        raise ApiError(409, f"batch {batch_id} is {status.value}; only a validating or in_progress batch is cancelled")
    record = batches.load_batch(steps.r, batch_id)
    advance(steps, record, background)
    return batches.batch_view(steps.r, record)

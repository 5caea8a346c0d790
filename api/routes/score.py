"""POST /v1/score: the scoring contract, synchronous for the caller."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request

from api.deps import KeyDep, RedisDep
from api.errors import ApiError
from api.json_body import StrictJsonRoute
from api.sync_calls import score_sync
from contract.protocol import ScoringRequest, ScoringResponse
from jobstore import records
from prompt_packs.job_calibration import with_batch_columns

router = APIRouter(route_class=StrictJsonRoute)


@router.post("/v1/score", response_model=ScoringResponse, response_model_exclude_none=True)
async def score(request: Request, body: ScoringRequest, key: KeyDep, r: RedisDep) -> dict:
    """Score one content; waits on the priority queue (504 with the job id past the deadline).
    `priors_from_job` names a finished job whose batch priors add batch_p to the reply."""
    priors = _job_priors(r, body.priors_from_job, key.name) if body.priors_from_job else None
    reply = await score_sync(request, key, body)
    if priors is None:
        return reply
    return with_batch_columns([{"response": reply}], priors)[0]["response"]


def _job_priors(r, job_id: str, owner: str) -> dict[str, list[float]]:
    """The job's batch priors, checked before anything is queued (4xx naming the field)."""
    record = records.load_job(r, job_id)
    if record is None or record.get("owner") != owner:
        raise ApiError(404, f"priors_from_job: no job {job_id!r}", param="priors_from_job")
    if "batch_priors" not in record:
        status = records.status_of(record).value
        raise ApiError(409, f"priors_from_job: job {job_id!r} ({status}) has no batch priors: it has not"
                            " succeeded, or none of its queries asked for calibrate \"batch\"", param="priors_from_job")
    return orjson.loads(record["batch_priors"])

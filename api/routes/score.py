"""POST /v1/score: the scoring contract, synchronous for the caller."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request

from api.deps import KeyDep, RedisDep
from api.json_body import StrictJsonRoute
from api.sync_calls import score_sync, sync_call
from api.sync_replies import job_priors, score_reply
from contract.protocol import ScoringRequest
from contract.scoring_results import ScoringResponse

router = APIRouter(route_class=StrictJsonRoute)


@router.post("/v1/score", response_model=ScoringResponse, response_model_exclude_none=True)
async def score(request: Request, body: ScoringRequest, key: KeyDep, r: RedisDep) -> dict:
    """Score one content; waits on the priority queue (504 with the job id past the deadline).
    `priors_from_job` names a finished job whose batch priors add batch_p to the reply."""
    # the priors are checked before anything is queued (4xx naming the field)
    priors = job_priors(r, body.priors_from_job, key.name) if body.priors_from_job else None
    reply_json = orjson.dumps({"priors_from_job": body.priors_from_job}).decode() if body.priors_from_job else ""
    return score_reply(priors, await score_sync(request, key, body, sync_call(request, body, reply_json)))

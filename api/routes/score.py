"""POST /v1/score: the scoring contract, synchronous for the caller."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.deps import KeyDep
from api.sync_calls import score_sync
from contract.protocol import ScoringRequest, ScoringResponse

router = APIRouter()


@router.post("/v1/score", response_model=ScoringResponse, response_model_exclude_none=True)
async def score(request: Request, body: ScoringRequest, key: KeyDep) -> dict:
    """Score one content; waits on the priority queue (504 with the job id past the deadline)."""
    return await score_sync(request, key, body)

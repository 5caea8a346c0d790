"""POST /v1/decide and /v1/decide/shared: option decisions over a state, through /v1/score's sync queue."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.decisions import (
    SINGLE_DECISION_ID,
    DecideRequest,
    SharedDecideRequest,
    check_workloads,
    decision_ids,
    envelope,
    read_decision,
    scoring_request,
)
from api.deps import KeyDep, SettingsDep
from api.json_body import StrictJsonRoute
from api.sync_calls import score_sync

router = APIRouter(route_class=StrictJsonRoute)


@router.post("/v1/decide")
async def decide(request: Request, body: DecideRequest, key: KeyDep, settings: SettingsDep) -> dict:
    """One decision: the option probabilities (order-averaged on request), calibrated for a fitted workload."""
    check_workloads(settings.workloads, [body], "")
    response = await score_sync(request, key, scoring_request(body.model, body.state, [SINGLE_DECISION_ID], [body]))
    result = read_decision(SINGLE_DECISION_ID, body, response, settings.workloads)
    return {"object": "decision", **result, **envelope(response)}


@router.post("/v1/decide/shared")
async def decide_shared(request: Request, body: SharedDecideRequest, key: KeyDep, settings: SettingsDep) -> dict:
    """Several decisions over one state: the state is read once, every decision is a branch."""
    check_workloads(settings.workloads, body.decisions, "decisions[{index}].")
    ids = decision_ids(body.decisions)
    response = await score_sync(request, key, scoring_request(body.model, body.state, ids, body.decisions))
    decisions = [read_decision(i, d, response, settings.workloads) for i, d in zip(ids, body.decisions, strict=True)]
    return {"object": "decision.list", "decisions": decisions, **envelope(response)}

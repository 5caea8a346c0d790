"""POST /v1/decide and /v1/decide/shared: option decisions over a state, through /v1/score's sync queue."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.decisions import (
    SINGLE_DECISION_ID,
    DecideRequest,
    SharedDecideRequest,
    check_workloads,
    decision_ids,
    scoring_request,
)
from api.deps import KeyDep, SettingsDep
from api.json_body import StrictJsonRoute
from api.sync_calls import score_sync, sync_call
from api.sync_replies import decide_reply, shared_reply

router = APIRouter(route_class=StrictJsonRoute)


@router.post("/v1/decide")
async def decide(request: Request, body: DecideRequest, key: KeyDep, settings: SettingsDep) -> dict:
    """One decision: the option probabilities (order-averaged on request), calibrated for a fitted workload."""
    check_workloads(settings.workloads, [body], "")
    scoring = scoring_request(body.model, body.state, [SINGLE_DECISION_ID], [body])
    call = sync_call(request, body, reply_json=body.model_dump_json())  # a poll of its job rebuilds the decision
    return decide_reply(body, await score_sync(request, key, scoring, call), settings)


@router.post("/v1/decide/shared")
async def decide_shared(request: Request, body: SharedDecideRequest, key: KeyDep, settings: SettingsDep) -> dict:
    """Several decisions over one state: the state is read once, every decision is a branch."""
    check_workloads(settings.workloads, body.decisions, "decisions[{index}].")
    scoring = scoring_request(body.model, body.state, decision_ids(body.decisions), body.decisions)
    call = sync_call(request, body, reply_json=body.model_dump_json())
    return shared_reply(body, await score_sync(request, key, scoring, call), settings)

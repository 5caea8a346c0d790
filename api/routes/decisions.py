"""POST /v1/decisions: the OpenAI Decisions API, every question a branch of one read (/v1/score's sync queue)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.deps import KeyDep, SettingsDep
from api.errors import ApiError
from api.json_body import StrictJsonRoute
from api.sync_calls import score_sync, sync_call
from api.sync_replies import decisions_reply
from contract.decisions import DecisionCreate
from prompt_packs.decision_format import DecisionFormatError, decision_request

router = APIRouter(route_class=StrictJsonRoute)


@router.post("/v1/decisions")
async def create_decision(request: Request, body: DecisionCreate, key: KeyDep, settings: SettingsDep) -> dict:
    """Answers in question order: predicate, choice, score or refusal (docs/decisions.md)."""
    try:
        plan = decision_request(body, settings.workloads)
    except DecisionFormatError as error:
        raise ApiError(422, str(error), param=error.field) from None
    call = sync_call(request, plan.request, reply_json=body.model_dump_json(warnings=False))  # a poll of its job rebuilds the answers
    return decisions_reply(body, await score_sync(request, key, plan.request, call), settings)

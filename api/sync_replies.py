"""Each sync route's reply from the scoring response: built by the route, and built again from
the job's record when the job of a 504 is polled (`GET /v1/jobs/{id}/results`).

    route               reply_json (in the job record)   reply
    /v1/score           {"priors_from_job"} or ""        the scoring response (+ batch_p from that job)
    /v1/chat/completions ""                              chat.completion (routes.chat.completion_body)
    /v1/decide          the DecideRequest                {"object": "decision", ...}
    /v1/decide/shared   the SharedDecideRequest          {"object": "decision.list", ...}
    /v1/decisions       the DecisionCreate               the Decision ({answers, model, usage, ...})

A reply that cannot be built again from the record (the body asks what the service no longer
serves, e.g. a workload since removed from SPINF_WORKLOADS) makes the poll's row an error row,
`{"custom_id", "error": {"custom_id", "field", "message"}}` (`sync_row`), never a 500.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import orjson
from pydantic import ValidationError
from redis import Redis

from api.decisions import (
    SINGLE_DECISION_ID,
    DecideRequest,
    SharedDecideRequest,
    decision_ids,
    envelope,
    read_decision,
)
from api.errors import ApiError
from api.routes.chat import completion_body
from contract.decisions import DecisionCreate
from contract.scoring_results import ScoringResponse
from contract.settings import Settings
from jobstore import records
from prompt_packs import decision_answers, decision_format
from prompt_packs.job_calibration import with_batch_columns


@dataclass(frozen=True, slots=True)
class ReplyContext:
    r: Redis
    settings: Settings
    owner: str  # the key whose call it was: a priors job is read as that key's


def job_priors(r: Redis, job_id: str, owner: str) -> dict[str, list[float]]:
    """A finished job's batch priors (`priors_from_job`), 404/409 naming the field."""
    record = records.load_job(r, job_id)
    if record is None or record.get("owner") != owner:
        raise ApiError(404, f"priors_from_job: no job {job_id!r}", param="priors_from_job")
    if "batch_priors" not in record:
        status = records.status_of(record).value
        raise ApiError(409, f"priors_from_job: job {job_id!r} ({status}) has no batch priors: it has not"
                            " succeeded, or none of its queries asked for calibrate \"batch\"", param="priors_from_job")
    return orjson.loads(record["batch_priors"])


def score_reply(priors: dict[str, list[float]] | None, response: dict) -> dict:
    return response if priors is None else with_batch_columns([{"response": response}], priors)[0]["response"]


def decide_reply(body: DecideRequest, response: dict, settings: Settings) -> dict:
    result = read_decision(SINGLE_DECISION_ID, body, response, settings.workloads)
    return {"object": "decision", **result, **envelope(response)}


def shared_reply(body: SharedDecideRequest, response: dict, settings: Settings) -> dict:
    ids = decision_ids(body.decisions)
    decisions = [read_decision(i, d, response, settings.workloads) for i, d in zip(ids, body.decisions, strict=True)]
    return {"object": "decision.list", "decisions": decisions, **envelope(response)}


def decisions_reply(body: DecisionCreate, response: dict, settings: Settings) -> dict:
    """The Decisions API's answer from the scoring response of its one read."""
    plan = decision_format.decision_request(body, settings.workloads)
    return decision_answers.read_decision(body, plan, ScoringResponse.model_validate(response), settings.workloads)


def _score(reply_json: str, response: dict, context: ReplyContext) -> dict:
    priors_job = orjson.loads(reply_json).get("priors_from_job") if reply_json else None
    return score_reply(job_priors(context.r, priors_job, context.owner) if priors_job else None, response)


REPLIES: dict[str, Callable[[str, dict, ReplyContext], dict]] = {
    "/v1/score": _score,
    "/v1/chat/completions": lambda reply_json, response, context: completion_body(response),
    "/v1/decide": lambda reply_json, response, context: decide_reply(
        DecideRequest.model_validate_json(reply_json), response, context.settings),
    "/v1/decide/shared": lambda reply_json, response, context: shared_reply(
        SharedDecideRequest.model_validate_json(reply_json), response, context.settings),
    "/v1/decisions": lambda reply_json, response, context: decisions_reply(
        DecisionCreate.model_validate_json(reply_json), response, context.settings),
}


def route_reply(record: dict[str, str], response: dict, context: ReplyContext) -> dict:
    """The reply the job's route would have sent for `response` (a job without a route: the response)."""
    reply = REPLIES.get(record.get("route", ""))
    return response if reply is None else reply(record.get("reply_json", ""), response, context)


def sync_row(record: dict[str, str], row: dict, context: ReplyContext) -> dict:
    """A sync call's result row with its route's reply as `response`; an error row naming the field
    when that reply cannot be built (a DecisionFormatError, or a stored body that no longer validates)."""
    if "response" not in row:
        return row
    try:
        return row | {"response": route_reply(record, row["response"], context)}
    except ValueError as error:  # DecisionFormatError, pydantic's ValidationError
        field = getattr(error, "field", None) or _first_field(error)
        message = (f"the {record.get('route')} reply cannot be built from this job's response: "
                   f"{str(error).splitlines()[0] if str(error) else type(error).__name__}")
        return {"custom_id": row.get("custom_id"),
                "error": {"custom_id": row.get("custom_id"), "field": field, "message": message}}


def _first_field(error: ValueError) -> str | None:
    if not isinstance(error, ValidationError) or not error.errors():
        return None
    return ".".join(str(part) for part in error.errors()[0]["loc"]) or None

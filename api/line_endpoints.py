"""Batch line endpoints: each a small translator between an endpoint's body and the scoring contract.

    input line body --to_request--> ScoringRequest (a row of the batch's job; BodyError names the field)
    the row's ScoringResponse (JSON) --to_body--> the endpoint's response body (an output line's `body`)

    /v1/score              the scoring contract itself, both ways
    /v1/chat/completions   a chat body with a `scoring` block (or `packs`) -> a chat.completion
    /v1/decisions          a Decisions API body (contract/decisions.py) -> a decision (prompt format
                           decisions-v2: prompt_packs/decision_format.py, decision_answers.py)

An endpoint whose `to_body` needs the line's own body (`reads_body`) has it stored beside the
job's rows until the batch is finalized. Pure functions of the body and the settings.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from api.routes.chat import (
    NO_SCORING,
    ChatRequest,
    chat_scoring_request,
    completion_body,
)
from contract.decisions import DecisionCreate
from contract.protocol import ScoringRequest
from contract.scoring_results import ScoringResponse
from contract.settings import Settings
from prompt_packs.decision_answers import read_decision
from prompt_packs.decision_format import DecisionFormatError, decision_request

_FIELD_PREFIX_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*): ")


class BodyError(ValueError):
    """A line body the endpoint cannot ask: `param` names the field (inside the body)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


@dataclass(frozen=True, slots=True)
class LineEndpoint:
    url: str
    to_request: Callable[[dict, Settings], ScoringRequest]  # raises BodyError
    to_body: Callable[[dict | None, dict, Settings], dict]  # (line body if reads_body, response JSON) -> body
    reads_body: bool = False
    shares_scoring: bool = False  # body["scoring"] is a ScoringSpec: validated once per distinct spec in a batch


def validated(model, body: dict):
    """`model.model_validate(body)`, a BodyError naming the first bad field."""
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise body_error(error) from None


def body_error(error: ValidationError) -> BodyError:
    """The first error, a model validator's "options: ..." folded into the field (as the API's 422s)."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    named = _FIELD_PREFIX_RE.match(message)
    if named and not field.endswith(named.group(1)):
        field, message = ".".join(filter(None, (field, named.group(1)))), message[named.end() :]
    return BodyError(field or "body", message)


def _score_request(body: dict, settings: Settings) -> ScoringRequest:
    return validated(ScoringRequest, body)


def _score_body(body: dict | None, response: dict, settings: Settings) -> dict:
    return response


def _chat_request(body: dict, settings: Settings) -> ScoringRequest:
    try:
        request = chat_scoring_request(validated(ChatRequest, body))
    except ValidationError as error:
        raise body_error(error) from None
    if request is None:
        raise BodyError("scoring", NO_SCORING.removeprefix("scoring: "))
    return request


def _chat_body(body: dict | None, response: dict, settings: Settings) -> dict:
    return completion_body(response)


def _decision_request(body: dict, settings: Settings) -> ScoringRequest:
    try:
        return decision_request(validated(DecisionCreate, body), settings.workloads).request
    except DecisionFormatError as error:
        raise BodyError(error.field, str(error).removeprefix(f"{error.field}: ")) from None


def _decision_body(body: dict | None, response: dict, settings: Settings) -> dict:
    """The line's own body again (its questions name the answers), as POST /v1/decisions answers it."""
    create = DecisionCreate.model_validate(body)
    plan = decision_request(create, settings.workloads)
    return read_decision(create, plan, ScoringResponse.model_validate(response), settings.workloads)


SCORE = LineEndpoint("/v1/score", _score_request, _score_body, shares_scoring=True)
CHAT = LineEndpoint("/v1/chat/completions", _chat_request, _chat_body, shares_scoring=True)
DECISIONS = LineEndpoint("/v1/decisions", _decision_request, _decision_body, reads_body=True)
ENDPOINTS: dict[str, LineEndpoint] = {endpoint.url: endpoint for endpoint in (CHAT, SCORE, DECISIONS)}

"""POST /v1/chat/completions: OpenAI shape; a `scoring` block or `packs` (SDK `extra_body`) is required.

    {model, messages, scoring, packs} -> /v1/score's path -> chat.completion with the scores in
    `scoring` and, as the assistant message, each query's most likely option (JSON), plus each
    named pack's decisions under "packs".
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.deps import KeyDep
from api.errors import ApiError
from api.json_body import StrictJsonRoute
from api.sync_calls import score_sync, sync_call
from contract.decisions import text_or
from contract.protocol import ContentText, Message, PackRef, ScoringRequest, ScoringSpec, Text
from contract.settings import LIMITS

router = APIRouter(route_class=StrictJsonRoute)


class TextPart(BaseModel):
    type: Literal["text"]
    text: ContentText


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")  # name, tool fields: not used for scoring
    role: Literal["system", "developer", "user", "assistant"]
    # picked by type, so an error names the part at fault, not the string branch
    content: text_or(ContentText, Annotated[list[TextPart], Field(max_length=LIMITS.max_messages)])

    def to_message(self) -> Message:
        text = self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)
        return Message(role="system" if self.role == "developer" else self.role, content=text)


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # temperature, max_tokens...: nothing is generated
    model: Text(LIMITS.max_id_chars) | None = None
    messages: list[ChatMessage] = Field(min_length=1, max_length=LIMITS.max_messages)
    scoring: ScoringSpec | None = None
    packs: list[PackRef] = Field(default_factory=list, max_length=LIMITS.max_queries)  # prompt packs, from the same read
    debug: bool = False


NO_SCORING = ("scoring: this service scores options; send a `scoring` block or name `packs`"
              " (OpenAI SDK: extra_body={'scoring': {...}} or extra_body={'packs': [{'id': ...}]})")


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, body: ChatRequest, key: KeyDep) -> dict:
    """A chat.completion whose `scoring` field is the /v1/score response."""
    try:
        scoring_request = chat_scoring_request(body)
    except ValidationError as error:  # e.g. a pack named twice: the same 422 as a malformed body
        raise RequestValidationError(error.errors()) from None
    if scoring_request is None:
        raise ApiError(422, NO_SCORING, param="scoring")
    return completion_body(await score_sync(request, key, scoring_request, sync_call(request, body)))


def chat_scoring_request(body: ChatRequest) -> ScoringRequest | None:
    """The scoring request a chat body asks (None: it asks nothing); pydantic's ValidationError when invalid."""
    if (body.scoring is None or not body.scoring.queries) and not body.packs:
        return None
    return ScoringRequest(
        model=body.model, messages=[m.to_message() for m in body.messages], scoring=body.scoring or ScoringSpec(),
        packs=body.packs, debug=body.debug,
    )


def completion_body(response: dict) -> dict:
    """The chat.completion of a scoring response (JSON): the scores under `scoring`, the best options as the message."""
    usage = response["usage"]
    num_prompt_tokens = usage["content_tokens"] + usage["question_tokens"] + usage["option_tokens"]
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": response["model"],
        "system_fingerprint": response["system_fingerprint"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": _best_options(response)},
                     "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": num_prompt_tokens, "completion_tokens": 0, "total_tokens": num_prompt_tokens},
        "scoring": response,
    }


def _best_options(response: dict) -> str:
    """{query id: most likely option, or an extraction slot's top answer} (a list over
    combinations for a grid; null where a slot found no answer), as JSON."""
    best: dict = {}
    for result in response["results"]:
        picks = [_best(combination) for combination in result["combinations"]]
        best[result["id"]] = picks[0] if len(picks) == 1 else picks
    if response.get("packs"):
        best["packs"] = {pack["pack"]: pack["decisions"] for pack in response["packs"]}
    return orjson.dumps(best).decode()


def _best(combination: dict) -> str | None:
    if combination.get("options"):
        return max(combination["options"], key=lambda o: o["p"])["text"]
    answers = combination.get("answers") or []
    return answers[0]["text"] if answers else None

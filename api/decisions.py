"""Decisions: a question with described options, asked as lettered choices of one read.

    DecideRequest {state, question, options: [{id, description}], orderings?, workload?}
    SharedDecideRequest {state, decisions: [...]}
      --decision_queries (prompt_packs.orderings)--> one Query per ordering per decision
      --ScoringRequest (state as the user message, debug for the rendered prompt)--> /v1/score's sync path
      --read_decision--> {id, option_ids, probabilities, option_logits, top, prompt_sha256,
                          combined (orderings only), calibrated (fitted workloads only)}

Every decision of a shared request is a branch of the same read of the state. Pure Python.
"""

from __future__ import annotations

import hashlib
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.errors import ApiError
from contract.probability import normalise
from contract.protocol import ContentText, Message, Query, ScoringRequest, ScoringSpec, Text
from contract.settings import LIMITS
from prompt_packs.orderings import (
    LETTERS,
    OrderingMode,
    choice_orders,
    combine_orderings,
    expand_orderings,
    letter_options,
)

SINGLE_DECISION_ID = "decision"
MAX_NUM_DECISIONS = 64
# the question, the lettered options, then a cue the letters continue
DECISION_TEMPLATE = "\n\n{question}\n{choices}\nAnswer with the letter of one option.\nAnswer:{?}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DecisionOption(_Strict):
    id: str = Field(min_length=1, max_length=100)  # what the result names
    description: Text(LIMITS.max_option_chars, min_chars=1)  # what the model reads after the option's letter


class DecisionSpec(_Strict):
    id: str | None = Field(default=None, min_length=1, max_length=100)  # shared: default "d<index>"
    question: Text(LIMITS.max_template_chars, min_chars=1)
    options: list[DecisionOption] = Field(min_length=2, max_length=len(LETTERS))  # lettered: A to Z
    orderings: OrderingMode = "one"  # "rotations" / "all" (<= 4 options): ask every order, average
    workload: str | None = None  # a settings.workloads name: adds `calibrated` when it has a temperature

    @model_validator(mode="after")
    def _check(self) -> DecisionSpec:
        ids = [o.id for o in self.options]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"options: duplicate option id(s) {duplicates}")
        letter_options(len(self.options))  # ValueError past 26 options
        choice_orders(len(self.options), self.orderings)  # ValueError: "all" past 4 options
        return self


class DecideRequest(DecisionSpec):
    model: Text(LIMITS.max_id_chars) | None = None
    state: Annotated[ContentText, Field(min_length=1)]  # the content, read once (as the user message)


class SharedDecideRequest(_Strict):
    model: Text(LIMITS.max_id_chars) | None = None
    state: Annotated[ContentText, Field(min_length=1)]
    decisions: list[DecisionSpec] = Field(min_length=1, max_length=MAX_NUM_DECISIONS)

    @model_validator(mode="after")
    def _unique_ids(self) -> SharedDecideRequest:
        ids = decision_ids(self.decisions)
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"decisions: duplicate decision id(s) {duplicates}")
        return self


def decision_ids(decisions: list[DecisionSpec]) -> list[str]:
    return [d.id or f"d{index}" for index, d in enumerate(decisions)]


def decision_queries(decision_id: str, decision: DecisionSpec) -> list[Query]:
    """One Query per ordering: ids `decision_id` and `decision_id~o<k>`."""
    question = decision.question.replace("{", "{{").replace("}", "}}")
    template = DECISION_TEMPLATE.replace("{question}", question)
    texts = [o.description for o in decision.options]
    try:
        return [q for q, _ in expand_orderings(decision_id, template, texts, decision.orderings)]
    except ValueError as error:
        raise ApiError(422, f"question: cannot be asked as lettered options: {error}", param="question") from None


def scoring_request(model: str | None, state: str, ids: list[str], decisions: list[DecisionSpec]) -> ScoringRequest:
    queries = [q for decision_id, d in zip(ids, decisions, strict=True) for q in decision_queries(decision_id, d)]
    # debug: the engine returns the rendered prompt, which prompt_sha256 fingerprints
    return ScoringRequest(model=model, messages=[Message(role="user", content=state)],
                          scoring=ScoringSpec(queries=queries), debug=True)


def check_workloads(workloads: dict[str, float | None], decisions: list[DecisionSpec], prefix: str) -> None:
    for index, decision in enumerate(decisions):
        if decision.workload is not None and decision.workload not in workloads:
            field = f"{prefix.format(index=index)}workload"
            raise ApiError(422, f"{field}: unknown workload {decision.workload!r}; configured: {sorted(workloads)}",
                           param=field)


def read_decision(decision_id: str, decision: DecisionSpec, response: dict, workloads: dict[str, float | None]) -> dict:
    """One decision's result from the scoring response (its queries, every ordering)."""
    by_id = {r["id"]: r["combinations"][0] for r in response["results"]}
    expanded = expand_orderings(decision_id, "{choices}{?}", [o.description for o in decision.options],
                                decision.orderings)  # the same ids and orders as decision_queries
    orderings = [o for _, o in expanded]
    letter_p = [[opt["p"] for opt in by_id[o.query_id]["options"]] for o in orderings]
    letter_logprob = [[opt["logprob"] for opt in by_id[o.query_id]["options"]] for o in orderings]
    combined = combine_orderings(orderings, letter_p)
    logits = combine_orderings(orderings, letter_logprob).probabilities  # mean logprob per option
    option_ids = [o.id for o in decision.options]
    result = {
        "id": decision_id,
        "option_ids": option_ids,
        "probabilities": combined.probabilities,
        "option_logits": logits,
        "top": option_ids[combined.top],
        "prompt_sha256": hashlib.sha256(by_id[decision_id]["debug"]["rendered"].encode()).hexdigest(),
    }
    if decision.orderings != "one":
        result["combined"] = {k: v for k, v in combined.as_dict(option_ids).items() if k != "probabilities"}
    temperature = workloads.get(decision.workload) if decision.workload else None
    if temperature is not None:
        calibrated = normalise([z / temperature for z in logits])
        result["calibrated"] = {"workload": decision.workload, "temperature": temperature,
                                "probabilities": calibrated, "top": option_ids[calibrated.index(max(calibrated))]}
    return result


def envelope(response: dict) -> dict:
    return {"model": response["model"], "system_fingerprint": response["system_fingerprint"],
            "usage": response["usage"]}

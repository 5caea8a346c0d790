"""The scoring response: what one ScoringRequest's read answers (the worker builds it in
engine/pipeline/responses.py; the API returns it, a job writes it per row).

    ScoringResponse -> results [QueryResult -> combinations [Combination -> options [OptionScore]
                                                                          | answers [SlotAnswer]]]
                     + usage (Usage: tokens read) + packs [PackResult]
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class OptionScore(BaseModel):
    text: str
    logprob: float  # sum of the option's token log-probabilities after the branch point
    p: float  # exp(logprob) normalised over the query's options
    floor_p: float  # p for the same query with every user message's content emptied
    contextual_p: float | None = None  # calibrate "contextual": p / floor_p renormalised over the options
    batch_p: float | None = None  # calibrate "batch": p / the job's mean p, renormalised (finished jobs)


class OptionDebug(BaseModel):
    text: str
    token_ids: list[int]  # the whole-string tokens scored for this option (after the branch point)
    tokens: list[str]


class CombinationDebug(BaseModel):
    rendered: str  # the prompt text before the options
    branch_point: int  # number of tokens shared by the prompt and every prompt+option
    options: list[OptionDebug]


class SlotAnswer(BaseModel):
    text: str  # as the model wrote it, up to the slot's closing text (the likeliest path's text)
    value: str | int | float | dict[str, Any] | None  # {*}: text; {n}: number; {$}: {amount, currency}
    p: float  # model probability of the answer: product of its token probabilities, summed over paths
    finish_reason: Literal["stop", "length"] | None = None  # mode "generate" only
    floor_p: float | None = None  # the same paths' probability under the floor prompt; only with `floor: true`


class Combination(BaseModel):
    values: dict[str, str]
    options: list[OptionScore] = Field(default_factory=list)  # option queries ({?})
    answers: list[SlotAnswer] | None = None  # extraction slots, sorted by p (None for {?})
    # {?}: max(0, 1 - sum of exp(logprob)): mass outside the options.
    # slots: max(0, 1 - sum of the answers' p): mass on continuations not listed.
    residual: float
    debug: CombinationDebug | None = None


class QueryResult(BaseModel):
    id: str
    combinations: list[Combination]
    calibrate: Literal["contextual", "batch"] | None = None  # the query's label-free calibration, if asked


class Usage(BaseModel):
    content_tokens: int = 0  # trunk tokens read once for the content
    question_tokens: int = 0  # branch tokens shared by a query's options
    option_tokens: int = 0  # leaf tokens of the options
    floor_tokens: int = 0  # tokens read to compute floors that were not cached
    floors_cached: int = 0  # floors served from the cache
    floors_computed: int = 0  # floors computed for this request
    slot_tokens: int = 0  # tokens decoded for extraction slots (rows of the passes after the read)


class PackQuestionResult(BaseModel):
    p: float | None = None  # summed p of the positive answers (None: a lettered question without any)
    calibrated_p: float | None = None  # the pack's fitted map applied to p; None where not fitted
    floor_p: float | None = None  # the same sum over the options' floor_p
    contextual_p: float | None = None  # pack label_free "contextual": the same sum after p / floor_p
    options: dict[str, float] | None = None  # plain question: p per option text
    choices: dict[str, float] | None = None  # lettered question: order-averaged p per choice id
    combined: dict[str, Any] | None = None  # lettered: probabilities, top, agreement, spread, orderings


class PackCategoryResult(BaseModel):
    score: float  # the category's combine over its members' raw scores
    calibrated_score: float | None = None  # the fitted category map; None where not fitted


class PackResult(BaseModel):
    """One named pack applied to the content (prompt_packs.registry.apply_pack)."""

    pack: str
    version: str
    questions: dict[str, PackQuestionResult]
    categories: dict[str, PackCategoryResult]
    decisions: dict[str, str]  # decision id -> label (on calibrated category scores where fitted)
    # argmax decisions with a fitted joint map: decision id -> {class: calibrated probability}
    decision_probabilities: dict[str, dict[str, float]] | None = None


class ScoringResponse(BaseModel):
    id: str
    object: Literal["scoring.result"] = "scoring.result"
    model: str
    system_fingerprint: str
    results: list[QueryResult]  # the request's own queries, in order (a pack's are under `packs`)
    usage: Usage  # the whole read: own queries and every pack's together
    packs: list[PackResult] | None = None  # one per named pack, in the request's order

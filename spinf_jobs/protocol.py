"""The scoring contract: request and response models (pydantic, no torch).

    ScoringRequest --(engine: compile, pack, run, score)--> ScoringResponse

One request is one content (its `messages`) and the questions asked about it. The same
response object is the body of `/v1/score`, the `scoring` field of a chat completion and
the `response` of a job result row. docs/scoring-api.md defines every field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from spinf_jobs.templates import EXTRACTION_SLOTS, OPTION_SLOT, TemplateError, parse_template

MIN_NUM_OPTIONS = 2
MAX_NUM_OPTIONS = 255
MAX_NUM_COMBINATIONS = 4096  # per query: a grid larger than this is almost surely a mistake


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Message(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str


class Query(_Strict):
    id: str = Field(min_length=1, max_length=200)
    template: str = Field(min_length=1)
    options: list[str] = Field(default_factory=list)
    values: dict[str, list[str]] = Field(default_factory=dict)
    # "user": the template continues the final message; "assistant": the user turn is
    # closed and an assistant turn opened before the template.
    answer_in: Literal["user", "assistant"] = "user"

    @model_validator(mode="after")
    def _check(self) -> Query:
        try:
            parsed = parse_template(self.template)
        except TemplateError as error:
            raise ValueError(f"template: {error}") from None
        if parsed.slot in EXTRACTION_SLOTS:
            raise ValueError(
                f"template: the extraction slot {{{parsed.slot}}} is not served yet;"
                " use {?} with options"
            )
        if parsed.slot == OPTION_SLOT:
            _check_options(self.options)
        names = parsed.placeholder_names
        missing = [n for n in names if n not in self.values]
        if missing:
            raise ValueError(f"values: placeholder(s) {missing} used in the template have no values")
        unused = [n for n in self.values if n not in names]
        if unused:
            raise ValueError(f"values: {unused} given but not used in the template")
        num_combinations = 1
        for name, items in self.values.items():
            if not items:
                raise ValueError(f"values.{name}: give at least one value")
            num_combinations *= len(items)
        if num_combinations > MAX_NUM_COMBINATIONS:
            raise ValueError(
                f"values: the grid has {num_combinations} combinations, more than {MAX_NUM_COMBINATIONS}"
            )
        return self


def _check_options(options: list[str]) -> None:
    if len(options) < MIN_NUM_OPTIONS:
        raise ValueError(f"options: give at least {MIN_NUM_OPTIONS} options (got {len(options)})")
    if len(options) > MAX_NUM_OPTIONS:
        raise ValueError(f"options: at most {MAX_NUM_OPTIONS} options (got {len(options)})")
    if any(option == "" for option in options):
        raise ValueError("options: an option is empty; every option needs text")
    duplicates = sorted({o for o in options if options.count(o) > 1})
    if duplicates:
        raise ValueError(f"options: duplicate option(s) {duplicates}; options must be distinct")


class ScoringSpec(_Strict):
    queries: list[Query] = Field(min_length=1)

    @field_validator("queries")
    @classmethod
    def _unique_ids(cls, queries: list[Query]) -> list[Query]:
        ids = [q.id for q in queries]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"duplicate query id(s) {duplicates}; ids must be unique")
        return queries


class ScoringRequest(_Strict):
    model: str | None = None  # None: the server's default model
    messages: list[Message] = Field(min_length=1)
    scoring: ScoringSpec
    debug: bool = False  # adds rendered text and token ids per combination


# ---- response --------------------------------------------------------------------------


class OptionScore(BaseModel):
    text: str
    logprob: float  # sum of the option's token log-probabilities after the branch point
    p: float  # exp(logprob) normalised over the query's options
    floor_p: float  # p for the same query with every user message's content emptied


class OptionDebug(BaseModel):
    text: str
    token_ids: list[int]  # the whole-string tokens scored for this option (after the branch point)
    tokens: list[str]


class CombinationDebug(BaseModel):
    rendered: str  # the prompt text before the options
    branch_point: int  # number of tokens shared by the prompt and every prompt+option
    options: list[OptionDebug]


class Combination(BaseModel):
    values: dict[str, str]
    options: list[OptionScore]
    residual: float  # max(0, 1 - sum of exp(logprob)): mass outside the options
    debug: CombinationDebug | None = None


class QueryResult(BaseModel):
    id: str
    combinations: list[Combination]


class Usage(BaseModel):
    content_tokens: int = 0  # trunk tokens read once for the content
    question_tokens: int = 0  # branch tokens shared by a query's options
    option_tokens: int = 0  # leaf tokens of the options
    floor_tokens: int = 0  # tokens read to compute floors that were not cached
    floors_cached: int = 0  # floors served from the cache
    floors_computed: int = 0  # floors computed for this request


class ScoringResponse(BaseModel):
    id: str
    object: Literal["scoring.result"] = "scoring.result"
    model: str
    system_fingerprint: str
    results: list[QueryResult]
    usage: Usage

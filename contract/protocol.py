"""The scoring contract: request and response models (pydantic, no torch).

    ScoringRequest --(engine: compile, pack, run, score)--> ScoringResponse
    Query.template --validation: parse_template, once--> Query.parsed_template (what the engine fills)

One request is one content (its `messages`) and the questions asked about it: option
queries (`{?}`, scored over the caller's options) and extraction slots (`{*}` `{n}` `{$}`,
decoded from the same read; docs/extraction.md). The same response object is the body of `/v1/score`, the `scoring` field of a chat completion and
the `response` of a job result row. docs/scoring-api.md defines every field.

Every text field is plain text (`Text`: no U+0000, no lone surrogate) and every size is
bounded by `contract.settings.LIMITS` (docs/service.md, "Limits"): per field as maxLength /
maxItems (so in /openapi.json), across fields in the validators (queries x combinations,
scored options, question text, content).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from contract.settings import LIMITS
from contract.templates import (
    EXTRACTION_SLOTS,
    OPTION_SLOT,
    TEXT_SLOT,
    ParsedTemplate,
    TemplateError,
    parse_template,
)

MIN_NUM_OPTIONS = 2
MAX_NUM_OPTIONS = LIMITS.max_options
MAX_NUM_COMBINATIONS = LIMITS.max_combinations  # per query: a grid larger than this is almost surely a mistake
DEFAULT_BEAM_WIDTH = 5  # extraction: hypotheses kept per step, and answers returned
MAX_BEAM_WIDTH = 32
DEFAULT_EXTRACT_MAX_TOKENS = 16  # extraction answers are short: a name, a month, a number
DEFAULT_GENERATE_MAX_TOKENS = 64
MAX_SLOT_TOKENS = 512
CALIBRATE_MODES = ("contextual", "batch")  # a query's (or a spec's) `calibrate`
SLOT_FIELDS = ("mode", "beam_width", "max_tokens", "seed", "temperature", "floor", "allow_empty")  # extraction-only fields


def plain_text(text: str) -> str:
    """`text` when it is plain Unicode text: no U+0000 (NUL), no lone surrogate."""
    if "\x00" in text:
        raise ValueError(f"contains U+0000 (NUL) at character {text.index(chr(0))}; remove it")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"a lone surrogate at character {error.start}; text must be valid Unicode") from None
    return text


def Text(max_chars: int, min_chars: int = 0):  # noqa: N802 - a type
    """A plain-text string of at most `max_chars` characters."""
    return Annotated[str, Field(min_length=min_chars, max_length=max_chars), AfterValidator(plain_text)]


ContentText = Text(LIMITS.max_content_chars)
OptionText = Text(LIMITS.max_option_chars)
ValueText = Text(LIMITS.max_value_chars)
IdText = Text(LIMITS.max_id_chars, min_chars=1)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Message(_Strict):
    role: Literal["system", "user", "assistant"]
    content: ContentText
    # what the engine renders for this message when it computes floors (None: "" for a user
    # message, the content itself otherwise); a pack presentation keeps its frame here, e.g.
    # "Customer support message:\n", so a floor empties only the content inside it
    floor_content: ContentText | None = None


class Query(_Strict):
    id: IdText
    template: Text(LIMITS.max_template_chars, min_chars=1)
    options: list[OptionText] = Field(default_factory=list, max_length=LIMITS.max_options)
    values: dict[Text(64, min_chars=1), list[ValueText]] = Field(default_factory=dict,
                                                                 max_length=LIMITS.max_placeholders)
    # "user": the template continues the final message; "assistant": the user turn is
    # closed and an assistant turn opened before the template.
    answer_in: Literal["user", "assistant"] = "user"
    # Extraction slots only ({*} {n} {$}; docs/extraction.md):
    # "extract": a beam over the most likely answers; "generate": one free text ({*} only).
    mode: Literal["extract", "generate"] = "extract"
    beam_width: int = Field(default=DEFAULT_BEAM_WIDTH, ge=1, le=MAX_BEAM_WIDTH)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_SLOT_TOKENS)  # None: the mode's default
    seed: int | None = None  # generate: None decodes greedily, a seed samples (reproducibly)
    temperature: float = Field(default=1.0, gt=0.0, le=10.0)  # generate with a seed only
    # generate: false (default) keeps writing until the text has a non-whitespace character
    # (no end-of-text token or closing text before it); true lets the answer end at once, empty
    allow_empty: bool = False
    floor: bool = False  # each answer also gets floor_p: its paths' probability with user contents emptied
    # label-free calibration of the options (docs/calibration.md): "contextual" adds
    # contextual_p (p divided by floor_p, renormalised) to every answer; "batch" adds batch_p
    # (p divided by the job's mean p) once every row of the job is scored
    calibrate: Literal["contextual", "batch"] | None = None
    _parsed: ParsedTemplate = PrivateAttr()  # set by the validator (a frozen model: never stale)
    _parsed_from: str | None = PrivateAttr(default=None)  # the template string `_parsed` was parsed from

    @property
    def parsed_template(self) -> ParsedTemplate:
        """`template` parsed, once, when the query was validated."""
        return self._parsed

    @property
    def slot(self) -> str:
        return self._parsed.slot

    @property
    def num_max_tokens(self) -> int:
        if self.max_tokens is not None:
            return self.max_tokens
        return DEFAULT_GENERATE_MAX_TOKENS if self.mode == "generate" else DEFAULT_EXTRACT_MAX_TOKENS

    @model_validator(mode="after")
    def _check(self) -> Query:
        parsed = self._parse()
        if parsed.slot in EXTRACTION_SLOTS:
            _check_slot(self, parsed.slot, parsed.tail)
        if self.calibrate is not None and parsed.slot != OPTION_SLOT:
            raise ValueError("calibrate: only option queries ({?}) are calibrated; extraction slots have no options")
        if parsed.slot == OPTION_SLOT:
            _check_options(self.options)
            given = [name for name in SLOT_FIELDS if name in self.model_fields_set]
            if given:
                raise ValueError(f"{given[0]}: only extraction slots ({{*}} {{n}} {{$}}) take it, not {{?}}")
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

    def _parse(self) -> ParsedTemplate:
        """`template` parsed once, though a Query is checked again in each model validated around it
        (after-validators run on instances too); a copy with a new template parses that one."""
        if self._parsed_from is not self.template:
            try:
                self._parsed = parse_template(self.template)
            except TemplateError as error:
                raise ValueError(f"template: {error}") from None
            self._parsed_from = self.template
        return self._parsed


def _check_slot(query: Query, slot: str, tail: str) -> None:
    if query.options:
        raise ValueError(f"options: the extraction slot {{{slot}}} takes no options; use {{?}} to score options")
    if query.mode == "generate":
        if slot != TEXT_SLOT:
            raise ValueError(f"mode: 'generate' writes free text, so it needs the {{*}} slot, not {{{slot}}}")
        if "beam_width" in query.model_fields_set:
            raise ValueError("beam_width: mode 'generate' writes one text; beam_width is for mode 'extract'")
        return
    if slot == TEXT_SLOT and not tail:
        raise ValueError(
            "template: the text slot {*} needs closing text after it, which ends the answer"
            ' (e.g. \'A: "{*}"\': the closing quote); or use mode \'generate\''
        )
    for name in ("seed", "temperature"):
        if name in query.model_fields_set:
            raise ValueError(f"{name}: only mode 'generate' samples; mode 'extract' is a beam search")
    if "allow_empty" in query.model_fields_set:
        raise ValueError("allow_empty: only mode 'generate' waits for a non-whitespace character; mode 'extract'"
                         " lists every answer by its p, an empty one included")


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
    # may be empty only in a request that names packs (ScoringRequest checks it)
    queries: list[Query] = Field(default_factory=list, max_length=LIMITS.max_queries)
    # the request's (a job's) label-free calibration: every option query ({?}) that does not
    # set its own `calibrate` gets this one (a pack's queries follow the pack's label_free)
    calibrate: Literal["contextual", "batch"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _calibrate_every_option_query(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("calibrate") is None or not isinstance(data.get("queries"), list):
            return data
        return {**data, "queries": [_with_calibrate(q, data["calibrate"]) for q in data["queries"]]}

    @field_validator("queries")
    @classmethod
    def _unique_ids(cls, queries: list[Query]) -> list[Query]:
        ids = [q.id for q in queries]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"duplicate query id(s) {duplicates}; ids must be unique")
        _check_sizes(queries)
        return queries


def _with_calibrate(query: Any, calibrate: Any) -> Any:
    """A query (a dict or a Query) with `calibrate` where it is an option query without its own.
    A dict is validated here, its template parsed this once, and goes on as its Query; one that
    is refused goes on as it came, for the `queries` field to name its fault (and with a
    `calibrate` that is no mode, as `_dict_with_calibrate` makes it)."""
    if isinstance(query, dict) and "calibrate" not in query and isinstance(query.get("template"), str):
        if calibrate not in CALIBRATE_MODES:
            return _dict_with_calibrate(query, calibrate)
        try:
            query = Query.model_validate(query)
        except ValidationError:
            return query
    if not isinstance(query, Query) or "calibrate" in query.model_fields_set or query.slot != OPTION_SLOT:
        return query
    return query.model_copy(update={"calibrate": calibrate})


def _dict_with_calibrate(query: dict, calibrate: Any) -> dict:
    """A query dict with `calibrate` where its template is an option query's (the spec's
    `calibrate` is no mode: the request is refused, the query's own error naming it too)."""
    try:
        is_option_query = parse_template(query["template"]).slot == OPTION_SLOT
    except TemplateError:
        return query  # the query's own validation names the template's fault
    return {**query, "calibrate": calibrate} if is_option_query else query


def _check_sizes(queries: list[Query]) -> None:
    """The limits across queries: grids, scored options and question text, all queries together."""
    num_combinations = num_scored = num_chars = 0
    for query in queries:
        grid = 1
        for items in query.values.values():
            grid *= len(items)
        num_combinations += grid
        num_scored += grid * len(query.options)
        num_chars += grid * (len(query.template) + sum(map(len, query.options)))
    for total, limit, what in (
        (num_combinations, LIMITS.max_request_combinations, "queries x combinations"),
        (num_scored, LIMITS.max_scored_options, "combinations x options (scored options)"),
        (num_chars, LIMITS.max_question_chars, "combinations x (template + options) characters"),
    ):
        if total > limit:
            raise ValueError(f"the queries ask {total} {what}; the limit is {limit}: split the request")


class PackRef(_Strict):
    id: IdText  # a loaded pack, e.g. "spinf/moderation" (GET /v1/packs)


class ScoringRequest(_Strict):
    model: Text(LIMITS.max_id_chars) | None = None  # None: the server's default model
    messages: list[Message] = Field(min_length=1, max_length=LIMITS.max_messages)
    scoring: ScoringSpec = Field(default_factory=ScoringSpec)
    # prompt packs answered from the same read as `scoring.queries` (docs/prompt-packs.md)
    packs: list[PackRef] = Field(default_factory=list, max_length=LIMITS.max_queries)
    debug: bool = False  # adds rendered text and token ids per combination
    # a finished job of the same key whose batch priors fill `batch_p` on this reply's
    # options (queries the job asked with calibrate "batch"; docs/calibration.md)
    priors_from_job: str | None = Field(default=None, min_length=1, max_length=200)

    @model_validator(mode="after")
    def _something_to_ask(self) -> ScoringRequest:
        if not self.scoring.queries and not self.packs:
            raise ValueError("scoring.queries: give at least one query, or name a pack in `packs`")
        ids = [p.id for p in self.packs]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"packs: pack(s) {duplicates} named more than once")
        check_content_size(self.messages)
        return self


def check_content_size(messages: list[Message]) -> None:
    num_chars = sum(len(m.content) + len(m.floor_content or "") for m in messages)
    if num_chars > LIMITS.max_content_chars:
        raise ValueError(f"messages: the content is {num_chars} characters (content and floor_content of every"
                         f" message); the limit is {LIMITS.max_content_chars}")

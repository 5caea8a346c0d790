"""The Decisions API contract (openai 3.57's `decision_create_params.py` and `decision.py`).

    DecisionCreate {input: str | [message], model, questions: [predicate | choice | score],
                    prompt_cache_key?, prompt_cache_options?, safety_identifier? (accepted, ignored)}
      --prompt_packs.decision_format.decision_request--> one ScoringRequest (every question a branch)
      --prompt_packs.decision_format.read_decision--> Decision {answers, model, usage, + extensions}

Unknown fields are 422s naming the field. Image parts and function / custom tool items are
422s naming the part (not supported yet). An `input_json` part's `data` is bounded
(contract/json_limits.py: 32 levels of nesting, 10,000 values, 256 KiB as compact JSON): past
one, a 422 naming the part's `data` and the limit.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    SerializationInfo,
    TypeAdapter,
    field_validator,
    model_validator,
)

from contract.json_limits import INPUT_JSON_LIMITS, json_limit_problem
from contract.protocol import ContentText, Text
from contract.settings import LIMITS

MAX_NUM_QUESTIONS = 400
MAX_NUM_CHOICES = 255
MAX_NUM_LEVELS = 10
UNSUPPORTED_ITEMS = ("function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def one_of(tag: str, kinds: dict[str, Any]) -> Any:
    """A union picked by the value of its `tag` field. Unlike a pydantic discriminated union, an
    error's location names only fields ("questions.0.choices"), never the branch tried."""
    adapters = {name: TypeAdapter(kind) for name, kind in kinds.items()}
    union = Union[tuple(dict.fromkeys(kinds.values()))]  # noqa: UP007 - built at runtime

    def validate(value: Any) -> Any:
        given_tag = value.get(tag) if isinstance(value, dict) else None
        chosen = adapters.get(given_tag) if isinstance(given_tag, str) else None
        if chosen is None:
            given = repr(value.get(tag)) if isinstance(value, dict) else f"a {type(value).__name__}"
            raise ValueError(f"{tag}: {given} is not one of {', '.join(map(repr, adapters))}")
        return chosen.validate_python(value)

    def dump(value: Any, info: SerializationInfo) -> Any:  # a model by its own serializer
        return value.model_dump(mode=info.mode, exclude_none=info.exclude_none) if isinstance(value, BaseModel) \
            else value

    return Annotated[union, PlainValidator(validate, json_schema_input_type=union), PlainSerializer(dump)]


def text_or(text: Any, parts: Any) -> Any:
    """A string, or a list of parts (the SDK's `str | Iterable[part]`), errors located as `one_of`'s."""
    as_text, as_parts = TypeAdapter(text), TypeAdapter(parts)
    union = Union[text, parts]  # noqa: UP007

    def validate(value: Any) -> Any:
        return (as_text if isinstance(value, str) else as_parts).validate_python(value)

    def dump(value: Any, info: SerializationInfo) -> Any:  # each branch by its own serializer
        return (as_text if isinstance(value, str) else as_parts).dump_python(value, mode=info.mode,
                                                                              exclude_none=info.exclude_none)

    return Annotated[union, PlainValidator(validate, json_schema_input_type=union), PlainSerializer(dump)]


class CacheBreakpoint(_Strict):
    mode: Literal["explicit"]


class InputText(_Strict):
    type: Literal["input_text"]
    text: ContentText
    prompt_cache_breakpoint: CacheBreakpoint | None = None  # accepted, ignored


class InputJson(_Strict):
    type: Literal["input_json"]
    data: Annotated[  # rendered as compact JSON text
        Annotated[dict[str, Any], Field(max_length=INPUT_JSON_LIMITS.max_values - 1)]
        | Annotated[list[dict[str, Any]], Field(max_length=INPUT_JSON_LIMITS.max_values - 1)],
        Field(description=f"A JSON object, or a list of objects, rendered as compact JSON text: "
                          f"{INPUT_JSON_LIMITS.describe()}.")]

    @field_validator("data", mode="before")
    @classmethod
    def _within_limits(cls, value: Any) -> Any:
        """Measured before the type is checked: a value nested too deeply for any recursive
        step (validation, serialization, rendering) is refused here, naming the limit."""
        problem = json_limit_problem(value, INPUT_JSON_LIMITS)
        if problem is not None:
            raise ValueError(problem)
        return value


class OutputText(_Strict):
    type: Literal["output_text"]
    text: ContentText


class RefusalPart(_Strict):
    type: Literal["refusal"]
    refusal: ContentText


UserPart = one_of("type", {"input_text": InputText, "input_json": InputJson})
AssistantPart = one_of("type", {"output_text": OutputText, "refusal": RefusalPart})


class _Message(_Strict):
    type: Literal["message"] = "message"


class UserMessage(_Message):
    role: Literal["user"]
    content: text_or(ContentText, list[UserPart])


class SystemMessage(_Message):
    role: Literal["system", "developer"]
    content: text_or(ContentText, list[InputText])


class AssistantMessage(_Message):
    role: Literal["assistant"]
    content: text_or(ContentText, list[AssistantPart])
    phase: Literal["commentary", "final_answer"] | None = None


InputMessage = one_of("role", {"user": UserMessage, "system": SystemMessage, "developer": SystemMessage,
                               "assistant": AssistantMessage})


class QuestionText(_Strict):
    type: Literal["input_text"]
    text: Text(LIMITS.max_template_chars)


Instructions = text_or(Text(LIMITS.max_template_chars, min_chars=1),
                       list[one_of("type", {"input_text": QuestionText, "input_json": InputJson})])
Workload = Text(LIMITS.max_id_chars, min_chars=1) | None  # extension: a SPINF_WORKLOADS name


class _Question(_Strict):
    instructions: Instructions
    name: Text(LIMITS.max_id_chars) | None = None
    workload: Workload = None

    @model_validator(mode="before")
    @classmethod
    def _no_images(cls, value: Any) -> Any:
        if isinstance(value, dict) and isinstance(value.get("instructions"), list):
            for index, part in enumerate(value["instructions"]):
                if isinstance(part, dict) and part.get("type") == "input_image":
                    raise ValueError(f"instructions.{index}: input_image parts are not supported yet")
        return value


class PredicateQuestion(_Question):
    type: Literal["predicate"]


class Choice(_Strict):
    value: Annotated[str, Field(strict=True, min_length=1, max_length=LIMITS.max_option_chars)] | Annotated[
        bool, Field(strict=True)]
    description: Text(LIMITS.max_option_chars) | None = None


class ChoiceQuestion(_Question):
    type: Literal["choice"]
    choices: list[Choice] = Field(min_length=2, max_length=MAX_NUM_CHOICES)
    orderings: Literal["one", "rotations"] = "one"  # extension: order averaging in the same read

    @model_validator(mode="after")
    def _unique(self) -> ChoiceQuestion:
        keys = [(type(c.value).__name__, c.value) for c in self.choices]
        repeated = sorted({repr(v) for t, v in keys if keys.count((t, v)) > 1})
        if repeated:
            raise ValueError(f"choices: repeated value(s) {repeated}; each choice must be unique")
        return self


class Level(_Strict):
    label: Text(LIMITS.max_option_chars, min_chars=1)
    description: Text(LIMITS.max_option_chars) | None = None


class ScoreQuestion(_Question):
    type: Literal["score"]
    levels: list[Level] = Field(min_length=2, max_length=MAX_NUM_LEVELS)


Question = one_of("type", {"predicate": PredicateQuestion, "choice": ChoiceQuestion, "score": ScoreQuestion})


class PromptCacheOptions(_Strict):
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] = "30m"


class DecisionCreate(_Strict):
    model: Text(LIMITS.max_id_chars)
    input: text_or(Annotated[ContentText, Field(min_length=1)],
                   Annotated[list[InputMessage], Field(min_length=1, max_length=LIMITS.max_messages)])
    questions: list[Question] = Field(min_length=1, max_length=MAX_NUM_QUESTIONS)
    prompt_cache_key: str | None = None  # accepted, ignored
    prompt_cache_options: PromptCacheOptions | None = None  # accepted, ignored
    safety_identifier: str | None = None  # accepted, ignored

    @model_validator(mode="before")
    @classmethod
    def _supported_items(cls, value: Any) -> Any:
        """Tool items and image parts are refused here, naming them, before `input`'s union
        (string or messages) would report only that the first branch is not a string."""
        if isinstance(value, dict) and isinstance(value.get("input"), list):
            for index, item in enumerate(value["input"]):
                kind = item.get("type") if isinstance(item, dict) else None
                if kind in UNSUPPORTED_ITEMS:
                    raise ValueError(f"input.{index}: {kind} items are not supported yet; send messages")
                content = item.get("content") if isinstance(item, dict) else None
                for part_index, part in enumerate(content if isinstance(content, list) else []):
                    if isinstance(part, dict) and part.get("type") == "input_image":
                        raise ValueError(f"input.{index}.content.{part_index}: input_image parts are not"
                                         " supported yet; send input_text or input_json parts")
        return value

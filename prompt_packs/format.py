"""The prompt-pack file format (pydantic: a pack file is a trust boundary).

    packs/moderation.yaml --yaml/json--> dict --Pack.model_validate--> Pack

A pack is one job made of many questions: how the content is presented, the questions
(yes/no or lettered choices), which answers count as positive, how question scores merge
into category scores, how category scores become decisions, and the fitted calibration of
each question and category with its provenance. docs/prompt-packs.md describes every field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contract.protocol import Message, Query
from prompt_packs.orderings import CHOICES_MARKER, MAX_NUM_CHOICES_ALL, OrderingMode

FORMAT_VERSION = 1
CONTENT_MARKER = "{content}"
_ID = r"^[a-z0-9][a-z0-9_-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Presentation(_Strict):
    """How a content is shown to the model: the user message is `template` with the
    content in place of {content}; floors keep the template and empty only the content."""

    system: str | None = None
    template: str = CONTENT_MARKER

    @model_validator(mode="after")
    def _check(self) -> Presentation:
        if self.template.count(CONTENT_MARKER) != 1:
            raise ValueError(f"template: must hold {CONTENT_MARKER} exactly once")
        return self

    def messages(self, content: str) -> list[Message]:
        user = Message(role="user", content=self.template.replace(CONTENT_MARKER, content),
                       floor_content=self.empty)
        return ([Message(role="system", content=self.system)] if self.system else []) + [user]

    @property
    def empty(self) -> str:
        """The presentation with no content: what a floor reads instead of the user message."""
        return self.template.replace(CONTENT_MARKER, "")

    def is_presenting(self, text: str) -> bool:
        """Whether `text` is this presentation around some content."""
        head, _, tail = self.template.partition(CONTENT_MARKER)
        return len(text) >= len(head) + len(tail) and text.startswith(head) and text.endswith(tail)


class Choice(_Strict):
    id: str = Field(pattern=_ID)
    text: str = Field(min_length=1)


class Provenance(_Strict):
    data: str  # the labelled JSONL, relative to the repository root
    data_sha256: str
    num_rows: int  # labelled rows scored
    num_positive: int  # rows whose label made this question/category positive
    held_out: str  # how the held-out metrics were obtained (e.g. "5-fold cross-fit")
    model: str
    system_fingerprint: str
    date: str  # ISO date of the fit
    before: dict[str, float]  # held-out metrics of the raw score
    after: dict[str, float]  # held-out metrics of the calibrated score
    num_flipped: int  # held-out rows whose side of 0.5 calibration moved


class Calibration(_Strict):
    method: Literal["identity", "temperature", "platt", "isotonic"]
    params: dict[str, float | list[float]] = Field(default_factory=dict)
    # categories only: the map reads the combine of the members' calibrated scores
    # ("calibrated") or of their raw scores ("raw"); `spinf-jobs calibrate` keeps the better
    reads: Literal["calibrated", "raw"] = "calibrated"
    provenance: Provenance | None = None

    @model_validator(mode="after")
    def _check(self) -> Calibration:
        needed = {"identity": set(), "temperature": {"temperature"}, "platt": {"a", "b"}, "isotonic": {"x", "y"}}
        missing = needed[self.method] - set(self.params)
        if missing:
            raise ValueError(f"params: method {self.method} needs {sorted(missing)}")
        if self.method == "temperature" and not float(self.params["temperature"]) > 0:
            raise ValueError("params.temperature: must be > 0")
        if self.method == "isotonic":
            x, y = self.params["x"], self.params["y"]
            if not isinstance(x, list) or not isinstance(y, list) or len(x) != len(y) or not x:
                raise ValueError("params: isotonic x and y are equal-length non-empty lists")
        return self


class PackQuestion(_Strict):
    id: str = Field(pattern=_ID)
    template: str  # ends with {?}; a lettered question also holds {choices} once
    options: list[str] = Field(default_factory=list)  # plain question: the option texts
    choices: list[Choice] = Field(default_factory=list)  # lettered question: shown as A) B) ...
    orderings: OrderingMode = "one"  # lettered only: ask rotations / all orders and average
    # option texts (plain) or choice ids (lettered) whose p adds up to the question's score;
    # a lettered question may leave it empty and be used only through "question/choice"
    positive: list[str] = Field(default_factory=list)
    weight: float = Field(default=1.0, gt=0)  # for categories that combine by weighted_mean
    answer_in: Literal["user", "assistant"] = "user"

    @property
    def is_lettered(self) -> bool:
        return bool(self.choices)

    @model_validator(mode="after")
    def _check(self) -> PackQuestion:
        if bool(self.options) == bool(self.choices):
            raise ValueError("give either options (plain question) or choices (lettered question)")
        if self.is_lettered:
            known = [c.id for c in self.choices]
            if len(set(known)) != len(known):
                raise ValueError("choices: duplicate choice ids")
            if CHOICES_MARKER not in self.template:
                raise ValueError(f"template: a lettered question holds {CHOICES_MARKER}")
            if self.orderings == "all" and len(known) > MAX_NUM_CHOICES_ALL:
                raise ValueError(f"orderings: 'all' is for at most {MAX_NUM_CHOICES_ALL} choices")
        else:
            known = self.options
            if self.orderings != "one":
                raise ValueError("orderings: only lettered questions (choices) can be reordered")
            Query(id=self.id, template=self.template, options=self.options, answer_in=self.answer_in)
        if not self.positive and not self.is_lettered:
            raise ValueError("positive: name the option(s) that count as positive")
        unknown = [p for p in self.positive if p not in known]
        if unknown:
            raise ValueError(f"positive: {unknown} not among {'choice ids' if self.is_lettered else 'options'} {known}")
        return self


class Category(_Strict):
    id: str = Field(pattern=_ID)
    description: str = ""
    # members: "question-id" (the question's positive score, calibrated where fitted) or
    # "question-id/choice-id" (one choice of a lettered question, averaged over orderings)
    questions: list[str] = Field(min_length=1)
    combine: Literal["max", "weighted_mean", "noisy_or"] = "max"


class Target(_Strict):
    """What a rule's threshold should reach on held-out rows; `spinf-jobs calibrate` picks
    the threshold and writes it under `calibration.thresholds` (prompt_packs.thresholds)."""

    metric: Literal["precision", "recall"]
    value: float = Field(gt=0.0, lt=1.0)


class Rule(_Strict):
    category: str
    at_least: float = Field(ge=0.0, le=1.0)  # used until a fitted threshold replaces it
    label: str
    target: Target | None = None


class Decision(_Strict):
    """Either ordered threshold rules (first match wins, else `default`) or the argmax of
    some categories (the label is the winning category's id)."""

    id: str = Field(pattern=_ID)
    description: str = ""
    rules: list[Rule] = Field(default_factory=list)
    default: str | None = None
    argmax_of: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> Decision:
        if bool(self.rules) == bool(self.argmax_of):
            raise ValueError("give either rules (with a default) or argmax_of")
        if self.rules and self.default is None:
            raise ValueError("default: rules need a default label for when none matches")
        return self

    @property
    def categories(self) -> list[str]:
        return [r.category for r in self.rules] or list(self.argmax_of)


class DecisionCalibration(_Strict):
    """A joint map over an argmax decision's categories (prompt_packs.joint): it reads the
    categories' raw or calibrated scores, renormalised over `classes`, and its output is
    both the decision's probabilities and those categories' calibrated scores."""

    method: Literal["identity", "temperature", "vector"]
    params: dict[str, float | list[float]] = Field(default_factory=dict)
    reads: Literal["calibrated", "raw"] = "calibrated"
    classes: list[str] = Field(min_length=2)  # the decision's argmax_of, in order
    provenance: dict[str, str | int | float | dict[str, float]] | None = None

    @model_validator(mode="after")
    def _check(self) -> DecisionCalibration:
        needed = {"identity": set(), "temperature": {"temperature"}, "vector": {"w", "b"}}[self.method]
        missing = needed - set(self.params)
        if missing:
            raise ValueError(f"params: method {self.method} needs {sorted(missing)}")
        if self.method == "vector" and not all(len(self.params[k]) == len(self.classes) for k in ("w", "b")):
            raise ValueError("params: vector w and b hold one number per class")
        return self


class Threshold(_Strict):
    """A rule's threshold picked for its target on some held-out rows, judged on others."""

    at_least: float = Field(ge=0.0, le=1.0)
    metric: Literal["precision", "recall"]
    target: float
    achieved: float | None  # on the check rows
    interval: list[float]  # Clopper-Pearson 95% interval of `achieved`
    successes: int
    trials: int
    other: float | None = None  # recall for a precision target, and the reverse
    num_pick_rows: int
    num_check_rows: int


class PackCalibration(_Strict):
    """Written by `spinf-jobs calibrate`; the last top-level key of a YAML pack."""

    questions: dict[str, Calibration] = Field(default_factory=dict)
    categories: dict[str, Calibration] = Field(default_factory=dict)
    decisions: dict[str, DecisionCalibration] = Field(default_factory=dict)  # argmax decisions only
    thresholds: dict[str, Threshold] = Field(default_factory=dict)  # "<decision id>/<rule index>"
    report: str | None = None  # the fit report folder, relative to the repository root


class Pack(_Strict):
    format: Literal[1] = FORMAT_VERSION
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*/[a-z0-9][a-z0-9-]*$")  # "owner/name"
    version: str = Field(pattern=r"^\d+\.\d+\.\d+$")
    description: str = ""
    presentation: Presentation = Presentation()
    questions: list[PackQuestion] = Field(min_length=1)
    categories: list[Category] = Field(default_factory=list)
    decisions: list[Decision] = Field(default_factory=list)
    # label-free calibration of every question: "contextual" divides each answer by its
    # floor (question results gain contextual_p); docs/calibration.md
    label_free: Literal["contextual"] | None = None
    calibration: PackCalibration = PackCalibration()

    @model_validator(mode="after")
    def _check_references(self) -> Pack:
        question_ids = _unique("questions", [q.id for q in self.questions])
        category_ids = _unique("categories", [c.id for c in self.categories])
        _unique("decisions", [d.id for d in self.decisions])
        for c in self.categories:
            _known(f"categories.{c.id}.questions", [m.split("/")[0] for m in c.questions], question_ids)
            for member in c.questions:
                _check_member(f"categories.{c.id}.questions", member, self)
        for d in self.decisions:
            _known(f"decisions.{d.id}", d.categories, category_ids)
        _known("calibration.questions", list(self.calibration.questions), question_ids)
        _known("calibration.categories", list(self.calibration.categories), category_ids)
        for decision_id, joint in self.calibration.decisions.items():
            decision = next((d for d in self.decisions if d.id == decision_id), None)
            if decision is None or joint.classes != decision.argmax_of:
                raise ValueError(f"calibration.decisions.{decision_id}: not an argmax decision over {joint.classes}")
        for key in self.calibration.thresholds:
            decision_id, _, index = key.partition("/")
            decision = next((d for d in self.decisions if d.id == decision_id), None)
            if decision is None or not index.isdigit() or int(index) >= len(decision.rules):
                raise ValueError(f"calibration.thresholds.{key}: no such decision rule")
        return self

    def question(self, question_id: str) -> PackQuestion:
        return next(q for q in self.questions if q.id == question_id)


def _check_member(field: str, member: str, pack: Pack) -> None:
    question_id, _, choice_id = member.partition("/")
    question = pack.question(question_id)
    if choice_id and choice_id not in [c.id for c in question.choices]:
        raise ValueError(f"{field}: {member!r}: {question_id} has no choice {choice_id!r}")
    if not choice_id and not question.positive:
        raise ValueError(f"{field}: {question_id} has no positive answers; name one choice as {question_id}/<choice>")


def _unique(field: str, ids: list[str]) -> set[str]:
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"{field}: duplicate id(s) {duplicates}")
    return set(ids)


def _known(field: str, used: list[str], known: set[str]) -> None:
    unknown = [u for u in used if u not in known]
    if unknown:
        raise ValueError(f"{field}: unknown id(s) {unknown}")

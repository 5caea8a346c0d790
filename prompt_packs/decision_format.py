"""The Decisions API's prompt format `decisions-v2`: a decisions request as ONE ScoringRequest, and back.

    DecisionCreate --decision_request--> DecisionPlan(request: ScoringRequest, queries per question)
        input (string or messages) -> the request's messages (read once: the trunk of the tree)
        question i -> query "q<i>" (and "q<i>~o<k>" per extra ordering): a branch of that read
    ScoringResponse --read_decision--> Decision dict {answers, model, usage, system_fingerprint,
                                                      prompt_format, per answer `spinf`}

decisions-v2 (docs/decisions.md): predicate -> " yes" / " no"; choice -> "- value: description"
lines answered with the values themselves (" billing") when they are short, one line and none
a prefix of another (answers_by_value), else lettered lines "A) value: description" answered
with " A", " B", ... (past 26 choices two letters "AA", "AB", ...); score -> numbered levels
"0) label: description" answered with " 0" ... " 9".
Refusal (docs/decisions.md): the mass the model puts off every option (`residual`) is more than
REFUSAL_ODDS times the mass on the options, i.e. the options together hold under 1 / (1 +
REFUSAL_ODDS) of the next-token mass; measured on fixtures/labelled/support.jsonl.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import ValidationError

from contract.decisions import ChoiceQuestion, DecisionCreate, PredicateQuestion, ScoreQuestion
from contract.protocol import Message, Query, ScoringRequest, ScoringSpec
from prompt_packs.orderings import LETTERS, choice_orders

PROMPT_FORMAT = "decisions-v2"
MAX_NAMED_CHOICE_CHARS = 64  # a longer value is answered by a label
REFUSAL_ODDS = 99.0  # refuse when residual > REFUSAL_ODDS * (1 - residual): the options hold < 1%
PREDICATE_TEMPLATE = "\n\n{instructions}\nAnswer yes or no.\nAnswer:{?}"
CHOICE_TEMPLATE = "\n\n{instructions}\n{lines}\nAnswer with the label of one option.\nAnswer:{?}"
NAMED_CHOICE_TEMPLATE = "\n\n{instructions}\nOptions:\n{lines}\nAnswer with one of the options.\nAnswer:{?}"
SCORE_TEMPLATE = "\n\n{instructions}\n{lines}\nAnswer with the number of one level.\nAnswer:{?}"


class DecisionFormatError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True, slots=True)
class DecisionPlan:
    request: ScoringRequest
    query_ids: list[list[str]]  # per question: its queries (one per ordering)
    orders: list[list[tuple[int, ...]]]  # per question: order[k][i] = the choice shown under label i


def labels(num_choices: int) -> list[str]:
    """A..Z up to 26 choices; past that two letters AA, AB, ..., AZ, BA, ... (676 >= 255)."""
    if num_choices <= len(LETTERS):
        return list(LETTERS[:num_choices])
    return [a + b for a in LETTERS for b in LETTERS][:num_choices]


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _part_text(part) -> str:
    if part.type == "input_json":
        return json.dumps(part.data, ensure_ascii=False, separators=(",", ":"))
    return part.refusal if part.type == "refusal" else part.text


def _text(content) -> str:
    return content if isinstance(content, str) else "\n".join(_part_text(p) for p in content)


def messages(create: DecisionCreate) -> list[Message]:
    if isinstance(create.input, str):
        return [Message(role="user", content=create.input)]
    roles = {"developer": "system"}
    return [Message(role=roles.get(m.role, m.role), content=_text(m.content)) for m in create.input]


def value_text(value: str | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else value


def _line(label: str, text: str, description: str | None) -> str:
    return f"{label}) {text}" + (f": {description}" if description else "")


def question_queries(index: int, question) -> tuple[list[Query], list[tuple[int, ...]]]:
    qid, instructions = f"q{index}", _escape(_text(question.instructions))
    if isinstance(question, PredicateQuestion):
        template = PREDICATE_TEMPLATE.replace("{instructions}", instructions)
        return [Query(id=qid, template=template, options=[" yes", " no"])], [(0, 1)]
    if isinstance(question, ScoreQuestion):
        lines = "\n".join(_line(str(i), lv.label, lv.description) for i, lv in enumerate(question.levels))
        template = SCORE_TEMPLATE.replace("{instructions}", instructions).replace("{lines}", _escape(lines))
        options = [f" {i}" for i in range(len(question.levels))]
        return [Query(id=qid, template=template, options=options)], [tuple(range(len(options)))]
    orders = choice_orders(len(question.choices), question.orderings)
    named = answers_by_value(question)
    names = labels(len(question.choices))
    queries = []
    for k, order in enumerate(orders):
        choices = [question.choices[c] for c in order]
        if named:
            texts = [value_text(c.value) for c in choices]
            lines = "\n".join(f"- {t}" + (f": {c.description}" if c.description else "") for t, c in zip(texts, choices))
            template, options = NAMED_CHOICE_TEMPLATE, [" " + t for t in texts]
        else:
            lines = "\n".join(_line(n, value_text(c.value), c.description) for n, c in zip(names, choices, strict=True))
            template, options = CHOICE_TEMPLATE, [" " + n for n in names]
        template = template.replace("{instructions}", instructions).replace("{lines}", _escape(lines))
        queries.append(Query(id=qid if k == 0 else f"{qid}~o{k}", template=template, options=options))
    return queries, orders


def answers_by_value(question: ChoiceQuestion) -> bool:
    """Whether the choices are answered by their own values (" billing") rather than labels: every
    value's text is one short line (MAX_NAMED_CHOICE_CHARS) and none is a prefix of another (the
    option " c1" would hold the mass of " c10"; the string "true" and the boolean true collide)."""
    texts = sorted(value_text(c.value) for c in question.choices)
    if any(t.strip() != t or "\n" in t or len(t) > MAX_NAMED_CHOICE_CHARS for t in texts):
        return False
    return not any(longer.startswith(shorter) for shorter, longer in zip(texts, texts[1:]))


def _is_about_the_input(error: ValidationError) -> bool:
    """Whether the scoring request the input became is refused for its messages (a message's
    content, or all of them together), not for the queries the questions became."""
    first = error.errors()[0]
    return first["loc"][:1] in (("messages",), ("content",)) or first["msg"].startswith("Value error, messages:")


def _limit_message(error: ValidationError, asked_as: str, fix: str) -> str:
    first = error.errors()[0]
    where = ".".join([asked_as, *(str(part) for part in first["loc"])])
    return f"past a request limit once asked ({where}: {first['msg']}); {fix} (docs/decisions.md)"


def decision_request(create: DecisionCreate, workloads: dict[str, float | None]) -> DecisionPlan:
    """Every question (and ordering) a query of one ScoringRequest over the input's messages.
    A question whose rendered query passes a request limit (e.g. 255 long choices listed in one
    template) is a DecisionFormatError naming it; so is a request whose queries together do."""
    all_queries, ids, orders = [], [], []
    for index, question in enumerate(create.questions):
        if question.workload is not None and question.workload not in workloads:
            raise DecisionFormatError(f"questions.{index}.workload",
                                      f"unknown workload {question.workload!r}; configured: {sorted(workloads)}")
        try:
            queries, question_orders = question_queries(index, question)
        except ValidationError as error:
            raise DecisionFormatError(f"questions.{index}", _limit_message(
                error, "query", "shorten its instructions, choices or descriptions")) from None
        all_queries += queries
        ids.append([q.id for q in queries])
        orders.append(question_orders)
    try:
        request = ScoringRequest(model=create.model, messages=messages(create),
                                 scoring=ScoringSpec(queries=all_queries))
    except ValidationError as error:
        if _is_about_the_input(error):
            raise DecisionFormatError("input", _limit_message(error, "input", "shorten the input")) from None
        raise DecisionFormatError("questions", _limit_message(
            error, "scoring", "ask fewer questions, choices or orderings per request")) from None
    return DecisionPlan(request, ids, orders)

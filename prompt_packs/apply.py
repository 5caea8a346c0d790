"""Prompt packs at work: turn a pack into queries, and the answers into decisions.

    Pack --expand_pack--> [Query] (ids "pack-id:question-id", one per ordering)
         --engine, same read as the request's own queries--> [QueryResult]
         --apply_pack--> {"questions": {id: {p, calibrated_p, floor_p, ...}},
                          "categories": {id: {score, calibrated_score}},
                          "decisions": {id: label}}
    ScoringRequest + [Pack] --with_packs--> one request; its results --split_pack_results--> own + per pack

Calibrated values sit beside the raw ones (`calibrated_p` beside `p`), never replace them.
Pure Python: no torch, no numpy beyond the calibration maps.
"""

from __future__ import annotations

import math
from typing import Any

from contract.probability import reweight
from contract.protocol import Message, Query, ScoringRequest, ScoringSpec
from contract.scoring_results import QueryResult
from prompt_packs.calibration import Calibrator
from prompt_packs.decision_calibration import joint_probabilities
from prompt_packs.format import Calibration, Category, Decision, Pack, PackQuestion
from prompt_packs.orderings import Ordering, combine_orderings, expand_orderings

QUERY_ID_SEPARATOR = ":"


# ---- pack -> queries -------------------------------------------------------------------


def query_id(pack: Pack, question_id: str) -> str:
    return f"{pack.id}{QUERY_ID_SEPARATOR}{question_id}"


def question_queries(pack: Pack, question: PackQuestion) -> list[tuple[Query, Ordering | None]]:
    base_id = query_id(pack, question.id)
    if not question.is_lettered:
        query = Query(id=base_id, template=question.template, options=question.options, answer_in=question.answer_in,
                      calibrate=pack.label_free)
        return [(query, None)]
    texts = [c.text for c in question.choices]
    expanded = expand_orderings(base_id, question.template, texts, question.orderings, answer_in=question.answer_in)
    return [(q.model_copy(update={"calibrate": pack.label_free}), o) for q, o in expanded]


def expand_pack(pack: Pack) -> list[Query]:
    """The queries the engine scores for a pack, question order kept, orderings adjacent."""
    return [query for q in pack.questions for query, _ in question_queries(pack, q)]


# ---- answers -> questions, categories, decisions ---------------------------------------


def _calibrator(calibration: Calibration | None) -> Calibrator | None:
    return Calibrator(calibration.method, dict(calibration.params)) if calibration else None


def _options_of(result: QueryResult) -> list:
    return result.combinations[0].options  # pack questions have no value grid: one combination


def score_question(pack: Pack, question: PackQuestion, by_id: dict[str, QueryResult]) -> dict[str, Any]:
    """Raw score of one question: the summed p (and floor_p) of its positive answers."""
    expanded = question_queries(pack, question)
    missing = [q.id for q, _ in expanded if q.id not in by_id]
    if missing:
        raise KeyError(f"no result for pack quer(ies) {missing}")
    if not question.is_lettered:
        options = _options_of(by_id[expanded[0][0].id])
        p: float | None = sum(o.p for o in options if o.text in question.positive)
        floor_p = sum(o.floor_p for o in options if o.text in question.positive)
        entry = {"p": p, "floor_p": floor_p, "options": {o.text: o.p for o in options}}
        if pack.label_free == "contextual":
            contextual = reweight([o.p for o in options], [o.floor_p for o in options])
            entry["contextual_p"] = sum(c for o, c in zip(options, contextual, strict=True) if o.text in question.positive)
        return entry
    choice_ids = [c.id for c in question.choices]
    orderings = [o for _, o in expanded]
    letter_p = [[o.p for o in _options_of(by_id[q.id])] for q, _ in expanded]
    letter_floor = [[o.floor_p for o in _options_of(by_id[q.id])] for q, _ in expanded]
    combined = combine_orderings(orderings, letter_p)
    floors = combine_orderings(orderings, letter_floor).probabilities
    positive = [choice_ids.index(c) for c in question.positive]
    entry = {
        "p": sum(combined.probabilities[i] for i in positive) if positive else None,
        "floor_p": sum(floors[i] for i in positive) if positive else None,
        "choices": dict(zip(choice_ids, combined.probabilities, strict=True)),
        "combined": combined.as_dict(choice_ids),
    }
    if pack.label_free == "contextual" and positive:
        contextual = reweight(combined.probabilities, floors)
        entry["contextual_p"] = sum(contextual[i] for i in positive)
    return entry


def member_scores(questions: dict[str, dict[str, Any]], key: str) -> dict[str, float]:
    """Scores by category member: "q" -> the question's `key` score, "q/c" -> choice c's p."""
    scores: dict[str, float] = {}
    for question_id, entry in questions.items():
        value = entry[key] if entry[key] is not None else entry["p"]
        if value is not None:
            scores[question_id] = value
        for choice_id, p in entry.get("choices", {}).items():
            scores[f"{question_id}/{choice_id}"] = p
    return scores


def combine_scores(category: Category, pack: Pack, scores: dict[str, float]) -> float:
    values = [scores[m] for m in category.questions]
    if category.combine == "max":
        return max(values)
    if category.combine == "noisy_or":
        return 1.0 - math.prod(1.0 - v for v in values)
    weights = [pack.question(m.split("/")[0]).weight for m in category.questions]
    return sum(w * v for w, v in zip(weights, values, strict=True)) / sum(weights)


def decide(decision: Decision, scores: dict[str, float], pack: Pack | None = None) -> str:
    """The label; a rule's threshold is the fitted one (`calibration.thresholds`) where present."""
    if decision.argmax_of:
        return max(decision.argmax_of, key=lambda c: scores[c])  # first listed wins a tie
    fitted = pack.calibration.thresholds if pack is not None else {}
    for index, rule in enumerate(decision.rules):
        threshold = fitted.get(f"{decision.id}/{index}")
        if scores[rule.category] >= (threshold.at_least if threshold else rule.at_least):
            return rule.label
    return decision.default or ""


def apply_joint_maps(pack: Pack, categories: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each fitted argmax decision's joint probabilities; they also become its classes'
    calibrated category scores (in place)."""
    out = {}
    for decision_id, joint in pack.calibration.decisions.items():
        key = "score" if joint.reads == "raw" else "calibrated_score"
        scores = {c: categories[c][key] if categories[c][key] is not None else categories[c]["score"]
                  for c in joint.classes}
        out[decision_id] = joint_probabilities(joint, scores)
        for c, p in out[decision_id].items():
            categories[c]["calibrated_score"] = p
    return out


def apply_pack(pack: Pack, results: list[QueryResult]) -> dict[str, Any]:
    """Questions (raw p, calibrated_p, floor_p), category scores (raw and calibrated) and
    decisions (on calibrated category scores where fitted) from one content's results."""
    by_id = {r.id: r for r in results}
    questions: dict[str, dict[str, Any]] = {}
    for question in pack.questions:
        entry = score_question(pack, question, by_id)
        calibrator = _calibrator(pack.calibration.questions.get(question.id))
        is_fitted = calibrator is not None and entry["p"] is not None
        entry["calibrated_p"] = float(calibrator.apply(entry["p"])) if is_fitted else None
        questions[question.id] = entry
    raw = member_scores(questions, "p")
    calibrated = member_scores(questions, "calibrated_p")
    categories: dict[str, dict[str, Any]] = {}
    for category in pack.categories:
        fitted = pack.calibration.categories.get(category.id)
        calibrator = _calibrator(fitted)
        merged = combine_scores(category, pack, raw if fitted and fitted.reads == "raw" else calibrated)
        categories[category.id] = {
            "score": combine_scores(category, pack, raw),
            "calibrated_score": float(calibrator.apply(merged)) if calibrator else None,
        }
    probabilities = apply_joint_maps(pack, categories)
    best = {c: (e["calibrated_score"] if e["calibrated_score"] is not None else e["score"]) for c, e in categories.items()}
    decisions = {d.id: decide(d, best, pack) for d in pack.decisions}
    out = {"pack": pack.id, "version": pack.version, "questions": questions,
           "categories": categories, "decisions": decisions}
    if probabilities:
        out["decision_probabilities"] = probabilities
    return out


# ---- a request naming packs: one read for its own queries and every pack's -------------


def with_packs(request: ScoringRequest, packs: list[Pack]) -> ScoringRequest:
    """The request with every pack's queries appended after its own: the engine reads the
    content once and answers all of them as branches. The request's messages are the
    content as given (a pack's presentation applies when a pack runs on bare text); when
    the last user message is a named pack's presentation around the content, its floor
    keeps that frame (`floor_content`) so a floor empties only the content.
    Raises ValueError when a pack's query id collides with one of the request's."""
    queries = list(request.scoring.queries) + [q for pack in packs for q in expand_pack(pack)]
    messages = with_floor_frame(request.messages, packs)
    spec = ScoringSpec.model_validate({"queries": queries})  # ValidationError (a ValueError) on a clash
    return request.model_copy(update={"scoring": spec, "messages": messages})


def with_floor_frame(messages: list[Message], packs: list[Pack]) -> list[Message]:
    """The messages with the last user message's floor set to the first matching pack's
    presentation (a floor the caller set is kept)."""
    last = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if last is None or messages[last].floor_content is not None:
        return list(messages)
    presentation = next((p.presentation for p in packs if p.presentation.is_presenting(messages[last].content)), None)
    if presentation is None:
        return list(messages)
    framed = messages[last].model_copy(update={"floor_content": presentation.empty})
    return [*messages[:last], framed, *messages[last + 1 :]]


def split_pack_results(results: list[QueryResult], packs: list[Pack]) -> tuple[list[QueryResult], list[dict[str, Any]]]:
    """(the request's own results, in order; apply_pack output per pack, in order)."""
    pack_ids = {q.id for pack in packs for q in expand_pack(pack)}
    own = [r for r in results if r.id not in pack_ids]
    return own, [apply_pack(pack, results) for pack in packs]

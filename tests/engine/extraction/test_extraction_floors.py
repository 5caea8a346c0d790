"""Slot floors (`floor: true`): each answer's floor_p is the probability of the same paths
with the user's content emptied. Checked against transformers reading the floor prompt
(its own chat template and tokenizer) followed by each path's tokens; null when not asked;
the answers themselves do not change; batch invariant. Tiny random qwen2 (CPU, fp32)."""

import math

import orjson
import pytest
from pydantic import ValidationError

from contract.protocol import ScoringRequest
from contract.templates import expand_grid, parse_template
from engine.checks.parity import Reference
from engine.checks.parity_slots import (
    SLOT_CASES_PATH,
    ReferenceDecoder,
    reference_questions,
)
from engine.extraction.decoder import Answer, BeamDecoder, Finished, answers
from engine.extraction.slots import merge_key, slot_spec

MAX_TOKENS = 3
TOLERANCE = 1e-3


def _engine(tiny_engine):
    engine = tiny_engine("qwen2")
    engine.beam = BeamDecoder()  # the session's engine: slot parity's greedy control may have swapped it
    return engine


def _requests(floor: bool = True, extra: list[dict] = ()) -> list[ScoringRequest]:
    cases = orjson.loads(SLOT_CASES_PATH.read_bytes())
    queries = [q | {"max_tokens": MAX_TOKENS, "floor": floor} for q in cases["queries"]] + list(extra)
    return [ScoringRequest.model_validate({"messages": [{"role": "user", "content": content}],
                                           "scoring": {"queries": queries}}) for content in cases["contents"]]


def _reference_floors(decoder: ReferenceDecoder, request: ScoringRequest, questions) -> list[dict]:
    """Per slot question: {answer key: floor p}, from the reference's own answers and paths."""
    reference = decoder.reference
    messages = [m.model_dump() for m in request.messages]
    floor_messages = [{**m, "content": ""} if m["role"] == "user" else m for m in messages]
    combos = [(query, values) for query in request.scoring.queries
              for values in expand_grid(tuple(query.values), query.values)]
    out = []
    for (query, values), question in zip(combos, questions, strict=True):
        spec = slot_spec(query)
        floor_ids = reference.encode(reference.render(floor_messages, query.answer_in)
                                     + parse_template(query.template).fill(values))
        listed, _ = answers(question.state)
        if spec.mode == "generate":  # the reference's beam does not generate: its own greedy path
            listed = [_greedy_answer(decoder, question.prompt_ids, spec)]
        floors = {}
        for answer in listed:
            total = 0.0
            for path in answer.paths:
                sequence = tuple(floor_ids + path.ids)
                logprob = sum(reference.tail_logprobs([(sequence, len(path.ids))])[0])
                if spec.is_grammar:  # END: the mass of every token the grammar does not allow next
                    rest = decoder._whole([list(sequence)])[0].double()
                    rest[decoder.vocab.allowed(spec.kind, path.text)] = -math.inf
                    logprob += rest.logsumexp(0).item()
                total += math.exp(logprob)
            floors[merge_key(spec.kind, answer.value)] = total
        out.append(floors)
    return out


def _greedy_answer(decoder: ReferenceDecoder, prompt_ids: list[int], spec) -> Answer:
    """transformers' greedy continuation of the content prompt (generate mode, no seed)."""
    ids: list[int] = []
    while True:
        token = int(decoder._whole([prompt_ids + ids])[0].argmax())
        if token in decoder.vocab.special_set:
            text = decoder.vocab.continuation_text(ids)
            return Answer(text, text, 0.0, paths=[Finished(ids + [token], text, 0.0)])
        ids.append(token)
        if len(ids) >= spec.max_tokens:
            text = decoder.vocab.continuation_text(ids)
            return Answer(text, text, 0.0, paths=[Finished(list(ids), text, 0.0)])


GENERATE = {"id": "note", "template": "\n\nSummary:{*}", "mode": "generate", "max_tokens": MAX_TOKENS, "floor": True}


@pytest.fixture(scope="module")
def floor_parity(tiny_engine):
    engine = _engine(tiny_engine)
    requests = _requests(extra=[GENERATE])
    decoder = ReferenceDecoder(Reference(engine.checkpoint_path), whole=True)
    questions = reference_questions(decoder, requests)
    expected = [_reference_floors(decoder, r, q) for r, q in zip(requests, questions, strict=True)]
    return engine, requests, expected


def test_slot_floor_p_matches_transformers(floor_parity):
    engine, requests, expected = floor_parity
    results = engine.score_requests(requests).results
    num_answers, compared, worst_p, worst_log = 0, 0, 0.0, 0.0
    for response, request_expected in zip(results, expected, strict=True):
        combinations = [(query, c) for query in response.results for c in query.combinations]
        for (query, combination), floors in zip(combinations, request_expected, strict=True):
            kind = parse_template(next(q for q in requests[0].scoring.queries if q.id == query.id).template).slot
            for answer in combination.answers:
                key = merge_key(kind, answer.value)
                assert answer.floor_p is not None and 0 <= answer.floor_p <= 1
                num_answers += 1
                if key in floors:
                    compared += 1
                    worst_p = max(worst_p, abs(answer.floor_p - floors[key]))
                    if answer.floor_p > 0 and floors[key] > 0:
                        worst_log = max(worst_log, abs(math.log(answer.floor_p) - math.log(floors[key])))
    print(f"slot floors: answers={num_answers} compared={compared} max_abs_diff={worst_p:.3g}"
          f" max_abs_log_diff={worst_log:.3g}")
    assert compared == num_answers >= 30  # every answer has its reference floor (slot parity: the same answers)
    assert worst_p <= TOLERANCE and worst_log <= TOLERANCE


def test_floor_p_is_null_unless_asked_and_leaves_the_answers_alone(tiny_engine):
    engine = _engine(tiny_engine)
    plain, floored = _requests(floor=False)[:2], _requests(floor=True)[:2]
    without, with_floor = engine.score_requests(plain), engine.score_requests(floored)
    for a, b in zip(without.results, with_floor.results, strict=True):
        a_answers = [x for q in a.results for c in q.combinations for x in c.answers]
        b_answers = [x for q in b.results for c in q.combinations for x in c.answers]
        assert a_answers and all(x.floor_p is None for x in a_answers)
        assert all(x.floor_p is not None for x in b_answers)
        assert [x.model_dump(exclude={"floor_p"}) for x in a_answers] == [x.model_dump(exclude={"floor_p"})
                                                                          for x in b_answers]
        assert [c.residual for q in a.results for c in q.combinations] == [
            c.residual for q in b.results for c in q.combinations]
        assert a.usage.slot_tokens == b.usage.slot_tokens and b.usage.floor_tokens > a.usage.floor_tokens
    # content matters: the floor is a different number from p for most answers
    floored_answers = [x for r in with_floor.results for q in r.results for c in q.combinations for x in c.answers]
    assert sum(x.floor_p != x.p for x in floored_answers) > len(floored_answers) // 2
    # no floor asked: no floor passes (the read and the decoding passes only)
    assert len(without.pass_ids[0]) < len(with_floor.pass_ids[0])


def test_slot_floors_are_batch_invariant(tiny_engine):
    engine = _engine(tiny_engine)
    requests = _requests(floor=True)
    alone = engine.score_requests([requests[2]]).results[0]
    packed = engine.score_requests(requests).results[2]
    a, b = alone.model_dump(), packed.model_dump()
    a.pop("usage"), b.pop("usage")
    assert a == b


def test_floor_is_for_extraction_slots_only():
    with pytest.raises(ValidationError, match="floor: only extraction slots"):
        ScoringRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "scoring": {"queries": [
            {"id": "q", "template": "Q:{?}", "options": [" a", " b"], "floor": True}]}})

"""Extraction slots on the real default model (Qwen2.5-Coder-1.5B-Instruct, CPU, fp32):
the issue's examples, and parity with transformers on the slot cases (>= 20 questions)."""

import pytest

from contract.protocol import ScoringRequest
from engine.checks.parity import Reference
from engine.checks.parity_slots import (
    ReferenceDecoder,
    engine_rows,
    is_passing,
    load_slot_cases,
    reference_questions,
    summarize_slots,
)
from engine.engine import Engine, EngineConfig
from engine.extraction.decoder import BeamDecoder
from engine.loading.model_registry import DEFAULT_MODEL

SUPPORT = "Customer support message:\nI was charged twice for September, please refund one of the charges."
INVOICE = ("Invoice #2291 from Northwind Supplies\nBilled to: Maria Lopez\n3 boxes of printer paper\n"
           "Total due: $1,249.50 by March 15.")
PARITY_MAX_TOKENS = 5  # bounds the CPU time of the reference; answers here are short


@pytest.fixture(scope="module")
def engine():
    return Engine(EngineConfig(model=DEFAULT_MODEL, device="cpu", dtype="float32"))


def _top(response, query_id):
    [result] = [r for r in response.results if r.id == query_id]
    answers = result.combinations[0].answers
    assert answers, f"{query_id}: no answer"
    return answers[0]


@pytest.mark.slow
def test_support_example_month_is_september(engine):
    request = ScoringRequest.model_validate({
        "messages": [{"role": "user", "content": SUPPORT}],
        "scoring": {"queries": [
            {"id": "refund", "template": "\n\nIs the customer asking for a refund?\nAnswer:{?}", "options": [" yes", " no"]},
            {"id": "month", "template": "\n\nQ: Which month was charged twice?\nA: \"{*}\""}]}})
    response = engine.score(request)
    month = _top(response, "month")
    assert month.text == "September" and month.value == "September" and month.p > 0.5
    refund = response.results[0].combinations[0]
    assert max(refund.options, key=lambda o: o.p).text == " yes"  # the same read answered both


@pytest.mark.slow
def test_invoice_numbers_and_money(engine):
    request = ScoringRequest.model_validate({
        "messages": [{"role": "user", "content": INVOICE}],
        "scoring": {"queries": [
            {"id": "boxes", "template": "\n\nQ: How many boxes were ordered?\nA:{n}"},
            {"id": "total_number", "template": "\n\nQ: What is the total due?\nA:{n}"},
            {"id": "total", "template": "\n\nQ: What is the total due?\nA:{$}"}]}})
    response = engine.score(request)
    assert _top(response, "boxes").value == 3
    assert _top(response, "total_number").value == 1249.5
    assert _top(response, "total").value == {"amount": 1249.5, "currency": "USD"}


@pytest.fixture(scope="module")
def slot_parity(engine):
    requests = load_slot_cases(max_tokens=PARITY_MAX_TOKENS)
    reference = ReferenceDecoder(Reference(engine.checkpoint_path), whole=False)
    return engine, requests, reference_questions(reference, requests)


@pytest.mark.slow
def test_slot_parity_with_transformers(slot_parity):
    rows = engine_rows(*slot_parity, BeamDecoder())
    print(summarize_slots(rows))
    assert len(rows) >= 20
    assert sum(len(r["expected"]) >= 5 for r in rows) >= 10, "too few questions with five answers to compare"
    assert is_passing(rows), summarize_slots(rows)


@pytest.mark.slow
def test_slot_parity_fails_for_a_greedy_decoder(slot_parity):
    rows = engine_rows(*slot_parity, BeamDecoder(max_width=1))
    print(summarize_slots(rows))
    assert not is_passing(rows), "a greedy-only decoder passed slot parity on the default model"


SUMMARY = {"id": "note", "template": "\n\nA one-line summary:{*}", "mode": "generate", "max_tokens": 12}


def _support(queries: list[dict], content: str = SUPPORT) -> ScoringRequest:
    return ScoringRequest.model_validate({"messages": [{"role": "user", "content": content}],
                                          "scoring": {"queries": queries}})


@pytest.mark.slow
def test_generate_summary_does_not_stop_before_it_writes_something(engine):
    """The README's support message: greedy's likeliest first token ends the user's turn; the
    answer may not stop before its first non-whitespace character (docs/extraction.md)."""
    summary = engine.score(_support([SUMMARY])).results[0].combinations[0]
    [answer] = summary.answers
    first = engine.tokenizer(answer.text, add_special_tokens=False)["input_ids"][0]
    assert answer.text.strip() and engine.tokenizer.decode([first]).strip(), answer.text
    empty = engine.score(_support([SUMMARY | {"allow_empty": True}])).results[0].combinations[0]
    [stopped] = empty.answers
    assert stopped.text == "" and stopped.finish_reason == "stop" and stopped.p > 0.5  # as the model would
    assert summary.residual >= stopped.p  # the ending set aside stays in the residual, p is the model's own


@pytest.mark.slow
def test_generate_summary_alone_vs_packed_is_bit_identical(engine):
    others = [_support([{"id": "boxes", "template": "\n\nQ: How many boxes were ordered?\nA:{n}"},
                        SUMMARY | {"max_tokens": 6}], INVOICE),
              _support([{"id": "month", "template": "\n\nQ: Which month was charged twice?\nA: \"{*}\""},
                        {"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"]}])]
    target = _support([SUMMARY])
    alone = engine.score_requests([target]).results[0].model_dump()
    packed = engine.score_requests([others[0], target, others[1]]).results[1].model_dump()
    for response in (alone, packed):
        response.pop("usage")
        response.pop("id", None)
    assert alone == packed and alone["results"][0]["combinations"][0]["answers"][0]["text"].strip()

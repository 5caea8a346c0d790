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

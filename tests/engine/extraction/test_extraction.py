"""Extraction slots end to end on a tiny random qwen2 checkpoint (CPU, fp32): parity with
transformers, the greedy negative control, one read, batched decoding, batch invariance."""

import pytest
from transformers import PreTrainedTokenizerFast

from contract.protocol import ScoringRequest
from engine import RequestError
from engine.checks.parity import Reference
from engine.checks.parity_slots import (
    ReferenceDecoder,
    engine_rows,
    is_passing,
    load_slot_cases,
    reference_questions,
    summarize_slots,
)
from engine.extraction.decoder import BeamDecoder

MAX_TOKENS = 3  # short answers keep the whole-sequence reference quick


@pytest.fixture(scope="module")
def slot_parity(tiny_engine):
    """(engine, requests, transformers' answers) for the slot cases, decoded once."""
    engine = tiny_engine("qwen2")
    requests = load_slot_cases(max_tokens=MAX_TOKENS)
    reference = ReferenceDecoder(Reference(engine.checkpoint_path), whole=True)
    return engine, requests, reference_questions(reference, requests)


def test_slot_parity_with_transformers(slot_parity):
    rows = engine_rows(*slot_parity, BeamDecoder())
    assert len(rows) >= 20
    assert sum(len(r["expected"]) > 1 for r in rows) >= 5, "too few questions with several answers to compare"
    assert is_passing(rows), summarize_slots(rows)
    assert max(r["logp_diff"] for r in rows) <= 1e-3, summarize_slots(rows)


def test_slot_parity_fails_for_a_greedy_decoder(slot_parity):
    rows = engine_rows(*slot_parity, BeamDecoder(max_width=1))
    print(summarize_slots(rows))
    assert not is_passing(rows), "a greedy-only decoder passed slot parity"


def _request(content: str, queries: list[dict]) -> ScoringRequest:
    return ScoringRequest.model_validate({"messages": [{"role": "user", "content": content}],
                                          "scoring": {"queries": queries}})


QUERIES = [
    {"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"]},
    {"id": "month", "template": "\n\nQ: Which month?\nA: \"{*}\"", "max_tokens": 3},
    {"id": "amount", "template": "\n\nAmount:{$}", "max_tokens": 3, "beam_width": 3},
]


def test_slots_read_once_with_the_options_then_decode_over_kept_kv(tiny_engine):
    engine = tiny_engine("qwen2")
    decoded_rows = []
    decode = engine.runner.decode

    def recording_decode(batch, graphs=None):  # the real decode, with the size of every pass noted
        decoded_rows.append(int(batch.input_ids.shape[0]))
        return decode(batch, graphs)

    engine.runner.decode = recording_decode
    try:
        first_pass = engine.runner.num_passes + 1
        output = engine.score_requests([_request("I was charged twice for September, $12.50.", QUERIES)])
    finally:
        engine.runner.decode = decode
    response = output.results[0]
    assert output.pass_ids[0][0] == first_pass  # options and slot prompts: the same read
    assert len(output.pass_ids[0]) == 1 + len(decoded_rows)
    assert response.usage.floors_computed + response.usage.floors_cached == 1  # slots get no floor
    # decoding passes feed only the beams' newest tokens (never the content again)
    assert max(decoded_rows) == 64 and response.usage.slot_tokens <= 2 * 5 * 3
    month, amount = response.results[1].combinations[0], response.results[2].combinations[0]
    assert month.options == [] and month.answers is not None and len(amount.answers) <= 3
    assert month.residual == pytest.approx(max(0.0, 1 - sum(a.p for a in month.answers)))
    assert response.results[0].combinations[0].answers is None


def test_slots_of_many_contents_decode_together_and_batch_invariant(tiny_engine):
    engine = tiny_engine("qwen2")
    target = _request("Charged twice in September: $12.50.", QUERIES)
    others = [_request(f"Ticket {i}: the invoice of {i} EUR arrived in March.", QUERIES) for i in range(50)]
    alone = engine.score_requests([target])
    packed = engine.score_requests(others[:20] + [target] + others[20:])
    index = 20
    decode_passes = set(packed.pass_ids[index][1:])
    sharing = [i for i, ids in enumerate(packed.pass_ids) if i != index and decode_passes & set(ids)]
    assert len(sharing) == 50, "the other contents' slots were not decoded in the same passes"
    assert len(packed.pass_ids[index]) <= len(alone.pass_ids[0]) + 1  # batching did not multiply passes
    a, b = alone.results[0].model_dump(), packed.results[index].model_dump()
    a.pop("usage"), b.pop("usage")
    assert a == b  # bit-identical answers, p and residuals


def test_generate_mode_is_reproducible_and_greedy_matches_the_top_path(tiny_engine):
    engine = tiny_engine("qwen2")
    greedy = {"id": "g", "template": "\n\nA: \"{*}\"", "mode": "generate", "max_tokens": 3}
    sampled = greedy | {"id": "s", "seed": 3, "temperature": 1.5}
    width1 = {"id": "b", "template": "\n\nA: \"{*}\"", "beam_width": 1, "max_tokens": 3}
    request = _request("A short message.", [greedy, sampled, width1])
    first, second = engine.score(request), engine.score(request)
    assert first.model_dump() == second.model_dump()
    [g] = first.results[0].combinations[0].answers
    assert g.finish_reason in ("stop", "length") and 0 < g.p <= 1
    [b] = first.results[2].combinations[0].answers or [g]  # width 1 = greedy, when it closes
    assert b.text == g.text


def test_number_slot_on_a_tokenizer_without_digits_is_refused(tiny_checkpoint):
    import dataclasses

    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    from engine.engine import Engine, EngineConfig
    from engine.loading.loader import load_checkpoint

    words = ["[UNK]", "<eos>", "hello", "amount", "total", ":", "?", "the", "is"]
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    # the tokenizer object is handed to the engine directly: transformers 5 would otherwise
    # re-read a tokenizer saved in a qwen2 folder as a Qwen2Tokenizer
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="<eos>")
    checkpoint = load_checkpoint(str(tiny_checkpoint("qwen2")))
    checkpoint = dataclasses.replace(checkpoint, tokenizer=tokenizer, has_chat_template=False)
    engine = Engine(EngineConfig(model=checkpoint.served_name, device="cpu", dtype="float32"), checkpoint=checkpoint)
    assert engine.tokenize(["total amount"]) == [[4, 3]]
    request = _request("total amount", [{"id": "n", "template": "\n\namount:{n}"}])
    [result] = engine.score_requests([request]).results
    assert isinstance(result, RequestError) and result.field == "scoring.queries.template"
    assert "cannot write the digits ['0', '1'," in result.message

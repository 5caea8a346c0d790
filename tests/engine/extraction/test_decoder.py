"""The slot decoders on hand-built next-token distributions over a real tokenizer (no model).

A toy language model here is a table {answer-so-far: {token text: probability}}; the rest of
the mass sits on one filler token. The decoders only ever see distributions, so this tests
exactly their rules: the beam, closing text, grammars, merging, residual, generation.
"""

import math
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from engine.extraction.decoder import BeamDecoder, GenerateDecoder, answers, start_state
from engine.extraction.slots import SlotSpec, SlotVocab
from engine.loading.loader import registry_tokenizer_dir

FILLER = " the"  # absorbs the mass a table leaves over


@pytest.fixture(scope="module")
def vocab():
    tokenizer = AutoTokenizer.from_pretrained(registry_tokenizer_dir("qwen2.5-coder-0.5b-instruct"))
    return SlotVocab.build(tokenizer, len(tokenizer))


def token(vocab, text):
    return vocab.texts.index(text)


def dist(vocab, table: dict[str, float]) -> torch.Tensor:
    logprobs = torch.full((len(vocab.texts),), -math.inf)
    for text, p in table.items():
        logprobs[token(vocab, text)] = math.log(p)
    logprobs[token(vocab, FILLER)] = math.log(max(1e-12, 1 - sum(table.values())))
    return torch.log_softmax(logprobs, 0)


def decode(vocab, spec, lm: dict[str, dict[str, float]], decoder=None):
    state = start_state(spec)
    decoder = decoder or (GenerateDecoder() if spec.mode == "generate" else BeamDecoder())
    while not state.is_done:
        dists = torch.stack([dist(vocab, lm.get(h.text, {})) for h in state.live])
        decoder.step(state, dists, vocab)
    return answers(state)


def spec(kind="*", tail='"', width=5, max_tokens=8, mode="extract", seed=None, allow_empty=False):
    return SlotSpec(kind, tail, mode, width, max_tokens, seed, 1.0, allow_empty=allow_empty)


# "Sep" is the likeliest first token, but most of its continuations leave the answer open:
# greedy finds "Sep" (0.5 * 0.6 = 0.3); the beam also finds "October" (0.4 * 0.9 = 0.36).
MONTHS = {"": {"Sep": 0.5, "October": 0.4}, "Sep": {'"': 0.6, "t": 0.3}, "October": {'"': 0.9},
          "Sept": {'"': 0.95}}


def test_beam_finds_what_greedy_misses(vocab):
    found, residual = decode(vocab, spec(), MONTHS)
    assert [a.text for a in found] == ["October", "Sep", "Sept"]
    assert [round(a.p, 6) for a in found] == [0.36, 0.3, round(0.5 * 0.3 * 0.95, 6)]
    assert residual == pytest.approx(1 - 0.36 - 0.3 - 0.1425)
    greedy, _ = decode(vocab, spec(), MONTHS, BeamDecoder(max_width=1))
    assert [a.text for a in greedy] == ["Sep"]


def test_closing_text_inside_a_token_ends_the_answer(vocab):
    found, _ = decode(vocab, spec(), {"": {"May": 0.9}, "May": {'".': 0.7}})
    assert found[0].text == "May" and found[0].p == pytest.approx(0.63)


def test_answers_need_their_closing_text_within_max_tokens(vocab):
    found, residual = decode(vocab, spec(max_tokens=1), MONTHS)
    assert found == [] and residual == 1.0


def test_width_limits_the_answers(vocab):
    found, _ = decode(vocab, spec(width=1), MONTHS)
    assert len(found) == 1


def test_numbers_merge_by_value(vocab):
    lm = {"": {" ": 0.9}, " ": {"1": 0.8}, " 1": {"2": 0.9}, " 12": {".": 0.5}, " 12.": {"0": 0.6}}
    found, residual = decode(vocab, spec("n", ""), lm)
    # " 12" + END (mass of everything but "." and digits) and " 12." + END and " 12.0" + END
    # are one number; ",", "-" etc. never appear here, so END at " 12" is 1 - 0.5 (".")
    end_12 = 0.5
    end_12_dot = 0.4  # " 12." continues with a digit only through "0" (0.6)
    expected = 0.9 * 0.8 * 0.9 * (end_12 + 0.5 * (end_12_dot + 0.6 * 1.0))
    assert found[0].value == 12 and found[0].p == pytest.approx(expected, rel=1e-4)
    assert residual == pytest.approx(1 - sum(a.p for a in found))


def test_number_grammar_keeps_to_numeric_tokens(vocab):
    lm = {"": {" about": 0.6, " ": 0.1}, " ": {"3": 0.9}}  # " about" is no number: its mass is residual
    found, residual = decode(vocab, spec("n", ""), lm)
    assert [a.value for a in found] == [3] and found[0].p == pytest.approx(0.09, rel=1e-4)
    assert residual == pytest.approx(0.91, rel=1e-3)


def test_money_amount_and_currency(vocab):
    lm = {"": {" $": 0.7, " ": 0.2}, " $": {"1": 0.9}, " $1": {"2": 0.9}, " $12": {".": 0.9},
          " $12.": {"5": 0.9}, " $12.5": {"0": 0.9}, " ": {"1": 0.9}, " 1": {"2": 0.9}, " 12": {" USD": 0.8}}
    found, _ = decode(vocab, spec("$", ""), lm)
    values = [a.value for a in found]
    assert values[0] == {"amount": 12.5, "currency": "USD"} and found[0].text == " $12.50"
    assert {"amount": 12, "currency": "USD"} in values  # " 12 USD"


def test_generate_greedy_stops_at_end_of_text(vocab):
    eos = vocab.tokenizer.eos_token
    lm = {"": {" Hello": 0.6}, " Hello": {" world": 0.7}, " Hello world": {eos: 0.8}}
    found, residual = decode(vocab, spec(mode="generate", tail=""), lm)
    assert found[0].text == " Hello world" and found[0].finish_reason == "stop"
    assert found[0].p == pytest.approx(0.6 * 0.7 * 0.8) and residual == pytest.approx(1 - found[0].p)


def test_generate_sampling_is_reproducible_by_seed(vocab):
    lm = {"": {" a": 0.3, " b": 0.3, " c": 0.3}}
    runs = [decode(vocab, spec(mode="generate", tail="", max_tokens=3, seed=s), lm)[0][0].text for s in range(12)]
    again = [decode(vocab, spec(mode="generate", tail="", max_tokens=3, seed=s), lm)[0][0].text for s in range(12)]
    assert runs == again and len(set(runs)) > 1
    assert all(decode(vocab, spec(mode="generate", tail="", max_tokens=3, seed=s), lm)[0][0].finish_reason
               == "length" for s in range(2))


# When a generate answer may stop: not before its first non-whitespace character
# (GenerateDecoder), unless the slot allows an empty answer.

def test_generate_does_not_stop_before_its_first_non_whitespace_character(vocab):
    eos = vocab.tokenizer.eos_token
    lm = {"": {eos: 0.55, " Double": 0.3}, " Double": {" charge": 0.9}, " Double charge": {eos: 0.8}}
    [found], residual = decode(vocab, spec(mode="generate", tail=""), lm)
    assert found.text == " Double charge" and found.finish_reason == "stop"
    assert found.p == pytest.approx(0.3 * 0.9 * 0.8)  # the model's own p, not renormalised past the 0.55
    assert residual == pytest.approx(1 - found.p)
    [empty], _ = decode(vocab, spec(mode="generate", tail="", allow_empty=True), lm)
    assert empty.text == "" and empty.finish_reason == "stop" and empty.p == pytest.approx(0.55)


def test_generate_whitespace_alone_does_not_let_it_stop(vocab):
    eos = vocab.tokenizer.eos_token
    lm = {"": {"\n": 0.6, eos: 0.3}, "\n": {eos: 0.9, "Ok": 0.06}, "\nOk": {eos: 0.9}}
    [found], _ = decode(vocab, spec(mode="generate", tail=""), lm)
    assert found.text == "\nOk" and found.p == pytest.approx(0.6 * 0.06 * 0.9)
    [found], _ = decode(vocab, spec(mode="generate", tail="", allow_empty=True), lm)
    assert found.text == "\n" and found.p == pytest.approx(0.6 * 0.9)


def test_generate_closing_text_ends_it_only_after_some_text(vocab):
    lm = {"": {'"': 0.7, " May": 0.2}, " May": {'"': 0.9}}
    [found], _ = decode(vocab, spec(mode="generate"), lm)
    assert found.text == " May" and found.finish_reason == "stop" and found.p == pytest.approx(0.2 * 0.9)
    [found], _ = decode(vocab, spec(mode="generate", allow_empty=True), lm)
    assert found.text == "" and found.p == pytest.approx(0.7)


def test_generate_sampling_draws_again_when_it_would_end_empty(vocab):
    eos = vocab.tokenizer.eos_token
    lm = {"": {eos: 0.5, " a": 0.2, " b": 0.2}}
    def texts(allow_empty):
        return [decode(vocab, spec(mode="generate", tail="", max_tokens=2, seed=s, allow_empty=allow_empty), lm)[0][0]
                .text for s in range(16)]
    strict, free = texts(False), texts(True)
    assert all(t.strip() for t in strict) and len({t[:2] for t in strict}) > 1
    assert "" in free
    # a draw the rule does not touch stays as it was: the same seed, the same text
    assert all(a == b for a, b in zip(strict, free, strict=True) if b)


# Candidate selection (engine/extraction/select.py): what the decoders get instead of whole rows.

from engine.extraction.select import ALL, TEXT, RowNeed, select  # noqa: E402


def _old_top(logprobs: torch.Tensor, width: int, allowed: list[int] | None = None) -> list[tuple[float, int]]:
    """The k best the way the decoder took them before selection moved to the device: topk over
    the (double) row or its allowed subset, -inf dropped; ranked (log-prob desc, token id)."""
    row = logprobs.double()
    if allowed is None:
        values, tokens = row.topk(width)
        pairs = zip(values.tolist(), tokens.tolist())
    else:
        values, positions = row[allowed].topk(min(width, len(allowed)))
        pairs = ((v, allowed[p]) for v, p in zip(values.tolist(), positions.tolist()))
    return sorted(((v, t) for v, t in pairs if v != -math.inf), key=lambda p: (-p[0], p[1]))


def test_select_matches_whole_row_topk_and_end_mass(vocab):
    generator = torch.Generator().manual_seed(0)
    rows = torch.log_softmax(torch.randn(6, len(vocab.texts), generator=generator) * 3, dim=-1)
    texts = {3: " 12.", 4: "$1", 5: " 1,"}  # the grammar rows' answers so far
    needs = [RowNeed(5, TEXT), RowNeed(1, ALL), None]
    needs += [RowNeed(5, "n", vocab.allowed_mask("n", " 12."), end=True),
              RowNeed(7, "$", vocab.allowed_mask("$", "$1"), end=True),
              RowNeed(3, "$", vocab.allowed_mask("$", " 1,"), end=False)]
    found = select(rows, needs, vocab)
    assert found[2] is None
    masked = rows[0].clone()
    masked[vocab.special_ids] = -math.inf
    assert list(zip(found[0].logprobs, found[0].ids)) == _old_top(masked, 5)
    assert found[1].ids == [int(rows[1].double().argmax())]
    for row, kind, k in ((3, "n", 5), (4, "$", 7), (5, "$", 3)):
        allowed = vocab.allowed(kind, texts[row])
        assert list(zip(found[row].logprobs, found[row].ids)) == _old_top(rows[row], k, allowed)
    for row, kind in ((3, "n"), (4, "$")):
        rest = rows[row].double().clone()
        rest[vocab.allowed(kind, texts[row])] = -math.inf
        assert found[row].end == torch.logsumexp(rest, 0).item()  # bit-identical to the whole-row formula
    assert found[5].end is None


def test_select_breaks_ties_at_the_kth_place_by_token_id(vocab):
    logprobs = torch.full((2, len(vocab.texts)), -30.0)
    logprobs[:, [9000, 4000, 7000, 500, 12000]] = torch.tensor([-1.0, -2.0, -2.0, -2.0, -2.0])
    logprobs = torch.log_softmax(logprobs, dim=-1)
    found = select(logprobs, [RowNeed(3, ALL), RowNeed(5, ALL)], vocab)
    assert found[0].ids == [9000, 500, 4000]  # four tie for second place: the lowest ids win
    assert found[1].ids == [9000, 500, 4000, 7000, 12000]


def test_select_gives_each_row_what_it_would_get_alone(vocab):
    generator = torch.Generator().manual_seed(1)
    rows = torch.log_softmax(torch.randn(5, len(vocab.texts), generator=generator) * 3, dim=-1)
    needs = [RowNeed(5, TEXT), RowNeed(2, TEXT), RowNeed(4, "n", vocab.allowed_mask("n", " 1"), end=True),
             RowNeed(0, ALL, full=True), RowNeed(1, ALL)]
    together = select(rows, needs, vocab)
    for row, need in enumerate(needs):
        [alone] = select(rows[row : row + 1], [need], vocab)
        assert alone.ids == together[row].ids and alone.logprobs == together[row].logprobs
        assert alone.end == together[row].end
        assert (alone.full is None) == (together[row].full is None)
    assert torch.equal(together[3].full, rows[3].double())


@pytest.mark.parametrize("name", ["tiny-gemma3_text", "tiny-qwen3"])
def test_continuation_text_is_the_tokenizers_decode(name):
    """SlotVocab decodes answers through the Rust tokenizer where the tokenizer cleans up no
    spaces: the same text as transformers' decode, special tokens and all."""
    import random

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    import random_models

    from engine.extraction.slots import text_of

    tokenizer = random_models.tokenizer_for(name)
    assert text_of(tokenizer) is not tokenizer.decode  # the fast path is taken for these tokenizers
    rng = random.Random(0)
    specials = list(tokenizer.all_special_ids)
    for _ in range(300):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 8))] + rng.sample(specials, 1)
        rng.shuffle(ids)
        assert text_of(tokenizer)(ids) == tokenizer.decode(ids), ids
    tokenizer.clean_up_tokenization_spaces = True
    assert text_of(tokenizer) == tokenizer.decode  # a tokenizer that cleans up keeps transformers' decode

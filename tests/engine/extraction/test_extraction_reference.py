"""Slot answers against a reference decoder written here from the rules of docs/extraction.md,
with nothing of the engine's decoding in it: transformers loads the checkpoint, renders the
chat template and tokenizes (engine/checks/parity.py's Reference, the parity tests' side), and
every step re-reads each whole sequence (prompt + the hypothesis's tokens) through
transformers' own forward. The beam, the closing text, the grammars ({n} {$}: each token
checked against the grammar's regular expression), END, merging by value and the generate
stop rule (not before the first non-whitespace character unless `allow_empty`) are the
loops below. Tiny random qwen3 (sliding layers, 152k vocabulary) and gemma3_text (262k
vocabulary, softcapping).

What is equal: every answer's text, value, order and finish_reason; p and residual within
TOLERANCE in log space (transformers' kernels round differently from the engine's). The
"forced" generate slots end on the text of the token greedy would write first, so the stop
rule is exercised (the test asserts it was, and that `allow_empty` ends there, empty)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import regex
import torch

from contract.protocol import ScoringRequest
from engine.checks.parity import Reference

CONTENTS = [
    "Hi, this is Maria Lopez. I ordered 3 blue kettles and was charged $89.97 twice in September.",
    "Invoice 2291 from Northwind Supplies: 12 boxes of paper, total due EUR 240.00 by March 15.",
]
QUERIES = [
    {"id": "name", "template": "\n\nQ: Who wrote this?\nA: \"{*}\"", "max_tokens": 4},
    {"id": "line", "template": "\n\nThe product:{*}\n", "max_tokens": 4, "beam_width": 9},
    {"id": "count", "template": "\n\nQ: How many?\nA:{n}", "max_tokens": 4, "beam_width": 6},
    {"id": "amount", "template": "\n\nQ: What amount?\nA:{$}", "max_tokens": 4, "beam_width": 6},
    {"id": "narrow", "template": "\n\nA: \"{*}\"", "beam_width": 1, "max_tokens": 4},
    {"id": "greedy", "template": "\n\nSummary:{*} ", "mode": "generate", "max_tokens": 4},
    {"id": "greedy_word", "template": "\n\nIn one word:{*} ", "mode": "generate", "max_tokens": 4},
    {"id": "greedy_empty", "template": "\n\nSummary:{*} ", "mode": "generate", "max_tokens": 4, "allow_empty": True},
    {"id": "sampled", "template": "\n\nSummary:{*} ", "mode": "generate", "max_tokens": 4, "seed": 3,
     "temperature": 1.5},
    {"id": "sampled_more", "template": "\n\nIn one word:{*} ", "mode": "generate", "max_tokens": 4, "seed": 11},
]
TOLERANCE = 1e-3  # |Δ log p| and |Δ residual|

# the grammars as docs/extraction.md states them
NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?"
SYMBOLS = {"$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY", "₹": "INR", "₩": "KRW", "₽": "RUB"}
CODES = ("USD EUR GBP JPY CNY CHF CAD AUD NZD INR KRW SEK NOK DKK PLN CZK HUF BRL MXN ZAR RUB TRY SGD HKD ILS AED"
         " SAR THB RON BGN").split()
CURRENCY = "(?:" + "|".join([regex.escape(s) for s in SYMBOLS] + CODES) + ")"
GRAMMARS = {"n": regex.compile(rf"\s?{NUMBER}[.,]?"),
            "$": regex.compile(rf"\s?(?:(?P<pre>{CURRENCY})\s?)?(?P<amount>{NUMBER})(?:\s?(?P<post>{CURRENCY}))?[.,]?")}


@dataclass
class Path:
    ids: list[int]
    text: str
    logprob: float
    finish_reason: str | None = None


class ReferenceSlots:
    def __init__(self, reference: Reference) -> None:
        self.ref = reference
        tokenizer = reference.tokenizer
        size = reference.model.config.vocab_size
        self.special = set(tokenizer.all_special_ids) | set(range(len(tokenizer), size))
        self.special |= {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        self.pieces = [tokenizer.decode([i]) if i < len(tokenizer) else "" for i in range(size)]
        chars = set(" +-0123456789.,")
        self.grammar_ids = {
            "n": [i for i, t in enumerate(self.pieces) if t and set(t) <= chars and i not in self.special],
            "$": [i for i, t in enumerate(self.pieces) if t and i not in self.special
                  and set(t) <= chars | set("".join(SYMBOLS) + "".join(CODES))],
        }
        self.num_set_aside = 0  # generate: tokens the stop rule set aside

    @torch.inference_mode()
    def next_logprobs(self, ids: list[int]) -> torch.Tensor:
        logits = self.ref.model(input_ids=torch.tensor([ids])).logits[0, -1].double()
        return torch.log_softmax(logits, -1)

    def text(self, prompt: list[int], ids: list[int]) -> str:
        decode = self.ref.tokenizer.decode
        return decode(prompt + ids)[len(decode(prompt)):]

    def allowed(self, kind: str, text: str) -> list[int]:
        return [i for i in self.grammar_ids[kind] if GRAMMARS[kind].fullmatch(text + self.pieces[i], partial=True)]

    def beam(self, query: dict, prompt: list[int], kind: str, tail: str) -> list[Path]:
        width, max_tokens = query.get("beam_width", 5), query.get("max_tokens", 16)
        live, finished = [Path([], "", 0.0)], []
        while live:
            proposals = []  # (-logprob, hypothesis index, token id, path, finished)
            for index, hyp in enumerate(live):
                row = self.next_logprobs(prompt + hyp.ids)
                masked = row.clone()
                if kind == "*":
                    masked[sorted(self.special)] = -math.inf
                else:
                    allowed = self.allowed(kind, hyp.text) if len(hyp.ids) < max_tokens else []
                    keep = torch.full_like(masked, -math.inf)
                    keep[allowed] = masked[allowed]
                    masked = keep
                    if hyp.ids and GRAMMARS[kind].fullmatch(hyp.text):
                        rest = row.clone()
                        rest[self.allowed(kind, hyp.text)] = -math.inf
                        end = hyp.logprob + torch.logsumexp(rest, 0).item()
                        proposals.append((-end, index, -1, Path(hyp.ids, hyp.text, end), True))
                values, tokens = torch.sort(masked, descending=True, stable=True)  # equal values: lower id first
                order = [j for j in range(width) if values[j] > -math.inf]
                tokens, values = tokens.tolist(), values
                for j in order:
                    token, logprob = tokens[j], hyp.logprob + values[j].item()
                    ids = hyp.ids + [token]
                    if kind == "*":
                        text = self.text(prompt, ids)
                        if tail in text:
                            proposals.append((-logprob, index, token, Path(ids, text[: text.index(tail)], logprob), True))
                        elif len(ids) < max_tokens:
                            proposals.append((-logprob, index, token, Path(ids, text, logprob), False))
                    else:
                        proposals.append((-logprob, index, token, Path(ids, hyp.text + self.pieces[token], logprob),
                                          False))
            proposals.sort(key=lambda p: p[:3])
            live = []
            for *_, path, is_finished in proposals[:width]:
                (finished if is_finished else live).append(path)
        return finished

    def generate(self, query: dict, prompt: list[int], tail: str) -> list[Path]:
        max_tokens, seed = query.get("max_tokens", 64), query.get("seed")
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        temperature = query.get("temperature", 1.0)
        ids, logprob = [], 0.0
        while True:
            row = self.next_logprobs(prompt + ids)
            written = self.text(prompt, ids)
            candidates = row.clone()
            while True:
                if generator is None:
                    token = int(candidates.argmax())
                else:
                    token = int(torch.multinomial(torch.softmax(candidates / temperature, 0), 1, generator=generator))
                text = self.text(prompt, ids + [token])
                ends_empty = token in self.special or (tail and tail in text and not text[: text.index(tail)].strip())
                if query.get("allow_empty") or written.strip() or not ends_empty:
                    break
                self.num_set_aside += 1
                candidates[token] = -math.inf
                candidates[sorted(self.special)] = -math.inf
            logprob += row[token].item()
            if token in self.special:
                return [Path(ids + [token], written, logprob, "stop")]
            ids.append(token)
            if tail and tail in text:
                return [Path(ids, text[: text.index(tail)], logprob, "stop")]
            if len(ids) >= max_tokens:
                return [Path(ids, text, logprob, "length")]


def value_of(kind: str, text: str):
    if kind == "*":
        return text
    match = GRAMMARS[kind].fullmatch(text)
    number = (match.group("amount") if kind == "$" else text.strip().rstrip(".,")).replace(",", "")
    number = float(number.rstrip(".")) if "." in number else int(number)
    number = int(number) if isinstance(number, float) and number.is_integer() else number
    if kind == "n":
        return number
    code = match.group("pre") or match.group("post")
    return {"amount": number, "currency": SYMBOLS.get(code, code)}


def reference_answers(slots: ReferenceSlots, request: ScoringRequest, query: dict) -> tuple[list[dict], float]:
    parsed = request.scoring.queries[[q.id for q in request.scoring.queries].index(query["id"])].parsed_template
    prompt_text = slots.ref.render([m.model_dump() for m in request.messages], "user") + parsed.fill({})
    prompt = slots.ref.encode(prompt_text)
    if query.get("mode") == "generate":
        paths = slots.generate(query, prompt, parsed.tail)
    else:
        paths = slots.beam(query, prompt, parsed.slot, parsed.tail)
    merged: dict[str, dict] = {}
    for path in sorted(paths, key=lambda p: -p.logprob):
        value = value_of(parsed.slot, path.text) if query.get("mode") != "generate" else path.text
        key = repr(value if parsed.slot == "*" or query.get("mode") == "generate" else
                   float(value) if parsed.slot == "n" else (float(value["amount"]), value["currency"]))
        if key in merged:
            merged[key]["p"] += math.exp(path.logprob)
        else:
            merged[key] = {"text": path.text, "value": value, "p": math.exp(path.logprob),
                           "finish_reason": path.finish_reason}
    listed = sorted(merged.values(), key=lambda a: (-a["p"], a["text"]))[: query.get("beam_width", 5)]
    return listed, max(0.0, 1.0 - sum(a["p"] for a in listed))


def _queries(slots: ReferenceSlots, content: str) -> list[dict]:
    """QUERIES and two generate slots whose closing text is the text of the token the model
    likes best after "Summary:" on this content, so greedy would end there, empty: the stop
    rule must set it aside (and `allow_empty` keeps it)."""
    prompt = slots.ref.encode(slots.ref.render([{"role": "user", "content": content}], "user") + "\n\nSummary:")
    row = slots.next_logprobs(prompt).clone()
    row[sorted(slots.special)] = -math.inf
    for token in torch.sort(row, descending=True, stable=True).indices.tolist():
        piece = slots.text(prompt, [token])
        if piece.strip() and not set(piece) & set("{}"):
            break
    forced = {"template": "\n\nSummary:{*}" + piece, "mode": "generate", "max_tokens": 4}
    return QUERIES + [forced | {"id": "forced"}, forced | {"id": "forced_empty", "allow_empty": True}]


def _requests(slots: ReferenceSlots) -> list[ScoringRequest]:
    return [ScoringRequest.model_validate({"messages": [{"role": "user", "content": c}],
                                           "scoring": {"queries": _queries(slots, c)}}) for c in CONTENTS]


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_slot_answers_match_an_independent_transformers_decoder(tiny_engine, family):
    engine = tiny_engine(family)
    slots = ReferenceSlots(Reference(engine.checkpoint_path))
    requests = _requests(slots)
    responses = engine.score_requests(requests).results
    largest, num_answers, texts = 0.0, 0, set()
    for request, response in zip(requests, responses, strict=True):
        queries = [q.model_dump(exclude_unset=True) for q in request.scoring.queries]
        for query, result in zip(queries, response.results, strict=True):
            [combination] = result.combinations
            expected, residual = reference_answers(slots, request, query)
            got = [{"text": a.text, "value": a.value, "finish_reason": a.finish_reason} for a in combination.answers]
            assert got == [{k: a[k] for k in ("text", "value", "finish_reason")} for a in expected], \
                (family, query["id"], request.messages[0].content[:20])
            for answer, want in zip(combination.answers, expected, strict=True):
                largest = max(largest, abs(math.log(answer.p) - math.log(want["p"])))
            largest = max(largest, abs(combination.residual - residual))
            num_answers += len(expected)
            if query["id"] == "forced_empty":
                assert [a["text"] for a in expected] == [""], "the forced slot did not end at once"
            texts |= {a["text"] for a in expected}
    print(f"{family}: {num_answers} answers, max |Δ log p| / |Δ residual| {largest:.1e},"
          f" stop rule set aside {slots.num_set_aside} tokens")
    assert num_answers >= 30 and len(texts) > 10
    assert slots.num_set_aside > 0, "no generate slot met the stop rule: the comparison does not cover it"
    assert largest <= TOLERANCE

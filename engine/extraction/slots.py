"""Extraction slots: what a slot may write, when its answer ends, and what the answer means.

    Query ({*} | {n} | {$}) --slot_spec--> SlotSpec (kind, tail, beam width, max tokens, ...)
    tokenizer --SlotVocab.build--> token texts, special ids, the tokens a number / money may use
    answer text --parse_number / parse_money--> value ({n}: 12.5; {$}: {"amount", "currency"})

`{*}` is free text ended by the template's closing text (`tail`). `{n}` and `{$}` are
grammars: a continuation may only use tokens that keep its text a prefix of a number (or an
amount with its currency), and it ends when the model writes anything else (that mass is
the answer's closing probability). Grammar prefixes are checked with the `regex` module's
partial matching (a transformers dependency). No model here; `SlotVocab.tables` puts the
token sets on the model's device once, for engine/extraction/select.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import regex
import torch

from contract.protocol import Query
from contract.templates import MONEY_SLOT, NUMBER_SLOT, TEXT_SLOT
from engine.pipeline.prompts import PromptError

# A number as written in text: optional leading space and sign, digits with optional
# thousands commas, an optional decimal part; a trailing "." or "," (the sentence goes on)
# still closes the number.
_NUMBER_BODY = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?"
NUMBER_RE = regex.compile(rf"\s?{_NUMBER_BODY}[.,]?")
CURRENCY_SYMBOLS = {"$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY", "₹": "INR", "₩": "KRW", "₽": "RUB"}
CURRENCY_CODES = (
    "USD", "EUR", "GBP", "JPY", "CNY", "CHF", "CAD", "AUD", "NZD", "INR", "KRW", "SEK", "NOK", "DKK", "PLN",
    "CZK", "HUF", "BRL", "MXN", "ZAR", "RUB", "TRY", "SGD", "HKD", "ILS", "AED", "SAR", "THB", "RON", "BGN",
)
_CURRENCY = "(?:" + "|".join([regex.escape(s) for s in CURRENCY_SYMBOLS] + list(CURRENCY_CODES)) + ")"
# "$12.50", "€ 12", "USD 12.50", "12.50 USD", "12.50€", or a bare amount (currency null)
MONEY_RE = regex.compile(
    rf"\s?(?:(?P<pre>{_CURRENCY})\s?)?(?P<amount>{_NUMBER_BODY})(?:\s?(?P<post>{_CURRENCY}))?[.,]?"
)
MAX_NUM_CACHED_STATES = 4096  # grammar states whose allowed tokens are kept
_NUMBER_CHARS = frozenset(" +-0123456789.,")
_MONEY_CHARS = _NUMBER_CHARS | frozenset("".join(CURRENCY_SYMBOLS) + "".join(CURRENCY_CODES))


@dataclass(frozen=True, slots=True)
class SlotSpec:
    """How one slot query is decoded (from the validated request)."""

    kind: str  # TEXT_SLOT, NUMBER_SLOT or MONEY_SLOT
    tail: str  # template text after the slot; ends a {*} answer
    mode: str  # "extract" (beam) or "generate" (one text)
    beam_width: int
    max_tokens: int  # most tokens an answer may have (for {*}, with the one carrying the tail)
    seed: int | None  # generate: None greedy, else sampled
    temperature: float
    floor: bool = False  # each answer also gets floor_p (engine/extraction/decoding.py: the slot floor)
    allow_empty: bool = False  # generate: may end before its first non-whitespace character

    @property
    def is_grammar(self) -> bool:
        return self.kind in (NUMBER_SLOT, MONEY_SLOT)


def text_of(tokenizer) -> Callable[[list[int]], str]:
    """`tokenizer.decode`, or the Rust tokenizer's own decode where that gives the same text (a
    tokenizer backed by one that cleans up no spaces): the beam decodes every candidate's text,
    and transformers' wrapper converts its arguments at every call."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return tokenizer.decode
    return partial(backend.decode, skip_special_tokens=False)  # transformers' default; the Rust one's is True


def slot_spec(query: Query) -> SlotSpec:
    parsed = query.parsed_template
    return SlotSpec(parsed.slot, parsed.tail, query.mode, query.beam_width, query.num_max_tokens,
                    query.seed, query.temperature, query.floor, query.allow_empty)


@dataclass(slots=True)
class SlotVocab:
    """What the decoders need to know about a tokenizer, computed once per engine."""

    texts: list[str]  # [V] each token's text as it reads after other text
    special_ids: list[int]  # tokens that never appear in an answer (EOS, chat markers, ...)
    special_set: frozenset[int]
    number_ids: list[int]  # tokens made only of characters a number can use
    money_ids: list[int]  # tokens made only of characters an amount with currency can use
    anchor_ids: list[int]  # decode(anchor + ids) minus decode(anchor): context-true text
    anchor_text: str
    tokenizer: object = field(repr=False)
    decode: Callable[[list[int]], str] = field(repr=False)  # token ids -> text: `text_of(tokenizer)`
    _allowed: dict[tuple[str, str], tuple[list[int], torch.Tensor]] = field(default_factory=dict, repr=False)
    _tables: dict[torch.device, VocabTables] = field(default_factory=dict, repr=False)

    @staticmethod
    def build(tokenizer, vocab_size: int) -> SlotVocab:
        anchor_ids = tokenizer("a", add_special_tokens=False)["input_ids"][-1:]
        anchor_text = tokenizer.decode(anchor_ids)
        num_tokens = min(vocab_size, len(tokenizer))
        decoded = tokenizer.batch_decode([anchor_ids + [i] for i in range(num_tokens)])
        texts = [text[len(anchor_text):] for text in decoded] + [""] * (vocab_size - num_tokens)
        special = set(tokenizer.all_special_ids)
        special |= {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
        special |= set(range(num_tokens, vocab_size))  # rows the tokenizer cannot emit
        number_ids = [i for i, t in enumerate(texts) if t and set(t) <= _NUMBER_CHARS and i not in special]
        money_ids = [i for i, t in enumerate(texts) if _is_money_piece(t) and i not in special]
        return SlotVocab(texts, sorted(special), frozenset(special), number_ids, money_ids, anchor_ids, anchor_text,
                         tokenizer, text_of(tokenizer))

    def continuation_text(self, ids: list[int]) -> str:
        """The text of an answer's tokens as they read after the prompt."""
        return self.decode(self.anchor_ids + list(ids))[len(self.anchor_text):]

    def grammar_ids(self, kind: str) -> list[int]:
        return self.number_ids if kind == NUMBER_SLOT else self.money_ids

    def allowed(self, kind: str, text: str) -> list[int]:
        """Tokens that keep `text` a prefix of the slot's grammar (cached: beams share states)."""
        return self._grammar_state(kind, text)[0]

    def allowed_mask(self, kind: str, text: str) -> torch.Tensor:
        """The same tokens as a bool [G] mask over `grammar_ids(kind)` (CPU; cached)."""
        return self._grammar_state(kind, text)[1]

    def _grammar_state(self, kind: str, text: str) -> tuple[list[int], torch.Tensor]:
        key = (kind, text)
        if key not in self._allowed:
            if len(self._allowed) >= MAX_NUM_CACHED_STATES:
                self._allowed.clear()
            flags = [is_prefix(kind, text + self.texts[i]) for i in self.grammar_ids(kind)]
            allowed = [i for i, flag in zip(self.grammar_ids(kind), flags, strict=True) if flag]
            self._allowed[key] = (allowed, torch.tensor(flags, dtype=torch.bool))
        return self._allowed[key]

    def tables(self, device: torch.device) -> VocabTables:
        """The token sets the decoders mask with, as index tensors on `device` (made once per device)."""
        device = torch.device(device)
        if device not in self._tables:
            def ids(values: list[int]) -> torch.Tensor:
                return torch.tensor(values, dtype=torch.long, device=device)

            self._tables[device] = VocabTables(
                special=ids(self.special_ids),
                grammar={NUMBER_SLOT: ids(self.number_ids), MONEY_SLOT: ids(self.money_ids)},
            )
        return self._tables[device]

    def check_serves(self, kind: str) -> None:
        """A number or money slot needs every digit as a token of its own or inside one."""
        if kind == TEXT_SLOT:
            return
        digits = set("".join(self.texts[i] for i in self.number_ids)) & set("0123456789")
        if len(digits) < 10:
            raise PromptError(
                "scoring.queries.template",
                f"this model's tokenizer cannot write the digits {sorted(set('0123456789') - digits)},"
                " so it cannot serve a number or money slot; use {*}",
            )


@dataclass(frozen=True, slots=True)
class VocabTables:
    """SlotVocab's token sets on one device: what candidate selection masks with."""

    special: torch.Tensor  # [n_special] long: never in a {*} answer of mode "extract"
    grammar: dict[str, torch.Tensor]  # kind -> [G] long: the tokens a number / money answer may use


def _is_money_piece(text: str) -> bool:
    """Characters an amount may use, and every run of letters inside some currency code."""
    if not text or not set(text) <= _MONEY_CHARS:
        return False
    return all(any(run in code for code in CURRENCY_CODES) for run in regex.findall(r"[A-Z]+", text))


def grammar_of(kind: str) -> regex.Pattern:
    return NUMBER_RE if kind == NUMBER_SLOT else MONEY_RE


def is_prefix(kind: str, text: str) -> bool:
    """True when `text` can still grow into a complete number / amount."""
    return grammar_of(kind).fullmatch(text, partial=True) is not None


def is_complete(kind: str, text: str) -> bool:
    return grammar_of(kind).fullmatch(text) is not None


def parse_number(text: str) -> int | float:
    """' 1,234.50' -> 1234.5; '12' -> 12; '12.' -> 12 (equal values merge)."""
    body = text.strip().rstrip(".,").replace(",", "")
    value = float(body)
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def parse_money(text: str) -> dict[str, float | int | str | None]:
    """'$12.50' -> {"amount": 12.5, "currency": "USD"}; a bare amount has currency None."""
    match = MONEY_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"not an amount: {text!r}")
    code = match.group("pre") or match.group("post")
    currency = CURRENCY_SYMBOLS.get(code, code) if code else None
    return {"amount": parse_number(match.group("amount")), "currency": currency}


def answer_value(kind: str, text: str):
    """The parsed value of a finished answer; answers with equal values are one answer."""
    if kind == NUMBER_SLOT:
        return parse_number(text)
    if kind == MONEY_SLOT:
        return parse_money(text)
    return text


def merge_key(kind: str, value) -> object:
    if kind == MONEY_SLOT:
        return (value["amount"], value["currency"])
    return value


__all__ = ["SlotSpec", "SlotVocab", "slot_spec", "is_prefix", "is_complete", "answer_value", "merge_key",
           "MONEY_SLOT", "NUMBER_SLOT", "TEXT_SLOT"]

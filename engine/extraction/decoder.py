"""Decoders for extraction slots: from next-token distributions to answers.

    live hypotheses --decoder.needs--> RowNeed per hypothesis: its k best tokens of which set,
        END (grammar slots), the whole row (sampling)
    log-probs [rows, V] on the model's device + needs --select--> Candidates per row on the host
    Candidates --decoder.advance--> new live hypotheses, finished paths
    finished paths --answers--> [Answer(text, value, p)] sorted by p, residual

BeamDecoder (mode "extract"), one step:
  1. each live hypothesis proposes its `beam_width` most likely allowed tokens ({*}: any
     non-special token; {n} {$}: tokens that keep the text a prefix of the grammar), and for
     a grammar slot whose text is already complete, END with the mass of every other token;
  2. a proposal whose text now contains the slot's closing text (or END) is a finished
     path; a {*} proposal that neither finishes nor may grow (max_tokens) is dropped;
  3. all proposals are ranked by log-probability (ties: hypothesis order, then token id)
     and the best `beam_width` are kept: finished ones leave the beam, the rest form it.
GenerateDecoder (mode "generate") follows one path: greedy, or sampled with the slot's seed;
it does not stop before its first non-whitespace character unless the slot allows it.
ForcedDecoder searches nothing: it reads given paths' probabilities under another prompt
(a slot's floor, engine/extraction/decoding.py).

`select` (engine/extraction/select.py) turns whole-vocabulary rows into each row's few
candidates where the rows are; the decoders' Python work is per candidate, never per
vocabulary entry. The caller (engine/extraction/decoding.py) runs the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from engine.extraction.select import ALL, TEXT, Candidates, RowNeed, select
from engine.extraction.slots import (
    SlotSpec,
    SlotVocab,
    answer_value,
    is_complete,
    merge_key,
)

END = -1  # the pseudo-token that closes a number / money answer


@dataclass(slots=True)
class Hypothesis:
    ids: list[int]  # answer tokens so far; the last one is fed to the next pass
    logprob: float  # sum of their log-probabilities (float64)
    text: str  # what they read as after the prompt
    rows: list[int] = field(default_factory=list)  # KV-store rows of the tokens already run


@dataclass(slots=True)
class Finished:
    ids: list[int]  # the path's tokens (the last may carry the closing text)
    text: str  # the answer: the path's text before the closing text
    logprob: float  # path log-probability, END mass included
    finish_reason: str | None = None  # generate: "stop" | "length"


@dataclass(slots=True)
class DecodeState:
    spec: SlotSpec
    live: list[Hypothesis]  # hypotheses waiting for their next distribution
    finished: list[Finished] = field(default_factory=list)
    generator: torch.Generator | None = None  # generate mode with a seed

    @property
    def is_done(self) -> bool:
        return not self.live


@dataclass(slots=True)
class Answer:
    text: str
    value: object
    p: float
    finish_reason: str | None = None
    paths: list[Finished] = field(default_factory=list)  # the finished paths merged into it, best first



def start_state(spec: SlotSpec) -> DecodeState:
    generator = None
    if spec.mode == "generate" and spec.seed is not None:
        generator = torch.Generator().manual_seed(spec.seed)
    return DecodeState(spec, [Hypothesis([], 0.0, "")], generator=generator)


class Decoder:
    """What every decoder has: `needs` (per live hypothesis, what to select from its next-token
    row), `advance` (from the selected Candidates), `max_rows` (a K/V capacity hint)."""

    def needs(self, state: DecodeState, vocab: SlotVocab) -> list[RowNeed]:
        raise NotImplementedError

    def advance(self, state: DecodeState, candidates: list[Candidates], vocab: SlotVocab) -> None:
        raise NotImplementedError

    def step(self, state: DecodeState, dists: torch.Tensor, vocab: SlotVocab) -> None:
        """dists: [n_live, V] float32 log-probabilities of the next token, one row per live
        hypothesis: select what the hypotheses need, then advance (one slot, any device)."""
        self.advance(state, select(dists, self.needs(state, vocab), vocab), vocab)


class BeamDecoder(Decoder):
    """Mode "extract". `max_width` caps the width (1 = greedy: parity's negative control)."""

    def __init__(self, max_width: int | None = None) -> None:
        self.max_width = max_width

    def width(self, spec: SlotSpec) -> int:
        return spec.beam_width if self.max_width is None else min(spec.beam_width, self.max_width)

    def max_rows(self, spec: SlotSpec) -> int:
        """The most rows it may feed to decoding passes (a hint for its slot's K/V capacity)."""
        return self.width(spec) * spec.max_tokens

    def needs(self, state: DecodeState, vocab: SlotVocab) -> list[RowNeed]:
        """Per live hypothesis: its `width` best allowed tokens, and END where its number is complete."""
        spec = state.spec
        width = self.width(spec)
        if not spec.is_grammar:
            return [RowNeed(width, TEXT) for _ in state.live]
        needs = []
        for hyp in state.live:
            allowed = vocab.allowed(spec.kind, hyp.text)
            k = min(width, len(allowed)) if len(hyp.ids) < spec.max_tokens else 0
            end = bool(hyp.ids) and is_complete(spec.kind, hyp.text)
            mask = vocab.allowed_mask(spec.kind, hyp.text) if k or end else None
            needs.append(RowNeed(k, spec.kind, mask, end))
        return needs

    def advance(self, state: DecodeState, candidates: list[Candidates], vocab: SlotVocab) -> None:
        """Steps 1-3 of the module docstring, from each live hypothesis's Candidates. The
        proposals are ranked first; a {*} proposal's text (a tokenizer decode) is made only for
        those the walk down the ranking reaches, until `width` are kept."""
        spec = state.spec
        width = self.width(spec)
        ranked: list[tuple[float, int, int]] = []  # (log-prob, hypothesis index, token)
        for index, (hyp, found) in enumerate(zip(state.live, candidates, strict=True)):
            ranked += ((hyp.logprob + value, index, token) for token, value in zip(found.ids, found.logprobs, strict=True))
            if spec.is_grammar and found.end is not None:
                ranked.append((hyp.logprob + found.end, index, END))
        ranked.sort(key=lambda c: (-c[0], c[1], c[2]))
        live, kept = [], 0
        for logprob, index, token in ranked:
            if kept == width:
                break
            grown = propose(spec, state.live[index], token, logprob, vocab)
            if grown is None:
                continue
            kept += 1
            (state.finished if isinstance(grown, Finished) else live).append(grown)
        state.live = live


def propose(spec: SlotSpec, hyp: Hypothesis, token: int, logprob: float,
            vocab: SlotVocab) -> Finished | Hypothesis | None:
    """Hypothesis `hyp` grown by `token` (END: a grammar slot's close) to `logprob`, as step 2
    of the module docstring: a finished path, a live hypothesis, or None (a {*} text that
    neither closes nor may grow)."""
    if spec.is_grammar:
        if token == END:
            return Finished(hyp.ids, hyp.text, logprob)
        return Hypothesis(hyp.ids + [token], logprob, hyp.text + vocab.texts[token], list(hyp.rows))
    ids = hyp.ids + [token]
    text = vocab.continuation_text(ids)
    cut = text.find(spec.tail)
    if cut >= 0:
        return Finished(ids, text[:cut], logprob)
    if len(ids) < spec.max_tokens:
        return Hypothesis(ids, logprob, text, list(hyp.rows))
    return None


class GenerateDecoder(Decoder):
    """Mode "generate": one path, greedy (no seed) or sampled at `temperature` (seed).
    p is the model's own (untempered) probability of the text and of how it ended.

    When it may stop: not before the text has a non-whitespace character, unless the slot
    allows an empty answer (`allow_empty`). Until then a token that would end the answer (a
    special token, or one that completes the closing text with only whitespace before it) is
    set aside: greedy takes the likeliest other token (ties: the lower id), sampling draws
    again from the tokens not set aside. The tokens chosen keep their own probabilities (p is
    not renormalised); `max_tokens` still ends the answer ("length")."""

    def max_rows(self, spec: SlotSpec) -> int:
        return spec.max_tokens

    def needs(self, state: DecodeState, vocab: SlotVocab) -> list[RowNeed]:
        [hyp] = state.live
        if state.generator is None and may_stop(state.spec, hyp.text):
            return [RowNeed(1, ALL)]  # argmax: the best token, ties to the lowest id
        return [RowNeed(0, ALL, full=True)]  # sampling, or a choice that may skip tokens: the whole row

    def advance(self, state: DecodeState, candidates: list[Candidates], vocab: SlotVocab) -> None:
        [hyp] = state.live
        [found] = candidates
        spec = state.spec
        if found.full is None:
            token, value = found.ids[0], found.logprobs[0]
        else:
            token = _choose(state, hyp, found.full, vocab)
            value = found.full[token].item()
        logprob = hyp.logprob + value
        if token in vocab.special_set:
            state.finished.append(Finished(hyp.ids + [token], hyp.text, logprob, "stop"))
            state.live = []
            return
        ids = hyp.ids + [token]
        text = vocab.continuation_text(ids)
        cut = text.find(spec.tail) if spec.tail else -1
        if cut >= 0:
            state.finished.append(Finished(ids, text[:cut], logprob, "stop"))
        elif len(ids) >= spec.max_tokens:
            state.finished.append(Finished(ids, text, logprob, "length"))
        else:
            state.live = [Hypothesis(ids, logprob, text, list(hyp.rows))]
            return
        state.live = []


def may_stop(spec: SlotSpec, text: str) -> bool:
    """Whether a generate answer that reads `text` so far may end (GenerateDecoder's rule)."""
    return spec.allow_empty or bool(text.strip())


def _ends_empty(spec: SlotSpec, hyp: Hypothesis, token: int, vocab: SlotVocab) -> bool:
    """Whether `token` would end the answer with only whitespace written."""
    if token in vocab.special_set:
        return True
    if not spec.tail:
        return False
    text = vocab.continuation_text(hyp.ids + [token])
    cut = text.find(spec.tail)
    return cut >= 0 and not text[:cut].strip()


def _choose(state: DecodeState, hyp: Hypothesis, row: torch.Tensor, vocab: SlotVocab) -> int:
    """The next token from the whole row ([V] float64 log-probs): argmax (ties: the lower id)
    or a draw from softmax(row / temperature); until the answer may stop, a token that would
    end it empty is set aside and the choice made again among the others."""
    spec = state.spec

    def pick(values: torch.Tensor) -> int:
        if state.generator is None:
            return int(values.argmax())  # the first of equal maxima: the lowest id
        weights = torch.softmax(values / spec.temperature, dim=0)
        return int(torch.multinomial(weights, 1, generator=state.generator))

    token = pick(row)  # as without the rule, so an answer it does not touch is unchanged
    if may_stop(spec, hyp.text) or not _ends_empty(spec, hyp, token, vocab):
        return token
    first, rest = token, row.clone()
    rest[vocab.special_ids] = -math.inf
    while True:
        rest[token] = -math.inf
        if rest.max() == -math.inf:  # every token would end it: it ends as the model wrote it
            return first
        token = pick(rest)
        if not _ends_empty(spec, hyp, token, vocab):
            return token


class ForcedDecoder(Decoder):
    """Reads the probability of given paths under another prompt (the slot floor,
    engine/extraction/decoding.py): no search. A live hypothesis is a prefix shared by some paths;
    its step reads the log-probabilities of the paths' next tokens and, where a grammar path
    ends, END (the mass of every token its grammar state does not allow), as the beam did.
    A path's log-probability lands in `logprobs` when its last token (or END) is read."""

    def __init__(self, paths: list[tuple[int, ...]]) -> None:
        self.paths = set(paths)
        self.prefixes = {path[:length] for path in self.paths for length in range(len(path))}  # proper prefixes
        self.logprobs: dict[tuple[int, ...], float] = {}

    def max_rows(self, spec: SlotSpec) -> int:
        return len(self.prefixes) + len(self.paths)  # each prefix (and each grammar path, for END) once

    def needs(self, state: DecodeState, vocab: SlotVocab) -> list[RowNeed]:
        spec = state.spec
        needs = []
        for hyp in state.live:
            prefix = tuple(hyp.ids)
            following = sorted({path[len(prefix)] for path in self.paths
                                if len(path) > len(prefix) and path[: len(prefix)] == prefix})
            end = spec.is_grammar and prefix in self.paths
            mask = vocab.allowed_mask(spec.kind, hyp.text) if end else None
            needs.append(RowNeed(0, spec.kind if spec.is_grammar else ALL, mask, end, gather=following))
        return needs

    def advance(self, state: DecodeState, candidates: list[Candidates], vocab: SlotVocab) -> None:
        spec = state.spec
        live = []
        for hyp, found in zip(state.live, candidates, strict=True):
            prefix = tuple(hyp.ids)
            if found.end is not None:
                self.logprobs[prefix] = hyp.logprob + found.end
            for token, value in found.gathered.items():
                ids = prefix + (token,)
                logprob = hyp.logprob + value
                if ids in self.paths and not spec.is_grammar:
                    self.logprobs[ids] = logprob
                if ids in self.prefixes or (spec.is_grammar and ids in self.paths):  # needs another distribution
                    text = hyp.text + vocab.texts[token] if spec.is_grammar else ""
                    live.append(Hypothesis(list(ids), logprob, text, list(hyp.rows)))
        state.live = live


def floor_p(answer: Answer, floor_logprobs: dict[tuple[int, ...], float] | None) -> float | None:
    """An answer's floor: the sum over its paths of each path's probability under the floor
    prompt (None: the slot did not ask for floors)."""
    if floor_logprobs is None:
        return None
    return sum(math.exp(floor_logprobs[tuple(path.ids)]) for path in answer.paths)


def answers(state: DecodeState) -> tuple[list[Answer], float]:
    """Finished paths merged by value ({*}: text), p summed, sorted by p; at most beam_width
    answers (one in generate mode); residual = max(0, 1 - sum of the listed answers' p)."""
    spec = state.spec
    groups: dict[object, Answer] = {}
    for path in sorted(state.finished, key=lambda f: -f.logprob):
        value = answer_value(spec.kind, path.text) if spec.mode == "extract" else path.text
        key = merge_key(spec.kind, value)
        if key in groups:
            groups[key].p += math.exp(path.logprob)
        else:
            groups[key] = Answer(path.text, value, math.exp(path.logprob), path.finish_reason)
        groups[key].paths.append(path)
    ranked = sorted(groups.values(), key=lambda a: (-a.p, a.text))
    listed = ranked[: spec.beam_width if spec.mode == "extract" else 1]
    return listed, max(0.0, 1.0 - sum(a.p for a in listed))


def decoder_for(spec: SlotSpec, beam: BeamDecoder) -> BeamDecoder | GenerateDecoder:
    return GenerateDecoder() if spec.mode == "generate" else beam

"""Decoders for extraction slots: from next-token distributions to answers (pure CPU logic).

    DecodeState(live hypotheses) + dists [n_live, V] --decoder.step--> new live hypotheses, finished paths
    finished paths --answers--> [Answer(text, value, p)] sorted by p, residual

BeamDecoder (mode "extract"), one step:
  1. each live hypothesis proposes its `beam_width` most likely allowed tokens ({*}: any
     non-special token; {n} {$}: tokens that keep the text a prefix of the grammar), and for
     a grammar slot whose text is already complete, END with the mass of every other token;
  2. a proposal whose text now contains the slot's closing text (or END) is a finished
     path; a {*} proposal that neither finishes nor may grow (max_tokens) is dropped;
  3. all proposals are ranked by log-probability (ties: hypothesis order, then token id)
     and the best `beam_width` are kept: finished ones leave the beam, the rest form it.
GenerateDecoder (mode "generate") follows one path: greedy, or sampled with the slot's seed.
The caller (engine/extraction.py) runs the model; this module never sees it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from engine.slots import SlotSpec, SlotVocab, answer_value, is_complete, merge_key

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


@dataclass(slots=True)
class _Proposal:
    logprob: float
    hyp_index: int
    token: int  # END for a grammar slot's close
    ids: list[int]
    text: str
    is_finished: bool


def start_state(spec: SlotSpec) -> DecodeState:
    generator = None
    if spec.mode == "generate" and spec.seed is not None:
        generator = torch.Generator().manual_seed(spec.seed)
    return DecodeState(spec, [Hypothesis([], 0.0, "")], generator=generator)


class BeamDecoder:
    """Mode "extract". `max_width` caps the width (1 = greedy: parity's negative control)."""

    def __init__(self, max_width: int | None = None) -> None:
        self.max_width = max_width

    def width(self, spec: SlotSpec) -> int:
        return spec.beam_width if self.max_width is None else min(spec.beam_width, self.max_width)

    def step(self, state: DecodeState, dists: torch.Tensor, vocab: SlotVocab) -> None:
        """dists: [n_live, V] float32 log-probabilities of the next token, one row per live hypothesis."""
        width = self.width(state.spec)
        proposals: list[_Proposal] = []
        for index, (hyp, logprobs) in enumerate(zip(state.live, dists, strict=True)):
            proposals += propose(state.spec, hyp, index, logprobs, width, vocab)
        proposals.sort(key=lambda c: (-c.logprob, c.hyp_index, c.token))
        live = []
        for c in proposals[:width]:
            if c.is_finished:
                state.finished.append(Finished(c.ids, c.text, c.logprob))
            else:
                live.append(Hypothesis(c.ids, c.logprob, c.text, list(state.live[c.hyp_index].rows)))
        state.live = live


def propose(spec: SlotSpec, hyp: Hypothesis, index: int, logprobs: torch.Tensor, width: int,
            vocab: SlotVocab) -> list[_Proposal]:
    """The proposals of one hypothesis (steps 1-2 of the module docstring)."""
    logprobs = logprobs.double()
    if spec.is_grammar:
        allowed = vocab.allowed(spec.kind, hyp.text)
        out = []
        if allowed and len(hyp.ids) < spec.max_tokens:
            values, tokens = logprobs[allowed].topk(min(width, len(allowed)))
            for value, position in zip(values.tolist(), tokens.tolist()):
                if value == -math.inf:
                    continue
                token = allowed[position]
                out.append(_Proposal(hyp.logprob + value, index, token, hyp.ids + [token],
                                     hyp.text + vocab.texts[token], False))
        if hyp.ids and is_complete(spec.kind, hyp.text):
            rest = logprobs.clone()
            rest[allowed] = -math.inf
            out.append(_Proposal(hyp.logprob + torch.logsumexp(rest, 0).item(), index, END, hyp.ids, hyp.text, True))
        return out
    masked = logprobs.clone()
    masked[vocab.special_ids] = -math.inf
    values, tokens = masked.topk(width)
    out = []
    for value, token in zip(values.tolist(), tokens.tolist()):
        if value == -math.inf:
            continue
        ids = hyp.ids + [token]
        text = vocab.continuation_text(ids)
        cut = text.find(spec.tail)
        if cut >= 0:
            out.append(_Proposal(hyp.logprob + value, index, token, ids, text[:cut], True))
        elif len(ids) < spec.max_tokens:
            out.append(_Proposal(hyp.logprob + value, index, token, ids, text, False))
    return out


class GenerateDecoder:
    """Mode "generate": one path, greedy (no seed) or sampled at `temperature` (seed).
    p is the model's own (untempered) probability of the text and of how it ended."""

    def step(self, state: DecodeState, dists: torch.Tensor, vocab: SlotVocab) -> None:
        [hyp] = state.live
        logprobs = dists[0].double()
        spec = state.spec
        if state.generator is None:
            token = int(logprobs.argmax())
        else:
            weights = torch.softmax(logprobs / spec.temperature, dim=0)
            token = int(torch.multinomial(weights, 1, generator=state.generator))
        logprob = hyp.logprob + logprobs[token].item()
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
    ranked = sorted(groups.values(), key=lambda a: (-a.p, a.text))
    listed = ranked[: spec.beam_width if spec.mode == "extract" else 1]
    return listed, max(0.0, 1.0 - sum(a.p for a in listed))


def decoder_for(spec: SlotSpec, beam: BeamDecoder) -> BeamDecoder | GenerateDecoder:
    return GenerateDecoder() if spec.mode == "generate" else beam

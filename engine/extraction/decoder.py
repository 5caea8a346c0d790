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
GenerateDecoder (mode "generate") follows one path: greedy, or sampled with the slot's seed.
ForcedDecoder searches nothing: it reads given paths' probabilities under another prompt
(a slot's floor, engine/extraction/decoding.py).

`select` is the only code that touches whole-vocabulary rows, and it runs where the rows are
(the GPU after a decoding pass): it masks, takes each row's top k + 1 (k <= beam width) and
the END log-mass, and returns only those to the host. A row's k best tokens are ranked by
log-probability, ties by token id (as `argmax` and step 3 rank); a tie across the k-th
place falls back to an exact pass over that row. The decoders' Python work is per
candidate, never per vocabulary entry. The caller (engine/extraction/decoding.py) runs the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from engine.extraction.slots import (
    MONEY_SLOT,
    NUMBER_SLOT,
    SlotSpec,
    SlotVocab,
    answer_value,
    is_complete,
    merge_key,
)
from engine.layers.ops import SCORE_CHUNK

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


ALL = "all"  # RowNeed.tokens: every token (mode "generate")
TEXT = "text"  # every token but the special ones ({*}, mode "extract"); a grammar slot names its kind


@dataclass(slots=True)
class RowNeed:
    """What one live hypothesis needs from its next-token distribution."""

    k: int  # its k best tokens of `tokens` (0: none)
    tokens: str  # ALL | TEXT | NUMBER_SLOT | MONEY_SLOT (the grammar state's allowed tokens)
    allowed: torch.Tensor | None = None  # grammar: bool [G] over vocab.grammar_ids(kind) (CPU)
    end: bool = False  # grammar: the log of the mass of every token not allowed (END)
    full: bool = False  # the whole row, float64 on the host (sampling)
    gather: list[int] | None = None  # the log-probabilities of these tokens (ForcedDecoder)


@dataclass(slots=True)
class Candidates:
    """One row's answer to its RowNeed, on the host."""

    ids: list[int]  # at most k tokens, best first (log-prob desc, then id); -inf ones left out
    logprobs: list[float]  # float32 log-probabilities, as Python floats
    end: float | None = None  # log END mass (float64)
    full: torch.Tensor | None = None  # [V] float64
    gathered: dict[int, float] = field(default_factory=dict)  # RowNeed.gather's tokens -> their log-probs


def select(logprobs: torch.Tensor, needs: list[RowNeed | None], vocab: SlotVocab) -> list[Candidates | None]:
    """logprobs: [S, V] float32 log-softmax rows on any device; needs: one per row (None: a
    padding row). Whole-vocabulary work stays on logprobs' device; the host gets [rows, k + 1]
    values and ids, the END masses, and only the rows that asked for `full`."""
    device = logprobs.device
    tables = vocab.tables(device)
    out = [None if need is None else Candidates([], []) for need in needs]
    by_tokens: dict[str, list[int]] = {}
    for row, need in enumerate(needs):
        if need is not None and need.k > 0:
            by_tokens.setdefault(need.tokens, []).append(row)
    for tokens, rows in by_tokens.items():
        index = torch.tensor(rows, device=device)
        column_ids = None  # column -> token id (None: the column is the token)
        if tokens in (ALL, TEXT):
            values = logprobs.index_select(0, index)  # [n, V]
            if tokens == TEXT:
                values.index_fill_(1, tables.special, -math.inf)
        else:
            column_ids = tables.grammar[tokens]
            values = logprobs[index[:, None], column_ids[None, :]]  # [n, G]
            values.masked_fill_(~_allowed(needs, rows, device), -math.inf)
        _top(values, column_ids, [needs[row].k for row in rows], [out[row] for row in rows])
    for kind in (NUMBER_SLOT, MONEY_SLOT):
        rows = [row for row, need in enumerate(needs) if need is not None and need.end and need.tokens == kind]
        if rows:
            rest = logprobs.index_select(0, torch.tensor(rows, device=device)).double()  # [n, V]
            column_ids = tables.grammar[kind]
            allowed = _allowed(needs, rows, device)
            rest.index_copy_(1, column_ids, rest.index_select(1, column_ids).masked_fill_(allowed, -math.inf))
            for row, mass in zip(rows, _row_logsumexp(rest).tolist(), strict=True):
                out[row].end = mass
    rows = [row for row, need in enumerate(needs) if need is not None and need.full]
    if rows:
        full = logprobs.index_select(0, torch.tensor(rows, device=device)).double().cpu()
        for row, values in zip(rows, full, strict=True):
            out[row].full = values
    rows = [row for row, need in enumerate(needs) if need is not None and need.gather]
    if rows:
        row_index = torch.tensor([row for row in rows for _ in needs[row].gather], device=device)
        token_index = torch.tensor([token for row in rows for token in needs[row].gather], device=device)
        values = iter(logprobs[row_index, token_index].cpu().tolist())
        for row in rows:
            out[row].gathered = {token: next(values) for token in needs[row].gather}
    return out


def _allowed(needs: list[RowNeed | None], rows: list[int], device: torch.device) -> torch.Tensor:
    return torch.stack([needs[row].allowed for row in rows]).to(device)


def _top(values: torch.Tensor, column_ids: torch.Tensor | None, ks: list[int], outs: list[Candidates]) -> None:
    """values: [n, m] masked log-probs (-inf: not a candidate). Each row's k best, exactly."""
    num_top = min(max(ks) + 1, values.shape[1])  # one more than asked: a tie at the k-th place shows
    top_values, top_columns = values.topk(num_top, dim=1)
    top_ids = top_columns if column_ids is None else column_ids[top_columns]
    host_values, host_ids = top_values.cpu().tolist(), top_ids.cpu().tolist()
    for row, (k, out) in enumerate(zip(ks, outs, strict=True)):
        row_values, row_ids = host_values[row], host_ids[row]
        if k < num_top and row_values[k - 1] == row_values[k] > -math.inf:
            row_values, row_ids = _exact_top(values[row], column_ids, k, row_values[k - 1])
        best = sorted((-value, token) for value, token in zip(row_values[:k], row_ids[:k]) if value > -math.inf)
        out.ids = [token for _, token in best]
        out.logprobs = [-value for value, _ in best]


def _exact_top(row: torch.Tensor, column_ids: torch.Tensor | None, k: int, kth: float) -> tuple[list, list]:
    """The k best of one row when several columns tie at the k-th value: every column above
    it, then the tied ones in token order (columns are in token order)."""
    above = (row > kth).nonzero()[:, 0]
    tied = (row == kth).nonzero()[:, 0][: k - above.shape[0]]
    columns = torch.cat((above, tied))
    ids = columns if column_ids is None else column_ids[columns]
    return row[columns].tolist(), ids.tolist()


def _row_logsumexp(rows: torch.Tensor) -> torch.Tensor:
    """[n, V] float64 -> [n] logsumexp per row, each independent of the others: one row at a
    time on CPU; on CUDA on fixed SCORE_CHUNK-row blocks (the kernel's shape never changes)."""
    if rows.device.type == "cpu":
        return torch.stack([torch.logsumexp(row, 0) for row in rows]) if len(rows) else rows.new_empty(0)
    num_rows = rows.shape[0]
    padded = torch.zeros(-(-num_rows // SCORE_CHUNK) * SCORE_CHUNK, rows.shape[1], dtype=rows.dtype,
                         device=rows.device)
    padded[:num_rows] = rows
    blocks = [torch.logsumexp(padded[start : start + SCORE_CHUNK], 1) for start in range(0, len(padded), SCORE_CHUNK)]
    return torch.cat(blocks)[:num_rows].cpu()


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
        """Steps 1-3 of the module docstring, from each live hypothesis's Candidates."""
        width = self.width(state.spec)
        proposals: list[_Proposal] = []
        for index, (hyp, found) in enumerate(zip(state.live, candidates, strict=True)):
            proposals += propose(state.spec, hyp, index, found, vocab)
        proposals.sort(key=lambda c: (-c.logprob, c.hyp_index, c.token))
        live = []
        for c in proposals[:width]:
            if c.is_finished:
                state.finished.append(Finished(c.ids, c.text, c.logprob))
            else:
                live.append(Hypothesis(c.ids, c.logprob, c.text, list(state.live[c.hyp_index].rows)))
        state.live = live


def propose(spec: SlotSpec, hyp: Hypothesis, index: int, found: Candidates, vocab: SlotVocab) -> list[_Proposal]:
    """The proposals of one hypothesis (steps 1-2 of the module docstring)."""
    pairs = zip(found.ids, found.logprobs, strict=True)
    if spec.is_grammar:
        out = [_Proposal(hyp.logprob + value, index, token, hyp.ids + [token], hyp.text + vocab.texts[token], False)
               for token, value in pairs]
        if found.end is not None:
            out.append(_Proposal(hyp.logprob + found.end, index, END, hyp.ids, hyp.text, True))
        return out
    out = []
    for token, value in pairs:
        ids = hyp.ids + [token]
        text = vocab.continuation_text(ids)
        cut = text.find(spec.tail)
        if cut >= 0:
            out.append(_Proposal(hyp.logprob + value, index, token, ids, text[:cut], True))
        elif len(ids) < spec.max_tokens:
            out.append(_Proposal(hyp.logprob + value, index, token, ids, text, False))
    return out


class GenerateDecoder(Decoder):
    """Mode "generate": one path, greedy (no seed) or sampled at `temperature` (seed).
    p is the model's own (untempered) probability of the text and of how it ended."""

    def max_rows(self, spec: SlotSpec) -> int:
        return spec.max_tokens

    def needs(self, state: DecodeState, vocab: SlotVocab) -> list[RowNeed]:
        if state.generator is None:
            return [RowNeed(1, ALL)]  # argmax: the best token, ties to the lowest id
        return [RowNeed(0, ALL, full=True)]

    def advance(self, state: DecodeState, candidates: list[Candidates], vocab: SlotVocab) -> None:
        [hyp] = state.live
        [found] = candidates
        spec = state.spec
        if state.generator is None:
            token, value = found.ids[0], found.logprobs[0]
        else:
            weights = torch.softmax(found.full / spec.temperature, dim=0)
            token = int(torch.multinomial(weights, 1, generator=state.generator))
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

"""Slot answers match the decoding as it was before candidate selection moved to the device
and before decoding attention was batched: a slow reference path kept here (whole [rows, V]
log-softmax rows on the host, the decoder's per-hypothesis topk / logsumexp over them, one
SDPA per slot per layer over exactly its L + n keys, K/V appended by torch.cat). Tiny random
qwen3 (sliding layers, 152k vocabulary) and gemma3_text (262k vocabulary, softcapping).

Not bit for bit: the batched attention (engine/layers/decode_attention.py) pads each slot's keys to its
capacity (masked) and folds GQA query heads into rows, which changes SDPA's reduction order
in the last bits. So the answer texts, values, order, options and usage are equal and p,
residual and floor_p agree within 1e-5; bit identity alone vs. batched is checked by
tests/engine/extraction/test_extraction_invariance.py. The decoding rows, masks and positions come from
the engine's own extraction.decode_rows here (batch plumbing, not what is compared); the
slot parity test against transformers (tests/engine/extraction/test_extraction.py) checks those."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

import engine.engine as engine_module
import engine.layers.decode_attention as decode_module
from contract.protocol import ScoringRequest
from engine.extraction.decoder import (
    END,
    DecodeState,
    Finished,
    Hypothesis,
    _Proposal,
    decoder_for,
    start_state,
)
from engine.extraction.decoding import Extraction, SlotJob, _groups, decode_rows
from engine.extraction.slots import is_complete
from engine.layers.attention import AttentionMetadata, sdpa
from engine.pipeline.floors import FloorCache
from engine.pipeline.runner import chunked_log_softmax

CONTENTS = [
    "Hi, this is Maria Lopez. I ordered 3 blue kettles and was charged $89.97 twice in September.",
    "Invoice 2291 from Northwind Supplies: 12 boxes of paper, total due EUR 240.00 by March 15.",
]
QUERIES = [
    {"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"]},
    {"id": "name", "template": "\n\nQ: Who wrote this?\nA: \"{*}\"", "max_tokens": 4},
    {"id": "line", "template": "\n\nThe product:{*}\n", "max_tokens": 4, "beam_width": 9},
    {"id": "count", "template": "\n\nQ: How many?\nA:{n}", "max_tokens": 5, "beam_width": 7},
    {"id": "amount", "template": "\n\nQ: What amount?\nA:{$}", "max_tokens": 5, "beam_width": 12},
    {"id": "greedy", "template": "\n\nA: \"{*}\"", "mode": "generate", "max_tokens": 5},
    {"id": "sampled", "template": "\n\nA: \"{*}\"", "mode": "generate", "max_tokens": 5, "seed": 3,
     "temperature": 1.5},
    {"id": "narrow", "template": "\n\nA: \"{*}\"", "beam_width": 1, "max_tokens": 4},
]


# ---- the reference: the code before candidate selection ----------------------------------

def _old_propose(spec, hyp, index, logprobs, width, vocab):
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


def _old_beam_step(state: DecodeState, dists: torch.Tensor, vocab, width: int) -> None:
    proposals = []
    for index, (hyp, logprobs) in enumerate(zip(state.live, dists, strict=True)):
        proposals += _old_propose(state.spec, hyp, index, logprobs, width, vocab)
    proposals.sort(key=lambda c: (-c.logprob, c.hyp_index, c.token))
    live = []
    for c in proposals[:width]:
        if c.is_finished:
            state.finished.append(Finished(c.ids, c.text, c.logprob))
        else:
            live.append(Hypothesis(c.ids, c.logprob, c.text, list(state.live[c.hyp_index].rows)))
    state.live = live


def _old_generate_step(state: DecodeState, dists: torch.Tensor, vocab) -> None:
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


def _old_step(job: SlotJob, dists: torch.Tensor, vocab, beam) -> None:
    if job.spec.mode == "generate":
        _old_generate_step(job.state, dists, vocab)
    else:
        _old_beam_step(job.state, dists, vocab, beam.width(job.spec))


@dataclass(slots=True)
class _OldSpan:
    start: int
    num_rows: int
    num_real: int
    kv: object
    mask: torch.Tensor  # [num_rows, L + num_rows]
    key_positions: torch.Tensor  # [L + num_rows]
    positions: torch.Tensor  # [num_rows]


@dataclass(slots=True)
class _OldBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    spans: list[_OldSpan]
    scored_index: torch.Tensor


def _old_prepare_decode_batch(jobs: list[SlotJob]) -> _OldBatch:
    """The engine's rows (decode_rows: the batch plumbing, not what is compared), each span with
    its keys' positions for the old attention."""
    spans, input_ids, positions = decode_rows(jobs)
    old_spans = [_OldSpan(span.start, span.num_rows, span.num_real, span.kv, span.mask,
                          torch.cat((span.kv.positions, span.positions)), span.positions) for span in spans]
    num_scored = spans[-1].start + spans[-1].num_rows
    return _OldBatch(input_ids, positions, old_spans, torch.arange(num_scored))


def _old_decode_attention(q, k, v, meta, layer, scale, sliding_window=None):
    out = torch.zeros_like(q)
    for span in meta.spans:
        rows = slice(span.start, span.start + span.num_rows)
        keys = torch.cat((span.kv.keys[layer], k[rows]))
        values = torch.cat((span.kv.values[layer], v[rows]))
        mask = span.mask.to(q.device)
        if sliding_window is not None:
            distance = span.positions[:, None] - span.key_positions[None, :]
            mask = mask & (distance < sliding_window).to(q.device)
        out[rows] = sdpa(q[rows], keys, values, mask, scale)
        real = slice(span.start, span.start + span.num_real)
        span.kv.keys[layer] = torch.cat((span.kv.keys[layer], k[real]))
        span.kv.values[layer] = torch.cat((span.kv.values[layer], v[real]))
    return out


class _OldExtraction(Extraction):
    """Extraction as it was: the runner returned whole [S, V] rows to the host."""

    def collect(self, batch, output) -> None:
        for packed in batch.trees:
            for offset, branch_index in enumerate(packed.tree.slot_branch):
                slot = packed.slot_start + offset
                branch = packed.tree.branches[branch_index]
                job = SlotJob(packed.owner.request_index, branch.query_index, branch.combination_index, branch.slot,
                              branch.branch_point, output.slot_kv[slot], start_state(branch.slot),
                              decoder_for(branch.slot, self.beam))  # SlotJob's field; the old step decodes itself
                _old_step(job, output.slot_logprobs[slot : slot + 1], self.vocab_fn(), self.beam)
                self.jobs.append(job)

    @torch.inference_mode()
    def run(self, runner, max_num_rows: int) -> None:
        vocab = self.vocab_fn() if self.jobs else None
        while True:
            live = [job for job in self.jobs if not job.state.is_done]
            if not live:
                return
            for group in _groups(live, max_num_rows):
                batch = _old_prepare_decode_batch(group)
                attention = AttentionMetadata(spans=[], decode=batch)
                logits = runner.model(batch.input_ids, batch.positions, attention, batch.scored_index)
                runner.num_passes += 1
                logprobs = chunked_log_softmax(logits)
                for job, span in zip(group, batch.spans, strict=True):
                    job.pass_ids.add(runner.num_passes)
                    first_row = job.kv.num_rows
                    job.kv.positions = torch.cat((job.kv.positions, span.positions[: span.num_real]))
                    for row, hyp in enumerate(job.state.live):
                        hyp.rows.append(first_row + row)
                    job.num_decoded_tokens += span.num_real
                    _old_step(job, logprobs[span.start : span.start + span.num_real], vocab, self.beam)


# ---- the comparison ------------------------------------------------------------------------

def _requests() -> list[ScoringRequest]:
    return [ScoringRequest.model_validate({"messages": [{"role": "user", "content": c}],
                                           "scoring": {"queries": QUERIES}}) for c in CONTENTS]


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_slot_answers_match_the_whole_row_decoder(tiny_engine, monkeypatch, family):
    engine = tiny_engine(family)
    requests = _requests()
    engine.floors = FloorCache(engine.config.floor_cache_size)  # both runs compute their floor
    new = engine.score_requests(requests).results
    engine.floors = FloorCache(engine.config.floor_cache_size)
    with monkeypatch.context() as patch:
        patch.setattr(engine_module, "Extraction", _OldExtraction)
        patch.setattr(decode_module, "decode_attention", _old_decode_attention)
        old = engine.score_requests(requests).results
    answers = [a for r in new for q in r.results for c in q.combinations for a in (c.answers or [])]
    assert len(answers) >= 40 and len({a.text for a in answers}) > 10
    largest = max(_differences([r.model_dump() for r in new], [r.model_dump() for r in old]), default=0.0)
    print(f"{family}: max |Δ| of p / residual / floor_p over {len(answers)} answers: {largest:.1e}")
    assert largest <= TOLERANCE


TOLERANCE = 1e-5  # |Δp|, |Δ residual|, |Δ floor_p|; everything else equal


def _differences(new, old, key: str = "") -> list[float]:
    """|new - old| of every p, residual and floor_p of an answer (or of a slot's residual);
    asserts that everything else is equal (texts, values, order, options, usage)."""
    if isinstance(new, dict):
        assert new.keys() == old.keys(), key
        return [d for k in new for d in _differences(new[k], old[k], k)]
    if isinstance(new, list):
        assert len(new) == len(old), key
        return [d for n, o in zip(new, old) for d in _differences(n, o, key)]
    if key in ("p", "residual", "floor_p") and isinstance(new, float) and isinstance(old, float):
        return [abs(new - old)]
    assert new == old, (key, new, old)
    return []

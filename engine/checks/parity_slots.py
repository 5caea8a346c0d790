"""Slot parity: the engine's extraction answers against transformers decoding the same slots.

    slot cases (contents x slot queries) --Engine.score_requests (decoder under test)--> answers, residual
    the same cases --transformers: its own chat template, tokenizer, forward passes--> next-token
        distributions --the reference BeamDecoder (always full width)--> answers, residual
    per question: the top answers must be the same (by value, in order) with p and residual
    within 1e-3; last line: max_abs_p_diff=<x> max_residual_diff=<y> questions=<n> mismatched=<m>

The reference shares with the engine only the checkpoint folder and the slot rules
(engine/extraction/slots.py grammars and engine/extraction/decoder.py's BeamDecoder step): every number comes from
transformers reading prompt + continuation as one causal sequence. `whole=True` re-reads every
whole sequence at each step (tiny models, CI); `whole=False` reads the prompt once and then one
token a step through transformers' own KV cache (the 1.5B default on CPU). The engine's
decoder is a parameter so a greedy-only decoder, the negative control, must fail.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from pathlib import Path

import orjson
import torch

from contract.protocol import ScoringRequest
from contract.scoring_results import ScoringResponse
from contract.templates import expand_grid
from engine.checks.parity import Reference
from engine.extraction.decoder import BeamDecoder, DecodeState, answers, start_state
from engine.extraction.slots import SlotVocab, merge_key, slot_spec

SLOT_CASES_PATH = Path(__file__).resolve().parents[2] / "fixtures" / "parity" / "slot_cases.json"
TOLERANCE = 1e-3


@dataclass(slots=True)
class SlotQuestion:
    prompt_ids: list[int]  # the reference's own tokens of rendered messages + filled template
    state: DecodeState


def load_slot_cases(num_contents: int | None = None, max_tokens: int | None = None) -> list[ScoringRequest]:
    cases = orjson.loads(SLOT_CASES_PATH.read_bytes())
    queries = [q | ({"max_tokens": max_tokens} if max_tokens else {}) for q in cases["queries"]]
    return [
        ScoringRequest.model_validate({"messages": [{"role": "user", "content": c}], "scoring": {"queries": queries}})
        for c in cases["contents"][:num_contents]
    ]


class ReferenceDecoder:
    """transformers' next-token distributions for many slot questions, decoded together."""

    def __init__(self, reference: Reference, whole: bool) -> None:
        self.reference = reference
        self.whole = whole
        self.vocab = SlotVocab.build(reference.tokenizer, reference.model.config.vocab_size)
        self.beam = BeamDecoder()

    def questions(self, request: ScoringRequest) -> list[SlotQuestion]:
        messages = [m.model_dump() for m in request.messages]
        out = []
        for query in request.scoring.queries:
            parsed = query.parsed_template
            for values in expand_grid(tuple(query.values), query.values):
                prompt = self.reference.render(messages, query.answer_in) + parsed.fill(values)
                out.append(SlotQuestion(self.reference.encode(prompt), start_state(slot_spec(query))))
        return out

    @torch.inference_mode()
    def decode(self, questions: list[SlotQuestion]) -> None:
        live = [(q, h) for q in questions for h in q.state.live]
        cache = None
        while live:
            if self.whole:
                dists = self._whole([q.prompt_ids + h.ids for q, h in live])
            else:
                dists, cache = self._cached(live, cache)
            rows = {}
            for row, (question, hyp) in enumerate(live):
                hyp.rows.append(row)  # the row of this hypothesis in the reference's cache
                rows.setdefault(id(question), []).append(row)
            for question in questions:
                if id(question) in rows:
                    self.beam.step(question.state, dists[rows[id(question)]], self.vocab)
            live = [(q, h) for q in questions for h in q.state.live]

    def _whole(self, sequences: list[list[int]]) -> torch.Tensor:
        """Full causal forwards of whole left-padded sequences -> [n, V] last-token log-probs."""
        out = []
        for start in range(0, len(sequences), self.reference.batch_size):
            batch = sequences[start : start + self.reference.batch_size]
            ids, attention, positions = _left_padded(batch)
            logits = self.reference.model(input_ids=ids, attention_mask=attention, position_ids=positions,
                                          logits_to_keep=1).logits[:, -1].float()
            out.append(torch.log_softmax(logits, dim=-1))
        return torch.cat(out)

    def _cached(self, live, cache):
        """First call: read every prompt (left-padded), keep transformers' cache. Later calls:
        select each hypothesis's parent row, feed its newest token."""
        model = self.reference.model
        if cache is None:
            prompts = [q.prompt_ids for q, _ in live]
            ids, attention, positions = _left_padded(prompts)
            out = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True,
                        logits_to_keep=1)
            return torch.log_softmax(out.logits[:, -1].float(), dim=-1), (_cache_of(out), attention)
        kv, attention = cache
        parents = torch.tensor([h.rows[-1] for _, h in live])
        kv.batch_select_indices(parents)
        attention = torch.cat((attention[parents], torch.ones(len(live), 1, dtype=attention.dtype)), dim=1)
        ids = torch.tensor([[h.ids[-1]] for _, h in live])
        positions = torch.tensor([[len(q.prompt_ids) + len(h.ids) - 1] for q, h in live])
        cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        out = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True, **{cache_arg: kv})
        return torch.log_softmax(out.logits[:, -1].float(), dim=-1), (_cache_of(out), attention)


def _cache_of(output):
    """transformers' KV cache of a forward (`cache` from 5.x, `past_key_values` before)."""
    return output["cache"] if "cache" in output else output["past_key_values"]


def _left_padded(sequences: list[list[int]]):
    length = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), length, dtype=torch.long)
    attention = torch.zeros(len(sequences), length, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, length - len(sequence) :] = torch.tensor(sequence)
        attention[row, length - len(sequence) :] = 1
    return ids, attention, (attention.cumsum(-1) - 1).clamp(min=0)


def compare_slots(request: ScoringRequest, response: ScoringResponse, questions: list[SlotQuestion]) -> list[dict]:
    """One row per slot question: are the listed answers the same, and how far apart are p and residual."""
    rows = []
    engine_combinations = [(r.id, c) for r in response.results for c in r.combinations]
    for (query_id, combination), question in zip(engine_combinations, questions, strict=True):
        expected, expected_residual = answers(question.state)
        kind = question.state.spec.kind
        got = {merge_key(kind, a.value): a.p for a in combination.answers}
        want = {merge_key(kind, a.value): a.p for a in expected}
        is_same = list(got) == list(want)
        p_diff = max((abs(got[k] - want[k]) for k in want if k in got), default=0.0)
        logp_diff = max((abs(math.log(got[k]) - math.log(want[k])) for k in want if k in got and got[k] > 0
                         and want[k] > 0), default=0.0)
        rows.append({"query": query_id, "content": request.messages[-1].content[:40], "is_same": is_same,
                     "answers": [a.text for a in combination.answers], "expected": [a.text for a in expected],
                     "p_diff": p_diff, "logp_diff": logp_diff,
                     "residual_diff": abs(combination.residual - expected_residual)})
    return rows


def reference_questions(reference: ReferenceDecoder, requests: list[ScoringRequest]) -> list[list[SlotQuestion]]:
    """transformers' answers to every slot question of the requests (decoded together)."""
    questions = [reference.questions(request) for request in requests]
    reference.decode([q for qs in questions for q in qs])
    return questions


def engine_rows(engine, requests: list[ScoringRequest], expected: list[list[SlotQuestion]],
                decoder: BeamDecoder) -> list[dict]:
    """Score the requests with `engine`, mode "extract" decoded by `decoder`; compare with `expected`."""
    engine.beam = decoder
    output = engine.score_requests(requests)
    rows = []
    for request, response, questions in zip(requests, output.results, expected, strict=True):
        if not isinstance(response, ScoringResponse):
            raise RuntimeError(f"the engine refused a slot parity case: {response}")
        rows += compare_slots(request, response, questions)
    return rows


def run_slot_parity(model: str, decoder: BeamDecoder | None = None, num_contents: int | None = None,
                    max_tokens: int | None = None, whole: bool = True) -> list[dict]:
    """Decode the slot cases with the engine (`decoder` for mode "extract", by default the
    full beam) and with the transformers reference; one comparison row per slot question."""
    from engine.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model=model, device="cpu", dtype="float32"))
    requests = load_slot_cases(num_contents, max_tokens)
    expected = reference_questions(ReferenceDecoder(Reference(engine.checkpoint_path), whole), requests)
    return engine_rows(engine, requests, expected, decoder or BeamDecoder())


def summarize_slots(rows: list[dict]) -> str:
    mismatched = sum(not r["is_same"] for r in rows)
    return (f"max_abs_p_diff={max(r['p_diff'] for r in rows):.3g}"
            f" max_abs_logp_diff={max(r['logp_diff'] for r in rows):.3g}"
            f" max_residual_diff={max(r['residual_diff'] for r in rows):.3g}"
            f" questions={len(rows)} mismatched={mismatched}")


def is_passing(rows: list[dict]) -> bool:
    return all(r["is_same"] and r["p_diff"] <= TOLERANCE and r["residual_diff"] <= TOLERANCE for r in rows)

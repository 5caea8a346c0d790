"""Batched decoding attention is batch invariant (CPU, tiny random qwen3 and gemma3_text: GQA,
sliding windows): a content's slot answers are bit-identical decoded alone or in passes
shared with other contents' slots of other lengths (other K/V capacities, the same capacity
at other arena entries), other widths (other rows per slot) and, with a small token budget,
passes that hold only some of an arena's entries."""

from __future__ import annotations

import pytest

import engine.kv_cache as kv_cache
from engine.kv_cache import capacity_for
from spinf_jobs.protocol import ScoringRequest

QUERIES = [
    {"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"]},
    {"id": "name", "template": "\n\nQ: Who wrote this?\nA: \"{*}\"", "max_tokens": 4, "floor": True},
    {"id": "wide", "template": "\n\nThe product:{*}\n", "max_tokens": 3, "beam_width": 12},
    {"id": "amount", "template": "\n\nQ: What amount?\nA:{$}", "max_tokens": 4, "beam_width": 3},
    {"id": "note", "template": "\n\nA: \"{*}\"", "mode": "generate", "max_tokens": 4},
]
TARGET = "Maria Lopez was charged $89.97 twice in September for 3 kettles."
FILLER = " The order number is 2291 and the parcel left the warehouse in Leeds on Monday."


def _request(content: str, queries: list[dict]) -> ScoringRequest:
    return ScoringRequest.model_validate({"messages": [{"role": "user", "content": content}],
                                          "scoring": {"queries": queries}})


def _others() -> list[ScoringRequest]:
    """Contents from shorter than the target to ~10x longer; some ask only a wide slot."""
    contents = [f"Note {i}:" + FILLER * i for i in (0, 1, 3, 6, 10)]
    return [_request(c, QUERIES if i % 2 == 0 else QUERIES[2:3]) for i, c in enumerate(contents)]


def _counting_attention(monkeypatch) -> list[tuple[int, int]]:
    """Patch decode_attention to note (slots, SDPA groups) of every call."""
    calls: list[tuple[int, int]] = []
    attention = kv_cache.decode_attention

    def counting(q, k, v, meta, *args, **kwargs):
        calls.append((len(meta.spans), len(meta.groups)))
        return attention(q, k, v, meta, *args, **kwargs)

    monkeypatch.setattr(kv_cache, "decode_attention", counting)
    return calls


@pytest.mark.parametrize("family,budget", [("qwen3", None), ("gemma3_text", 128)])
def test_slot_answers_alone_vs_batched_are_bit_identical(tiny_engine, monkeypatch, family, budget):
    engine = tiny_engine(family) if budget is None else tiny_engine(family, max_num_batched_tokens=budget)
    target, others = _request(TARGET, QUERIES), _others()
    alone = engine.score_batch([target]).results[0].model_dump()
    calls = _counting_attention(monkeypatch)
    packed = engine.score_batch(others[:3] + [target] + others[3:]).results[3].model_dump()
    for response in (alone, packed):
        response.pop("usage")
    assert alone == packed  # answers, values, p, residual, floor_p: bit for bit
    assert any(groups < slots for slots, groups in calls), "no pass shared an SDPA between slots"
    assert max(groups for _, groups in calls) >= 2, "every slot landed in one arena: lengths too alike"


def test_capacity_depends_only_on_the_rows_and_bounds_the_padding():
    capacities = [capacity_for(n) for n in range(1, 5000)]
    assert capacities[:64] == [64] * 64
    assert sorted(set(capacities))[:8] == [64, 96, 128, 192, 256, 384, 512, 768]
    for n, capacity in enumerate(capacities, start=1):
        assert n <= capacity < max(1.5 * n + 1, 65) and capacity % 32 == 0

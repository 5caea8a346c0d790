"""GPU: extraction slots decoded on CUDA (a 6- or 2-layer cut of the Gemma-3-12B architecture,
random weights, real tokenizer): a content's slot answers are bit-identical alone vs packed
with the other contents, and every slot's answers are a proper distribution (sorted by p,
each p in (0, 1], p + residual = 1), with either decoding attention (the Triton kernel, SDPA;
the kernel with shared trunks giving the bits it gives without);
batched decoding attention makes one call per group and never syncs the host."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))


def _slots(response) -> dict:
    return {q.id: [(a.text, a.p) for a in q.combinations[0].answers] + [q.combinations[0].residual]
            for q in response.results if q.combinations[0].answers is not None}


def _news_slots(num_layers: int, num_slots: int) -> tuple:
    """(engine, 6 news requests with `num_slots` slot queries each) on a random Gemma-3-12B cut."""
    if not torch.cuda.is_available():
        pytest.fail("needs CUDA (run through the device tool)")
    import random_models
    from slot_workload import load_slot_queries, with_slots
    from workloads import load_workload

    from contract.protocol import ScoringRequest

    hf = random_models.make_hf_model("gemma-3-12b", torch.bfloat16, num_layers=num_layers)
    engine = random_models.make_engine(random_models.engine_model(hf), random_models.tokenizer_for("gemma-3-12b"),
                                       "gemma-3-12b", "slots", 16384)
    plain = load_workload("news").requests(engine.model_name, 6, 4)
    return engine, [ScoringRequest.model_validate(r) for r in with_slots(plain, load_slot_queries("news", num_slots))]


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["triton", "triton-trunks", "sdpa"])
def test_gpu_slot_answers_alone_vs_packed_are_bit_identical(attention, monkeypatch):
    from engine.layers import decode_attention

    engine, requests = _news_slots(num_layers=6, num_slots=4)
    engine.runner.decoding_attention = attention.removesuffix("-trunks")
    monkeypatch.setattr(decode_attention, "SHARED_TRUNKS", False)  # "triton": each slot reads its own copy
    if attention == "triton-trunks":  # each content's slots read their shared rows from one entry: the same bits
        own = [_slots(r) for r in engine.score_requests(requests).results]
        monkeypatch.setattr(decode_attention, "SHARED_TRUNKS", True)
    packed = engine.score_requests(requests).results
    if attention == "triton-trunks":
        assert [_slots(r) for r in packed] == own
    for index in (0, 5):
        alone = engine.score_requests([requests[index]]).results[0]
        assert _slots(alone) == _slots(packed[index])
    for response in packed:
        slots = _slots(response)
        assert len(slots) == 4
        for answers in slots.values():
            ps = [p for _, p in answers[:-1]]
            assert ps == sorted(ps, reverse=True) and all(0 < p <= 1 for p in ps)
            assert math.isclose(sum(ps) + answers[-1], 1.0, abs_tol=1e-6) or answers[-1] == 0.0


@pytest.mark.gpu
def test_gpu_batched_decode_attention_shares_calls_and_never_syncs(monkeypatch):
    """Decoding attention (engine/layers/decode_attention.py) on CUDA: one call per (capacity, rows) group,
    fewer than the slots; no host sync inside it (sync debug mode "error"); the answers of a
    content alone and packed with contents of other lengths are bit-identical."""
    import engine.layers.decode_attention as decode_module

    engine, requests = _news_slots(num_layers=2, num_slots=5)
    alone = engine.score_requests([requests[2]]).results[0]
    attention, calls = decode_module.decode_attention, []

    def strict(q, k, v, meta, *args, **kwargs):
        calls.append((len(meta.spans), len(meta.groups)))
        torch.cuda.set_sync_debug_mode("error")
        try:
            return attention(q, k, v, meta, *args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(decode_module, "decode_attention", strict)
    packed = engine.score_requests(requests).results
    assert _slots(alone) == _slots(packed[2])
    assert calls and all(groups <= slots for slots, groups in calls)
    assert sum(groups for _, groups in calls) * 4 <= sum(slots for slots, _ in calls), calls


@pytest.mark.gpu
def test_gpu_decode_graph_replays_give_the_eager_bits(monkeypatch):
    """Decoding passes replayed as CUDA graphs (engine/pipeline/decode_graphs.py) give every
    slot answer, p and residual bit-identical to the same passes launched eagerly, and most
    passes of the run are replays."""
    from engine.pipeline.runner import ModelRunner

    engine, requests = _news_slots(num_layers=6, num_slots=5)
    engine.runner.use_decode_graphs = False
    eager = [_slots(r) for r in engine.score_requests(requests).results]
    engine.runner.use_decode_graphs = True
    made, decode_graphs = [], ModelRunner.decode_graphs
    monkeypatch.setattr(ModelRunner, "decode_graphs", lambda self: made.append(decode_graphs(self)) or made[-1])
    graphed = [_slots(r) for r in engine.score_requests(requests).results]
    assert graphed == eager
    [graphs] = made  # one decoding run (no floors asked)
    assert (graphs.num_eager, graphs.num_captured) == (1, 1), graphs  # one shape: the first pass eager, then captured
    assert graphs.num_replayed >= 8, graphs

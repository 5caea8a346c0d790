"""GPU, without the sync lane: a batch that arrivals may join packs each pass late, near the end of the pass before it
(engine/pipeline/launch_clock.py), and scores the same bits as one packed at once (a 24-layer
cut of the Gemma-3-12B architecture, random weights, real tokenizer, news requests)."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def _requests(engine):
    from workloads import load_workload

    from contract.protocol import ScoringRequest

    news = load_workload("news").requests(engine.model_name, 48, 64)  # 24 articles, ~48k tokens
    return [ScoringRequest.model_validate(r) for r in news * 2]  # ~12 passes of 8,192 tokens


@pytest.mark.gpu
def test_gpu_passes_are_packed_late_and_score_the_same_bits(gemma_cut_engine):
    from pass_log import PassLog

    engine, requests = gemma_cut_engine, _requests(gemma_cut_engine)
    engine.config = dataclasses.replace(engine.config, sync_lane=False)  # arrivals packed into the batch's passes
    compiled = [engine.compile(r) for r in requests]
    at_once = engine.score_batch(compiled)
    engine.score_batch(compiled, arrivals=lambda: [])  # the clock learns this engine's passes
    log = PassLog(engine)
    packed_at: list[tuple[int, float]] = []  # (passes launched so far, host time) at each look

    def arrivals():
        packed_at.append((engine.runner.num_passes, time.time()))
        return []

    late = engine.score_batch(compiled, arrivals=arrivals)
    # the scores (usage differs: the floors the first batch computed are cached for the later ones)
    assert [r.model_dump()["results"] for r in late.results] == [r.model_dump()["results"] for r in at_once.results]
    assert engine.launch_clock.seconds_per_token is not None and engine.launch_clock.launch_s is not None
    passes = {p["pass_id"]: p for p in log.passes()}
    first_look = {}
    for launched, when in packed_at:
        first_look.setdefault(launched, when)
    late_enough, fractions = [], []
    for launched, when in first_look.items():
        before = passes.get(launched)  # the pass in flight while the next one was packed
        if before is None or launched - 1 not in passes:
            continue
        duration = before["gpu_end"] - before["gpu_start"]
        late_enough.append(when >= before["gpu_start"] + 0.5 * duration)
        fractions.append(round((when - before["gpu_start"]) / duration, 2))
    assert len(late_enough) >= 4, f"too few passes to judge: {len(late_enough)} of {len(passes)}"
    assert sum(late_enough) >= 0.75 * len(late_enough), \
        f"packed at these fractions of the pass before it: {fractions} (not late)"

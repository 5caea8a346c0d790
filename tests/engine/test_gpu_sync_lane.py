"""GPU: sync arrivals run in passes of their own on a high-priority stream beside the batch's
passes (engine/pipeline/sync_lane.py): each is answered on that stream, with no more than the
batch pass in flight and the next one ending while it waits, with the bits it gets alone (a
24-layer cut of the Gemma-3-12B architecture, random weights, real tokenizer, news requests). How soon, against the batch's passes, is a
measurement, not a test: benchmarks/service_load.py (docs/performance.md, sync calls)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.mark.gpu
def test_gpu_arrivals_run_on_the_lane_past_at_most_two_batch_passes_with_their_own_bits(gemma_cut_engine):
    from pass_log import PassLog
    from workloads import load_workload

    from contract.protocol import ScoringRequest

    engine = gemma_cut_engine
    assert engine.uses_sync_lane
    news = load_workload("news")
    batch = [ScoringRequest.model_validate(r) for r in news.requests(engine.model_name, 24, 64)] * 2  # ~12 passes
    late = [ScoringRequest.model_validate(r) for r in news.requests(engine.model_name, 6, 5)]  # 5 questions each
    alone = engine.score_requests(late).results
    engine.score_requests(batch)  # every pass shape compiled, floors cached
    log = PassLog(engine)
    first = engine.runner.num_passes
    due = {first + 2 + 2 * i: late[i] for i in range(len(late))}  # one call every two batch passes
    handed: dict[int, float] = {}
    told: dict[int, float] = {}
    compiled = [engine.compile(r) for r in batch]

    def arrivals():
        ready = [k for k in due if engine.runner.num_passes >= k]
        out = []
        for k in sorted(ready):
            handed[len(batch) + len(handed)] = time.time()  # PassLog's clock
            out.append(engine.compile(due.pop(k)))
        return out

    def on_result(index, response, pass_ids):
        told.setdefault(index, time.time())
        results[index] = response

    results = {}
    engine.score_batch(compiled, arrivals=arrivals, on_result=on_result)
    assert not due, f"calls never handed: {sorted(due)}"
    got = [results[len(batch) + i] for i in range(len(late))]
    assert [r.model_dump()["results"] for r in got] == [r.model_dump()["results"] for r in alone]
    passes = log.passes()
    assert sum(p["lane"] for p in passes) >= len(late) // 2, "the calls did not run on the lane's stream"
    batch_ends = [p["gpu_end"] for p in passes if not p["lane"]]
    behind = {i: sum(handed[i] < end < told[i] for end in batch_ends) for i in handed}
    assert max(behind.values()) <= 2, f"batch passes that ended while each arrival waited: {behind}"

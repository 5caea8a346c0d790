"""GPU: extraction slots decoded on CUDA (a 6-layer cut of the Gemma-3-12B architecture, random
weights, real tokenizer): a content's slot answers are bit-identical alone vs packed with
the other contents, and every slot's answers are a proper distribution (sorted by p, each p
in (0, 1], p + residual = 1)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def _slots(response) -> dict:
    return {q.id: [(a.text, a.p) for a in q.combinations[0].answers] + [q.combinations[0].residual]
            for q in response.results if q.combinations[0].answers is not None}


@pytest.mark.gpu
def test_gpu_slot_answers_alone_vs_packed_are_bit_identical():
    if not torch.cuda.is_available():
        pytest.fail("needs CUDA (run through the device tool)")
    import random_models
    from slot_workload import load_slot_queries, with_slots
    from workloads import load_workload

    from spinf_jobs.protocol import ScoringRequest

    hf = random_models.make_hf_model("gemma-3-12b", torch.bfloat16, num_layers=6)
    engine = random_models.make_engine(random_models.engine_model(hf), random_models.tokenizer_for("gemma-3-12b"),
                                       "gemma-3-12b", "slots", 16384)
    plain = load_workload("news").requests(engine.model_name, 6, 4)
    requests = [ScoringRequest.model_validate(r) for r in with_slots(plain, load_slot_queries("news", 4))]
    packed = engine.score_batch(requests).results
    for index in (0, 5):
        alone = engine.score_batch([requests[index]]).results[0]
        assert _slots(alone) == _slots(packed[index])
    for response in packed:
        slots = _slots(response)
        assert len(slots) == 4
        for answers in slots.values():
            ps = [p for _, p in answers[:-1]]
            assert ps == sorted(ps, reverse=True) and all(0 < p <= 1 for p in ps)
            assert math.isclose(sum(ps) + answers[-1], 1.0, abs_tol=1e-6) or answers[-1] == 0.0

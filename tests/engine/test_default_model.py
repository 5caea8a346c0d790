"""The issue's example on the real default model (Qwen2.5-Coder-1.5B-Instruct, CPU, fp32)."""

import pytest

from contract.protocol import ScoringRequest
from engine.engine import Engine, EngineConfig
from engine.loading.model_registry import DEFAULT_MODEL

EXAMPLE = "fixtures/example-request.json"


@pytest.mark.slow
def test_example_ranks_billing_and_refund_yes():
    from pathlib import Path

    request = ScoringRequest.model_validate_json((Path(__file__).parents[2] / EXAMPLE).read_bytes())
    engine = Engine(EngineConfig(model=DEFAULT_MODEL, device="cpu", dtype="float32"))
    response = engine.score(request)
    by_id = {r.id: r.combinations for r in response.results}
    topic = max(by_id["topic"][0].options, key=lambda o: o.p)
    refund = max(by_id["refund"][0].options, key=lambda o: o.p)
    assert topic.text == " billing" and topic.p > 0.5
    assert refund.text == " yes" and refund.p > 0.5
    # the content moved the answer: billing is far above what the empty content gives
    assert topic.p - topic.floor_p > 0.3

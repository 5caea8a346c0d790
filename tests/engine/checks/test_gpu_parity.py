"""GPU: spinf in bf16 against transformers in fp32 on the same random weights, a leaking mask
as the negative control, and a content's scores alone vs packed with the workload.

A 6-layer cut of each full-size architecture keeps the test short; benchmarks/gpu_parity.py
runs the full depth and its results are committed under benchmarks/results/.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["gemma-3-12b", "qwen3-8b"])
def test_gpu_parity_against_hf_fp32_and_negative_control(model):
    if not torch.cuda.is_available():
        pytest.fail("needs CUDA (run through the device tool)")
    from gpu_parity import MAX_BOUND, MEAN_BOUND, parity

    result = parity(model, num_layers=6, layer_std=0.5, num_texts=2, num_queries=8, logit_std=1.0)
    good, leaky = result["spinf_bf16_vs_hf_fp32"], result["negative_control_vs_hf_fp32"]
    assert good["items"] == 2 * 8 * 2
    # The bounds. With logits of std 4 (the benchmark's spread) bf16 rounding of the
    # final hidden state alone moves top logits by ~0.03 nats; docs/performance.md has those numbers.
    assert good["mean_abs"] <= MEAN_BOUND and good["max_abs"] <= MAX_BOUND, good
    assert leaky["mean_abs"] > MEAN_BOUND or leaky["max_abs"] > MAX_BOUND, leaky
    # And never worse than transformers itself in bf16 against the same fp32 reference.
    assert good["mean_abs"] <= result["hf_bf16_vs_hf_fp32"]["mean_abs"], result


@pytest.mark.gpu
def test_gpu_scores_alone_vs_packed_are_bit_identical():
    if not torch.cuda.is_available():
        pytest.fail("needs CUDA (run through the device tool)")
    import random_models
    from throughput import spinf_logprobs
    from workloads import load_workload

    from contract.protocol import ScoringRequest

    hf = random_models.make_hf_model("gemma-3-12b", torch.bfloat16, num_layers=6)
    engine = random_models.make_engine(random_models.engine_model(hf), random_models.tokenizer_for("gemma-3-12b"),
                                       "gemma-3-12b", "invariance", 16384)
    requests = [ScoringRequest.model_validate(r) for r in load_workload("news").requests(engine.model_name, 24, 20)]
    passes = []
    launch = engine.runner.launch
    engine.runner.launch = lambda batch: passes.append(len(batch.trees)) or launch(batch)
    packed = engine.score_requests(requests).results
    assert max(passes) >= 10, passes  # contents really shared passes
    for index in (0, 5, 23):
        alone = engine.score_requests([requests[index]]).results[0]
        assert spinf_logprobs([alone]) == spinf_logprobs([packed[index]])
        assert alone.model_dump()["results"] == packed[index].model_dump()["results"]


_SCORE_IN_A_NEW_PROCESS = """
import json, sys
import torch
sys.path.insert(0, "benchmarks")
import random_models
from throughput import spinf_logprobs
from workloads import load_workload
from contract.protocol import ScoringRequest
hf = random_models.make_hf_model("gemma-3-12b", torch.bfloat16, num_layers=6)
engine = random_models.make_engine(random_models.engine_model(hf), random_models.tokenizer_for("gemma-3-12b"),
                                   "gemma-3-12b", "invariance", 16384)
requests = [ScoringRequest.model_validate(r) for r in load_workload("news").requests(engine.model_name, 24, 20)]
print(json.dumps(spinf_logprobs(engine.score_requests([requests[i] for i in json.loads(sys.argv[1])]).results)))
"""


@pytest.mark.gpu
def test_gpu_scores_are_bit_identical_across_processes():
    """A content scored alone in one process and packed with the whole workload (in reverse
    order) in another: the same log-probabilities to the last bit (floats through JSON's repr
    round-trip exactly)."""
    import json
    import subprocess

    if not torch.cuda.is_available():
        pytest.fail("needs CUDA (run through the device tool)")
    root = Path(__file__).resolve().parents[3]

    def scored(indices: list[int]) -> list[list[float]]:
        proc = subprocess.run([sys.executable, "-c", _SCORE_IN_A_NEW_PROCESS, json.dumps(indices)], cwd=root,
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    [alone] = scored([5])
    packed = scored(list(range(23, -1, -1)))
    assert alone == packed[23 - 5]

"""GPU parity: spinf_bf16 against transformers in fp32 on the same random weights.

    HF model fp32 (seeded) --(same tensors, cast)--> our stack in bf16 --Engine--> logprobs
    HF fp32, each (content, question) its own whole sequence (hf_baselines.naive_pass) --> reference
    stats: mean / max |Δlogprob| over every (content, question, option)
    negative controls: a causal mask over each tree (every token also sees all earlier sibling
    branches: must exceed the bounds) and the engine's own one-token leak (reported)
    calibration: the same HF model cast to bf16, against its own fp32 (plain bf16 transformers)

    python3 benchmarks/gpu_parity.py --model gemma-3-12b [--num-layers N] [--layer-std S]
      --> benchmarks/results/parity-<model>.json (the commit inside; one run per (layer std, logit std))
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hf_baselines  # noqa: E402
import random_models  # noqa: E402
from result_files import new_result, write_json  # noqa: E402
from throughput import diff_stats, spinf_logprobs  # noqa: E402
from workloads import load_workload  # noqa: E402

from contract.protocol import ScoringRequest  # noqa: E402

MEAN_BOUND, MAX_BOUND = 0.02, 0.1


def sibling_leak_mask(parents: list[int], num_padded: int) -> np.ndarray:
    """NEGATIVE CONTROL ONLY: plain causal attention over the tree's node order, so each
    branch also reads every sibling branch listed before it (what a broken tree mask does)."""
    return np.tril(np.ones((num_padded, num_padded), dtype=bool))


def reference(hf, items) -> list[list[float]]:
    out, _ = hf_baselines.naive_pass(hf, items)
    per_question = [t.tolist() for t in out]
    rows, i = [], 0
    for item in items:
        rows.append([x for q in per_question[i : i + len(item.questions)] for x in q])
        i += len(item.questions)
    return rows


def parity(
    model: str, num_layers: int | None, layer_std: float, num_texts: int, num_queries: int, logit_std: float = 4.0
) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tokenizer = random_models.tokenizer_for(model)
    hf = random_models.make_hf_model(model, torch.float32, num_layers=num_layers, layer_std=layer_std,
                                     logit_std=logit_std)
    engine = random_models.make_engine(random_models.engine_model(hf, torch.bfloat16), tokenizer, model, "parity", 16384)
    workload = load_workload("news")
    requests = [ScoringRequest.model_validate(r) for r in workload.requests(engine.model_name, num_texts, num_queries)]
    items = hf_baselines.items_from_engine(engine, requests)
    ref = reference(hf, items)
    ours = spinf_logprobs(engine.score_requests(requests).results)
    result = {"model": model, "num_layers": num_layers or hf.config.num_hidden_layers, "layer_std": layer_std, "logit_std": logit_std,
              "spinf_bf16_vs_hf_fp32": diff_stats(ours, ref)}
    engine.mask_fn = sibling_leak_mask
    engine.system_fingerprint += "-sibling-leak"  # new floors too: nothing cached is reused
    engine.floors = type(engine.floors)(16)
    result["negative_control_vs_hf_fp32"] = diff_stats(spinf_logprobs(engine.score_requests(requests).results), ref)
    engine.leak_sibling_for_negative_control()
    result["one_token_leak_vs_hf_fp32"] = diff_stats(spinf_logprobs(engine.score_requests(requests).results), ref)
    del engine
    hf.to(torch.bfloat16)
    result["hf_bf16_vs_hf_fp32"] = diff_stats(reference(hf, items), ref)
    good, leaky = result["spinf_bf16_vs_hf_fp32"], result["negative_control_vs_hf_fp32"]
    result["passes"] = good["mean_abs"] <= MEAN_BOUND and good["max_abs"] <= MAX_BOUND
    result["negative_control_fails"] = leaky["mean_abs"] > MEAN_BOUND or leaky["max_abs"] > MAX_BOUND
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gemma-3-12b", choices=sorted(random_models.ARCHS))
    parser.add_argument("--num-layers", type=int, default=None)
    parser.add_argument("--layer-std", type=float, nargs="+", default=[1.0])
    parser.add_argument("--logit-std", type=float, nargs="+", default=[4.0])
    parser.add_argument("--num-texts", type=int, default=3)
    parser.add_argument("--num-queries", type=int, default=12)
    args = parser.parse_args()
    results = []
    for std in args.layer_std:
        for logit_std in args.logit_std:
            results.append(parity(args.model, args.num_layers, std, args.num_texts, args.num_queries, logit_std))
        print(json.dumps(results[-1]), flush=True)
        torch.cuda.empty_cache()
    write_json(new_result(gpu=torch.cuda.get_device_name(), torch=torch.__version__, runs=results), "parity", args.model)


if __name__ == "__main__":
    main()

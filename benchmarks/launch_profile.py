"""The CPU cost of launching one pass (GPU): where a launch-bound pass spends its time.

    python3 benchmarks/launch_profile.py [--model gemma-3-12b] [--layers 6]
      --> benchmarks/results/launch-profile-<model>.txt (the commit on its first line)
      1. the architecture cut to --layers layers, random weights, real tokenizer
      2. one news text with 8 questions (one small pass: the GPU waits for the CPU)
      3. wall clock of score_batch per layer, then a cProfile of it (top functions by own time)

A pass of a few hundred tokens is launch-bound, so its wall clock per layer is the CPU cost of
launching a layer; full passes hide it behind the GPU, the first pass and decoding passes do not.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import random_models  # noqa: E402
from result_files import new_result, result_path  # noqa: E402
from workloads import load_workload  # noqa: E402

from contract.protocol import ScoringRequest  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma-3-12b")
    parser.add_argument("--layers", type=int, default=6)
    args = parser.parse_args()
    hf = random_models.make_hf_model(args.model, torch.bfloat16, num_layers=args.layers, layer_std=0.5)
    engine = random_models.make_engine(random_models.engine_model(hf), random_models.tokenizer_for(args.model),
                                       args.model, f"random-{args.model}-{args.layers}", 16384)
    [body] = load_workload("news").requests(engine.model_name, 1)
    body["scoring"]["queries"] = body["scoring"]["queries"][:8]
    requests = [ScoringRequest.model_validate(body)]
    for _ in range(3):  # warm-up: compiles, fills the floor cache
        engine.score_requests(requests)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        engine.score_requests(requests)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    best = min(times)
    profiler = cProfile.Profile()
    profiler.enable()
    engine.score_requests(requests)
    torch.cuda.synchronize()
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(30)
    measured = new_result()
    report = (f"commit {measured['commit']}, {measured['date']}, {torch.cuda.get_device_name()}, torch {torch.__version__}\n"
              f"{args.model} cut to {args.layers} layers, 1 text x 8 questions: score_batch best of 10 {best * 1e3:.1f} ms"
              f" = {best * 1e3 / args.layers:.2f} ms per layer\n\n{stream.getvalue()}")
    print(report)
    result_path("launch-profile", args.model, suffix=".txt").write_text(report)


if __name__ == "__main__":
    main()

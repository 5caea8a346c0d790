"""Extraction slots on CPU: how many attention calls the decoding passes make, and their time.

    python3 benchmarks/decode_calls.py [--family qwen3] [--texts 8] [--slots 5] [--repeats 3]
      1. a tiny random checkpoint of --family (engine/testing/tiny.py, real tokenizer), CPU, fp32
      2. the first --texts news texts, each also asking the first --slots slot queries
         (fixtures/benchmarks/news-slots.json)
      3. min of --repeats `score_requests` runs with and without the slots (after a warm-up), and
         in one more run: decoding passes, rows, SDPA calls while `ModelRunner.decode` runs,
         the calls one SDPA per slot per layer would make, and the time in `decode_attention`
      --> benchmarks/results/decode-calls-<family>-news.json (the commit inside)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from result_files import new_result, write_json  # noqa: E402

from benchmarks.slot_workload import load_slot_queries, with_slots  # noqa: E402
from benchmarks.workloads import load_workload  # noqa: E402
from contract.protocol import ScoringRequest  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.layers import decode_attention as decode_module  # noqa: E402
from engine.testing.tiny import tiny_cpu_engine  # noqa: E402


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def count_decoding(engine: Engine, requests: list[ScoringRequest]) -> dict:
    """One score_batch with counters around the decoding passes and their attention."""
    counts = {"passes": 0, "rows": 0, "sdpa_calls": 0, "per_slot_calls": 0, "decode_attention_s": 0.0}
    num_layers = engine.runner.model.config.num_hidden_layers
    in_decode = [False]
    sdpa, decode, attention = F.scaled_dot_product_attention, engine.runner.decode, decode_module.decode_attention

    def counted_sdpa(*args, **kwargs):
        counts["sdpa_calls"] += in_decode[0]
        return sdpa(*args, **kwargs)

    def counted_decode(batch):
        counts["passes"] += 1
        counts["rows"] += sum(span.num_real for span in batch.decode.spans)
        counts["per_slot_calls"] += len(batch.decode.spans) * num_layers
        in_decode[0] = True
        try:
            return decode(batch)
        finally:
            in_decode[0] = False

    def timed_attention(*args, **kwargs):
        start = time.perf_counter()
        try:
            return attention(*args, **kwargs)
        finally:
            counts["decode_attention_s"] += time.perf_counter() - start

    F.scaled_dot_product_attention, engine.runner.decode, decode_module.decode_attention = (
        counted_sdpa, counted_decode, timed_attention)
    try:
        engine.score_requests(requests)
    finally:
        F.scaled_dot_product_attention, engine.runner.decode, decode_module.decode_attention = sdpa, decode, attention
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="qwen3")
    parser.add_argument("--texts", type=int, default=8)
    parser.add_argument("--slots", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    engine = tiny_cpu_engine(args.family)
    plain = load_workload("news").requests(engine.model_name, args.texts)
    without = [ScoringRequest.model_validate(r) for r in plain]
    with_ = [ScoringRequest.model_validate(r) for r in with_slots(plain, load_slot_queries("news", args.slots))]
    engine.score_requests(with_)  # warm-up: the slot vocabulary, the floor cache
    seconds = {"without_slots_s": best_of(lambda: engine.score_requests(without), args.repeats),
               "with_slots_s": best_of(lambda: engine.score_requests(with_), args.repeats)}
    seconds["extra_for_slots_s"] = seconds["with_slots_s"] - seconds["without_slots_s"]
    result = new_result(command="python3 benchmarks/decode_calls.py " + " ".join(sys.argv[1:]), family=args.family,
                        texts=args.texts, slots=args.slots, threads=torch.get_num_threads(),
                        **seconds, **count_decoding(engine, with_))
    write_json(result, "decode-calls", args.family, "news")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

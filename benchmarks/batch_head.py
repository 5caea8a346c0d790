"""The host work of a batch before and between its passes, as on CUDA, measured on the CPU.

    python3 benchmarks/batch_head.py [--family gemma3_text] [--workload news] [--repeats 7] [--tag T]
      a tiny random checkpoint of `family` (engine/testing/tiny.py, the family's real tokenizer), so the
      engine's own code runs; its floor cache warmed by one batch; requests compiled once
      (Engine.compile: tokens and trees; the timed part starts from compiled requests, as a
      worker's batch and throughput.py's do). Then per mode, `repeats` times, what
      Engine.score_batch does on the host on CUDA, pass by pass: the ResponseBuilder
      (floor-cache lookups), packing each pass (floor trees, splits, batch tensors; the
      first pass capped at engine.engine.FIRST_PASS_TOKENS) and its block masks
      (engine/attention_cuda.build_tree_block_masks, both windows' BlockMasks):
        subtree   as shipped on CUDA: no dense [n, n] masks, block masks from the subtree ends
        bits      dense tree masks, packed to one bit per (row, column) (the CUDA path before f402a36)
      --> benchmarks/results/batch-head-<family>-<workload>[-T].{json,md}: per mode the
          median head (everything before the first pass is launched: builder + first packing)
          and, per pass, packing and mask milliseconds

On CUDA the masks' torch part (block lists, argsort, BlockMask) runs on the GPU, so the masks
column overstates the host share there; packing is host work either way. In `bits` mode the
packer still computes the subtree ends (not needed there; not subtracted). Feature-detected, so
the same file also runs at commits before the subtree masks (only `bits` then).
Needs .data/benchmarks/<workload>-texts.json (benchmarks/make_<workload>_workload.py).
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from result_files import git_commit, write_pair  # noqa: E402
from workloads import load_workload  # noqa: E402

from contract.protocol import ScoringRequest  # noqa: E402
from engine.engine import FIRST_PASS_TOKENS, Engine  # noqa: E402
from engine.layers.attention_cuda import build_tree_block_masks  # noqa: E402
from engine.pipeline.packer import pack_trees  # noqa: E402
from engine.testing.tiny import TINY_SLIDING_WINDOW, tiny_cpu_engine  # noqa: E402

HAS_SUBTREES = "use_subtrees" in inspect.signature(build_tree_block_masks).parameters


def one_batch(engine: Engine, compiled: list, dense_masks: bool) -> list[dict]:
    """Per pass: packing ms (the first includes the ResponseBuilder) and block-mask ms."""
    packing = {"dense_masks": dense_masks} if HAS_SUBTREES else {}
    masking = {"use_subtrees": not dense_masks} if HAS_SUBTREES else {}
    passes = []
    start = time.perf_counter()
    builder = engine._response_builder(compiled)
    batches = pack_trees(engine._trees(compiled, builder), engine.config.max_num_batched_tokens, engine.mask_fn,
                         first_max_num_tokens=FIRST_PASS_TOKENS, **packing)
    for batch in batches:
        packed = time.perf_counter()
        masks = build_tree_block_masks(batch.attention.spans, "cpu", **masking)
        masks.for_window(None), masks.for_window(TINY_SLIDING_WINDOW)
        done = time.perf_counter()
        passes.append({"tokens": batch.num_real_tokens, "pack_ms": (packed - start) * 1e3, "masks_ms": (done - packed) * 1e3})
        start = time.perf_counter()
    return passes


def median_passes(runs: list[list[dict]]) -> list[dict]:
    return [{"tokens": run[0]["tokens"], **{key: statistics.median(r[key] for r in run) for key in ("pack_ms", "masks_ms")}}
            for run in zip(*runs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="gemma3_text")
    parser.add_argument("--workload", default="news")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    engine = tiny_cpu_engine(args.family)
    requests = [ScoringRequest.model_validate(r) for r in load_workload(args.workload).requests(engine.model_name)]
    engine.score_requests(requests)  # warms the floor cache, as a running worker's is
    compiled = [engine.compile(r) for r in requests]
    modes = {"subtree": False, "bits": True} if HAS_SUBTREES else {"bits": True}
    result = {"commit": git_commit(), "date": datetime.date.today().isoformat(), "family": args.family,
              "workload": args.workload, "repeats": args.repeats, "first_pass_tokens": FIRST_PASS_TOKENS,
              "num_requests": len(requests), "modes": {}}
    for name, dense_masks in modes.items():
        runs = [one_batch(engine, compiled, dense_masks) for _ in range(args.repeats)]
        passes = median_passes(runs)
        result["modes"][name] = {"head_ms": passes[0]["pack_ms"], "passes": passes,
                                 "total_pack_ms": sum(p["pack_ms"] for p in passes),
                                 "total_masks_ms": sum(p["masks_ms"] for p in passes)}
        print(name, result["modes"][name], flush=True)
    write_pair(result, markdown(result, " ".join(sys.argv[1:])), "batch-head", args.family, args.workload, args.tag)


def markdown(result: dict, argv: str) -> str:
    lines = [f"# Host work of a batch ({result['workload']}, tiny {result['family']}, CPU)", "",
             f"commit `{result['commit'][:7]}`, {result['date']}, `python3 benchmarks/batch_head.py {argv}`, "
             f"{result['num_requests']} requests, median of {result['repeats']}; first pass capped at "
             f"{result['first_pass_tokens']} tokens.", "",
             "| mode | head ms (builder + first packing) | first pass masks ms | all passes: pack ms | all passes: masks ms | passes (tokens) |",
             "|---|---:|---:|---:|---:|---|"]
    for name, mode in result["modes"].items():
        tokens = " / ".join(str(p["tokens"]) for p in mode["passes"])
        lines.append(f"| {name} | {mode['head_ms']:.1f} | {mode['passes'][0]['masks_ms']:.1f} | "
                     f"{mode['total_pack_ms']:.1f} | {mode['total_masks_ms']:.1f} | {tokens} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

"""CPU tree attention over one wide tree: every key masked (the baseline) beside only the visible keys.

    python3 benchmarks/cpu_attention.py [--questions 400] [--content 45] [--question-tokens 36]
                                        [--heads 9 --kv-heads 3 --head-dim 64 --layers 30] [--repeats 3]
      one content of --content tokens and --questions branches of --question-tokens tokens and
      two one-token options each (45 + 400 x 37 = 14,845 tokens, a span of 14,848 rows: about the
      shape of tests/api/test_decisions.py's 400-question request), packed as the engine packs it (no dense mask), random
      q/k/v of smollm2-135m's attention shape; per arm, in one process, the seconds of one layer's
      attention over the span (best of --repeats), in blocks of CPU_SCORES_PER_BLOCK scores:
        masked:  each block of query rows against all n keys, the rows' [rows, n] tree mask
        visible: each block against only the keys its rows may see (engine.layers.attention.span_block)
      --> benchmarks/results/cpu-attention-<questions>-questions.{json,md}: per arm the seconds per
          layer, the keys read per block, the projected seconds per pass (x --layers), and the
          largest difference between the arms' outputs
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from result_files import new_result, write_pair  # noqa: E402

import engine.layers.attention as attention  # noqa: E402
from engine.pipeline.packer import pack_trees  # noqa: E402
from engine.pipeline.stages import Branch  # noqa: E402
from engine.pipeline.tree import build_tree  # noqa: E402


def question_span(num_questions: int, content: int, question_tokens: int):
    trunk = list(range(1, content + 1))
    branches = [Branch(0, i, {}, "", [trunk + [1000 + i] * (question_tokens - 1) + [7],
                                      trunk + [1000 + i] * (question_tokens - 1) + [8]],
                       content + question_tokens - 1, None) for i in range(num_questions)]
    [batch] = pack_trees([(0, build_tree(branches))], 1 << 20, dense_masks=False)
    return batch.attention.spans[0]


def masked_block(span, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The baseline: every key of the span, the rows' mask over all of them."""
    return torch.arange(span.positions.shape[0]), attention.span_mask(span, None, start, stop)


def timed(arm, q, k, v, repeats: int) -> tuple[float, torch.Tensor, list[int], bool]:
    keys_read, real_sdpa = [], attention.sdpa

    def counting(q, k, *rest):
        keys_read.append(k.shape[0])
        return real_sdpa(q, k, *rest)

    attention.sdpa = counting
    try:
        out = attention.sdpa_in_row_blocks(q, k, v, arm, 0.125)
    finally:
        attention.sdpa = real_sdpa
    best, same_bits = float("inf"), True
    for _ in range(repeats):
        began = time.perf_counter()
        again = attention.sdpa_in_row_blocks(q, k, v, arm, 0.125)
        best = min(best, time.perf_counter() - began)
        same_bits &= torch.equal(again, out)
    return best, out, keys_read, same_bits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=400)
    parser.add_argument("--content", type=int, default=45)
    parser.add_argument("--question-tokens", type=int, default=36)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    span = question_span(args.questions, args.content, args.question_tokens)
    n = span.positions.shape[0]
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(n, args.heads, args.head_dim, generator=generator)
    k, v = (torch.randn(n, args.kv_heads, args.head_dim, generator=generator) for _ in range(2))
    arms = {"masked": partial(masked_block, span), "visible": partial(attention.span_block, span, None)}
    measured = {name: timed(arm, q, k, v, args.repeats) for name, arm in arms.items()}
    rows = {name: {"seconds_per_layer": round(seconds, 4), "seconds_per_pass": round(seconds * args.layers, 2),
                   "blocks": len(keys), "keys_read_per_block_max": max(keys),
                   "keys_read_per_block_mean": round(sum(keys) / len(keys), 1), "same_bits_every_repeat": same}
            for name, (seconds, _, keys, same) in measured.items()}
    difference = (measured["masked"][1] - measured["visible"][1]).abs().max().item()
    command = "python3 benchmarks/cpu_attention.py " + " ".join(sys.argv[1:])
    result = new_result(command=command.strip(), device="cpu", cpu=platform.processor() or platform.machine(),
                        torch_threads=torch.get_num_threads(), span_tokens=n, questions=args.questions,
                        heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim, layers=args.layers,
                        cpu_scores_per_block=attention.CPU_SCORES_PER_BLOCK, arms=rows,
                        speedup=round(rows["masked"]["seconds_per_layer"] / rows["visible"]["seconds_per_layer"], 1),
                        max_abs_difference=difference)
    lines = [f"# CPU tree attention: one {n:,}-token tree of {args.questions} questions", "",
             f"commit {result['commit']}, {result['date']}; `{result['command']}`; CPU, {result['torch_threads']} "
             f"threads; {args.heads} query heads, {args.kv_heads} KV heads, head dim {args.head_dim} "
             f"(smollm2-135m's by default), {args.layers} layers; blocks of {attention.CPU_SCORES_PER_BLOCK:,} scores",
             "", "| arm | blocks | keys read per block (mean / max) | s per layer | s per pass (projected) "
             "| same bits every repeat |", "|---|---:|---:|---:|---:|---|"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['blocks']} | {row['keys_read_per_block_mean']:,} / "
                     f"{row['keys_read_per_block_max']:,} | {row['seconds_per_layer']} | {row['seconds_per_pass']} "
                     f"| {row['same_bits_every_repeat']} |")
    lines += ["", f"visible is {result['speedup']}x faster; largest |masked - visible| of the outputs: {difference:.2e} "
              "(the visible arm sums over fewer keys)", ""]
    path = write_pair(result, "\n".join(lines), "cpu-attention", f"{args.questions}-questions")
    print(path.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()

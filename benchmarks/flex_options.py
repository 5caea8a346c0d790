"""Flex-attention launch options on the real tree masks of the news workload (GPU).

    python3 benchmarks/flex_options.py [--model gemma-3-12b] [--variants ...] [--probe-mask-cost]
      --> benchmarks/results/flex-options-<model>.json (the commit inside)
      1. the news requests, compiled with the model's real tokenizer, packed as the engine packs
         them (budget 16,384) -> the first pass's tree spans -> block masks on the GPU
      2. random q/k/v with the model's heads; per kernel-options variant: time one layer's
         tree attention (full and sliding window), and compare its output bit for bit with the
         engine's current options (engine.layers.attention_cuda.KERNEL_OPTIONS)

A variant is only usable if it is bit-identical to the current one on every row (or, if not,
its own alone-vs-packed invariance must be shown before adopting it: a new fingerprint).

    --variants tma,...   only these (default: all)
    --probe-mask-cost    also: the bit-per-column mask (bit-checked against the engine's subtree
                         mask), and the same block lists with a mask_mod that keeps every key of
                         a partial block (wrong outputs: a cost probe only); per window the tile
                         counts, so each row also has TFLOP/s over the tiles the kernel visits;
                         and the host time to build each mask for the pass (median of 5)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import random_models  # noqa: E402
from result_files import new_result, write_json  # noqa: E402
from workloads import load_workload  # noqa: E402

from contract.protocol import ScoringRequest  # noqa: E402
from engine.layers import attention_cuda  # noqa: E402
from engine.pipeline.compiler import compile_request  # noqa: E402
from engine.pipeline.packer import pack_trees  # noqa: E402
from engine.pipeline.prompts import PromptRenderer  # noqa: E402
from engine.pipeline.stages import TreeOwner  # noqa: E402
from engine.pipeline.tokenize import Tokenize  # noqa: E402

BASE = dict(attention_cuda.KERNEL_OPTIONS)
VARIANTS = {
    "current": {},
    "tma": {"USE_TMA": True},
    "warps8": {"num_warps": 8},
    "stages3": {"num_stages": 3},
    "rows_safe": {"ROWS_GUARANTEED_SAFE": True},
    "tma_stages3": {"USE_TMA": True, "num_stages": 3},
    "warps8_stages3": {"num_warps": 8, "num_stages": 3},
}


def first_pass_spans(model: str):
    tokenizer = random_models.tokenizer_for(model)
    has_template = bool(tokenizer.chat_template)
    renderer, tokenize = PromptRenderer(tokenizer, has_template), Tokenize(tokenizer, not has_template)
    requests = [ScoringRequest.model_validate(r) for r in load_workload("news").requests(None)]
    trees = [compile_request(r, renderer, tokenize).tree for r in requests]
    return next(iter(pack_trees([(TreeOwner(i), tree) for i, tree in enumerate(trees)], 16384))).attention.spans


def time_variant(q, k, v, masks, scale, window, options, repeats=20):
    attention_cuda.KERNEL_OPTIONS = {**BASE, **options}
    attention_cuda._compiled_flex = None
    torch._dynamo.reset()
    out = attention_cuda.flex_tree_attention(q, k, v, masks, scale, window)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        attention_cuda.flex_tree_attention(q, k, v, masks, scale, window)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats, out


class _NoMaskLookup(attention_cuda.TreeBlockMasks):
    """The same block lists; inside a partial block every key is kept (no lookup at all)."""

    def _mask_mod(self, window):
        return lambda b, h, q, kv: kv >= 0


def build_ms(spans, use_subtrees: bool, window: int | None, repeats: int = 5) -> float:
    """Host milliseconds to build the pass's block masks and both windows' BlockMasks (median)."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        masks = attention_cuda.build_tree_block_masks(spans, "cuda", use_subtrees=use_subtrees)
        masks.for_window(None), masks.for_window(window)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def tile_counts(masks, window) -> dict:
    block_mask = masks.for_window(window)
    return {"partial_tiles": int(block_mask.kv_num_blocks.sum()), "full_tiles": int(block_mask.full_kv_num_blocks.sum())}


def tile_tflops(counts: dict, heads: int, dim: int, seconds: float) -> float:
    """FLOPs of every visited 64x64 tile (QK^T and PV, 2 x 2 x 64 x 64 x d per head) / time."""
    size = attention_cuda.BLOCK_SIZE
    return (counts["partial_tiles"] + counts["full_tiles"]) * 4 * size * size * dim * heads / seconds / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma-3-12b")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma list of VARIANTS to time")
    parser.add_argument("--probe-mask-cost", action="store_true")
    args = parser.parse_args()
    variants = {name: VARIANTS[name] for name in args.variants.split(",")}
    config = random_models.ARCHS[args.model].config
    spans = first_pass_spans(args.model)
    masks = attention_cuda.build_tree_block_masks(spans, "cuda")
    num_tokens = masks.num_tokens
    gen = torch.Generator(device="cuda").manual_seed(0)
    heads, kv_heads, dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    q, k, v = (torch.randn(num_tokens, h, dim, device="cuda", generator=gen, dtype=torch.bfloat16)
               for h in (heads, kv_heads, kv_heads))
    scale = dim**-0.5
    rows = []
    for window in (None, config.get("sliding_window")):
        reference = None
        counts = tile_counts(masks, window)
        for name, options in variants.items():
            try:
                seconds, out = time_variant(q, k, v, masks, scale, window, options)
            except Exception as error:  # a variant the compiler refuses is reported, not fatal
                rows.append({"variant": name, "window": window, "error": repr(error)[:300]})
                print(rows[-1], flush=True)
                continue
            reference = out if reference is None else reference
            row = {"variant": name, "window": window, "options": {**BASE, **options}, "ms": seconds * 1e3,
                   "bit_identical_to_current": bool(torch.equal(out, reference)),
                   "max_abs_diff": float((out.float() - reference.float()).abs().max()),
                   **counts, "tile_tflops": tile_tflops(counts, heads, dim, seconds)}
            rows.append(row)
            print(row, flush=True)
        if args.probe_mask_cost:
            bits = attention_cuda.build_tree_block_masks(spans, "cuda", use_subtrees=False)
            seconds, out = time_variant(q, k, v, bits, scale, window, variants[next(iter(variants))])
            rows.append({"variant": "bits_mask", "window": window, "ms": seconds * 1e3, **counts,
                         "tile_tflops": tile_tflops(counts, heads, dim, seconds),
                         "bit_identical_to_current": bool(torch.equal(out, reference)),
                         "same_blocks": bool(torch.equal(bits.any_blocks, masks.any_blocks)
                                             and torch.equal(bits.full_blocks, masks.full_blocks)),
                         "note": "one mask bit read per (row, column), as before the subtree ends"})
            print(rows[-1], flush=True)
            fields = {f.name: getattr(masks, f.name) for f in dataclasses.fields(masks) if not f.name.startswith("_")}  # own caches
            probe = _NoMaskLookup(**fields)
            seconds, _ = time_variant(q, k, v, probe, scale, window, variants[next(iter(variants))])
            rows.append({"variant": "probe_no_bit_lookup", "window": window, "ms": seconds * 1e3, **counts,
                         "tile_tflops": tile_tflops(counts, heads, dim, seconds),
                         "note": "partial blocks keep every key: wrong outputs, cost only"})
            print(rows[-1], flush=True)
    if args.probe_mask_cost:
        for use_subtrees in (True, False):
            rows.append({"variant": "build_" + ("subtree" if use_subtrees else "bits") + "_masks",
                         "host_ms": build_ms(spans, use_subtrees, config.get("sliding_window"))})
            print(rows[-1], flush=True)
    result = new_result(gpu=torch.cuda.get_device_name(), model=args.model, num_tokens=num_tokens,
                        num_spans=len(spans), torch=torch.__version__, rows=rows)
    write_json(result, "flex-options", args.model)


if __name__ == "__main__":
    main()

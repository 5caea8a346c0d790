"""Passes of every shape a pass budget can take, run once before the first request (CUDA).

    warm_up_batches(max_num_tokens, bucket, max_context) -> [PackedBatch], one per bucket size
        bucket, 2*bucket, ..., max_num_tokens: chains of filler tokens (one scored option each)
        packed to fill that bucket
    Engine.warm_up runs each once: flex_attention compiles one kernel per padded size
    (engine/layers/attention_cuda.py BUCKET), and a size first met by a live pass costs that
    pass seconds of compiling (a sync call riding it waits for it)

The filler's scores are thrown away; nothing here changes a later score.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from engine.layers.ops import ROW_CHUNK
from engine.pipeline.compiler import make_branch
from engine.pipeline.packer import padded
from engine.pipeline.stages import PackedBatch, TokenTree, TreeOwner
from engine.pipeline.tree import build_tree

FILLER_ID = 1  # any id of the vocabulary: the filler's logits are never read


def filler_tree(num_tokens: int) -> TokenTree:
    """A chain of `num_tokens` tokens whose last one is a scored option."""
    prompt = [FILLER_ID] * (num_tokens - 1)
    return build_tree([make_branch(0, 0, {}, "", [prompt, prompt + [FILLER_ID]], None)])


def warm_up_batches(
    pack: Callable[..., Iterator[PackedBatch]], max_num_tokens: int, bucket: int, max_context: int
) -> Iterator[PackedBatch]:
    """One batch of each padded size up to the budget: trees of at most one bucket (and the
    context), as many as fill the size without passing it."""
    tree_tokens = max(2, min(bucket, max_context) - ROW_CHUNK)  # one chain, aligned, inside a bucket
    size = padded(tree_tokens, ROW_CHUNK)
    for target in range(bucket, max_num_tokens + bucket, bucket):
        target = min(target, max_num_tokens)
        count = max(1, target // size)
        trees = [(TreeOwner(0), filler_tree(tree_tokens)) for _ in range(count)]
        yield next(pack(trees, target))

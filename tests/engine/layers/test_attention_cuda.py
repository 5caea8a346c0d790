"""The flex_attention block mask (engine/layers/attention_cuda.py) against per-span SDPA.

On CPU flex_attention runs eagerly, so the mask construction (subtree ends, or bits and span
tables for a dense mask; block classification; sliding windows) is checked here; the gpu tests check the compiled kernel
and that a content's attention is bit-identical alone and packed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.layers.attention import AttentionMetadata, TreeSpan, tree_attention
from engine.layers.attention_cuda import build_tree_block_masks, flex_tree_attention
from engine.layers.ops import ROW_CHUNK
from engine.pipeline.packer import padded, tree_mask


def random_tree(rng: np.random.Generator, num_nodes: int) -> tuple[list[int], list[int]]:
    """A trunk then branches, in preorder as engine/pipeline/tree.py lays trees out (each node hangs
    below the previous node or one of its ancestors): parents, depths."""
    parents, depths = [-1], [0]
    for node in range(1, num_nodes):
        parent = node - 1
        if rng.random() < 0.2:
            for _ in range(int(rng.integers(1, depths[parent] + 2))):
                parent = parents[parent]
                if parent < 0:
                    break
        parents.append(parent)
        depths.append(depths[parent] + 1 if parent >= 0 else 0)
    return parents, depths


def ends_of(mask: np.ndarray) -> np.ndarray:
    """Per column, one past the last row that sees it (exactly the mask when rows are in preorder)."""
    return (mask.shape[0] - np.argmax(mask[::-1], axis=0)).astype(np.int32)


def random_spans(seed: int, sizes: list[int], with_subtrees: bool = True) -> list[TreeSpan]:
    """As the packer makes them: with subtree ends (the CUDA mask reads them), or without
    (the bit-per-column mask, as for a custom mask_fn)."""
    rng = np.random.default_rng(seed)
    spans, start = [], 0
    for size in sizes:
        parents, depths = random_tree(rng, size)
        num_padded = padded(size, ROW_CHUNK)
        positions = torch.tensor(depths + [0] * (num_padded - size))
        mask = tree_mask(parents, num_padded)
        ends = ends_of(mask)
        rows, cols = np.arange(num_padded)[:, None], np.arange(num_padded)[None, :]
        assert np.array_equal((cols <= rows) & (rows < ends[None, :]), mask), "not a preorder tree"
        spans.append(TreeSpan(start, torch.from_numpy(mask), positions, ends if with_subtrees else None))
        start += num_padded
    return spans


def qkv(num_tokens: int, device: str = "cpu", dtype=torch.float32, seed: int = 0):
    gen = torch.Generator(device).manual_seed(seed)
    shape = lambda h: (num_tokens, h, 32)  # noqa: E731
    return [torch.randn(shape(h), generator=gen, device=device, dtype=dtype) for h in (4, 2, 2)]


@pytest.mark.parametrize("with_subtrees", [True, False])
@pytest.mark.parametrize("window", [None, 5])
def test_flex_mask_matches_per_span_sdpa(window, with_subtrees):
    spans = random_spans(0, [70, 130, 64, 9], with_subtrees)
    num_tokens = spans[-1].start + spans[-1].num_tokens
    q, k, v = qkv(num_tokens)
    expected = tree_attention(q, k, v, AttentionMetadata(spans), 0.2, window)
    masks = build_tree_block_masks(spans, torch.device("cpu"), bucket=256)
    assert (masks.subtree_end is not None) == with_subtrees and (masks.bits is None) == with_subtrees
    got = flex_tree_attention(q, k, v, masks, 0.2, window)
    assert masks.num_padded == 512
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 5])
def test_subtree_mask_is_the_bits_mask_and_gives_the_same_bits(window):
    """The subtree mask_mod keeps exactly the keys the bit lookup keeps, on every (row, column)
    of the padded stream, its blocks are classified the same, and the attention is bit-identical."""
    spans = random_spans(3, [200, 64, 130, 9])
    subtree_masks = build_tree_block_masks(spans, torch.device("cpu"), bucket=256)
    bits_masks = build_tree_block_masks(spans, torch.device("cpu"), bucket=256, use_subtrees=False)
    assert subtree_masks.subtree_end is not None and bits_masks.subtree_end is None
    assert torch.equal(subtree_masks.any_blocks, bits_masks.any_blocks)
    assert torch.equal(subtree_masks.full_blocks, bits_masks.full_blocks)
    rows, cols = torch.meshgrid(torch.arange(subtree_masks.num_padded), torch.arange(subtree_masks.num_padded), indexing="ij")
    zero = torch.zeros((), dtype=torch.long)
    keep_subtrees = subtree_masks._mask_mod(window)(zero, zero, rows, cols)
    keep_bits = bits_masks._mask_mod(window)(zero, zero, rows, cols)
    assert torch.equal(keep_subtrees, keep_bits)
    assert keep_subtrees.sum() > subtree_masks.num_tokens  # more than the diagonal: a real tree
    q, k, v = qkv(subtree_masks.num_tokens)
    assert torch.equal(flex_tree_attention(q, k, v, subtree_masks, 0.2, window),
                       flex_tree_attention(q, k, v, bits_masks, 0.2, window))


def dense_blocks(mask: torch.Tensor, num_padded: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(any, full) per 64x64 block of the mask placed in a stream of num_padded (bucket rows see nothing)."""
    dense = torch.zeros(num_padded, num_padded, dtype=torch.bool)
    dense[: mask.shape[0], : mask.shape[0]] = mask
    nb = num_padded // 64
    dense = dense.reshape(nb, 64, nb, 64)
    return dense.any(dim=3).any(dim=1), dense.all(dim=3).all(dim=1)


@pytest.mark.parametrize("use_subtrees", [True, False])
def test_block_classification_is_exact(use_subtrees):
    chain_mask = tree_mask(list(range(-1, 319)), 320)  # ends on a block boundary: the last row block is full too
    chain = TreeSpan(0, torch.from_numpy(chain_mask), torch.arange(320), ends_of(chain_mask))
    for span in random_spans(1, [300]) + random_spans(5, [256]) + [chain]:
        masks = build_tree_block_masks([span], torch.device("cpu"), bucket=128, use_subtrees=use_subtrees)
        any_blocks, full_blocks = dense_blocks(span.mask, masks.num_padded)
        assert torch.equal(masks.full_blocks, full_blocks) and torch.equal(masks.any_blocks, any_blocks)
    causal = build_tree_block_masks([chain], torch.device("cpu"), bucket=64, use_subtrees=use_subtrees)
    assert causal.full_blocks[1, 0] and not causal.full_blocks[0, 0]  # below the diagonal: full
    assert causal.any_blocks[0, 0] and not causal.any_blocks[0, 1]  # above it: empty


def test_leaky_mask_changes_the_result():
    """The negative control: a mask that lets a token see its left neighbour must differ."""
    spans = random_spans(2, [200])
    leaky = spans[0].mask.clone()
    rows = torch.arange(1, 200)
    leaky[rows, rows - 1] = True
    q, k, v = qkv(256)
    good = flex_tree_attention(q, k, v, build_tree_block_masks(spans, torch.device("cpu"), 256), 0.2)
    bad_spans = [TreeSpan(0, leaky, spans[0].positions)]
    bad = flex_tree_attention(q, k, v, build_tree_block_masks(bad_spans, torch.device("cpu"), 256), 0.2)
    assert (good - bad).abs().max() > 1e-3


def test_misaligned_span_is_refused():
    span = TreeSpan(0, torch.ones(10, 10, dtype=torch.bool).tril(), torch.arange(10))
    with pytest.raises(ValueError, match="aligned"):
        build_tree_block_masks([span], torch.device("cpu"))


def test_span_without_mask_or_subtree_ends_is_refused():
    [span] = random_spans(0, [64], with_subtrees=False)
    span.mask = None
    with pytest.raises(ValueError, match="neither subtree ends nor a dense mask"):
        build_tree_block_masks([span], torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("use_subtrees", [False, True])
@pytest.mark.parametrize("window", [None, 40])
def test_gpu_flex_alone_vs_packed_bit_identical(window, use_subtrees):
    sizes = [500, 90, 1300, 64, 700]
    spans = random_spans(3, sizes)
    num_tokens = spans[-1].start + spans[-1].num_tokens
    q, k, v = qkv(num_tokens, "cuda", torch.bfloat16)
    cuda = torch.device("cuda")
    packed = flex_tree_attention(q, k, v, build_tree_block_masks(spans, cuda, use_subtrees=use_subtrees), 0.2, window)
    expected = tree_attention(q.float().cpu(), k.float().cpu(), v.float().cpu(), AttentionMetadata(spans), 0.2, window)
    assert (packed.float().cpu() - expected).abs().max() < 2e-2
    for span in spans:  # each content alone, at row 0 of its own stream
        rows = slice(span.start, span.start + span.num_tokens)
        alone_span = TreeSpan(0, span.mask, span.positions, span.subtree_end)
        masks = build_tree_block_masks([alone_span], cuda, use_subtrees=use_subtrees)
        alone = flex_tree_attention(q[rows], k[rows], v[rows], masks, 0.2, window)
        assert torch.equal(alone, packed[rows]), f"span at {span.start} differs alone vs packed"


@pytest.mark.gpu
@pytest.mark.parametrize("window", [None, 40])
def test_gpu_subtree_mask_gives_the_bits_masks_outputs(window):
    """Compiled on the GPU, the subtree mask_mod and the bit lookup give the same bits."""
    spans = random_spans(4, [500, 90, 1300, 64, 700])
    num_tokens = spans[-1].start + spans[-1].num_tokens
    q, k, v = qkv(num_tokens, "cuda", torch.bfloat16)
    subtree_masks = build_tree_block_masks(spans, torch.device("cuda"))
    assert subtree_masks.subtree_end is not None
    with_subtrees = flex_tree_attention(q, k, v, subtree_masks, 0.2, window)
    with_bits = flex_tree_attention(q, k, v, build_tree_block_masks(spans, torch.device("cuda"), use_subtrees=False), 0.2, window)
    assert torch.equal(with_subtrees, with_bits)

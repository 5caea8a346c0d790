"""The flex_attention block mask (engine/attention_cuda.py) against per-span SDPA.

On CPU flex_attention runs eagerly, so the mask construction (bits, span tables, block
classification, sliding windows) is checked here; the gpu tests check the compiled kernel
and that a content's attention is bit-identical alone and packed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.attention import AttentionMetadata, TreeSpan, tree_attention
from engine.attention_cuda import build_tree_block_masks, flex_tree_attention
from engine.packer import padded, tree_mask
from engine.ops import ROW_CHUNK


def random_tree(rng: np.random.Generator, num_nodes: int) -> tuple[list[int], list[int]]:
    """A trunk then branches that fork anywhere earlier: parents (parent before child), depths."""
    parents, depths = [-1], [0]
    for node in range(1, num_nodes):
        parent = node - 1 if rng.random() < 0.8 else int(rng.integers(0, node))
        parents.append(parent)
        depths.append(depths[parent] + 1)
    return parents, depths


def random_spans(seed: int, sizes: list[int], with_runs: bool = True) -> list[TreeSpan]:
    """As the packer makes them: with the tree (the CUDA mask may read its runs), or without
    (the bit-per-column mask, as for a custom mask_fn)."""
    rng = np.random.default_rng(seed)
    spans, start = [], 0
    for size in sizes:
        parents, depths = random_tree(rng, size)
        num_padded = padded(size, ROW_CHUNK)
        positions = torch.tensor(depths + [0] * (num_padded - size))
        spans.append(TreeSpan(start, torch.from_numpy(tree_mask(parents, num_padded)), positions,
                              parents if with_runs else None))
        start += num_padded
    return spans


def qkv(num_tokens: int, device: str = "cpu", dtype=torch.float32, seed: int = 0):
    gen = torch.Generator(device).manual_seed(seed)
    shape = lambda h: (num_tokens, h, 32)  # noqa: E731
    return [torch.randn(shape(h), generator=gen, device=device, dtype=dtype) for h in (4, 2, 2)]


@pytest.mark.parametrize("with_runs", [True, False])
@pytest.mark.parametrize("window", [None, 5])
def test_flex_mask_matches_per_span_sdpa(window, with_runs):
    spans = random_spans(0, [70, 130, 64, 9], with_runs)
    num_tokens = spans[-1].start + spans[-1].num_tokens
    q, k, v = qkv(num_tokens)
    expected = tree_attention(q, k, v, AttentionMetadata(spans), 0.2, window)
    masks = build_tree_block_masks(spans, torch.device("cpu"), bucket=256, use_runs=with_runs)
    assert (masks.run_start is not None) == with_runs
    got = flex_tree_attention(q, k, v, masks, 0.2, window)
    assert masks.num_padded == 512
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 5])
def test_runs_mask_is_the_bits_mask_and_gives_the_same_bits(window):
    """The runs mask_mod keeps exactly the keys the bit lookup keeps, on every (row, column)
    of the padded stream, so the attention is bit-identical."""
    spans, bit_spans = random_spans(3, [200, 64, 130, 9]), random_spans(3, [200, 64, 130, 9], with_runs=False)
    runs_masks = build_tree_block_masks(spans, torch.device("cpu"), bucket=256, use_runs=True)
    bits_masks = build_tree_block_masks(bit_spans, torch.device("cpu"), bucket=256, use_runs=True)  # no runs to use
    assert runs_masks.run_start is not None and bits_masks.run_start is None
    rows, cols = torch.meshgrid(torch.arange(runs_masks.num_padded), torch.arange(runs_masks.num_padded), indexing="ij")
    zero = torch.zeros((), dtype=torch.long)
    keep_runs = runs_masks._mask_mod(window)(zero, zero, rows, cols)
    keep_bits = bits_masks._mask_mod(window)(zero, zero, rows, cols)
    assert torch.equal(keep_runs, keep_bits)
    assert keep_runs.sum() > runs_masks.num_tokens  # more than the diagonal: a real tree
    q, k, v = qkv(runs_masks.num_tokens)
    assert torch.equal(flex_tree_attention(q, k, v, runs_masks, 0.2, window),
                       flex_tree_attention(q, k, v, bits_masks, 0.2, window))


def test_block_classification_is_exact_for_full_blocks():
    spans = random_spans(1, [300])
    masks = build_tree_block_masks(spans, torch.device("cpu"), bucket=64)
    dense = spans[0].mask.reshape(5, 64, 5, 64)
    assert torch.equal(masks.full_blocks, dense.all(dim=3).all(dim=1))
    assert torch.equal(masks.any_blocks, dense.any(dim=3).any(dim=1))
    chain = TreeSpan(0, torch.from_numpy(tree_mask(list(range(-1, 299)), 320)), torch.arange(320))
    causal = build_tree_block_masks([chain], torch.device("cpu"), bucket=64)
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


@pytest.mark.gpu
@pytest.mark.parametrize("use_runs", [False, True])
@pytest.mark.parametrize("window", [None, 40])
def test_gpu_flex_alone_vs_packed_bit_identical(window, use_runs):
    sizes = [500, 90, 1300, 64, 700]
    spans = random_spans(3, sizes)
    num_tokens = spans[-1].start + spans[-1].num_tokens
    q, k, v = qkv(num_tokens, "cuda", torch.bfloat16)
    packed = flex_tree_attention(q, k, v, build_tree_block_masks(spans, torch.device("cuda"), use_runs=use_runs), 0.2, window)
    expected = tree_attention(q.float().cpu(), k.float().cpu(), v.float().cpu(), AttentionMetadata(spans), 0.2, window)
    assert (packed.float().cpu() - expected).abs().max() < 2e-2
    for span in spans:  # each content alone, at row 0 of its own stream
        rows = slice(span.start, span.start + span.num_tokens)
        alone_span = TreeSpan(0, span.mask, span.positions, span.parents)
        masks = build_tree_block_masks([alone_span], torch.device("cuda"), use_runs=use_runs)
        alone = flex_tree_attention(q[rows], k[rows], v[rows], masks, 0.2, window)
        assert torch.equal(alone, packed[rows]), f"span at {span.start} differs alone vs packed"


@pytest.mark.gpu
@pytest.mark.parametrize("window", [None, 40])
def test_gpu_runs_mask_gives_the_bits_masks_outputs(window):
    """Compiled on the GPU, the runs mask_mod and the bit lookup give the same bits."""
    sizes = [500, 90, 1300, 64, 700]
    spans, bit_spans = random_spans(4, sizes), random_spans(4, sizes, with_runs=False)
    num_tokens = spans[-1].start + spans[-1].num_tokens
    q, k, v = qkv(num_tokens, "cuda", torch.bfloat16)
    runs_masks = build_tree_block_masks(spans, torch.device("cuda"), use_runs=True)
    assert runs_masks.run_start is not None
    with_runs = flex_tree_attention(q, k, v, runs_masks, 0.2, window)
    with_bits = flex_tree_attention(q, k, v, build_tree_block_masks(bit_spans, torch.device("cuda")), 0.2, window)
    assert torch.equal(with_runs, with_bits)

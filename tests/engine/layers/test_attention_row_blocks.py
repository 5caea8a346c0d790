"""CPU tree attention in blocks of query rows (engine.layers.attention.sdpa_in_row_blocks): each
block reads only the keys its rows may see, agrees with one dense SDPA call over the whole span,
gives the same bits however often it runs and whatever the span is packed with, and holds at
most CPU_SCORES_PER_BLOCK scores at once."""

import pytest
import torch

import engine.layers.attention as attention
from engine.pipeline.packer import pack_trees
from engine.pipeline.stages import Branch
from engine.pipeline.tree import build_tree


def _random_qkv(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 4, 16, generator=generator), torch.randn(n, 2, 16, generator=generator),
            torch.randn(n, 2, 16, generator=generator))


def _causal(num_rows, window):
    mask = torch.ones(num_rows, num_rows, dtype=torch.bool).tril()
    if window is not None:
        rows = torch.arange(num_rows)
        mask &= (rows[:, None] - rows[None, :]) < window
    return mask


def _question_tree(num_questions, content=40, question=6):
    """One content of `content` tokens and `num_questions` branches of `question` + 1 tokens each."""
    trunk = list(range(1, content + 1))
    branches = [Branch(0, i, {}, "", [trunk + [100 + i] * question + [7], trunk + [100 + i] * question + [8]],
                       content + question, None) for i in range(num_questions)]
    return build_tree(branches)


def _spans(tree):
    [dense] = pack_trees([(0, tree)], 1 << 16, dense_masks=True)
    [lean] = pack_trees([(0, tree)], 1 << 16, dense_masks=False)
    return dense.attention.spans[0], lean.attention.spans[0]


@pytest.mark.parametrize("num_rows, window", [(300, None), (257, 40), (5, None)])
def test_row_blocks_agree_with_one_call_and_bound_the_call_size(monkeypatch, num_rows, window):
    q, k, v = _random_qkv(num_rows, num_rows)
    mask = _causal(num_rows, window)
    whole = attention.sdpa(q, k, v, mask, 0.25)
    monkeypatch.setattr(attention, "CPU_SCORES_PER_BLOCK", 4 * num_rows * 7)  # blocks of 7 rows
    blocked = attention.sdpa_in_row_blocks(q, k, v, mask, 0.25)
    torch.testing.assert_close(blocked, whole, rtol=0, atol=1e-5)
    assert torch.equal(attention.sdpa_in_row_blocks(q, k, v, mask, 0.25), blocked)
    calls = []
    monkeypatch.setattr(attention, "sdpa", lambda q, k, *rest: calls.append((q.shape[0], k.shape[0])) or q.clone())
    attention.sdpa_in_row_blocks(q, k, v, mask, 0.25)
    assert max(rows for rows, _ in calls) == min(7, num_rows) and sum(rows for rows, _ in calls) == num_rows
    if window is not None and num_rows > 7:  # a block of 7 rows sees at most window + 6 keys
        assert max(keys for _, keys in calls) == window + 6


def test_a_whole_span_in_one_block_gives_the_bits_of_one_dense_call():
    q, k, v = _random_qkv(64, 3)
    mask = _causal(64, None)
    assert torch.equal(attention.sdpa_in_row_blocks(q, k, v, mask, 0.25), attention.sdpa(q, k, v, mask, 0.25))


def test_a_deep_block_of_a_tree_reads_only_its_ancestors_keys(monkeypatch):
    """400 questions over one content: a block of rows inside the questions sees the content and
    the block's own rows, not the other questions' tokens."""
    dense_span, lean_span = _spans(_question_tree(400))
    n = lean_span.positions.shape[0]
    q, k, v = _random_qkv(n, 5)
    monkeypatch.setattr(attention, "CPU_SCORES_PER_BLOCK", 4 * n * 32)  # blocks of 32 rows
    keys_read = []
    real_sdpa = attention.sdpa
    monkeypatch.setattr(attention, "sdpa", lambda q, k, *rest: keys_read.append(k.shape[0]) or real_sdpa(q, k, *rest))
    blocked = attention.sdpa_in_row_blocks(q, k, v, attention.partial(attention.span_block, lean_span, None), 0.25)
    assert len(keys_read) == -(-n // 32)
    assert max(keys_read[2:]) <= 40 + 32  # the content's 40 tokens and the block's 32 rows
    whole = real_sdpa(q, k, v, attention.span_mask(dense_span, None), 0.25)
    torch.testing.assert_close(blocked, whole, rtol=0, atol=1e-5)


@pytest.mark.parametrize("window", [None, 6])
def test_blocks_from_subtree_ends_give_the_dense_masks_columns_and_bits(monkeypatch, window):
    """The engine packs tree spans without a dense mask (dense_masks=False): CPU attention finds
    each block's columns and mask rows from the subtree ends. The same as from packer.tree_mask."""
    dense_span, lean_span = _spans(_question_tree(5, content=3, question=1))
    assert lean_span.mask is None
    assert torch.equal(attention.span_mask(lean_span, window), attention.span_mask(dense_span, window))
    assert torch.equal(attention.span_mask(lean_span, window, 3, 9), attention.span_mask(dense_span, window)[3:9])
    n = dense_span.positions.shape[0]
    for start in range(0, n, 5):
        stop = min(start + 5, n)
        lean_columns, lean_mask = attention.span_block(lean_span, window, start, stop)
        dense_columns, dense_mask = attention.span_block(dense_span, window, start, stop)
        assert torch.equal(lean_columns, dense_columns) and torch.equal(lean_mask, dense_mask)
        assert lean_mask.any(dim=0).all()  # every column read is seen by some row of the block
    q, k, v = _random_qkv(n, 1)
    monkeypatch.setattr(attention, "CPU_SCORES_PER_BLOCK", 4 * n * 5)  # blocks of 5 rows
    lean = attention.sdpa_in_row_blocks(q, k, v, attention.partial(attention.span_block, lean_span, window), 0.25)
    dense = attention.sdpa_in_row_blocks(q, k, v, attention.partial(attention.span_block, dense_span, window), 0.25)
    assert torch.equal(lean, dense)
    torch.testing.assert_close(lean, attention.sdpa(q, k, v, attention.span_mask(dense_span, window), 0.25),
                               rtol=0, atol=1e-5)

"""CPU tree attention in blocks of query rows (engine.layers.attention.sdpa_in_row_blocks) gives
the bits of one SDPA call over the whole span, for GQA and for a sliding-window mask."""

import pytest
import torch

import engine.layers.attention as attention


@pytest.mark.parametrize("num_rows, window", [(300, None), (257, 40), (5, None)])
def test_row_blocks_give_the_bits_of_one_call(monkeypatch, num_rows, window):
    generator = torch.Generator().manual_seed(num_rows)
    q = torch.randn(num_rows, 4, 16, generator=generator)
    k, v = (torch.randn(num_rows, 2, 16, generator=generator) for _ in range(2))
    mask = torch.ones(num_rows, num_rows, dtype=torch.bool).tril()
    if window is not None:
        rows = torch.arange(num_rows)
        mask &= (rows[:, None] - rows[None, :]) < window
    whole = attention.sdpa(q, k, v, mask, 0.25)
    monkeypatch.setattr(attention, "CPU_SCORES_PER_BLOCK", 4 * num_rows * 7)  # blocks of 7 rows
    blocked = attention.sdpa_in_row_blocks(q, k, v, mask, 0.25)
    assert torch.equal(blocked, whole)
    calls = []
    monkeypatch.setattr(attention, "sdpa", lambda q, *rest: calls.append(q.shape[0]) or whole[: q.shape[0]])
    attention.sdpa_in_row_blocks(q, k, v, mask, 0.25)
    assert max(calls) == min(7, num_rows) and sum(calls) == num_rows  # the scores held at once are bounded


@pytest.mark.parametrize("window", [None, 6])
def test_mask_rows_made_from_subtree_ends_give_the_dense_masks_bits(monkeypatch, window):
    """The engine packs tree spans without a dense mask (dense_masks=False): CPU attention makes
    each block's mask rows from the subtree ends. Same rows as packer.tree_mask, so the same bits."""
    from engine.pipeline.packer import pack_trees
    from engine.pipeline.stages import Branch
    from engine.pipeline.tree import build_tree

    branches = [Branch(0, i, {}, "", [[1, 2, 3, 4 + i, 9], [1, 2, 3, 4 + i, 10, 11]], 4, None) for i in range(5)]
    tree = build_tree(branches)
    [dense] = pack_trees([(0, tree)], 4096, dense_masks=True)
    [lean] = pack_trees([(0, tree)], 4096, dense_masks=False)
    dense_span, lean_span = dense.attention.spans[0], lean.attention.spans[0]
    assert lean_span.mask is None
    assert torch.equal(attention.span_mask(lean_span, window), attention.span_mask(dense_span, window))
    assert torch.equal(attention.span_mask(lean_span, window, 3, 9), attention.span_mask(dense_span, window)[3:9])
    n = dense_span.positions.shape[0]
    generator = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(n, 4, 8, generator=generator), torch.randn(n, 2, 8, generator=generator), torch.randn(n, 2, 8, generator=generator)
    whole = attention.sdpa(q, k, v, attention.span_mask(dense_span, window), 0.25)
    monkeypatch.setattr(attention, "CPU_SCORES_PER_BLOCK", 4 * n * 5)  # blocks of 5 rows
    assert torch.equal(attention.sdpa_in_row_blocks(q, k, v, lambda a, b: attention.span_mask(lean_span, window, a, b), 0.25), whole)

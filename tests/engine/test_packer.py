"""What the packer hands attention (engine/packer.py): dense masks and/or subtree ends."""

from __future__ import annotations

import numpy as np

from engine.compiler import Branch
from engine.packer import leaky_tree_mask, pack_trees, tree_mask
from engine.tree import build_tree


def five_questions() -> list[Branch]:
    trunk = list(range(1, 40))
    return [  # five questions on one trunk, two options each
        Branch(query_index=i, combination_index=0, values={}, prompt_text="", floor_key=None,
               option_ids=[trunk + [100 + i, 200 + i], trunk + [100 + i, 300 + i]], branch_point=len(trunk) + 1)
        for i in range(5)
    ]


def mask_of_ends(ends: np.ndarray) -> np.ndarray:
    rows, cols = np.arange(len(ends))[:, None], np.arange(len(ends))[None, :]
    return (cols <= rows) & (rows < ends[None, :])


def test_packed_spans_carry_subtree_ends_only_for_the_tree_mask():
    tree = build_tree(five_questions())
    [batch] = pack_trees([(0, tree)], 4096)
    [span] = batch.attention.spans
    assert span.subtree_end.dtype == np.int32 and len(span.subtree_end) == span.num_tokens == 64
    assert np.array_equal(mask_of_ends(span.subtree_end), span.mask.numpy())
    assert np.array_equal(span.mask.numpy(), tree_mask(tree.parents, 64))
    [leaky] = pack_trees([(0, tree)], 4096, mask_fn=leaky_tree_mask)
    assert leaky.attention.spans[0].subtree_end is None  # a custom mask is read bit by bit
    assert not np.array_equal(leaky.attention.spans[0].mask.numpy(), span.mask.numpy())


def test_without_dense_masks_tree_spans_keep_only_their_ends():
    tree = build_tree(five_questions())
    [dense] = pack_trees([(0, tree)], 4096)
    [lean] = pack_trees([(0, tree)], 4096, dense_masks=False)
    assert lean.attention.spans[0].mask is None
    assert np.array_equal(lean.attention.spans[0].subtree_end, dense.attention.spans[0].subtree_end)
    [leaky] = pack_trees([(0, tree)], 4096, mask_fn=leaky_tree_mask, dense_masks=False)
    assert leaky.attention.spans[0].mask is not None  # no ends to read: the mask is still made

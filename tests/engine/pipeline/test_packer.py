"""What the packer hands attention (engine/pipeline/packer.py): dense masks and/or subtree ends."""

from __future__ import annotations

import numpy as np

from engine.pipeline.packer import leaky_tree_mask, pack_trees, shared_prefix
from engine.pipeline.stages import Branch
from engine.pipeline.tree import build_tree


def five_questions() -> list[Branch]:
    """Five questions on one trunk, two options each; the third and fifth reuse the first's
    opening word after the second moved away from it (out of trie order as listed)."""
    trunk = list(range(1, 40))
    openings = [[100, 101], [102], [100, 103], [104], [100, 101, 105]]
    return [
        Branch(query_index=i, combination_index=0, values={}, prompt_text="", floor_key=None,
               option_ids=[trunk + words + [200], trunk + words + [300]], branch_point=len(trunk) + len(words))
        for i, words in enumerate(openings)
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
    assert mask_of_ends(span.subtree_end)[: tree.num_tokens, : tree.num_tokens].sum() > 2 * tree.num_tokens  # a tree
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


def test_shared_prefix_is_the_leading_run_every_path_has():
    assert shared_prefix([[0, 1, 2, 3], [0, 1, 2, 5, 6], [0, 1, 2]]) == 3
    assert shared_prefix([[0, 1, 4], [0, 2, 4]]) == 1  # the same node later does not count
    assert shared_prefix([[0, 1]]) == 2 and shared_prefix([]) == 0 and shared_prefix([[1], [2]]) == 0

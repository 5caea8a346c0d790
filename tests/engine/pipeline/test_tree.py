"""build_tree (engine/pipeline/tree.py) against a trie built the slow way, on adversarial branch orders.

The checks that matter for the CUDA mask: the nodes are the trie of the sequences (one node
per distinct prefix), listed in preorder, and `subtree_end[i]` bounds exactly i's subtree.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.layers.ops import ROW_CHUNK
from engine.pipeline.packer import padded, tree_mask
from engine.pipeline.stages import Branch
from engine.pipeline.tree import build_tree


def random_branches(rng: np.random.Generator) -> list[Branch]:
    """Questions that reuse earlier questions' words out of order (A B C, A D, A B E), repeated
    and prefix-of-another sequences, a forest now and then, and a slot (prompt only)."""
    trunk = [int(t) for t in rng.integers(1, 50, int(rng.integers(0, 12)))]
    words = [[int(t) for t in rng.integers(50, 60, int(rng.integers(1, 4)))] for _ in range(6)]
    branches = []
    for index in range(int(rng.integers(1, 9))):
        head = [] if rng.random() < 0.1 else trunk  # no shared trunk: a forest
        prompt = head + [t for w in rng.choice(len(words), int(rng.integers(0, 4))) for t in words[w]] or [5]
        if rng.random() < 0.15:
            branches.append(Branch(index, 0, {}, "", [prompt + [7]], len(prompt) + 1, None, slot=object()))
            continue
        options = [[int(t) for t in rng.integers(60, 64, int(rng.integers(0, 3)))] for _ in range(int(rng.integers(1, 4)))]
        option_ids = [prompt + option for option in options]
        point = min(len(prompt), *(len(ids) for ids in option_ids))
        branches.append(Branch(index, 0, {}, "", option_ids, point, None))
    return branches


def slow_trie(sequences: list[list[int]]) -> dict[tuple[int, ...], None]:
    return {tuple(ids[:length]): None for ids in sequences for length in range(1, len(ids) + 1)}


def node_prefixes(tree) -> list[tuple[int, ...]]:
    prefixes: list[tuple[int, ...]] = []
    for node, (token, parent) in enumerate(zip(tree.token_ids, tree.parents)):
        prefixes.append((prefixes[parent] if parent >= 0 else ()) + (token,))
    return prefixes


@pytest.mark.parametrize("seed", range(6))
def test_build_tree_is_the_trie_in_preorder(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        branches = random_branches(rng)
        tree = build_tree(branches)
        sequences = [ids for b in branches for ids in b.option_ids]
        prefixes = node_prefixes(tree)
        assert sorted(prefixes) == sorted(slow_trie(sequences)), "one node per distinct prefix"
        assert all(p < n for n, p in enumerate(tree.parents))
        assert tree.depths == [len(p) - 1 for p in prefixes]
        node_of = {prefix: node for node, prefix in enumerate(prefixes)}
        for node, end in enumerate(tree.subtree_end):
            descendants = {n for n, p in enumerate(prefixes) if p[: len(prefixes[node])] == prefixes[node]}
            assert descendants == set(range(node, end)), f"node {node}'s subtree is not [{node}, {end})"
        expected = sorted(
            (b, o, node_of[tuple(ids[:t])], ids[t])
            for b, branch in enumerate(branches) if branch.slot is None
            for o, ids in enumerate(branch.option_ids) for t in range(branch.branch_point, len(ids))
        )
        got = sorted(zip(tree.scored_branch, tree.scored_option, tree.scored_nodes, tree.scored_targets))
        assert got == expected
        slots = [(b, node_of[tuple(branch.option_ids[0])]) for b, branch in enumerate(branches) if branch.slot is not None]
        assert sorted(zip(tree.slot_branch, tree.slot_nodes)) == sorted(slots)
        shared = min(next((i for i, pair in enumerate(zip(*sequences)) if len(set(pair)) > 1), min(map(len, sequences))),
                     *(b.branch_point for b in branches))
        assert tree.num_trunk_tokens == shared
        questions = {node_of[tuple(ids[:t])] for b in branches for ids in b.option_ids for t in range(1, b.branch_point + 1)}
        assert tree.num_question_tokens == len(questions) - shared


def test_subtree_ends_give_the_tree_mask():
    """The interval test the CUDA mask runs (i <= j < subtree_end[i]) is tree_mask, pads included."""
    rng = np.random.default_rng(7)
    for _ in range(100):
        tree = build_tree(random_branches(rng))
        num_padded = padded(tree.num_tokens, ROW_CHUNK)
        end = np.arange(1, num_padded + 1)  # a pad sees itself only
        end[: tree.num_tokens] = tree.subtree_end
        rows, cols = np.arange(num_padded)[:, None], np.arange(num_padded)[None, :]
        assert np.array_equal((cols <= rows) & (rows < end[None, :]), tree_mask(tree.parents, num_padded))


def test_questions_that_share_words_out_of_order_share_nodes():
    """A B C, then A D, then A B E: the third reuses A B of the first (the order the old
    builder broke preorder with)."""
    trunk = [1, 2, 3]
    prompts = [trunk + [10, 11, 12], trunk + [10, 13], trunk + [10, 11, 14]]
    branches = [Branch(i, 0, {}, "", [p + [20], p + [21]], len(p), None) for i, p in enumerate(prompts)]
    tree = build_tree(branches)
    assert tree.num_tokens == 3 + 1 + 1 + 1 + 1 + 1 + 6  # trunk, 10, 11, 12, 13, 14, two options each
    assert tree.subtree_end[3] == tree.num_tokens  # node "10" holds every question


def test_the_first_query_is_laid_out_as_it_is_alone():
    """Siblings go in order of first appearance, not of token ids: a query listed first keeps
    its rows when queries with smaller token ids come after it (a pack's after a caller's)."""
    trunk = [5, 6, 7]
    first = Branch(0, 0, {}, "", [trunk + [40, 41, 90], trunk + [40, 41, 91]], len(trunk) + 2, None)
    later = [Branch(i, 0, {}, "", [trunk + [40 - i, 90], trunk + [40 - i, 91]], len(trunk) + 1, None) for i in (1, 2)]
    alone, merged = build_tree([first]), build_tree([first, *later])
    assert merged.token_ids[: alone.num_tokens] == alone.token_ids and merged.parents[: alone.num_tokens] == alone.parents
    assert merged.scored_nodes[: len(alone.scored_nodes)] == alone.scored_nodes
    assert merged.subtree_end[3] == alone.num_tokens  # "40" closes before the later questions begin

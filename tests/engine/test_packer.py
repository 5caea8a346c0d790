"""The packer's tree mask as runs of visible columns (engine/packer.py:tree_runs)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.compiler import Branch
from engine.packer import MAX_NUM_RUNS, leaky_tree_mask, pack_trees, padded, tree_mask, tree_runs
from engine.ops import ROW_CHUNK
from engine.tree import build_tree


def mask_of_runs(runs: np.ndarray) -> np.ndarray:
    """[n, 2, K] runs -> [n, n] bool: column c visible to row i if some run holds it."""
    cols = np.arange(runs.shape[0])[None, :, None]
    return ((cols >= runs[:, None, 0, :]) & (cols < runs[:, None, 1, :])).any(-1)


def random_forest(rng: np.random.Generator, num_nodes: int) -> list[int]:
    """Parents before children: mostly chains, forks anywhere earlier, now and then a new root."""
    parents = [-1]
    for node in range(1, num_nodes):
        draw = rng.random()
        parents.append(node - 1 if draw < 0.6 else -1 if draw < 0.7 else int(rng.integers(0, node)))
    return parents


@pytest.mark.parametrize("seed", range(5))
def test_tree_runs_are_the_tree_mask(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        num_nodes = int(rng.integers(1, 300))
        parents = random_forest(rng, num_nodes)
        num_padded = padded(num_nodes, ROW_CHUNK)
        runs = tree_runs(parents, num_padded, max_num_runs=num_nodes + 1)
        assert runs.shape == (num_padded, 2, num_nodes + 1) and runs.dtype == np.int32
        assert np.array_equal(mask_of_runs(runs), tree_mask(parents, num_padded))


def test_tree_runs_give_up_past_the_limit():
    """Node 2m's ancestors 0, 2, 4, ... are never adjacent (a leaf sits between each): m + 1 runs."""
    parents = [-1] + [node - 1 if node % 2 else node - 2 for node in range(1, 2 * MAX_NUM_RUNS + 1)]
    num_padded = padded(len(parents), ROW_CHUNK)
    assert tree_runs(parents, num_padded) is None
    runs = tree_runs(parents, num_padded, max_num_runs=MAX_NUM_RUNS + 1)
    assert np.array_equal(mask_of_runs(runs), tree_mask(parents, num_padded))
    assert tree_runs(parents[: 2 * MAX_NUM_RUNS - 1], num_padded) is not None  # exactly the limit fits


def test_packed_spans_carry_their_tree_only_for_the_tree_mask():
    trunk = list(range(1, 40))
    branches = [  # five questions on one trunk, two options each
        Branch(query_index=i, combination_index=0, values={}, prompt_text="", floor_key=None,
               option_ids=[trunk + [100 + i, 200 + i], trunk + [100 + i, 300 + i]], branch_point=len(trunk) + 1)
        for i in range(5)
    ]
    tree = build_tree(branches)
    [batch] = pack_trees([(0, tree)], 4096)
    [span] = batch.attention.spans
    assert np.array_equal(mask_of_runs(tree_runs(span.parents, span.num_tokens)), span.mask.numpy())
    [leaky] = pack_trees([(0, tree)], 4096, mask_fn=leaky_tree_mask)
    assert leaky.attention.spans[0].parents is None  # a custom mask is read bit by bit

"""Pack many token trees into flat streams under a token budget (pure CPU).

    [(TreeOwner, TokenTree)] --pack_trees--> [PackedBatch(input_ids, positions, attention, scored_*)]
                                             (engine/pipeline/stages.py)

Each tree starts at a multiple of ROW_CHUNK and is padded to one, so its rows meet the
same fixed-shape matmuls wherever it sits (batch invariance). Positions are node depths.
Each tree's scored rows are padded to a multiple of SCORE_CHUNK for the same reason at the
LM head. Trees are placed whole, in order; a tree larger than the budget is first split by
`split_tree` into trees that share the trunk (each re-reads it).
Extraction slots add, per tree, one more scored row each (the slot's last prompt node, whose
whole distribution is read) and ask the pass to keep their prompt paths' K/V (KVCapture).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np
import torch

from engine.extraction.kv_cache import KVCapture
from engine.layers.attention import AttentionMetadata, TreeSpan
from engine.layers.ops import ROW_CHUNK, SCORE_CHUNK
from engine.pipeline.stages import Branch, PackedBatch, PackedTree, TokenTree, TreeOwner
from engine.pipeline.tree import build_tree

PAD_TOKEN_ID = 0


def padded(num: int, multiple: int) -> int:
    return -(-num // multiple) * multiple


def split_tree(whole: TokenTree, max_num_tokens: int) -> list[TokenTree]:
    """The tree, or, when it is over the budget, trees of groups of its branches that each
    fit (a group holds at least one branch; each re-reads the trunk)."""
    if padded(whole.num_tokens, ROW_CHUNK) <= max_num_tokens:
        return [whole]
    groups: list[list[Branch]] = [[]]
    group_size = whole.num_trunk_tokens
    for branch in whole.branches:
        extra = build_tree([branch]).num_tokens - whole.num_trunk_tokens
        if groups[-1] and padded(group_size + extra, ROW_CHUNK) > max_num_tokens:
            groups.append([])
            group_size = whole.num_trunk_tokens
        groups[-1].append(branch)
        group_size += extra
    return [build_tree(group) for group in groups]


def pack_trees(
    items: Iterable[tuple[TreeOwner, TokenTree]], max_num_tokens: int, mask_fn=None, first_max_num_tokens: int | None = None,
    dense_masks: bool = True,
) -> Iterator[PackedBatch]:
    """Greedy in order: a tree that does not fit the current pass opens the next one.
    Lazy: a batch is prepared when it is full, so packing overlaps the pass before it.
    `first_max_num_tokens` caps the first pass only: a small first pass starts the device
    while the next, full pass is still being packed (nothing else overlaps the first packing).
    `dense_masks=False` (CUDA): tree spans carry only their subtree ends, no [n, n] mask."""
    group: list[tuple[TreeOwner, TokenTree]] = []
    used = 0
    limit = min(max_num_tokens, first_max_num_tokens or max_num_tokens)
    for owner, tree in items:
        size = padded(tree.num_tokens, ROW_CHUNK)
        if group and used + size > limit:
            yield prepare_batch(group, mask_fn or tree_mask, dense_masks)
            group, used, limit = [], 0, max_num_tokens
        group.append((owner, tree))
        used += size
    if group:
        yield prepare_batch(group, mask_fn or tree_mask, dense_masks)


def prepare_batch(items: list[tuple[TreeOwner, TokenTree]], mask_fn=None, dense_masks: bool = True) -> PackedBatch:
    mask_fn = mask_fn or tree_mask
    input_ids: list[int] = []
    positions: list[int] = []
    scored_index: list[int] = []
    scored_targets: list[int] = []
    spans: list[TreeSpan] = []
    trees: list[PackedTree] = []
    slot_index: list[int] = []
    capture_rows: list[int] = []
    capture_lengths: list[int] = []
    capture_trunks: list[tuple[int, int]] = []  # per slot: (its tree, rows all the tree's slot paths share)
    for owner, tree in items:
        start, score_start, slot_start = len(input_ids), len(scored_index), len(slot_index)
        num_padded = padded(tree.num_tokens, ROW_CHUNK)
        num_pad = num_padded - tree.num_tokens
        input_ids += tree.token_ids + [PAD_TOKEN_ID] * num_pad
        positions += tree.depths + [0] * num_pad
        num_scored = len(tree.scored_nodes) + len(tree.slot_nodes)
        num_score_pad = padded(num_scored, SCORE_CHUNK) - num_scored
        slot_index += range(score_start + len(tree.scored_nodes), score_start + num_scored)
        scored_index += [start + node for node in tree.scored_nodes + tree.slot_nodes] + [start] * num_score_pad
        scored_targets += tree.scored_targets + [0] * (len(tree.slot_nodes) + num_score_pad)
        paths = [tree.path_to(node) for node in tree.slot_nodes]
        shared = shared_prefix(paths)
        for path in paths:
            capture_rows += [start + row for row in path]
            capture_lengths.append(len(path))
            capture_trunks.append((len(trees), shared))
        is_tree_mask = mask_fn is tree_mask  # then the subtree ends say the same (engine/pipeline/tree.py)
        spans.append(
            TreeSpan(
                start=start,
                mask=torch.from_numpy(mask_fn(tree.parents, num_padded)) if dense_masks or not is_tree_mask else None,
                positions=torch.tensor(positions[start:], dtype=torch.long),
                subtree_end=subtree_ends(tree, num_padded) if is_tree_mask else None,
            )
        )
        trees.append(PackedTree(owner, tree, start, score_start, slot_start))
    capture = KVCapture(torch.tensor(capture_rows, dtype=torch.long), capture_lengths,
                        capture_trunks) if slot_index else None
    return PackedBatch(
        trees=trees,
        input_ids=torch.tensor(input_ids, dtype=torch.long),
        positions=torch.tensor(positions, dtype=torch.long),
        attention=AttentionMetadata(spans=spans, capture=capture),
        scored_index=torch.tensor(scored_index, dtype=torch.long),
        scored_targets=torch.tensor(scored_targets, dtype=torch.long),
        num_real_tokens=sum(t.tree.num_tokens for t in trees),
        slot_index=torch.tensor(slot_index, dtype=torch.long) if slot_index else None,
    )


def shared_prefix(paths: list[list[int]]) -> int:
    """How many leading nodes every path has in common (0 for no paths)."""
    return sum(1 for _ in itertools.takewhile(lambda nodes: len(set(nodes)) == 1, zip(*paths))) if paths else 0


def tree_mask(parents: list[int], num_padded: int) -> np.ndarray:
    """[n, n] bool: row i sees its ancestors and itself; padding rows see only themselves.

    Nodes come parents first, in chains: a run of nodes each the child of the one before.
    A chain starting below node p sees what p sees, plus a lower triangle over itself.
    """
    mask = np.zeros((num_padded, num_padded), dtype=bool)
    num_nodes = len(parents)
    for start, end in _chains(parents):
        parent = parents[start]
        if parent >= 0:
            mask[start:end, : parent + 1] = mask[parent, : parent + 1]
        mask[start:end, start:end] = _lower_triangle(end - start)
    padding = np.arange(num_nodes, num_padded)
    mask[padding, padding] = True
    return mask


def subtree_ends(tree: TokenTree, num_padded: int) -> np.ndarray:
    """[num_padded] int32: one past the last row of each row's subtree (tree.subtree_end; a
    padding row is its own subtree). Row i sees column j exactly when j <= i < ends[j]."""
    ends = np.arange(1, num_padded + 1, dtype=np.int32)
    ends[: tree.num_tokens] = tree.subtree_end
    return ends


def _chains(parents: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each chain: a run of nodes each the child of the one before."""
    starts = [i for i in range(len(parents)) if i == 0 or parents[i] != i - 1] + [len(parents)]
    return list(zip(starts, starts[1:]))


def _lower_triangle(size: int) -> np.ndarray:
    return np.tri(size, dtype=bool)


def leaky_tree_mask(parents: list[int], num_padded: int) -> np.ndarray:
    """NEGATIVE CONTROL ONLY: also lets each token see the token listed just before it,
    which for the first token of a branch is the last token of a sibling branch."""
    mask = tree_mask(parents, num_padded)
    rows = np.arange(1, len(parents))
    mask[rows, rows - 1] = True
    return mask

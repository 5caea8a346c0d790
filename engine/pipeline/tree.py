"""Merge a content's branches into one token tree (a trie of whole-string sequences).

    list[Branch] --build_tree--> TokenTree(token_ids, parents, depths, subtree_end, scored_*)
                                 (engine/pipeline/stages.py)

The rendered content is the trunk every sequence shares; each (query, combination) is a
branch, each option a leaf; sequences that share a prefix share its nodes. Nodes are
listed in depth-first preorder (siblings in order of first appearance), so parents come first
and every subtree is one interval of nodes: the tree can be read in one pass with a tree
attention mask, and on CUDA that mask compares a row with the key and the key's subtree end.
A node's depth is its position in the whole sequence it belongs to, which is what RoPE
sees, so every branch reads exactly the positions it would read alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.pipeline.stages import Branch, TokenTree


@dataclass(slots=True)
class _Builder:
    token_ids: list[int]
    parents: list[int]
    depths: list[int]
    subtree_end: list[int]

    def extend(self, path: list[int], ids: list[int], start: int) -> None:
        """Append nodes for ids[start:] below path[start-1] (path covers ids[:start]). The
        sequences come in trie order, so the nodes left on the path past `start` are never
        visited again (their subtrees end here) and every node of ids[start:] is new: a chain,
        appended in bulk."""
        first = len(self.token_ids)
        for node in path[start:]:
            self.subtree_end[node] = first
        del path[start:]
        num_new = len(ids) - start
        if num_new <= 0:
            return
        self.token_ids += ids[start:]
        self.parents.append(path[-1] if path else -1)
        self.parents += range(first, first + num_new - 1)
        self.depths += range(start, len(ids))
        self.subtree_end += [0] * num_new  # set when the path leaves them
        path += range(first, first + num_new)


def build_tree(branches: list[Branch]) -> TokenTree:
    """Sequences are inserted in the depth-first order of their trie (_trie_order), so each one
    shares with the one before it every node it can share, and nodes come out in preorder."""
    sequences = [(ids, b, o) for b, branch in enumerate(branches) for o, ids in enumerate(branch.option_ids)]
    num_trunk = _trunk_length(branches)
    sequences = [sequences[i] for i in _trie_order([s[0] for s in sequences], num_trunk,
                                                   [branches[s[1]].branch_point for s in sequences])]
    builder = _Builder([], [], [], [])
    scored_nodes: list[int] = []
    scored_targets: list[int] = []
    scored_branch: list[int] = []
    scored_option: list[int] = []
    slot_nodes: list[int] = []
    slot_branch: list[int] = []
    path: list[int] = []
    previous: list[int] = []
    previous_branch_point = 0
    is_question: set[int] = set()  # nodes before some branch point
    for ids, branch_index, option_index in sequences:
        branch = branches[branch_index]
        shared = _common_prefix(previous, ids, num_trunk, branch.branch_point) if previous else 0
        builder.extend(path, ids, shared)
        # path[:min(shared, previous_branch_point)] was marked with the previous sequence
        is_question.update(path[min(shared, previous_branch_point) : branch.branch_point])
        previous, previous_branch_point = ids, branch.branch_point
        for position in range(branch.branch_point, len(ids)):
            scored_nodes.append(path[position - 1])
            scored_targets.append(ids[position])
            scored_branch.append(branch_index)
            scored_option.append(option_index)
        if branch.slot is not None:  # its one sequence is the prompt: decoding starts after its last node
            slot_nodes.append(path[-1])
            slot_branch.append(branch_index)
    builder.extend(path, [], 0)  # closes the last path
    return TokenTree(
        branches=branches,
        token_ids=builder.token_ids,
        parents=builder.parents,
        depths=builder.depths,
        subtree_end=builder.subtree_end,
        scored_nodes=scored_nodes,
        scored_targets=scored_targets,
        scored_branch=scored_branch,
        scored_option=scored_option,
        slot_nodes=slot_nodes,
        slot_branch=slot_branch,
        num_trunk_tokens=num_trunk,
        num_question_tokens=len(is_question) - num_trunk,
    )


def _trie_order(sequences: list[list[int]], num_shared: int, hints: list[int]) -> list[int]:
    """Indices of `sequences` in the depth-first order of their trie, siblings in order of first
    appearance: sequences that share a prefix are contiguous (so nodes come out in preorder),
    and where they go depends on the sequences listed before them, not on token ids (a tree's
    first query is laid out as it is alone). All share their first `num_shared` tokens; hints:
    a guess of each one's shared length (its branch point).
    Sorting by tokens groups the sequences; the groups, split where neighbours share least,
    are then ordered by their first sequence, level by level."""
    order = sorted(range(len(sequences)), key=lambda i: sequences[i][num_shared:])  # stable
    shared = [_common_prefix(sequences[a], sequences[b], num_shared, min(hints[a], hints[b]))
              for a, b in zip(order, order[1:])]
    emitted: list[int] = []
    pending = [(0, len(order) - 1)]  # ranges of `order` sharing a prefix, last one on top
    while pending:
        low, high = pending.pop()
        if low == high:
            emitted.append(order[low])
            continue
        depth = min(shared[low:high])
        groups, start = [], low
        for k in range(low, high):
            if shared[k] == depth:  # the two sides part at `depth`
                groups.append((start, k))
                start = k + 1
        groups.append((start, high))
        groups.sort(key=lambda group: min(order[group[0] : group[1] + 1]))
        pending += reversed(groups)
    return emitted


def _trunk_length(branches: list[Branch]) -> int:
    """Tokens every sequence shares, capped at the shortest branch point (the trunk). A branch's
    sequences share its first branch_point tokens (compiler.make_branch makes it so), so each
    branch's first sequence is compared with the first one's, once, at C speed (bisection only
    where they differ)."""
    branches = [branch for branch in branches if branch.option_ids]
    if not branches:
        return 0
    first = branches[0].option_ids[0]
    shared = min(b.branch_point for b in branches)
    for branch in branches[1:]:
        ids = branch.option_ids[0]
        if first[:shared] != ids[:shared]:
            low, high = 0, min(shared, len(ids)) - 1
            while low < high:
                middle = (low + high + 1) // 2
                if first[:middle] == ids[:middle]:
                    low = middle
                else:
                    high = middle - 1
            shared = low
    return shared


def _common_prefix(a: list[int], b: list[int], low: int, hint: int) -> int:
    """Length of the common prefix of a and b, known to be at least `low`. `hint` is a guess
    of it (a branch point): when a and b agree up to it (one C-speed comparison), only the
    tokens after it are walked, else the tokens after `low`."""
    limit = min(len(a), len(b))
    hint = min(max(hint, low), limit)
    if a[low:hint] == b[low:hint]:
        low = hint
    while low < limit and a[low] == b[low]:
        low += 1
    return low

"""Merge a content's branches into one token tree (a trie of whole-string sequences).

    list[Branch] --build_tree--> TokenTree(token_ids, parents, depths, subtree_end, scored_*)

The rendered content is the trunk every sequence shares; each (query, combination) is a
branch, each option a leaf; sequences that share a prefix share its nodes. Nodes are
listed in depth-first preorder (sequences inserted sorted), so parents come first and every
subtree is one interval of nodes: the tree can be read in one pass with a tree attention
mask, and on CUDA that mask is one comparison with the key's subtree end.
A node's depth is its position in the whole sequence it belongs to, which is what RoPE
sees, so every branch reads exactly the positions it would read alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.compiler import Branch


@dataclass(slots=True)
class TokenTree:
    branches: list[Branch]  # what the tree answers, in order
    token_ids: list[int]  # [n] node tokens; a parent always comes before its children
    parents: list[int]  # [n] parent node, -1 for the first token
    depths: list[int]  # [n] position in the whole sequence (RoPE position)
    subtree_end: list[int]  # [n] one past the node's last descendant: nodes are in preorder, so
    # node j sees node i (i is j's ancestor or j itself) exactly when i <= j < subtree_end[i]
    scored_nodes: list[int]  # [s] nodes whose next-token distribution is read
    scored_targets: list[int]  # [s] the token read there
    scored_branch: list[int]  # [s] branch index (into `branches`)
    scored_option: list[int]  # [s] option index within that branch
    slot_nodes: list[int]  # last prompt node of each extraction slot: its full distribution is read
    slot_branch: list[int]  # branch index of each slot node
    num_trunk_tokens: int  # nodes shared by every sequence
    num_question_tokens: int  # other nodes before some branch point

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_option_tokens(self) -> int:
        return self.num_tokens - self.num_trunk_tokens - self.num_question_tokens

    def path_to(self, node: int) -> list[int]:
        """The node's ancestors and itself, root first (a slot's prompt, as tree nodes)."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


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
    """Sequences are inserted in trie order (sorted by token ids), so each one shares with the
    one before it every node it can share, and nodes come out in depth-first preorder."""
    sequences = [(ids, b, o) for b, branch in enumerate(branches) for o, ids in enumerate(branch.option_ids)]
    num_trunk = _trunk_length(branches)
    sequences.sort(key=lambda sequence: sequence[0][num_trunk:])  # stable: equal sequences keep their order
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


def _trunk_length(branches: list[Branch]) -> int:
    """Tokens every sequence shares, capped at the shortest branch point (the trunk). A branch's
    sequences share its first branch_point tokens, so each branch's first sequence is compared
    with the first branch's, once, at C speed (bisection only where they differ)."""
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

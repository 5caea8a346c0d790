"""Merge a content's branches into one token tree (a trie of whole-string sequences).

    list[Branch] --build_tree--> TokenTree(token_ids, parents, depths, scored_*)

The rendered content is the trunk every sequence shares; each (query, combination) is a
branch, each option a leaf; sequences that share a prefix share its nodes. Nodes are
listed parents first, so the tree can be read in one pass with a tree attention mask.
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
    children: list[dict[int, int]]
    roots: dict[int, int]

    def extend(self, path: list[int], ids: list[int], start: int) -> None:
        """Append nodes for ids[start:] below path[start-1] (path covers ids[:start])."""
        del path[start:]
        for depth in range(start, len(ids)):
            token = ids[depth]
            siblings = self.children[path[-1]] if path else self.roots
            node = siblings.get(token)
            if node is None:
                node = len(self.token_ids)
                siblings[token] = node
                self.token_ids.append(token)
                self.parents.append(path[-1] if path else -1)
                self.depths.append(depth)
                self.children.append({})
            path.append(node)


def build_tree(branches: list[Branch]) -> TokenTree:
    builder = _Builder([], [], [], [], {})
    scored_nodes: list[int] = []
    scored_targets: list[int] = []
    scored_branch: list[int] = []
    scored_option: list[int] = []
    slot_nodes: list[int] = []
    slot_branch: list[int] = []
    path: list[int] = []
    previous: list[int] = []
    previous_branch_point = 0
    across_hint = 0  # shared length between the last two branches: usually the trunk
    num_trunk = min(b.branch_point for b in branches)  # lowered to the shortest shared prefix
    is_question: set[int] = set()  # nodes before some branch point
    for branch_index, branch in enumerate(branches):
        for option_index, ids in enumerate(branch.option_ids):
            hint = branch.branch_point if option_index else across_hint
            shared = _common_prefix(previous, ids, hint)
            if option_index == 0 and branch_index:
                across_hint = shared
            if branch_index or option_index:
                num_trunk = min(num_trunk, shared)
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
    return TokenTree(
        branches=branches,
        token_ids=builder.token_ids,
        parents=builder.parents,
        depths=builder.depths,
        scored_nodes=scored_nodes,
        scored_targets=scored_targets,
        scored_branch=scored_branch,
        scored_option=scored_option,
        slot_nodes=slot_nodes,
        slot_branch=slot_branch,
        num_trunk_tokens=num_trunk,
        num_question_tokens=len(is_question) - num_trunk,
    )


def _common_prefix(a: list[int], b: list[int], hint: int) -> int:
    """Length of the common prefix of a and b. `hint` is a guess of it: when the first
    `hint` tokens agree (one C-speed comparison) only the few tokens after it are walked."""
    limit = min(len(a), len(b))
    low = min(hint, limit)
    if a[:low] == b[:low]:
        while low < limit and a[low] == b[low]:
            low += 1
        return low
    low, high = 0, low - 1  # the answer is below the hint: bisect
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low

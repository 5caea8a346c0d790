"""What one stage of the scoring pipeline hands the next: a small dataclass per seam.

    ScoringRequest --Engine.compile (pack_requests, prompts, tokenize, compiler, tree)-->
        CompiledRequest(branches=[Branch], tree=TokenTree, num_tokens) | RequestError
    [(TreeOwner, TokenTree)] --packer.pack_trees--> PackedBatch(trees=[PackedTree], ...)
    PackedBatch --runner.ModelRunner.run_all--> RunnerOutput (target log-probs, slot rows and K/V)
    (PackedBatch, RunnerOutput)* --responses.ResponseBuilder-->
        BatchOutput(results=[ScoringResponse | RequestError], pass_ids)

The stages import this module, never each other's classes. Extraction's own hand-overs
(SlotJob, DecodeBatch) are in engine/extraction/decoding.py; the seam between the packer and
the model's layers (AttentionMetadata, TreeSpan) is engine/layers/attention.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from contract.protocol import ScoringRequest
from contract.scoring_results import ScoringResponse
from engine.extraction.kv_cache import SlotKV
from engine.extraction.slots import SlotSpec
from engine.layers.attention import AttentionMetadata
from prompt_packs.format import Pack


@dataclass(slots=True)
class RequestError:
    field: str  # which field is wrong, e.g. "messages"
    message: str  # what to fix


class FloorKey(NamedTuple):
    """What a floor depends on (the fingerprint is the cache's own). A named tuple: hashed and
    compared in C, since every batch looks up each request's keys (news: 1,344 lookups)."""

    empty_prefix: str  # the rendered prefix with user contents emptied
    answer_in: str  # "user" or "assistant": where the template continues
    filled_template: str  # the template with this combination's values
    options: tuple[str, ...]  # the query's options, in order


@dataclass(slots=True)
class Branch:
    """One (query, combination): the sequences scored for its options."""

    query_index: int  # the query in the (pack-expanded) request
    combination_index: int  # the combination in the query's grid of values
    values: dict[str, str]  # placeholder name -> this combination's value
    prompt_text: str  # prefix + filled template (the text before the options)
    option_ids: list[list[int]]  # whole-string tokens of prompt + option, per option
    branch_point: int  # tokens shared by the prompt and every prompt + option
    floor_key: FloorKey | None  # None for a floor branch itself, and for a slot
    slot: SlotSpec | None = None  # an extraction slot: option_ids holds only the prompt

    @property
    def num_prompt_tokens(self) -> int:
        return self.branch_point


@dataclass(slots=True)
class TokenTree:
    """The branches' sequences as one trie, nodes in depth-first preorder (engine/pipeline/tree.py)."""

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
class CompiledRequest:
    """A request as the passes read it (Engine.compile): admitted, tokenized, its tree built."""

    request: ScoringRequest  # the request scored: the named packs' questions appended as queries
    branches: list[Branch]  # one per (query, combination), in query order
    tree: TokenTree  # the branches' tree (the packer splits it when it is over a pass)
    max_num_tokens: int  # the longest whole sequence (for the model's context limit)
    floor_keys: list[FloorKey]  # distinct, in first-use order
    packs: list[Pack]  # the named packs, whose questions `request` holds

    @property
    def num_tokens(self) -> int:
        """Tokens its tree adds to a pass (a worker fills its pass budget with these)."""
        return self.tree.num_tokens


@dataclass(frozen=True, slots=True)
class TreeOwner:
    """Whom a packed tree answers: the packer carries it, the collectors read it."""

    request_index: int  # the request in the batch; -1 for a question's floor (shared by requests)
    floor_key: FloorKey | None = None  # a question's floor: its key
    slot_floor: int = -1  # a slot's floor tree: its index among the floors extraction reads


@dataclass(slots=True)
class PackedTree:
    owner: TreeOwner  # the bookkeeping of whoever packed the tree (the packer never reads it)
    tree: TokenTree  # the tree placed
    start: int  # first row of the tree in the stream
    score_start: int  # first of its scored rows in `scored_index`
    slot_start: int = 0  # its first slot in the batch's slots (`slot_index`, the capture)


@dataclass(slots=True)
class PackedBatch:
    trees: list[PackedTree]  # in stream order
    input_ids: torch.Tensor  # [T] long, T a multiple of ROW_CHUNK
    positions: torch.Tensor  # [T] long, node depth (pads 0)
    attention: AttentionMetadata  # one span per tree
    scored_index: torch.Tensor  # [S] long rows whose next-token logits are read
    scored_targets: torch.Tensor  # [S] long tokens read there (pads: 0)
    num_real_tokens: int  # tokens that are not padding
    slot_index: torch.Tensor | None = None  # [R] long: entries of `scored_index` read as whole distributions

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(slots=True)
class RunnerOutput:
    pass_id: int  # engine-global counter of forward passes
    target_logprobs: torch.Tensor  # [S] float32 on CPU: log P(target token | row)
    slot_logprobs: torch.Tensor | None = None  # [R, V] float32 on CPU: next-token log-probs per slot
    slot_kv: list[SlotKV] = field(default_factory=list)  # [R] each slot's prompt K/V (on the device)


@dataclass(slots=True)
class BatchOutput:
    results: list[ScoringResponse | RequestError | None]  # one per request, same order; None: told through on_result
    pass_ids: list[tuple[int, ...]]  # the forward passes that served each request

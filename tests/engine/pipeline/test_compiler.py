"""Compiler and tree: whole-string tokens, branch points, shared prefixes (CPU, no model)."""

from transformers import AutoTokenizer

from contract.protocol import ScoringRequest
from engine.pipeline.compiler import compile_request
from engine.pipeline.prompts import PromptRenderer
from engine.pipeline.tokenize import Tokenize
from engine.pipeline.tree import build_tree

MERGE_PRONE = [
    ("Call f(x)", "Sentiment:{?}", ["positive", "negative", " mixed"]),
    ("x = {a: 1};", '\n\n{{"label": "{?}', ['refund"}', 'other"}']),
    ("商品がまだ届いていません", "。答え：{?}", ["はい", "いいえ"]),
    ("I love it 🎉", "🎉{?}", ["🎉", "!"]),
    ("Total:", "{?}", [" $5", "5", "five"]),
]


def _request(content, template, options, answer_in="user"):
    return ScoringRequest.model_validate(
        {
            "messages": [{"role": "user", "content": content}],
            "scoring": {"queries": [{"id": "q", "template": template, "options": options, "answer_in": answer_in}]},
        }
    )


def _setup(folder):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    has_template = bool(tokenizer.chat_template)
    return tokenizer, PromptRenderer(tokenizer, has_template), Tokenize(tokenizer, not has_template)


def _walk(tree, ids):
    """Follow the tree from its first token along ids; returns the node path."""
    path, node = [], -1
    for depth, token in enumerate(ids):
        matches = [
            n for n in range(tree.num_tokens)
            if tree.parents[n] == node and tree.token_ids[n] == token and tree.depths[n] == depth
        ]
        assert len(matches) == 1, f"token {token} at depth {depth} not found exactly once"
        node = matches[0]
        path.append(node)
    return path


def test_scored_tokens_are_the_whole_string_tokens(tiny_checkpoint):
    tokenizer, renderer, tokenize = _setup(tiny_checkpoint("qwen2"))
    num_merged = 0
    for content, template, options in MERGE_PRONE:
        compiled = compile_request(_request(content, template, options), renderer, tokenize)
        [branch] = compiled.branches
        prompt_ids = tokenizer(branch.prompt_text, add_special_tokens=False)["input_ids"]
        for option, ids in zip(options, branch.option_ids):
            assert ids == tokenizer(branch.prompt_text + option, add_special_tokens=False)["input_ids"]
            assert ids[: branch.branch_point] == prompt_ids[: branch.branch_point]
        num_merged += branch.branch_point < len(prompt_ids)
        tree = build_tree(compiled.branches)
        for option_index, ids in enumerate(branch.option_ids):
            path = _walk(tree, ids)
            scored = [
                (node, target)
                for node, target, o in zip(tree.scored_nodes, tree.scored_targets, tree.scored_option)
                if o == option_index
            ]
            assert scored == [(path[t - 1], ids[t]) for t in range(branch.branch_point, len(ids))]
    assert num_merged >= 1, "no case merged across the prompt/option boundary: the cases test nothing"


def test_tree_shares_the_trunk_and_grid_expands(tiny_checkpoint):
    _, renderer, tokenize = _setup(tiny_checkpoint("qwen2"))
    request = ScoringRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "I was charged twice for September."}],
            "scoring": {
                "queries": [
                    {"id": "a", "template": "\n\nRefund?{?}", "options": [" yes", " no"]},
                    {"id": "b", "template": "\n\nMentions {x}?{?}", "options": [" yes", " no"],
                     "values": {"x": ["money", "a date", "an error"]}},
                ]
            },
        }
    )
    compiled = compile_request(request, renderer, tokenize)
    assert [(b.query_index, b.combination_index, b.values) for b in compiled.branches] == [
        (0, 0, {}), (1, 0, {"x": "money"}), (1, 1, {"x": "a date"}), (1, 2, {"x": "an error"}),
    ]
    tree = build_tree(compiled.branches)
    num_sequence_tokens = sum(len(ids) for b in compiled.branches for ids in b.option_ids)
    assert tree.num_tokens < num_sequence_tokens / 4  # the trunk is read once, not per sequence
    assert tree.num_trunk_tokens >= len(tokenize([renderer.render_prefix(request.messages, "user")])[0]) - 1
    assert all(tree.parents[n] < n for n in range(tree.num_tokens))
    assert all(tree.depths[n] == tree.depths[tree.parents[n]] + 1 for n in range(1, tree.num_tokens))


def test_floor_prefix_keeps_the_turn_open(tiny_checkpoint):
    _, renderer, _ = _setup(tiny_checkpoint("qwen2"))
    request = _request("hello there", "Q:{?}", [" a", " b"])
    full = renderer.render_prefix(request.messages, "user")
    empty = renderer.render_prefix(request.messages, "user", is_floor=True)
    assert full.endswith("hello there")
    assert full == empty + "hello there"  # only the content is gone, the turn is still open
    assistant = renderer.render_prefix(request.messages, "assistant", is_floor=True)
    assert assistant.startswith(empty) and len(assistant) > len(empty)


def test_common_prefix_length_matches_a_token_by_token_scan():
    import random

    from engine.pipeline.compiler import _common_prefix_length

    def naive(sequences):
        length = 0
        while all(length < len(s) for s in sequences) and len({s[length] for s in sequences}) == 1:
            length += 1
        return length

    rng = random.Random(0)
    for _ in range(500):
        head = [rng.randrange(5) for _ in range(rng.randrange(0, 40))]
        sequences = [head[: rng.randrange(len(head) + 1)] + [rng.randrange(5) for _ in range(rng.randrange(0, 6))]
                     for _ in range(rng.randrange(1, 5))]
        assert _common_prefix_length(sequences) == naive(sequences), sequences

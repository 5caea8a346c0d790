"""A 50-question decisions request is one read, shown from the engine's passes (not from `usage`):
the passes that served it hold ONE tree of it, and that tree's tokens are the input once plus
the questions' branches (every token sequence the questions ask, each distinct prefix once)."""

from __future__ import annotations

from contract.decisions import DecisionCreate
from prompt_packs.decision_format import decision_request

INPUT = "Customer support message:\nI was charged twice for September, please refund one of the charges."
KINDS = [
    lambda i: {"type": "predicate", "instructions": f"Does the message mention item {i}?"},
    lambda i: {"type": "choice", "instructions": f"Which queue, case {i}?",
               "choices": [{"value": "billing"}, {"value": "technical", "description": "bugs"}, {"value": True}]},
    lambda i: {"type": "score", "instructions": f"How urgent is case {i}?",
               "levels": [{"label": "low"}, {"label": "medium"}, {"label": "high"}]},
]


def _plan(questions: list[dict], model: str):
    return decision_request(DecisionCreate.model_validate({"model": model, "input": INPUT, "questions": questions}), {})


def _launches(engine, monkeypatch) -> list:
    """Every PackedBatch the engine launches, as it launches it (the pass log of this test)."""
    batches, launch = [], engine.runner.launch

    def logged(batch):
        batches.append(batch)
        return launch(batch)

    monkeypatch.setattr(engine.runner, "launch", logged)
    return batches


def test_fifty_questions_are_one_tree_holding_the_input_once(tiny_engine, monkeypatch):
    engine = tiny_engine("qwen2")
    questions = [KINDS[i % 3](i) for i in range(50)]
    plan = _plan(questions, engine.model_name)
    assert len(plan.request.scoring.queries) == 50
    compiled = engine.compile(plan.request)
    batches = _launches(engine, monkeypatch)
    output = engine.score_batch([compiled])
    trees = [t.tree for batch in batches for t in batch.trees if t.owner.request_index == 0]
    assert len(trees) == 1 and len(output.pass_ids[0]) == 1  # one tree, in one pass (floors ride beside it)
    [tree] = trees
    # the input as the model reads it (chat template + content) is the trunk every question shares
    num_input = tree.num_trunk_tokens
    content_ids = engine.tokenizer(INPUT, add_special_tokens=False)["input_ids"]
    assert num_input >= len(content_ids)
    sequences = [ids for branch in compiled.branches for ids in branch.option_ids]
    assert len(sequences) == 17 * 2 + 17 * 3 + 16 * 3  # predicates (yes, no), choices (3), scores (3 levels)
    assert all(ids[:num_input] == sequences[0][:num_input] for ids in sequences)
    branch_nodes = {tuple(ids[num_input:k]) for ids in sequences for k in range(num_input + 1, len(ids) + 1)}
    assert tree.num_tokens == num_input + len(branch_nodes)
    # asked one question per request, the same questions read the input 50 times
    alone = [engine.compile(_plan([q], engine.model_name).request).tree for q in questions]
    assert sum(t.num_tokens for t in alone) - tree.num_tokens >= 49 * num_input

"""What compiling a request may cost (engine/pipeline/tokenize.py TokenBudget): tokenizing in
chunks gives the same ids; a request past either budget stops at the chunk that crosses it,
before the rest is tokenized; the kept suffix tails are bounded in tokens; the engine refuses
such a request as an error on `scoring.queries`."""

import functools
import random

import pytest
from transformers import AutoTokenizer

from contract.protocol import ScoringRequest
from contract.settings import LIMITS
from engine.loading.loader import registry_tokenizer_dir
from engine.pipeline import token_budget as budget_module
from engine.pipeline import tokenize as tokenize_module
from engine.pipeline.stages import RequestError
from engine.pipeline.token_budget import TokenBudget, TokenBudgetExceeded
from engine.pipeline.tokenize import Tokenize

TOKENIZERS = ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m")
PREFIX = "<|im_start|>user\n" + "I was charged twice for September and nobody answers my emails. " * 8


@functools.cache
def _load(name: str):
    return AutoTokenizer.from_pretrained(registry_tokenizer_dir(name))


def _suffixes(num: int) -> list[str]:
    rng = random.Random(num)
    words = ("refund", "order", "中文字符", "\n\nQuestion:", " yes", " no", "Answer:", "😀", "  ", "\n")
    return ["".join(rng.choice(words) for _ in range(rng.randrange(1, 12))) for _ in range(num)]


@pytest.mark.parametrize("name", TOKENIZERS)
def test_chunked_continuations_are_the_whole_strings_and_are_counted(name, monkeypatch):
    tokenizer = _load(name)
    suffixes = _suffixes(300)
    whole = tokenizer([PREFIX + s for s in suffixes], add_special_tokens=False)["input_ids"]
    monkeypatch.setattr(budget_module, "CHUNK_CHARS", 97)  # dozens of calls
    budget = TokenBudget(max_tokenized=10**9, max_held=10**9)
    assert Tokenize(tokenizer, add_special_tokens=False).continuations(PREFIX, suffixes, budget) == whole
    assert budget.num_held == sum(map(len, whole))
    assert 0 < budget.num_tokenized < budget.num_held  # the prefix's head is tokenized once, not per suffix


@pytest.mark.parametrize("limit", ["max_tokenized", "max_held"])
def test_a_request_past_its_budget_stops_at_the_chunk_that_crosses_it(limit, monkeypatch):
    tokenizer = _load("smollm2-135m-instruct")
    suffixes = _suffixes(2000)
    monkeypatch.setattr(budget_module, "CHUNK_CHARS", 200)
    unbounded = TokenBudget(max_tokenized=10**9, max_held=10**9)
    Tokenize(tokenizer, add_special_tokens=False).continuations(PREFIX, suffixes, unbounded)
    total = {"max_tokenized": unbounded.num_tokenized, "max_held": unbounded.num_held}[limit]
    budget = TokenBudget(**({"max_tokenized": 10**9, "max_held": 10**9} | {limit: total // 10}))
    with pytest.raises(TokenBudgetExceeded, match="the limit max_(tokenized|held)_tokens"):
        Tokenize(tokenizer, add_special_tokens=False).continuations(PREFIX, suffixes, budget)
    spent = {"max_tokenized": budget.num_tokenized, "max_held": budget.num_held}[limit]
    assert total // 10 < spent < total // 5, (spent, total)  # stopped soon after the limit, long before the end


def test_kept_suffix_tails_are_bounded_in_tokens(monkeypatch):
    tokenizer = _load("smollm2-135m-instruct")
    monkeypatch.setattr(tokenize_module, "MAX_SUFFIX_CUT_TOKENS", 500)
    tokenize = Tokenize(tokenizer, add_special_tokens=False)
    suffixes = [f"\n\nQuestion {i}: is it about " + "the long story of a refund " * 10 + "?" for i in range(200)]
    whole = tokenizer([PREFIX + s for s in suffixes], add_special_tokens=False)["input_ids"]
    assert tokenize.continuations(PREFIX, suffixes) == whole
    kept = [cut for cut in tokenize._suffix_cuts.values() if cut is not None]
    assert kept and sum(len(cut.tail_ids) for cut in kept) <= 500
    assert tokenize._num_suffix_cut_tokens[0] == sum(len(cut.tail_ids) for cut in kept)


def test_the_engine_refuses_a_request_past_the_held_budget(monkeypatch):
    from engine import engine as engine_module
    from engine.testing.tiny import tiny_cpu_engine

    engine = tiny_cpu_engine("llama")
    queries = [{"id": f"q{i}", "template": f"\nQuestion {i}?{{?}}", "options": [" yes", " no"]} for i in range(50)]
    request = ScoringRequest.model_validate({"messages": [{"role": "user", "content": "refund " * 200}],
                                             "scoring": {"queries": queries}})
    budgets = []
    monkeypatch.setattr(engine_module, "TokenBudget", lambda *limits: budgets.append(TokenBudget(*limits)) or budgets[-1])
    assert not isinstance(engine.compile(request), RequestError)
    held = budgets[-1].num_held  # the prompt and every prompt + option of each branch
    assert held > sum(len(ids) for branch in engine.compile(request).branches for ids in branch.option_ids)
    monkeypatch.setattr(engine_module, "LIMITS", LIMITS.model_copy(update={"max_held_tokens": held - 1}))
    refused = engine.compile(request)
    assert isinstance(refused, RequestError) and refused.field == "scoring.queries", refused
    assert "max_held_tokens" in refused.message
    monkeypatch.setattr(engine_module, "LIMITS", LIMITS.model_copy(update={"max_held_tokens": held}))
    assert not isinstance(engine.compile(request), RequestError)  # exactly at the limit is admitted


def _choice_question(rng: random.Random, num_choices: int) -> tuple[str, list[str]]:
    labels = [chr(65 + i // 26) + chr(65 + i % 26) for i in range(num_choices)]
    pieces = ("code", "the long name", "中文字符", "refund", "  ", "\n", "😀", "it's", "(a)", "---")
    listing = "\n".join(f"{label}: {' '.join(rng.choice(pieces) for _ in range(rng.randrange(1, 6)))}" for label in labels)
    return f"\n\nQuestion: which one fits?\n{listing}\nAnswer:", [" " + label for label in labels] + [" none", " AA AB"]


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_options_read_as_continuations_of_their_question_are_the_whole_strings(name, add_special_tokens):
    tokenizer = _load(name)
    tokenize = Tokenize(tokenizer, add_special_tokens=add_special_tokens)
    rng = random.Random(7)
    for prefix in (PREFIX, "short", PREFIX + "中文字符 " * 40 + "\n"):
        questions = [_choice_question(rng, rng.choice([8, 40, 255])) for _ in range(3)]
        budget = TokenBudget(max_tokenized=10**9, max_held=10**9)
        got = tokenize.option_continuations(prefix, [q for q, _ in questions], [o for _, o in questions], budget)
        expected = [tokenizer([prefix + q + o for o in options], add_special_tokens=add_special_tokens)["input_ids"]
                    for q, options in questions]
        assert got == expected, prefix[:20]
        assert budget.num_held == sum(len(ids) for per_question in expected for ids in per_question)


def test_a_255_choice_question_is_tokenized_about_once_not_once_per_option():
    tokenizer = _load("smollm2-135m-instruct")
    question, options = _choice_question(random.Random(3), 255)
    num_question_tokens = len(tokenizer(question, add_special_tokens=False)["input_ids"])
    budget = TokenBudget(max_tokenized=10**9, max_held=10**9)
    Tokenize(tokenizer, add_special_tokens=False).option_continuations(PREFIX, [question], [options], budget)
    assert budget.num_tokenized < 3 * num_question_tokens + 40 * len(options), (budget.num_tokenized, num_question_tokens)


def test_a_compiled_long_choice_question_scores_the_whole_strings():
    from engine.testing.tiny import tiny_cpu_engine

    engine = tiny_cpu_engine("llama")
    question, options = _choice_question(random.Random(5), 60)  # within the tiny model's 1,024-token context
    assert len(question) >= 1024
    queries = [{"id": "code", "template": question + "{?}", "options": options},
               {"id": "short", "template": "\nRefund?{?}", "options": [" yes", " no"]}]
    request = ScoringRequest.model_validate({"messages": [{"role": "user", "content": "refund " * 20}],
                                             "scoring": {"queries": queries}})
    compiled = engine.compile(request)
    assert not isinstance(compiled, RequestError), compiled
    add_special = engine.tokenize.add_special_tokens
    for branch, query in zip(compiled.branches, queries, strict=True):
        whole = engine.tokenizer([branch.prompt_text + o for o in query["options"]], add_special_tokens=add_special)
        assert branch.option_ids == whole["input_ids"], query["id"]
    [floor] = [b for _, tree in engine._floor_trees(compiled.floor_keys[:1]) for b in tree.branches]
    key = compiled.floor_keys[0]
    whole = engine.tokenizer([key.empty_prefix + key.filled_template + o for o in key.options], add_special_tokens=add_special)
    assert floor.option_ids == whole["input_ids"]

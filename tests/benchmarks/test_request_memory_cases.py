"""The cases of benchmarks/request_memory.py sit exactly at a default limit: each validates, and
the same request with one more unit of what it maxes out is refused (so the measured memory is
that of the largest request the limits admit)."""

import copy
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import request_memory

from contract.protocol import ScoringRequest
from contract.settings import LIMITS


def _one_more_character(body: dict) -> dict:
    body["messages"][0]["content"] += "x"
    return body


def _one_more_message(body: dict) -> dict:
    body["messages"].append({"role": "user", "content": "x"})
    return body


def _one_more_option(body: dict) -> dict:
    body["scoring"]["queries"][0]["options"].append(" one more")
    return body


def _one_more_template_character(body: dict) -> dict:
    query = body["scoring"]["queries"][0]
    query["template"] = "x" + query["template"]
    return body


def _one_more_query(body: dict) -> dict:
    extra = copy.deepcopy(body["scoring"]["queries"][0]) | {"id": "one-more"}
    body["scoring"]["queries"].append(extra)
    return body


AT_THE_LIMIT = {  # case -> (what its size must equal, the change that must be refused)
    "max_content": ({"content_chars": LIMITS.max_content_chars}, _one_more_character),
    "max_messages": ({"num_messages": LIMITS.max_messages}, _one_more_message),
    "max_scored_options": ({"scored_options": LIMITS.max_scored_options, "num_queries": LIMITS.max_queries},
                           _one_more_option),
    "max_question_chars_words": ({"question_chars": LIMITS.max_question_chars}, _one_more_template_character),
    "max_question_chars_adversarial": ({"question_chars": LIMITS.max_question_chars}, _one_more_template_character),
    "max_request_combinations": ({"combinations": LIMITS.max_request_combinations,
                                  "scored_options": LIMITS.max_scored_options}, _one_more_query),
}


UNDER_A_TOKEN_LIMIT = {  # case -> the worker's limit it sits just under (what compiling it counts)
    "max_read_tokens": "max_read_tokens",
    "max_tokenized_tokens": "max_tokenized_tokens",
    "max_held_tokens": "max_held_tokens",
}


def test_every_case_is_checked():
    assert set(AT_THE_LIMIT) | set(UNDER_A_TOKEN_LIMIT) == set(request_memory.CASE_NAMES)
    assert not set(AT_THE_LIMIT) & set(UNDER_A_TOKEN_LIMIT)


def _counted(body: dict) -> dict:
    """What the worker counts compiling `body` with SmolLM2's tokenizer (the llama family's)."""
    from transformers import AutoTokenizer

    from engine.loading.loader import registry_tokenizer_dir
    from engine.pipeline.compiler import compile_request
    from engine.pipeline.prompts import PromptRenderer
    from engine.pipeline.token_budget import TokenBudget
    from engine.pipeline.tokenize import Tokenize

    tokenizer = AutoTokenizer.from_pretrained(registry_tokenizer_dir("smollm2-135m-instruct"))
    budget = TokenBudget(max_tokenized=10**12, max_held=10**12)
    compiled = compile_request(ScoringRequest.model_validate(body), PromptRenderer(tokenizer, True),
                               Tokenize(tokenizer, add_special_tokens=False), [], budget)
    return {"max_read_tokens": len(compiled.tree.token_ids), "max_tokenized_tokens": budget.num_tokenized,
            "max_held_tokens": budget.num_held, "longest": compiled.max_num_tokens}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(UNDER_A_TOKEN_LIMIT))
def test_a_token_case_is_admitted_and_sits_just_under_its_worker_limit(name):
    """The API admits it, and compiling it counts between 90% and 100% of its limit (and stays
    inside the other two limits and the 8,192-token context), so the benchmark measures about
    the largest request that limit lets through."""
    body = request_memory.case_body(name)
    ScoringRequest.model_validate(body)
    counted = _counted(body)
    limit = getattr(LIMITS, UNDER_A_TOKEN_LIMIT[name])
    assert 0.9 * limit < counted[UNDER_A_TOKEN_LIMIT[name]] <= limit, counted
    assert all(counted[other] <= getattr(LIMITS, other) for other in UNDER_A_TOKEN_LIMIT.values()), counted
    assert counted["longest"] <= 8192, counted


@pytest.mark.parametrize("name", list(AT_THE_LIMIT))
def test_a_case_is_admitted_and_one_more_is_refused(name):
    body = request_memory.case_body(name)
    size = request_memory.case_size(ScoringRequest.model_validate(body))
    expected, one_more = AT_THE_LIMIT[name]
    assert {key: size[key] for key in expected} == expected
    with pytest.raises(ValidationError, match="limit|at most"):
        ScoringRequest.model_validate(one_more(copy.deepcopy(body)))

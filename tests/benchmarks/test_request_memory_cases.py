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


def test_every_case_is_checked():
    assert set(AT_THE_LIMIT) == set(request_memory.CASE_NAMES)


@pytest.mark.parametrize("name", request_memory.CASE_NAMES)
def test_a_case_is_admitted_and_one_more_is_refused(name):
    body = request_memory.case_body(name)
    size = request_memory.case_size(ScoringRequest.model_validate(body))
    expected, one_more = AT_THE_LIMIT[name]
    assert {key: size[key] for key in expected} == expected
    with pytest.raises(ValidationError, match="limit|at most"):
        ScoringRequest.model_validate(one_more(copy.deepcopy(body)))

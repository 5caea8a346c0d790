"""The Decisions API request models against the openai 3.57 wheel's `decision_create_params.py`, field for
field: the wheel's fields all present, the same required ones, and only our named extensions beside them;
the route in /openapi.json with the sync statuses."""

import typing

import pydantic
import pytest
from openai.types import decision_create_params as params
from openai.types import decision_input_text_param, shared_params

from contract import decisions

EXTENSIONS = {"workload", "orderings"}  # ours only: docs/decisions.md
THEIRS = {  # our model -> the wheel's
    decisions.DecisionCreate: params.DecisionCreateParams,
    decisions.PredicateQuestion: params.QuestionQuestionParamPredicate,
    decisions.ChoiceQuestion: params.QuestionQuestionParamChoice,
    decisions.Choice: params.QuestionQuestionParamChoiceChoice,
    decisions.ScoreQuestion: params.QuestionQuestionParamScore,
    decisions.Level: params.QuestionQuestionParamScoreLevel,
    decisions.PromptCacheOptions: params.PromptCacheOptions,
    decisions.UserMessage: params.InputUnionMember1DecisionInputUserMessage,
    decisions.AssistantMessage: params.InputUnionMember1DecisionInputAssistantMessage,
    decisions.InputText: decision_input_text_param.DecisionInputTextParam,
    decisions.InputJson: shared_params.DecisionInputJSON,
}


def _required(typed_dict) -> set[str]:
    hints = typing.get_type_hints(typed_dict, include_extras=True)
    return {name for name, hint in hints.items() if typing.get_origin(hint) is typing.Required}


@pytest.mark.parametrize(("ours", "theirs"), list(THEIRS.items()), ids=[ours.__name__ for ours in THEIRS])
def test_the_wheels_fields_and_only_our_extensions(ours, theirs):
    wheel = set(typing.get_type_hints(theirs))
    assert wheel <= set(ours.model_fields)
    assert set(ours.model_fields) - wheel <= EXTENSIONS
    # the wheel's required fields are required here; `type` of a message defaults to "message"
    required = {n for n, f in ours.model_fields.items() if f.is_required()}
    assert _required(theirs) - {"type"} <= required <= _required(theirs) | {"type"}


def test_system_and_developer_messages_are_the_wheels():
    for theirs in (params.InputUnionMember1DecisionInputSystemMessage,
                   params.InputUnionMember1DecisionInputDeveloperMessage):
        assert set(typing.get_type_hints(theirs)) == set(decisions.SystemMessage.model_fields)


def test_the_route_is_in_openapi_with_the_sync_statuses():
    from api.app import create_app
    from contract.settings import Settings

    operation = create_app(Settings(redis_url="redis://127.0.0.1:1/0")).openapi()["paths"]["/v1/decisions"]["post"]
    assert {"401", "413", "422", "429", "504"} <= set(operation["responses"])


@pytest.mark.parametrize("tag", [{}, [], 3, None, True, "Score"])
def test_a_question_type_that_is_not_a_known_name_is_a_validation_error(tag):
    """Any JSON value can arrive as `type`: an object or a list must be a 422 naming it, not a
    TypeError (an unhashable dict looked up among the kinds was a 500)."""
    body = {"input": "x", "questions": [{"type": tag, "instructions": "q", "levels": [{"label": "a"}, {"label": "b"}]}]}
    with pytest.raises(pydantic.ValidationError, match="is not one of 'predicate', 'choice', 'score'"):
        decisions.DecisionCreate.model_validate(body)

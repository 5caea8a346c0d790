"""POST /v1/decisions before any worker (the app on a real Redis): what is admitted under the default
limits (400 questions of 255 choices each), what is a 422 naming the field (never a 5xx), the 429 of
admission, the prompt format's options (by value, by label, labels past 26 choices) and the refusal rule
on hand-built scoring responses."""

import math

import orjson

import pytest
from fastapi.testclient import TestClient
from openai.types import Decision
from rq.job import Job

from api.app import create_app
from contract import queues
from contract.decisions import DecisionCreate
from contract.payloads import ChunkPayload
from contract.scoring_results import ScoringResponse
from jobstore import lifecycle
from jobstore.submit import chunk_rq_id
from prompt_packs.decision_answers import is_refusal, read_decision
from prompt_packs.decision_format import PROMPT_FORMAT, decision_request, labels

pytestmark = pytest.mark.redis

PREDICATE = {"type": "predicate", "instructions": "Is it about billing?"}


def _choice(num: int, value=lambda i: f"code {i}", **extra) -> dict:
    return {"type": "choice", "instructions": "Which code?", "choices": [{"value": value(i)} for i in range(num)],
            **extra}


@pytest.fixture
def client(make_settings, bearer):
    with TestClient(create_app(make_settings(default_model="m", sync_timeout_s=0.2, max_queue=3)),
                    raise_server_exceptions=False) as test_client:
        test_client.headers.update(bearer("alice"))
        yield test_client


def _post(client, questions, **fields):
    return client.post("/v1/decisions", json={"model": "m", "input": "hello", "questions": questions, **fields})


def test_400_questions_of_255_choices_are_admitted_under_the_default_limits(client):
    body = {"model": "m", "input": "I was charged twice.", "questions": [_choice(255) for _ in range(400)]}
    plan = decision_request(DecisionCreate.model_validate(body), {})
    assert len(plan.request.scoring.queries) == 400
    assert all(len(q.options) == 255 for q in plan.request.scoring.queries)
    response = _post(client, body["questions"])
    assert response.status_code == 504, response.text  # validated and queued; no worker here answers it
    assert int(client.app.state.redis.get(queues.QUEUED_ROWS_KEY)) == 1


def test_requests_past_a_limit_once_asked_are_422s_naming_the_question(client):
    long_values = _choice(255, value=lambda i: f"{i} " + "x" * 1000)  # 255 kB listed in one template
    response = _post(client, [PREDICATE, long_values])
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == "questions.1"
    assert "65536" in response.json()["error"]["message"]
    rotations = [_choice(255, orderings="rotations") for _ in range(5)]  # 5 x 255 orderings > 1024 queries
    response = _post(client, rotations)
    assert response.status_code == 422 and response.json()["error"]["param"] == "questions", response.text
    assert "1024" in response.json()["error"]["message"]
    assert int(client.app.state.redis.get(queues.QUEUED_ROWS_KEY) or 0) == 0  # nothing queued


def test_an_input_over_the_content_limit_once_asked_is_a_422_naming_the_input(client):
    """Each message under the limit on its own, the input as a whole over it: the fix is the
    input's, not the questions'."""
    half = 131_073  # two of these pass 262,144 characters
    for value in ([{"role": "user", "content": "x" * half}, {"role": "user", "content": "y" * half}],
                  [{"role": "user", "content": [{"type": "input_text", "text": "x" * half},
                                                {"type": "input_text", "text": "y" * half}]}]):
        response = _post(client, [PREDICATE], input=value)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["param"] == "input" and "262144" in error["message"] and "shorten the input" in error["message"], error
    assert int(client.app.state.redis.get(queues.QUEUED_ROWS_KEY) or 0) == 0  # nothing queued


@pytest.mark.parametrize(("questions", "fields", "param", "said"), [
    ([PREDICATE] * 401, {}, "questions", "400"),
    ([_choice(256)], {}, "questions.0.choices", "255"),
    ([_choice(1)], {}, "questions.0.choices", "2"),
    ([_choice(2, value=lambda i: "same")], {}, "questions.0.choices", "repeated"),
    ([{"type": "score", "instructions": "How?", "levels": [{"label": str(i)} for i in range(11)]}], {},
     "questions.0.levels", "10"),
    ([PREDICATE], {"temperature": 1}, "temperature", "xtra"),
    ([PREDICATE], {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input.0.content.0", "input_image"),
    ([PREDICATE], {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]},
     "input.0", "function_call"),
    ([{**PREDICATE, "instructions": [{"type": "input_image", "image_url": "x"}]}], {},
     "questions.0.instructions.0", "input_image"),
    ([{**PREDICATE, "workload": "nope"}], {}, "questions.0.workload", "nope"),
])
def test_bad_bodies_are_422s_naming_the_field(client, questions, fields, param, said):
    response = _post(client, questions, **fields)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"].startswith(param), error
    assert said in error["message"], error


def test_optional_params_of_the_sdk_are_accepted_and_ignored(client):
    fields = {"prompt_cache_key": "k", "prompt_cache_options": {"mode": "explicit", "ttl": "30m"},
              "safety_identifier": "user-1"}
    assert _post(client, [PREDICATE], **fields).status_code == 504  # validated and queued
    with_messages = [{"role": "developer", "content": "Be strict."},
                     {"role": "user", "content": [{"type": "input_text", "text": "hi"},
                                                  {"type": "input_json", "data": {"order": 17}}]},
                     {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}], "phase": "final_answer"}]
    assert _post(client, [PREDICATE], input=with_messages).status_code == 504


def _nested_objects(levels: int) -> dict:
    data: dict = {}
    for _ in range(levels - 1):
        data = {"a": data}
    return data


def _with_json(data) -> list[dict]:
    return [{"role": "user", "content": [{"type": "input_json", "data": data}]}]


@pytest.mark.parametrize(("within", "past", "said"), [
    (_nested_objects(32), _nested_objects(33), "32 levels"),
    ({f"k{i}": i for i in range(9_999)}, {f"k{i}": i for i in range(10_000)}, "10,000 values"),
    ({"a": "x" * (256 * 1024 - 8)}, {"a": "x" * (256 * 1024 - 7)}, "262,144"),
])
def test_input_json_past_a_limit_is_a_422_naming_the_part_and_the_limit(client, within, past, said):
    """32 levels of nesting, 10,000 values, 256 KiB of compact JSON: each admitted at its limit,
    one more is a 422 on the part's `data` (never the 500 of a reply that cannot be serialized)."""
    assert _post(client, [PREDICATE], input=_with_json(within)).status_code == 504  # validated and queued
    response = _post(client, [PREDICATE], input=_with_json(past))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "input.0.content.0.data" and said in error["message"], error
    in_question = _post(client, [{**PREDICATE, "instructions": [{"type": "input_json", "data": past}]}])
    assert in_question.status_code == 422 and in_question.json()["error"]["param"] == "questions.0.instructions.0.data"


def test_input_json_nested_far_past_the_limit_is_a_422_not_a_500(client):
    deep_lists: list = []
    for _ in range(900):  # parses (under Python's recursion limit) but is past every serializer's
        deep_lists = [deep_lists]
    for data in (_nested_objects(40), {"a": deep_lists}, [{"a": deep_lists}]):
        response = _post(client, [PREDICATE], input=_with_json(data))
        assert response.status_code == 422, response.text[:300]
        assert response.json()["error"]["param"] == "input.0.content.0.data"
    assert int(client.app.state.redis.get(queues.QUEUED_ROWS_KEY) or 0) == 0  # nothing queued


def test_the_input_json_limits_are_in_the_openapi_schema(client):
    data = client.get("/openapi.json").json()["components"]["schemas"]["InputJson"]["properties"]["data"]
    assert "32 levels of nesting" in data["description"] and "10,000 values" in data["description"]
    assert "256 KiB" in data["description"]
    assert [branch.get("maxProperties", branch.get("maxItems")) for branch in data["anyOf"]] == [9_999, 9_999]


def test_admission_refuses_past_max_queue_before_reading_the_body(client):
    # distinct calls (an identical one would attach to the first's job), each leaves one row queued
    statuses = [_post(client, [PREDICATE | {"instructions": f"Is it about topic {i}?"}]).status_code for i in range(5)]
    assert statuses == [504] * 3 + [429] * 2


def test_labels_are_letters_then_two_letters_distinct_up_to_255():
    assert labels(3) == ["A", "B", "C"] and labels(26)[-1] == "Z"
    many = labels(255)
    assert many[:2] == ["AA", "AB"] and len(set(many)) == 255 and all(len(x) == 2 for x in many)
    assert PROMPT_FORMAT == "decisions-v2"


@pytest.mark.parametrize(("values", "options"), [
    (["billing", "technical"], [" billing", " technical"]),  # short and distinct: the values themselves
    (["c1", "c10"], [" A", " B"]),  # " c1" would hold the mass of " c10"
    (["true", True], [" A", " B"]),  # the string and the boolean read alike
    (["x" * 65, "y"], [" A", " B"]),  # past MAX_NAMED_CHOICE_CHARS
    ([f"v{i:03d}" for i in range(255)], [f" v{i:03d}" for i in range(255)]),
    ([f"value {i}" for i in range(27)], [" AA", " AB"] + [" " + a + b for a in "ABCDEFGHIJ" for b in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"][2:27]),
])
def test_choices_are_answered_by_value_or_by_label(values, options):
    body = {"model": "m", "input": "hi", "questions": [{"type": "choice", "instructions": "Which?",
                                                         "choices": [{"value": v} for v in values]}]}
    [query] = decision_request(DecisionCreate.model_validate(body), {}).request.scoring.queries
    assert query.options == options
    by_value = options[0] == " " + str(values[0])
    assert ("Options:\n- " in query.template) is by_value


def _response(plan, residuals: list[float]) -> ScoringResponse:
    results = []
    for query, residual in zip(plan.request.scoring.queries, residuals, strict=True):
        n = len(query.options)
        options = [{"text": t, "logprob": math.log((1 - residual) / n), "p": 1 / n, "floor_p": 1 / n}
                   for t in query.options]
        results.append({"id": query.id, "combinations": [{"values": {}, "options": options, "residual": residual}]})
    return ScoringResponse.model_validate({"id": "x", "model": "m", "system_fingerprint": "fp", "results": results,
                                           "usage": {"content_tokens": 5, "question_tokens": 7, "option_tokens": 3}})


def test_an_answer_is_a_refusal_when_the_options_hold_under_one_percent():
    assert not is_refusal(0.98) and not is_refusal(0.99) and is_refusal(0.995)
    questions = [PREDICATE, _choice(3), {"type": "score", "name": "s", "instructions": "How?",
                                         "levels": [{"label": "low"}, {"label": "high"}]}]
    create = DecisionCreate.model_validate({"model": "m", "input": "hi", "questions": questions})
    plan = decision_request(create, {})
    body = read_decision(create, plan, _response(plan, [0.5, 0.995, 0.999]), {})
    decision = Decision.model_validate(body, strict=True)
    assert [a.type for a in decision.answers] == ["predicate", "refusal", "refusal"]
    assert decision.answers[2].name == "s" and body["answers"][1]["spinf"]["residual"] == [0.995]
    assert decision.usage.input_tokens == 15 and decision.usage.output_tokens == 0


def test_a_polled_reply_that_cannot_be_built_again_is_the_jobs_error_row(make_settings, bearer):
    """A decisions call's job answered (the row settled through the job store, its response built
    by hand), then polled from a service whose SPINF_WORKLOADS no longer has the question's
    workload: the row is an error row naming the field, not a 500."""
    body = {"model": "m", "input": "hi", "questions": [PREDICATE | {"workload": "support"}]}
    with TestClient(create_app(make_settings(default_model="m", sync_timeout_s=0.2, workloads={"support": 1.5})),
                    raise_server_exceptions=False) as client:
        late = client.post("/v1/decisions", json=body, headers=bearer("alice"))
        assert late.status_code == 504, late.text
        job_id = late.json()["error"]["job_id"]
        r, settings = client.app.state.redis, client.app.state.settings
        payload = Job.fetch(chunk_rq_id(job_id, 0), connection=r, serializer=queues.JsonSerializer).kwargs["payload"]
        work = lifecycle.load_chunk(r, None, ChunkPayload.model_validate(payload))
        plan = decision_request(DecisionCreate.model_validate(body), {"support": 1.5})
        work.rows[0].response = _response(plan, [0.1]).model_dump(mode="json")
        lifecycle.settle_chunk(r, None, settings, work, "w")
        answered = client.get(f"/v1/jobs/{job_id}/results", headers=bearer("alice"))
        assert answered.status_code == 200 and "answers" in orjson.loads(answered.content)["response"]
    with TestClient(create_app(make_settings(default_model="m")), raise_server_exceptions=False) as client:
        polled = client.get(f"/v1/jobs/{job_id}/results", headers=bearer("alice"))
    assert polled.status_code == 200, polled.text
    row = orjson.loads(polled.content)
    assert row["error"]["field"] == "questions.0.workload" and "support" in row["error"]["message"], row
    assert row["custom_id"] == row["error"]["custom_id"] and "response" not in row

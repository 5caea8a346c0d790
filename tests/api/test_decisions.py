"""POST /v1/decisions through the real openai SDK on a live service (uvicorn + worker thread + real Redis +
smollm2-135m): the raw JSON validated strictly into the wheel's `Decision`; one question of each type,
400 questions, a 255-choice question; probabilities equal /v1/score on the equivalent queries bit for bit."""

import httpx
import openai
import pytest
from openai.types import Decision

from contract.decisions import DecisionCreate
from prompt_packs.decision_format import decision_request

pytestmark = [pytest.mark.redis, pytest.mark.slow]

INPUT = "Customer support message:\nI was charged twice for September, please refund one of the charges."
QUESTIONS = [
    {"type": "predicate", "name": "refund", "instructions": "Is the customer asking for a refund?"},
    {"type": "choice", "name": "queue", "instructions": "Which queue should handle this message?",
     "choices": [{"value": "billing", "description": "payments, charges, refunds"}, {"value": "technical"},
                 {"value": "true"}, {"value": True}]},
    {"type": "score", "name": "urgency", "instructions": [{"type": "input_text", "text": "How urgent is it?"}],
     "levels": [{"label": "low"}, {"label": "medium"}, {"label": "high", "description": "act now"}]},
]

SCORE_EQUIVALENT = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": INPUT}], "scoring": {
    "queries": [
        {"id": "q0", "template": "\n\nIs the customer asking for a refund?\nAnswer yes or no.\nAnswer:{?}",
         "options": [" yes", " no"]},
        {"id": "q1", "template": "\n\nWhich queue should handle this message?\nA) billing: payments, charges, refunds\n"
                                 "B) technical\nC) true\nD) true\nAnswer with the label of one option.\nAnswer:{?}",
         "options": [" A", " B", " C", " D"]},  # "true" and true read alike: answered by label
        {"id": "q2", "template": "\n\nHow urgent is it?\n0) low\n1) medium\n2) high: act now\n"
                                 "Answer with the number of one level.\nAnswer:{?}", "options": [" 0", " 1", " 2"]}]}}

MODEL = "smollm2-135m-instruct"  # a real small model: a random one puts no mass on the options (refusals)


@pytest.fixture(scope="module")
def small_engine():
    from engine.engine import Engine, EngineConfig

    return Engine(EngineConfig(model=MODEL, device="cpu", dtype="float32"))


@pytest.fixture
def live(make_settings, small_engine, live_service):
    return live_service(make_settings(default_model=MODEL, sync_timeout_s=900), small_engine)  # 400 questions: minutes on a CPU


def _sdk(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="sk-test-alice", max_retries=0, timeout=900)


def _create(live, questions, input=INPUT) -> tuple[dict, Decision]:
    raw = _sdk(live).decisions.with_raw_response.create(model=MODEL, input=input, questions=questions)
    body = raw.http_response.json()
    return body, Decision.model_validate(body, strict=True)


def test_one_question_of_each_type_through_the_sdk(live, bearer):
    body, decision = _create(live, QUESTIONS)
    kinds = [a.type for a in decision.answers]
    assert kinds == ["predicate", "choice", "score"], kinds  # smollm2 puts mass on every option
    predicate, choice, score = decision.answers
    assert 0 <= predicate.probability <= 1 and predicate.name == "refund"
    values = [p.value for p in choice.probabilities]
    assert values == ["billing", "technical", "true", True] and type(values[3]) is bool
    assert abs(sum(p.probability for p in choice.probabilities) - 1) < 1e-9
    assert choice.confidence == max(p.probability for p in choice.probabilities)
    assert [p.value for p in score.probabilities] == [0, 1, 2]
    assert score.score == pytest.approx(sum(p.value * p.probability for p in score.probabilities))
    assert decision.usage.input_tokens == decision.usage.total_tokens > 0 and decision.usage.output_tokens == 0
    assert body["prompt_format"] == "decisions-v2" and body["system_fingerprint"]
    # the same queries through /v1/score, written out as docs/decisions.md shows them: the same floats
    direct = httpx.post(f"{live.base_url}/v1/score", json=SCORE_EQUIVALENT, headers=bearer("alice"), timeout=120)
    assert direct.status_code == 200, direct.text
    direct = direct.json()
    p = {r["id"]: [o["p"] for o in r["combinations"][0]["options"]] for r in direct["results"]}
    assert predicate.probability == p["q0"][0]
    assert [x.probability for x in choice.probabilities] == p["q1"]
    assert [x.probability for x in score.probabilities] == p["q2"]
    assert [a["spinf"]["p"][0] for a in body["answers"]] == [p["q0"], p["q1"], p["q2"]]
    assert body["usage"]["input_tokens"] == sum(direct["usage"][k] for k in ("content_tokens", "question_tokens",
                                                                             "option_tokens"))
    # and the translator builds exactly that request
    plan = decision_request(DecisionCreate.model_validate({"model": MODEL, "input": INPUT, "questions": QUESTIONS}),
                            {})
    assert plan.request.model_dump(mode="json", exclude_defaults=True) == SCORE_EQUIVALENT


def test_400_questions_and_255_choices(live):
    questions = [{"type": "predicate", "instructions": f"Does it mention the number {i}?"} for i in range(398)]
    named = [{"value": f"c{i:03d}"} for i in range(255)]  # short, none a prefix of another: answered by value
    labelled = [{"value": f"code {i}, " + "the long name of a code " * 3} for i in range(255)]  # labels AA..JU
    questions += [{"type": "choice", "instructions": "Which code?", "choices": choices} for choices in (named, labelled)]
    body, decision = _create(live, questions)
    assert len(decision.answers) == 400
    for answer, raw, options in zip(decision.answers[-2:], body["answers"][-2:], ([" c000", " c254"], [" AA", " JU"])):
        assert answer.type == "choice" and len(answer.probabilities) == 255
        assert abs(sum(p.probability for p in answer.probabilities) - 1) < 1e-9
        assert [raw["spinf"]["options"][i] for i in (0, -1)] == options
    assert [p.value for p in decision.answers[-1].probabilities] == [c["value"] for c in labelled]


def test_unsupported_parts_and_unknown_fields_are_422s_naming_them(live):
    client = _sdk(live)
    with pytest.raises(openai.UnprocessableEntityError) as error:
        client.decisions.create(model=MODEL, questions=QUESTIONS[:1],
                                input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])
    assert "input_image" in str(error.value) and error.value.body["param"] == "input.0.content.0"
    with pytest.raises(openai.UnprocessableEntityError) as error:
        client.decisions.create(model=MODEL, questions=QUESTIONS[:1], input=INPUT, extra_body={"temp": 1})
    assert error.value.body["param"] == "temp"



def test_rotations_average_each_value_over_the_orderings_of_the_same_read(live, bearer):
    """orderings "rotations" on a choice: ordering k shows choice (i + k) mod n in place i; each value's
    probability is the mean over orderings of the p of the option that showed it (docs/decisions.md),
    checked against the orderings written out by hand as /v1/score queries of one request."""
    choices = [{"value": "billing", "description": "payments, charges, refunds"},
               {"value": "technical", "description": "bugs, outages"},
               {"value": "true", "description": "yes"}, {"value": True, "description": "also yes"}]  # by label
    question = {"type": "choice", "instructions": "Which queue should handle this message?", "choices": choices,
                "orderings": "rotations"}
    reply = httpx.post(f"{live.base_url}/v1/decisions", json={"model": MODEL, "input": INPUT, "questions": [question]},
                       headers=bearer("alice"), timeout=300)
    assert reply.status_code == 200, reply.text
    [answer] = Decision.model_validate(reply.json(), strict=True).answers
    n = len(choices)
    shown = [[(i + k) % n for i in range(n)] for k in range(n)]  # ordering k: the choice shown in each place
    queries = [{"id": "q0" if k == 0 else f"q0~o{k}", "options": [" A", " B", " C", " D"],
                "template": "\n\nWhich queue should handle this message?\n"
                            + "\n".join(f"{label}) {str(choices[c]['value']).lower()}: {choices[c]['description']}"
                                        for label, c in zip("ABCD", order))
                            + "\nAnswer with the label of one option.\nAnswer:{?}"}
               for k, order in enumerate(shown)]
    score_body = {"model": MODEL, "messages": [{"role": "user", "content": INPUT}], "scoring": {"queries": queries}}
    direct = httpx.post(f"{live.base_url}/v1/score", json=score_body, headers=bearer("alice"), timeout=300)
    assert direct.status_code == 200, direct.text
    p = {r["id"]: [o["p"] for o in r["combinations"][0]["options"]] for r in direct.json()["results"]}
    per_ordering = [p[q["id"]] for q in queries]
    assert reply.json()["answers"][0]["spinf"]["p"] == per_ordering  # one branch per rotation, as written here
    expected = [sum(row[order.index(c)] for row, order in zip(per_ordering, shown)) / n for c in range(n)]
    assert answer.type == "choice", answer  # smollm2 puts mass on the labels of described choices
    assert [x.value for x in answer.probabilities] == [c["value"] for c in choices]
    assert [x.probability for x in answer.probabilities] == pytest.approx(expected, rel=1e-12, abs=0)
    assert answer.choice == choices[max(range(n), key=lambda c: (expected[c], -c))]["value"]
    assert answer.confidence == pytest.approx(max(expected), rel=1e-12)
    assert max(abs(a - b) for a, b in zip(expected, per_ordering[0])) > 1e-3  # the rotations moved the answer

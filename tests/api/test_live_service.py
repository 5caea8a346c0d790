"""Live service on a loopback port (uvicorn + a worker thread + real Redis + tiny engine).

Must show 5: the real `openai` SDK with extra_body={"scoring": ...} gets the same scores as
POST /v1/score. Also: /v1/score's 422 from the engine, its 504 with a job id, /v1/models.
"""


import httpx
import openai
import pytest


pytestmark = [pytest.mark.redis, pytest.mark.slow]

MESSAGES = [{"role": "system", "content": "You triage customer support."},
            {"role": "user", "content": "Customer support message:\nI was charged twice, please refund one charge."}]
SCORING = {"queries": [
    {"id": "topic", "template": "\n\nTopic (billing, technical, account):{?}",
     "options": [" billing", " technical", " account"]},
    {"id": "brand", "template": "\n\nDoes the message mention {brand}?{?}", "options": [" yes", " no"],
     "values": {"brand": ["Visa", "PayPal"]}},
]}


@pytest.fixture
def live(make_settings, service_engine, live_service):
    return live_service(make_settings(default_model=service_engine.model_name), service_engine)


def test_openai_sdk_gets_the_same_scores_as_score(live, bearer):
    token = bearer("alice")["Authorization"].removeprefix("Bearer ")
    client = openai.OpenAI(base_url=f"{live.base_url}/v1", api_key=token, max_retries=0)
    completion = client.chat.completions.create(model="tiny-llama", messages=MESSAGES, extra_body={"scoring": SCORING})
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.role == "assistant"
    chat_scores = completion.model_extra["scoring"]

    direct = httpx.post(f"{live.base_url}/v1/score", json={"messages": MESSAGES, "scoring": SCORING},
                        headers=bearer("alice"), timeout=60)
    assert direct.status_code == 200, direct.text
    scores = direct.json()
    assert chat_scores["results"] == scores["results"]  # every logprob, p, floor_p, residual
    assert chat_scores["system_fingerprint"] == scores["system_fingerprint"] == completion.system_fingerprint
    assert [c["values"] for c in scores["results"][1]["combinations"]] == [{"brand": "Visa"}, {"brand": "PayPal"}]
    assert completion.usage.prompt_tokens > 0

    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-llama"]
    with pytest.raises(openai.UnprocessableEntityError):  # no scoring block: nothing to answer
        client.chat.completions.create(model="tiny-llama", messages=MESSAGES)


def test_engine_errors_are_422_naming_the_field(live, bearer):
    too_long = [{"role": "user", "content": "refund " * 5000}]
    response = httpx.post(f"{live.base_url}/v1/score", json={"messages": too_long, "scoring": SCORING},
                          headers=bearer("alice"), timeout=60)
    assert response.status_code == 422
    assert response.json()["error"]["param"] == "messages"
    assert response.json()["error"]["job_id"].startswith("job-")


def test_score_past_its_deadline_is_504_with_the_job_id(make_settings, bearer):
    from fastapi.testclient import TestClient

    from api.app import create_app

    settings = make_settings(default_model="no-worker-serves-this", sync_timeout_s=0.5)
    with TestClient(create_app(settings)) as client:
        response = client.post("/v1/score", json={"messages": MESSAGES, "scoring": SCORING}, headers=bearer("alice"))
        assert response.status_code == 504
        job_id = response.json()["error"]["job_id"]
        assert client.get(f"/v1/jobs/{job_id}", headers=bearer("alice")).json()["status"] == "queued"

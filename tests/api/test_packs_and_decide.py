"""Prompt packs and decisions through the live service (uvicorn + worker thread + real Redis + tiny engine).

GET /v1/packs lists the official packs plus `pack_dirs`; /v1/score naming a pack returns
its questions, categories and decisions beside the request's own results; an unknown pack
is a 422 naming it before anything is queued; /v1/decide and /v1/decide/shared answer
lettered decisions (order-averaged, calibrated for a fitted workload) from one read.
"""

import math
import socket
from pathlib import Path

import httpx
import pytest

from spinf_jobs.embedded import EmbeddedService

pytestmark = [pytest.mark.redis, pytest.mark.slow]

STATE = "Customer support message:\nI was charged twice for September, please refund one charge."
OWN = {"queries": [{"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"]}]}
QUEUE = {"question": "Which team should handle this message?",
         "options": [{"id": "billing", "description": "Billing and payments"},
                     {"id": "tech", "description": "Technical support"},
                     {"id": "sales", "description": "Sales"}]}
TEMPERATURE = 2.5


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def extra_packs(tmp_path) -> Path:
    folder = tmp_path / "packs"
    folder.mkdir()
    official = Path(__file__).resolve().parents[2] / "packs" / "product-reviews.yaml"
    text = official.read_text().replace("id: spinf/product-reviews", "id: acme/reviews", 1)
    (folder / "reviews.yaml").write_text(text)
    return folder


@pytest.fixture
def live(make_settings, service_engine, extra_packs):
    settings = make_settings(default_model=service_engine.model_name, pack_dirs=[extra_packs],
                             workloads={"triage": TEMPERATURE, "unfitted": None})
    service = EmbeddedService(settings, {service_engine.model_name: service_engine}, port=_free_port()).start()
    yield service
    service.stop()


def _post(live, bearer, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{live.base_url}{path}", json=body, headers=bearer("alice"), timeout=120)


def _num_read(response: dict) -> int:
    usage = response["usage"]
    return usage["content_tokens"] + usage["question_tokens"] + usage["option_tokens"]


def test_packs_lists_official_and_extra_folders(live, bearer):
    response = httpx.get(f"{live.base_url}/v1/packs", headers=bearer("alice"))
    assert response.status_code == 200, response.text
    by_id = {p["id"]: p for p in response.json()["data"]}
    assert {"spinf/moderation", "spinf/support-triage", "spinf/news-topics", "spinf/product-reviews",
            "acme/reviews"} <= set(by_id)
    assert by_id["acme/reviews"]["questions"] == by_id["spinf/product-reviews"]["questions"]
    assert httpx.get(f"{live.base_url}/v1/packs").status_code == 401


def test_score_naming_a_pack_returns_it_beside_its_own_results(live, bearer):
    body = {"messages": [{"role": "user", "content": STATE}], "scoring": OWN}
    alone = _post(live, bearer, "/v1/score", body)
    named = _post(live, bearer, "/v1/score", {**body, "packs": [{"id": "spinf/support-triage"}]})
    assert alone.status_code == 200 and named.status_code == 200, named.text
    alone, named = alone.json(), named.json()
    assert [r["id"] for r in named["results"]] == ["refund"]
    assert "packs" not in alone
    [pack] = named["packs"]
    assert pack["pack"] == "spinf/support-triage"
    assert set(pack["categories"]) == {"billing", "technical", "account", "shipping", "cancellation"}
    assert pack["decisions"]["queue"] in pack["categories"]
    fitted = [q for q in pack["questions"].values() if q.get("calibrated_p") is not None]
    assert fitted and all(0.0 <= q["calibrated_p"] <= 1.0 for q in fitted)
    pack_only = _post(live, bearer, "/v1/score", {"messages": body["messages"], "packs": [{"id": "spinf/support-triage"}]})
    assert pack_only.status_code == 200, pack_only.text
    pack_only = pack_only.json()
    assert pack_only["packs"][0]["decisions"] == pack["decisions"]
    # one read: the merged tree is the two trees less one copy of their shared trunk (the content)
    assert named["usage"]["content_tokens"] >= 20
    assert _num_read(named) == _num_read(alone) + _num_read(pack_only) - named["usage"]["content_tokens"]


def test_chat_completions_name_packs_and_get_the_same_scores_as_score(live, bearer):
    import json

    messages = [{"role": "user", "content": STATE}]
    pack = [{"id": "spinf/support-triage"}]
    scored = _post(live, bearer, "/v1/score", {"messages": messages, "scoring": OWN, "packs": pack}).json()
    chat = _post(live, bearer, "/v1/chat/completions", {"messages": messages, "scoring": OWN, "packs": pack})
    assert chat.status_code == 200, chat.text
    chat = chat.json()
    assert chat["scoring"]["packs"] == scored["packs"] and chat["scoring"]["results"] == scored["results"]
    content = json.loads(chat["choices"][0]["message"]["content"])
    assert content["packs"] == {"spinf/support-triage": scored["packs"][0]["decisions"]}
    pack_only = _post(live, bearer, "/v1/chat/completions", {"messages": messages, "packs": pack})
    assert pack_only.status_code == 200, pack_only.text
    assert pack_only.json()["scoring"]["packs"][0]["decisions"] == scored["packs"][0]["decisions"]
    twice = _post(live, bearer, "/v1/chat/completions", {"messages": messages, "packs": pack + pack})
    assert twice.status_code == 422 and "named more than once" in twice.json()["error"]["message"]
    unknown = _post(live, bearer, "/v1/chat/completions", {"messages": messages, "packs": [{"id": "spinf/nope"}]})
    assert unknown.status_code == 422 and "spinf/nope" in unknown.json()["error"]["message"]
    neither = _post(live, bearer, "/v1/chat/completions", {"messages": messages})
    assert neither.status_code == 422 and "packs" in neither.json()["error"]["message"]


def test_unknown_pack_is_422_naming_it_before_anything_is_queued(live, bearer):
    body = {"messages": [{"role": "user", "content": STATE}], "packs": [{"id": "spinf/nope"}]}
    response = _post(live, bearer, "/v1/score", body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["param"] == "packs[0].id"
    assert "spinf/nope" in error["message"] and "spinf/moderation" in error["message"]
    assert "job_id" not in error
    neither = _post(live, bearer, "/v1/score", {"messages": body["messages"]})
    assert neither.status_code == 422 and "name a pack" in neither.json()["error"]["message"]


def test_decide_gives_option_probabilities_and_a_calibrated_block(live, bearer):
    response = _post(live, bearer, "/v1/decide", {"state": STATE, **QUEUE, "workload": "triage"})
    assert response.status_code == 200, response.text
    decision = response.json()
    assert decision["option_ids"] == ["billing", "tech", "sales"]
    assert math.isclose(sum(decision["probabilities"]), 1.0, rel_tol=1e-6)
    assert len(decision["prompt_sha256"]) == 64
    # the same lettered prompt through /v1/score gives the same numbers
    template = ("\n\nWhich team should handle this message?\nA) Billing and payments\nB) Technical support\nC) Sales"
                "\nAnswer with the letter of one option.\nAnswer:{?}")
    query = {"id": "q", "template": template, "options": [" A", " B", " C"]}
    scored = _post(live, bearer, "/v1/score", {"messages": [{"role": "user", "content": STATE}],
                                               "scoring": {"queries": [query]}}).json()
    options = scored["results"][0]["combinations"][0]["options"]
    assert decision["probabilities"] == pytest.approx([o["p"] for o in options], rel=1e-5)
    assert decision["option_logits"] == pytest.approx([o["logprob"] for o in options], rel=1e-5)
    # calibrated: softmax of the logits over the workload's temperature, beside the raw ones
    scaled = [math.exp(z / TEMPERATURE) for z in decision["option_logits"]]
    assert decision["calibrated"]["probabilities"] == pytest.approx([s / sum(scaled) for s in scaled], rel=1e-6)
    assert decision["calibrated"]["temperature"] == TEMPERATURE
    unfitted = _post(live, bearer, "/v1/decide", {"state": STATE, **QUEUE, "workload": "unfitted"}).json()
    assert "calibrated" not in unfitted
    unknown = _post(live, bearer, "/v1/decide", {"state": STATE, **QUEUE, "workload": "nope"})
    assert unknown.status_code == 422 and unknown.json()["error"]["param"] == "workload"


def test_decide_shared_reads_the_state_once_with_rotations(live, bearer):
    single = _post(live, bearer, "/v1/decide", {"state": STATE, **QUEUE}).json()
    urgent = {"id": "urgent", "question": "How urgent is it?",
              "options": [{"id": "low", "description": "Low"}, {"id": "high", "description": "High"}]}
    body = {"state": STATE, "decisions": [{**QUEUE, "id": "queue", "orderings": "rotations"}, urgent]}
    response = _post(live, bearer, "/v1/decide/shared", body)
    assert response.status_code == 200, response.text
    shared = response.json()
    queue, urgency = shared["decisions"]
    assert [queue["id"], urgency["id"]] == ["queue", "urgent"]
    # the state read once: the shared tree is the two decisions' trees less one copy of their trunk
    queue_alone = _post(live, bearer, "/v1/decide", {"state": STATE, **QUEUE, "orderings": "rotations"}).json()
    urgent_alone = _post(live, bearer, "/v1/decide", {"state": STATE, **urgent, "id": None}).json()
    assert shared["usage"]["content_tokens"] >= 20
    assert _num_read(shared) == _num_read(queue_alone) + _num_read(urgent_alone) - shared["usage"]["content_tokens"]
    assert urgency["probabilities"] == pytest.approx(urgent_alone["probabilities"], rel=1e-4)
    orderings = queue["combined"]["orderings"]
    assert len(orderings) == 3 and 0.0 < queue["combined"]["agreement"] <= 1.0
    assert orderings[0]["probabilities"] == pytest.approx(single["probabilities"], rel=1e-4)
    means = [sum(o["probabilities"][c] for o in orderings) / 3 for c in range(3)]
    assert queue["probabilities"] == pytest.approx(means, rel=1e-9)
    assert "combined" not in urgency and urgency["option_ids"] == ["low", "high"]
    too_many = _post(live, bearer, "/v1/decide", {"state": STATE, **QUEUE, "orderings": "all",
                                                  "options": QUEUE["options"] * 2})
    assert too_many.status_code == 422


def test_jobs_name_packs_for_every_row_and_refuse_unknown_ones(live, bearer):
    import time

    import orjson

    items = [{"custom_id": f"row-{i}", "text": STATE} for i in range(3)]
    body = {"scoring": {"queries": []}, "items": items, "packs": [{"id": "spinf/support-triage"}]}
    created = _post(live, bearer, "/v1/jobs", body)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = httpx.get(f"{live.base_url}/v1/jobs/{job_id}", headers=bearer("alice")).json()["status"]
        if status in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.5)
    assert status == "succeeded"
    results = httpx.get(f"{live.base_url}/v1/jobs/{job_id}/results", headers=bearer("alice"), timeout=60)
    rows = [orjson.loads(line) for line in results.text.splitlines() if line.strip()]
    assert [row["custom_id"] for row in rows] == [item["custom_id"] for item in items]
    decisions = {row["response"]["packs"][0]["decisions"]["queue"] for row in rows}
    assert len(decisions) == 1  # the same text gives the same decision on every row
    unknown = _post(live, bearer, "/v1/jobs", {**body, "packs": [{"id": "spinf/nope"}]})
    assert unknown.status_code == 422 and unknown.json()["error"]["param"] == "packs[0].id"
    neither = _post(live, bearer, "/v1/jobs", {**body, "packs": []})
    assert neither.status_code == 422 and "name a pack" in neither.json()["error"]["message"]

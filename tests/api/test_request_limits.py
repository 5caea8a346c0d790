"""The per-field request limits of docs/service.md ("Limits") through the API, on a real Redis (no
worker): a job at a limit is accepted (201), one unit past it is a 422 whose `param` names the
field and whose message gives the limit, and nothing is written for the refused one.

    max_queries          scoring.queries               1,024 queries
    max_option_chars     scoring.queries.0.options.1   4,096 characters of one option
    max_id_chars         scoring.queries.0.id          200 characters of a query id
    max_custom_id_chars  items.0.custom_id             512 characters of a row's custom_id
"""

from __future__ import annotations

import pytest
import redis
from fastapi.testclient import TestClient

from api.app import create_app
from contract.settings import LIMITS

pytestmark = pytest.mark.redis


def _query(i: int, option: str = " no", query_id: str | None = None) -> dict:
    return {"id": query_id or f"q{i}", "template": "\n\nIs it about a refund?{?}", "options": [" yes", option]}


def _job(queries: list[dict], custom_id: str = "a") -> dict:
    return {"scoring": {"queries": queries}, "items": [{"custom_id": custom_id, "text": "Refund my order."}]}


CASES = {  # limit -> (a job of n units of it, the field a refusal names)
    "max_queries": (lambda n: _job([_query(i) for i in range(n)]), "scoring.queries"),
    "max_option_chars": (lambda n: _job([_query(0, option="x" * n)]), "scoring.queries.0.options.1"),
    "max_id_chars": (lambda n: _job([_query(0, query_id="i" * n)]), "scoring.queries.0.id"),
    "max_custom_id_chars": (lambda n: _job([_query(0)], custom_id="c" * n), "items.0.custom_id"),
}


@pytest.fixture
def client(make_settings, bearer):
    settings = make_settings(default_model="m")
    with TestClient(create_app(settings)) as test_client:
        test_client.headers.update(bearer("alice"))
        yield test_client, redis.Redis.from_url(settings.redis_url)


def _snapshot(r: redis.Redis) -> dict:
    return {key: r.dump(key) for key in sorted(r.keys("*"))}


@pytest.mark.parametrize("limit", sorted(CASES))
def test_a_job_at_a_limit_is_accepted_and_one_past_it_is_a_422_naming_it(client, limit):
    test_client, r = client
    job, field = CASES[limit]
    value = getattr(LIMITS, limit)
    before = _snapshot(r)
    refused = test_client.post("/v1/jobs", json=job(value + 1))
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["param"] == field, error
    assert error["message"].startswith(f"{field}: ") and f"at most {value} " in error["message"], error
    assert _snapshot(r) == before, "a refused job wrote to Redis"
    accepted = test_client.post("/v1/jobs", json=job(value))
    assert accepted.status_code == 201, accepted.text[:300]
    assert accepted.json()["progress"]["total"] == 1


@pytest.mark.parametrize("limit", ["max_queries", "max_option_chars", "max_id_chars"])
def test_a_sync_call_one_past_a_limit_is_a_422_naming_it(client, limit):
    """The same bound on POST /v1/score: refused before anything is queued."""
    test_client, r = client
    job, field = CASES[limit]
    body = {"messages": [{"role": "user", "content": "Refund my order."}],
            "scoring": job(getattr(LIMITS, limit) + 1)["scoring"]}
    before = _snapshot(r)
    refused = test_client.post("/v1/score", json=body)
    assert refused.status_code == 422 and refused.json()["error"]["param"] == field, refused.text[:300]
    assert f"at most {getattr(LIMITS, limit)} " in refused.json()["error"]["message"]
    assert _snapshot(r) == before

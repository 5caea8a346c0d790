"""Workers name their device and report it with their heartbeat; /health and /metrics show
workers per model and device with pass fill and rows/s; a model with no live worker makes
/health 503 with the reason (the dead-worker rule)."""

import time

import pytest
import redis
from fastapi.testclient import TestClient
from worker_helpers import SCORING, drain_until_settled, make_worker, texts

from api.app import create_app
from contract import queues
from contract.payloads import JobItem
from contract.protocol import ScoringSpec
from jobstore.lifecycle import submit_inline

pytestmark = pytest.mark.redis

NUM_ROWS = 24


def test_health_and_metrics_show_each_worker_on_its_device(make_settings, service_engine):
    model = service_engine.model_name
    settings = make_settings(default_model=model, chunk_num_rows=4)
    r = redis.Redis.from_url(settings.redis_url)
    job_id = submit_inline(r, settings, "alice", model, ScoringSpec.model_validate(SCORING),
                           [JobItem.model_validate(row) for row in texts(NUM_ROWS)])
    created = time.monotonic()
    worker = make_worker(settings, service_engine, name="gpu-box-a")
    worker.device = "cpu:7"  # as `--device cpu:7` names it
    built = time.monotonic()
    drain_until_settled(worker, [job_id])
    before_publish = time.monotonic()
    worker.publish()
    published = time.monotonic()

    with TestClient(create_app(settings)) as client:
        health = client.get("/health")
        metrics = client.get("/metrics", headers={"Authorization": "Bearer sk-test-alice"}).text
    assert health.status_code == 200, health.text
    body = health.json()
    assert body["status"] == "ok" and body["problems"] == []
    [served] = [m for m in body["models"] if m["id"] == model]
    [row] = served["devices"]
    assert (row["worker"], row["device"]) == ("gpu-box-a", "cpu:7")
    assert 0 <= row["heartbeat_age_s"] < 5

    # pass fill: the worker's own window against the service-wide counters (one worker, one job)
    stats = {k.decode(): int(v) for k, v in r.hgetall(queues.STATS_KEY).items()}
    assert stats["rows_total"] == NUM_ROWS and stats["pass_budget_tokens_total"] > 0
    assert row["pass_fill"] == pytest.approx(stats["pass_tokens_total"] / stats["pass_budget_tokens_total"], abs=1e-6)
    assert 0 < row["pass_fill"] <= 1
    # rows/s: every row in the last minute, over the worker's age (bracketed by the clocks here)
    assert NUM_ROWS / (published - created) <= row["rows_per_s"] <= NUM_ROWS / (before_publish - built)

    labels = f'device="cpu:7",model="{model}",worker="gpu-box-a"'
    assert f"spinf_worker_pass_fill{{{labels}}} {row['pass_fill']}" in metrics
    assert f"spinf_worker_rows_per_second{{{labels}}} {row['rows_per_s']}" in metrics
    assert f'spinf_model_live_workers{{model="{model}"}} 1.0' in metrics


def test_a_model_whose_worker_stopped_checking_in_makes_health_503(make_settings, service_engine):
    model = service_engine.model_name
    settings = make_settings(default_model=model, worker_ttl_s=2, models=["spare-model"],
                             scale_to_zero_models=["batch-only-model"])
    worker = make_worker(settings, service_engine, name="gpu-box-b")
    with TestClient(create_app(settings)) as client:
        worker.publish()  # one check-in, then silence: a worker that died or hung
        first = client.get("/health")
        time.sleep(2.5)
        second = client.get("/health")
    # the configured spare model never had a worker; the scale-to-zero model needs none
    assert first.status_code == 503
    assert first.json()["problems"] == ["model 'spare-model': no live worker (none checked in within worker_ttl_s=2 s)"]
    assert second.status_code == 503 and second.json()["status"] == "unavailable"
    assert second.json()["problems"] == [
        f"model '{model}': no live worker (none checked in within worker_ttl_s=2 s)",
        "model 'spare-model': no live worker (none checked in within worker_ttl_s=2 s)",
    ]
    assert second.json()["workers"] == []

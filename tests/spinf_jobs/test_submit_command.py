"""`spinf-jobs submit` and `spinf-jobs jobs ...` as real processes against a live service (in-test API +
worker thread + real Redis + tiny engine): the results file equals GET /v1/jobs/{id}/results row for
row; Ctrl-C (SIGINT) on `submit --wait` leaves the job running and says how to pick it up again."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

pytestmark = [pytest.mark.redis, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
QUERIES = [{"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"]}]


def _env(live) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPINF_")}
    return env | {"SPINF_BASE_URL": live.base_url, "SPINF_API_KEY": "sk-test-alice", "PYTHONPATH": str(REPO)}


def _cli(live, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spinf_jobs.cli", *args], cwd=kwargs.pop("cwd", REPO),
                          env=_env(live), capture_output=True, timeout=240, check=False, **kwargs)


def _inputs(tmp_path: Path, num_rows: int) -> tuple[Path, Path]:
    data, queries = tmp_path / "rows.jsonl", tmp_path / "queries.json"
    rows = [{"custom_id": f"r{i}", "text": f"Customer {i}: please refund order {i}."} for i in range(num_rows)]
    rows.append({"custom_id": "bad", "text": "refund " * 5000})  # the engine refuses it: an error row
    data.write_bytes(b"\n".join(orjson.dumps(row) for row in rows) + b"\n")
    queries.write_bytes(orjson.dumps(QUERIES))
    return data, queries


def test_submit_wait_writes_the_results_of_the_job(make_settings, service_engine, live_service, tmp_path, bearer):
    live = live_service(make_settings(default_model="tiny-llama", chunk_num_rows=4), service_engine)
    data, queries = _inputs(tmp_path, 10)
    out = tmp_path / "out.jsonl"
    done = _cli(live, "submit", str(data), "--queries", str(queries), "--wait", "--output", str(out))
    assert done.returncode == 0, done.stderr.decode()
    job_id = done.stdout.decode().split()[0]
    assert b"11 rows (1 errors)" in done.stderr and b"row/s" in done.stderr  # the bar's rate
    served = httpx.get(f"{live.base_url}/v1/jobs/{job_id}/results", headers=bearer("alice"), timeout=60)
    expected = [orjson.loads(line) for line in served.content.splitlines() if line]
    assert [orjson.loads(line) for line in out.read_bytes().splitlines()] == expected
    assert [row["custom_id"] for row in expected] == [f"r{i}" for i in range(10)] + ["bad"]

    status = orjson.loads(_cli(live, "jobs", "status", job_id).stdout)
    assert status["status"] == "succeeded" and status["progress"] == {"total": 11, "done": 11, "failed": 1}
    printed = _cli(live, "jobs", "results", job_id).stdout
    assert [orjson.loads(line) for line in printed.splitlines()] == expected
    listed = _cli(live, "jobs", "list").stdout.decode().splitlines()
    assert listed[0].split()[:3] == [job_id, "succeeded", "11/11"]
    # no SPINF_API_KEY: the key `spinf-jobs serve` wrote to SPINF_DATA_DIR/api-key
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "api-key").write_text("sk-test-alice\n")
    env = {k: v for k, v in _env(live).items() if k != "SPINF_API_KEY"} | {"SPINF_DATA_DIR": str(tmp_path / "data")}
    by_file = subprocess.run([sys.executable, "-m", "spinf_jobs.cli", "jobs", "list", "--limit", "1"], cwd=REPO,
                             env=env, capture_output=True, timeout=120, check=False)
    assert by_file.stdout.decode().split()[:2] == [job_id, "succeeded"], by_file.stderr.decode()
    env["SPINF_API_KEY"] = "sk-wrong"
    refused = subprocess.run([sys.executable, "-m", "spinf_jobs.cli", "jobs", "list"], cwd=REPO, env=env,
                             capture_output=True, timeout=120, check=False)
    assert refused.returncode == 1 and refused.stderr.decode().startswith("401"), refused.stderr.decode()
    refused = _cli(live, "submit", str(data))
    assert refused.returncode == 2 and b"--queries" in refused.stderr

    # --pack alone: every row asked the pack's questions; its file row for row what the service returns
    packed_out = tmp_path / "packed.jsonl"
    packed = _cli(live, "submit", str(data), "--pack", "spinf/support-triage", "--wait", "--output", str(packed_out))
    assert packed.returncode == 0, packed.stderr.decode()
    packed_id = packed.stdout.decode().split()[0]
    served = httpx.get(f"{live.base_url}/v1/jobs/{packed_id}/results", headers=bearer("alice"), timeout=60)
    rows = [orjson.loads(line) for line in packed_out.read_bytes().splitlines()]
    assert rows == [orjson.loads(line) for line in served.content.splitlines() if line]
    assert all(row["response"]["packs"][0]["pack"] == "spinf/support-triage" for row in rows if "response" in row)
    unknown = _cli(live, "submit", str(data), "--pack", "spinf/nope")
    assert unknown.returncode == 1 and b"packs[0].id" in unknown.stderr, unknown.stderr


def test_ctrl_c_on_submit_wait_leaves_the_job_running(make_settings, slow_engine, live_service, tmp_path, bearer):
    live = live_service(make_settings(default_model="tiny-llama", chunk_num_rows=2), slow_engine(0.5))
    data, queries = _inputs(tmp_path, 19)
    command = [sys.executable, "-u", "-m", "spinf_jobs.cli", "submit", str(data), "--queries", str(queries), "--wait"]
    proc = subprocess.Popen(command, cwd=tmp_path, env=_env(live), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    job_id = proc.stdout.readline().decode().strip()
    assert job_id.startswith("job-"), proc.stderr.read()
    deadline = time.monotonic() + 60
    while httpx.get(f"{live.base_url}/v1/jobs/{job_id}", headers=bearer("alice"), timeout=30).json()[
            "progress"]["done"] == 0:  # following: the bar is up; once rows are done it shows a rate
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(0.75)  # three of the bar's polls
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr.decode()
    for hint in (f"spinf-jobs jobs status {job_id}", f"spinf-jobs jobs results {job_id}",
                 f"spinf-jobs jobs cancel {job_id}", "spinf-jobs jobs list"):
        assert hint.encode() in stderr
    view = httpx.get(f"{live.base_url}/v1/jobs/{job_id}", headers=bearer("alice"), timeout=30).json()
    assert view["status"] in ("queued", "running") and view["progress"]["done"] < 20  # not cancelled
    # the bar was up: rows done of the total, elapsed<ETA, rows/s (tqdm's "3/20 [00:01<00:08, 1.9row/s]")
    assert re.search(rb"\d+/20 \[\d\d:\d\d<\d\d:\d\d, +[\d.]+row/s\]", stderr), stderr.decode()

    # `jobs cancel` of a second job queued behind the first: it ends cancelled, the first keeps running
    second = _cli(live, "submit", str(data), "--queries", str(queries))
    second_id = second.stdout.decode().split()[0]
    assert second.returncode == 0 and f"spinf-jobs jobs status {second_id}".encode() in second.stderr
    cancelled = _cli(live, "jobs", "cancel", second_id)
    assert cancelled.returncode == 0 and orjson.loads(cancelled.stdout)["status"] == "cancelled"
    assert orjson.loads(_cli(live, "jobs", "status", second_id).stdout)["status"] == "cancelled"
    missing = _cli(live, "jobs", "cancel", "job-nope")
    assert missing.returncode == 1 and b"404" in missing.stderr
    deadline = time.monotonic() + 120
    while view["status"] != "succeeded":
        assert time.monotonic() < deadline and view["status"] in ("queued", "running"), view
        time.sleep(0.3)
        view = httpx.get(f"{live.base_url}/v1/jobs/{job_id}", headers=bearer("alice"), timeout=30).json()
    assert view["progress"] == {"total": 20, "done": 20, "failed": 1}
    assert not list(tmp_path.glob("*.results.jsonl"))  # nothing written for a job it stopped following

"""SIGTERM on a worker process mid-job hands its held chunks back to the queue at once.

Worker A (its own process, `spinf-jobs worker`) takes chunks of a job; while it holds some
unsettled chunks it gets SIGTERM. Its heartbeat TTL is long (600 s), so RQ's dead-worker
cleanup cannot be what re-queues them: A itself must. Worker B then finishes the job: every
row once, in order, and no retry spent on A's chunks.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis
from rq.job import Job
from reliability.servers import held_by
from worker_helpers import SCORING, drain_until_settled, make_worker, texts

from contract import queues
from contract.payloads import JobItem, JobStatus
from contract.protocol import ScoringSpec
from jobstore import records
from jobstore.lifecycle import submit_inline
from jobstore.submit import chunk_rq_id

pytestmark = [pytest.mark.redis, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
NUM_ROWS = 60


def test_sigterm_hands_held_chunks_back(make_settings, service_model_dir, service_engine, tmp_path):
    settings = make_settings(chunk_num_rows=3, heartbeat_ttl_s=600, heartbeat_interval_s=0.5)
    r = redis.Redis.from_url(settings.redis_url)
    model = service_engine.model_name
    job_id = submit_inline(r, settings, "alice", model, ScoringSpec.model_validate(SCORING),
                           [JobItem.model_validate(row) for row in texts(NUM_ROWS)])
    batch = queues.queue_pair(model).batch
    env = os.environ | {"SPINF_REDIS_URL": settings.redis_url, "SPINF_HEARTBEAT_TTL_S": "600",
                        "SPINF_HEARTBEAT_INTERVAL_S": "0.5", "PYTHONPATH": str(REPO)}
    log = tmp_path / "worker-a.log"
    worker_a = subprocess.Popen(
        [sys.executable, "-m", "spinf_jobs.service_commands", "worker", "--model", str(service_model_dir),
         "--device", "cpu:0", "--max-num-batched-tokens", "128", "--name", "worker-a"],
        cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    held: list[str] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and worker_a.poll() is None:
        settled = {chunk_rq_id(job_id, index) for index in records.chunk_summaries(r, job_id)}
        held = [rq_id for rq_id in held_by(r, batch, "worker-a") if rq_id not in settled]
        if records.load_view(r, job_id).progress.done >= 3 and held:
            worker_a.send_signal(signal.SIGTERM)
            break
        time.sleep(0.02)
    assert held, f"worker A never held a chunk mid-job:\n{log.read_text()[-3000:]}"
    assert worker_a.wait(timeout=60) == 0, log.read_text()[-3000:]
    assert "hands back" in log.read_text()
    assert held_by(r, batch, "worker-a") == []  # nothing left in the started registry
    queued = {job.decode() for job in r.lrange(f"rq:queue:{batch}", 0, -1)}
    settled = {chunk_rq_id(job_id, index) for index in records.chunk_summaries(r, job_id)}
    assert set(held) - settled <= queued  # back in the queue at once, not after a heartbeat TTL
    view = records.load_view(r, job_id)
    assert view.status == JobStatus.RUNNING and view.progress.done < NUM_ROWS

    worker_b = make_worker(settings, service_engine, name="worker-b")
    drain_until_settled(worker_b, [job_id], timeout_s=240)
    view = records.load_view(r, job_id)
    assert view.status == JobStatus.SUCCEEDED and (view.progress.done, view.progress.failed) == (NUM_ROWS, 0)
    rows = [orjson.loads(line) for chunk in records.iter_inline_results(r, job_id, 100) for line in chunk.splitlines()]
    assert [row["custom_id"] for row in rows] == [f"r{i}" for i in range(NUM_ROWS)]  # every row once, in order
    assert all("response" in row for row in rows)
    for rq_id in set(held) - settled:  # handed back, not failed: no retry spent
        job = Job.fetch(rq_id, connection=r, serializer=queues.JsonSerializer)
        assert job.get_status() == "finished" and job.worker_name == "worker-b"
        assert job.retries_left == settings.max_num_retries
    assert int(r.get(queues.QUEUED_ROWS_KEY)) == 0

"""A worker SIGKILLed in the middle of a job, then Redis SIGKILLed and started again: every
row exactly once, every score bit-identical to a clean run.

    clean run: worker C (its own process, as `spinf-jobs worker` runs) scores the job alone
    same rows, second job: worker A takes chunks; once some are settled and others are in its
    hands (started registry) -> SIGKILL A -> SIGKILL Redis (append-only file, fsync always)
    -> Redis started again (same data) -> worker B: RQ's registry cleanup re-queues A's chunks
    once their heartbeats expire; the job succeeds with one row per input row, in order, each
    row's scores equal to the clean run's, bit for bit.
"""

import signal
import time

import orjson
import pytest
import redis
from rq.job import Job

from contract import queues
from contract.payloads import JobItem, JobStatus
from contract.protocol import ScoringSpec
from jobstore import records
from jobstore.lifecycle import submit_inline
from jobstore.submit import chunk_rq_id
from reliability.servers import RedisProcess, held_by, start_worker

pytestmark = [pytest.mark.redis, pytest.mark.slow]

NUM_ROWS = 60
SCORING = {"queries": [
    {"id": "refund", "template": "\n\nIs the customer asking for a refund?\nAnswer:{?}", "options": [" yes", " no"]},
    {"id": "topic", "template": "\n\nTopic:{?}", "options": [" billing", " shipping", " technical"]},
]}
FLAGS = ("--max-num-batched-tokens", "128")


def _texts(num_rows: int) -> list[JobItem]:
    return [JobItem(custom_id=f"r{i}", text=f"Customer message {i}: please refund order {i}.") for i in range(num_rows)]


def _wait_until_ended(r, job_id: str, worker, log, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if records.load_view(r, job_id).status.is_terminal:
            return
        assert worker.poll() is None, f"the worker exited:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end in {timeout_s}s:\n{log.read_text()[-3000:]}")


def _rows(r, job_id: str) -> list[dict]:
    return [orjson.loads(line) for chunk in records.iter_inline_results(r, job_id, 100) for line in chunk.splitlines()]


def test_killed_worker_and_restarted_redis_lose_no_row_and_move_no_score(make_settings, service_model_dir,
                                                                         service_engine, tmp_path):
    server = RedisProcess(tmp_path / "redis").start()
    try:
        settings = make_settings(redis_url=server.url, chunk_num_rows=3, heartbeat_ttl_s=3, heartbeat_interval_s=0.5)
        model = service_engine.model_name
        spec = ScoringSpec.model_validate(SCORING)
        r = redis.Redis.from_url(settings.redis_url)

        clean_id = submit_inline(r, settings, "alice", model, spec, _texts(NUM_ROWS))
        worker_c = start_worker(settings, str(service_model_dir), "worker-c", tmp_path / "c.log", *FLAGS, "--burst")
        _wait_until_ended(r, clean_id, worker_c, tmp_path / "c.log")
        worker_c.wait(timeout=60)
        clean = {row["custom_id"]: row["response"]["results"] for row in _rows(r, clean_id)}
        assert len(clean) == NUM_ROWS

        job_id = submit_inline(r, settings, "alice", model, spec, _texts(NUM_ROWS))
        held_at_kill = _kill_mid_job(r, settings, service_model_dir, job_id, tmp_path)
        server.kill()  # Redis dies too, then comes back with its data
        server.start()
        r = redis.Redis.from_url(settings.redis_url)
        assert records.load_view(r, job_id).status == JobStatus.RUNNING

        worker_b = start_worker(settings, str(service_model_dir), "worker-b", tmp_path / "b.log", *FLAGS)
        try:
            _wait_until_ended(r, job_id, worker_b, tmp_path / "b.log")
        finally:
            worker_b.send_signal(signal.SIGTERM)
            worker_b.wait(timeout=60)

        view = records.load_view(r, job_id)
        assert view.status == JobStatus.SUCCEEDED
        assert (view.progress.done, view.progress.failed) == (NUM_ROWS, 0)
        rows = _rows(r, job_id)
        assert [row["custom_id"] for row in rows] == [f"r{i}" for i in range(NUM_ROWS)]  # once each, in order
        assert {row["custom_id"]: row["response"]["results"] for row in rows} == clean  # bit-identical floats
        for rq_id in held_at_kill:  # RQ's registry cleanup re-queued A's chunks (one retry spent); B finished them
            job = Job.fetch(rq_id, connection=r, serializer=queues.JsonSerializer)
            assert job.retries_left == settings.max_num_retries - 1
            assert job.get_status() == "finished" and job.worker_name == "worker-b"
        assert int(r.get(queues.QUEUED_ROWS_KEY)) == 0
    finally:
        server.kill()


def _kill_mid_job(r, settings, model_dir, job_id: str, tmp_path) -> list[str]:
    """Worker A, SIGKILLed once some of the job's chunks settled and others are in its hands."""
    batch = queues.queue_pair(records.load_job(r, job_id)["model"]).batch
    worker_a = start_worker(settings, str(model_dir), "worker-a", tmp_path / "a.log", *FLAGS)
    held_at_kill: list[str] = []
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline and worker_a.poll() is None:
            worker_a.send_signal(signal.SIGSTOP)  # frozen while we look: what it holds now, it holds at the kill
            done = records.load_view(r, job_id).progress.done
            settled = {chunk_rq_id(job_id, index) for index in records.chunk_summaries(r, job_id)}
            # held and not yet settled (a chunk settled but not yet completed in RQ needs no re-run)
            held_at_kill = [rq_id for rq_id in held_by(r, batch, "worker-a") if rq_id not in settled]
            if done >= 3 and held_at_kill:
                break
            worker_a.send_signal(signal.SIGCONT)
            time.sleep(0.02)
    finally:
        worker_a.send_signal(signal.SIGKILL)
        worker_a.wait(timeout=30)
    assert held_at_kill, f"worker A never held a chunk mid-job:\n{(tmp_path / 'a.log').read_text()[-3000:]}"
    view = records.load_view(r, job_id)
    assert view.status == JobStatus.RUNNING and 0 < view.progress.done < NUM_ROWS  # killed mid-job
    return held_at_kill

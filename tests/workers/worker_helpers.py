"""Helpers for worker tests: build a worker on the test Redis, drain until a job settles."""

from __future__ import annotations

import time

import redis

from jobstore import records
from jobstore.s3 import make_client
from workers.loop import GreedyWorker

SCORING = {"queries": [
    {"id": "refund", "template": "\n\nIs the customer asking for a refund?\nAnswer:{?}", "options": [" yes", " no"]},
    {"id": "topic", "template": "\n\nTopic:{?}", "options": [" billing", " shipping", " technical"]},
]}


def make_worker(settings, engine, name: str | None = None) -> GreedyWorker:
    connection = redis.Redis.from_url(settings.redis_url)
    return GreedyWorker(connection, {engine.model_name: engine}, settings, s3=make_client(settings), name=name)


def drain_until_settled(worker: GreedyWorker, job_ids: list[str], timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        views = [records.load_view(worker.connection, job_id) for job_id in job_ids]
        if all(view.status.is_terminal for view in views):
            return
        worker.maintain_if_due()
        worker.drain_once(block_s=1)
    raise AssertionError(f"jobs did not settle in {timeout_s}s: {views}")


def texts(num_rows: int, prefix: str = "r") -> list[dict]:
    return [{"custom_id": f"{prefix}{i}", "text": f"Customer message {i}: please refund order {i}."}
            for i in range(num_rows)]

"""Job records in Redis: the state a client sees, kept apart from RQ's per-chunk jobs.

    submit -> create_job (status queued) -> chunk RQ jobs
    worker: mark_running -> store results -> settle_chunk (first write wins) -> finish when all settled
    API: load_view (status, progress, usage), results, cancel

A chunk settles once: its summary is written with HSETNX, so a chunk re-run after a dead
worker overwrites its results but never counts twice, and the queued-rows gauge (the
backpressure signal) drops by its rows exactly once. Records expire `ttl` seconds after the
job ends (the documented retention); a running job never expires.
"""

from __future__ import annotations

import time

import orjson
from redis import Redis

from contract import queues
from contract.payloads import JobStatus, JobView, Progress
from contract.protocol import Usage

# status := to, only when it is one of the states listed after it
_TRANSITION_LUA = """
local status = redis.call('hget', KEYS[1], 'status')
if not status then return 0 end
for i = 3, #ARGV do
  if status == ARGV[i] then
    redis.call('hset', KEYS[1], 'status', ARGV[1])
    if ARGV[2] ~= '' then redis.call('hsetnx', KEYS[1], ARGV[2], redis.call('time')[1]) end
    return 1
  end
end
return 0
"""

# settle a chunk once; the first settle also lowers the queued-rows gauge
_SETTLE_LUA = """
if redis.call('hsetnx', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('decrby', KEYS[2], ARGV[3])
  return 1
end
return 0
"""

_ACTIVE = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)


def now() -> int:
    return int(time.time())


def create_job(r: Redis, job_id: str, fields: dict[str, str | int]) -> None:
    record = {"id": job_id, "status": JobStatus.QUEUED.value, "created_at": now(), **fields}
    r.hset(queues.job_key(job_id), mapping={k: str(v) for k, v in record.items()})


def load_job(r: Redis, job_id: str) -> dict[str, str] | None:
    raw = r.hgetall(queues.job_key(job_id))
    if not raw:
        return None
    return {k.decode(): v.decode() for k, v in raw.items()}


def set_plan(r: Redis, job_id: str, num_rows: int, num_chunks: int) -> None:
    r.hset(queues.job_key(job_id), mapping={"num_rows": num_rows, "num_chunks": num_chunks})


def mark_running(r: Redis, job_id: str) -> bool:
    return bool(_transition(r, job_id, JobStatus.RUNNING, [JobStatus.QUEUED.value], "started_at"))


def _transition(r: Redis, job_id: str, to: JobStatus, from_states: list[str], stamp: str = "") -> int:
    script = r.register_script(_TRANSITION_LUA)
    return script(keys=[queues.job_key(job_id)], args=[to.value, stamp, *from_states])


def store_results(r: Redis, job_id: str, chunk_index: int, jsonl: bytes) -> None:
    r.hset(queues.results_key(job_id), str(chunk_index), jsonl)


def add_passes(r: Redis, job_id: str, pass_names: list[str]) -> None:
    if pass_names:
        r.sadd(queues.passes_key(job_id), *pass_names)


def settle_chunk(r: Redis, job_id: str, chunk_index: int, summary: dict) -> bool:
    """Record a chunk's summary once; True when this call settled it."""
    script = r.register_script(_SETTLE_LUA)
    keys = [queues.chunks_key(job_id), queues.QUEUED_ROWS_KEY]
    args = [str(chunk_index), orjson.dumps(summary), summary["num_rows"]]
    return bool(script(keys=keys, args=args))


def chunk_summaries(r: Redis, job_id: str) -> dict[int, dict]:
    raw = r.hgetall(queues.chunks_key(job_id))
    return {int(k): orjson.loads(v) for k, v in raw.items()}


def is_complete(r: Redis, job_id: str) -> bool:
    record = load_job(r, job_id)
    if record is None or not record.get("num_chunks"):
        return record is not None and record.get("num_chunks") == "0"
    return r.hlen(queues.chunks_key(job_id)) >= int(record["num_chunks"])


def finish(r: Redis, job_id: str, status: JobStatus, ttl: int, error: str | None = None) -> bool:
    """Move an active job to a terminal status, start its retention clock, wake waiters."""
    if error:
        r.hsetnx(queues.job_key(job_id), "error", error)
    if not _transition(r, job_id, status, list(_ACTIVE), "finished_at"):
        return False
    with r.pipeline() as pipe:
        for key in _job_keys(job_id):
            pipe.expire(key, ttl)
        pipe.rpush(queues.done_key(job_id), status.value)
        pipe.expire(queues.done_key(job_id), max(ttl, 60))
        pipe.execute()
    return True


def _job_keys(job_id: str) -> list[str]:
    return [
        queues.job_key(job_id),
        queues.chunks_key(job_id),
        queues.results_key(job_id),
        queues.rq_ids_key(job_id),
        queues.passes_key(job_id),
        queues.partial_key(job_id),
    ]


def status_of(record: dict[str, str]) -> JobStatus:
    return JobStatus(record["status"])


def total_usage(summaries: dict[int, dict]) -> Usage:
    totals: dict[str, int] = {}
    for summary in summaries.values():
        for name, value in summary.get("usage", {}).items():
            totals[name] = totals.get(name, 0) + value
    return Usage(**totals)


def load_view(r: Redis, job_id: str) -> JobView | None:
    record = load_job(r, job_id)
    if record is None:
        return None
    summaries = chunk_summaries(r, job_id)
    num_rows = record.get("num_rows")
    partial = {int(k): int(v) for k, v in r.hgetall(queues.partial_key(job_id)).items()}  # chunks in a pass
    progress = Progress(
        total=int(num_rows) if num_rows else None,
        done=sum(s["num_succeeded"] + s["num_failed"] for s in summaries.values())
        + sum(n for index, n in partial.items() if index not in summaries),
        failed=sum(s["num_failed"] for s in summaries.values()),
    )

    def stamp(name: str) -> int | None:
        return int(record[name]) if record.get(name) else None

    return JobView(
        id=job_id,
        model=record["model"],
        status=status_of(record),
        progress=progress,
        created_at=int(record["created_at"]),
        started_at=stamp("started_at"),
        finished_at=stamp("finished_at"),
        usage=total_usage(summaries),
        input=record.get("input") or None,
        output=record.get("output") or None,
        error=record.get("error") or None,
    )


def iter_inline_results(r: Redis, job_id: str, num_chunks: int):
    """The result rows of an inline job, chunk by chunk in order (JSONL bytes)."""
    for index in range(num_chunks):
        data = r.hget(queues.results_key(job_id), str(index))
        if data:
            yield data

"""Job records in Redis: the state a client sees, kept apart from RQ's per-chunk jobs.

    job hash (create_job, mark_running, set_plan, finish) -- status, timestamps, counts
    chunks hash: chunk index -> ChunkSummary (settle_chunk: first write wins)
    results hash: chunk index -> JSONL rows (inline jobs), passes set, done list (sync waiters)
      --> load_view: JobView (status, progress, usage); iter_inline_results

The steps that drive a job through these records are in `jobstore.lifecycle`. A chunk
settles once: its summary is written with HSETNX, so a chunk re-run after a dead worker
overwrites its results but never counts twice, and the queued-rows gauge (the backpressure
signal) drops by its rows exactly once. Records expire `ttl` seconds after the job ends (the
documented retention); a running job never expires.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import orjson
from redis import Redis

from contract import queues
from contract.payloads import JobStatus, JobView, Progress
from contract.scoring_results import Usage
from contract.s3_uri import S3Access

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

# drop a sync call's digest key (jobstore.sync_jobs) only while it still names this job
_RELEASE_ATTACH_LUA = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""

_ACTIVE = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)


@dataclass(frozen=True, slots=True)
class ChunkSummary:
    """What a settled chunk counted: its rows, how they ended, the usage of the scored ones.

    Stored as JSON in the chunks hash: `{num_rows, num_succeeded, num_failed, usage}`, plus
    `"cancelled": true` for a chunk that was never run (it has no `usage`)."""

    num_rows: int
    num_succeeded: int
    num_failed: int
    usage: dict[str, int] = field(default_factory=dict)  # Usage field name -> tokens or counts
    cancelled: bool = False  # settled by cancel: nothing was written for it

    @classmethod
    def for_cancelled(cls, num_rows: int) -> ChunkSummary:
        return cls(num_rows=num_rows, num_succeeded=0, num_failed=0, cancelled=True)

    @property
    def num_done(self) -> int:
        return self.num_succeeded + self.num_failed

    def to_dict(self) -> dict:
        counts = {"num_rows": self.num_rows, "num_succeeded": self.num_succeeded, "num_failed": self.num_failed}
        return counts | ({"cancelled": True} if self.cancelled else {"usage": self.usage})

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())

    @classmethod
    def from_json(cls, data: bytes) -> ChunkSummary:
        raw = orjson.loads(data)
        return cls(num_rows=raw["num_rows"], num_succeeded=raw["num_succeeded"], num_failed=raw["num_failed"],
                   usage=raw.get("usage", {}), cancelled=bool(raw.get("cancelled", False)))


def now() -> int:
    return int(time.time())


def create_job(r: Redis, job_id: str, fields: dict[str, str | int], pipe=None) -> None:
    """The job's record, queued; `pipe`: written with the pipeline (lifecycle: with its queue entries)."""
    record = {"id": job_id, "status": JobStatus.QUEUED.value, "created_at": now(), **fields}
    (pipe or r).hset(queues.job_key(job_id), mapping={k: str(v) for k, v in record.items()})


def load_job(r: Redis, job_id: str) -> dict[str, str] | None:
    raw = r.hgetall(queues.job_key(job_id))
    if not raw:
        return None
    return {k.decode(): v.decode() for k, v in raw.items()}


def s3_access_of(record: dict[str, str]) -> S3Access:
    """A dataset job's S3 grants (jobs recorded without them: their input and output only)."""
    if record.get("s3_access"):
        return S3Access.from_json(record["s3_access"])
    return S3Access.for_job(record.get("input"), record.get("output"))


def set_plan(r: Redis, job_id: str, num_rows: int, num_chunks: int) -> None:
    r.hset(queues.job_key(job_id), mapping={"num_rows": num_rows, "num_chunks": num_chunks})


def mark_running(r: Redis, job_id: str) -> bool:
    return bool(_transition(r, job_id, JobStatus.RUNNING, [JobStatus.QUEUED.value], "started_at"))


def _transition(r: Redis, job_id: str, to: JobStatus, from_states: list[str], stamp: str = "") -> int:
    script = r.register_script(_TRANSITION_LUA)
    return script(keys=[queues.job_key(job_id)], args=[to.value, stamp, *from_states])


def store_results(r: Redis, job_id: str, chunk_index: int, jsonl: bytes) -> None:
    r.hset(queues.results_key(job_id), str(chunk_index), jsonl)


def kept_chunks(r: Redis, job_id: str) -> set[int]:
    """The chunks whose rows are in the Redis results hash (every chunk of an inline job; the
    chunks of a dataset job that S3 could not take)."""
    return {int(index) for index in r.hkeys(queues.results_key(job_id))}


def stored_results(r: Redis, job_id: str, chunk_index: int) -> bytes | None:
    return r.hget(queues.results_key(job_id), str(chunk_index))


def add_passes(r: Redis, job_id: str, pass_names: list[str]) -> None:
    if pass_names:
        r.sadd(queues.passes_key(job_id), *pass_names)


def settle_chunk(r: Redis, job_id: str, chunk_index: int, summary: ChunkSummary) -> bool:
    """Record a chunk's summary once; True when this call settled it."""
    script = r.register_script(_SETTLE_LUA)
    keys = [queues.chunks_key(job_id), queues.QUEUED_ROWS_KEY]
    args = [str(chunk_index), summary.to_json(), summary.num_rows]
    return bool(script(keys=keys, args=args))


def chunk_summaries(r: Redis, job_id: str) -> dict[int, ChunkSummary]:
    raw = r.hgetall(queues.chunks_key(job_id))
    return {int(k): ChunkSummary.from_json(v) for k, v in raw.items()}


def is_complete(r: Redis, job_id: str) -> bool:
    record = load_job(r, job_id)
    if record is None or not record.get("num_chunks"):
        return record is not None and record.get("num_chunks") == "0"
    return r.hlen(queues.chunks_key(job_id)) >= int(record["num_chunks"])


def finish(r: Redis, job_id: str, status: JobStatus, ttl: int, error: str | None = None) -> bool:
    """Move an active job to a terminal status, start its retention clock, wake waiters, and
    stop identical sync calls from attaching to it."""
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
    attach_key = r.hget(queues.job_key(job_id), "attach_key")
    if attach_key:  # an identical call made from now on is a new job
        r.register_script(_RELEASE_ATTACH_LUA)(keys=[attach_key.decode()], args=[job_id])
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


def total_usage(summaries: dict[int, ChunkSummary]) -> Usage:
    totals: dict[str, int] = {}
    for summary in summaries.values():
        for name, value in summary.usage.items():
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
        done=sum(s.num_done for s in summaries.values())
        + sum(n for index, n in partial.items() if index not in summaries),
        failed=sum(s.num_failed for s in summaries.values()),
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
        route=record.get("route") or None,
    )


def iter_inline_results(r: Redis, job_id: str, num_chunks: int):
    """The result rows of an inline job, chunk by chunk in order (JSONL bytes)."""
    for index in range(num_chunks):
        data = r.hget(queues.results_key(job_id), str(index))
        if data:
            yield data

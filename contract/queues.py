"""Queue names and Redis keys: the one place that spells them.

    model "qwen2.5-coder-1.5b-instruct" -> QueuePair(sync="spinf:qwen2.5-coder-1.5b-instruct:sync",
                                                     batch="spinf:qwen2.5-coder-1.5b-instruct:batch")

One queue pair per served model: the sync (priority) queue carries `/v1/score` and chat
calls, the batch queue carries job chunks and dataset plans. A worker listens on the pairs
of the models it has loaded, sync first.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import orjson

PREFIX = "spinf"
QUEUED_ROWS_KEY = f"{PREFIX}:queued_rows"
"""Rows enqueued and not yet settled: the backpressure gauge (429 past `max_queue`)."""
WORKERS_KEY = f"{PREFIX}:workers"
"""Sorted set: worker name -> unix time of its last check-in."""
STATS_KEY = f"{PREFIX}:stats"
"""Hash of monotonic counters the workers bump (rows, passes, pass tokens) for /metrics."""
DEAD_CHUNKS_KEY = f"{PREFIX}:dead_chunks"
"""List of {payload, reason}: chunks RQ gave up on, waiting for a worker to settle them."""

CHUNK_FUNC = "workers.tasks.run_chunk"
PLAN_FUNC = "workers.tasks.run_plan"
FAILURE_CALLBACK = "workers.callbacks.on_chunk_failure"

_SAFE_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,80}")


@dataclass(frozen=True, slots=True)
class QueuePair:
    sync: str  # priority: synchronous calls, drained first
    batch: str  # job chunks and dataset plans


def model_slug(model: str) -> str:
    """A Redis-safe name: the model name itself, or a hash for paths and odd names."""
    if _SAFE_NAME_RE.fullmatch(model):
        return model
    return "m-" + hashlib.sha256(model.encode()).hexdigest()[:16]


def queue_pair(model: str) -> QueuePair:
    slug = model_slug(model)
    return QueuePair(sync=f"{PREFIX}:{slug}:sync", batch=f"{PREFIX}:{slug}:batch")


def job_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}"


def chunks_key(job_id: str) -> str:
    """Hash: chunk index -> settled chunk summary (first write wins)."""
    return f"{PREFIX}:job:{job_id}:chunks"


def results_key(job_id: str) -> str:
    """Hash: chunk index -> the chunk's result rows as JSONL (inline jobs; a retry overwrites)."""
    return f"{PREFIX}:job:{job_id}:results"


def partial_key(job_id: str) -> str:
    """Hash: chunk index -> rows of the chunk scored so far in the pass in hand (progress before it settles)."""
    return f"{PREFIX}:job:{job_id}:partial"


def rq_ids_key(job_id: str) -> str:
    """Set of the RQ job ids of a job's chunks and plan (for cancel)."""
    return f"{PREFIX}:job:{job_id}:rq"


def passes_key(job_id: str) -> str:
    """Set of `worker/pass_id` strings: the forward passes that served a job."""
    return f"{PREFIX}:job:{job_id}:passes"


def done_key(job_id: str) -> str:
    """List pushed once when a job settles: synchronous callers block on it."""
    return f"{PREFIX}:job:{job_id}:done"


def sync_call_key(digest: str) -> str:
    """String: a sync call's digest (key, route, model, body) -> the id of its job while it is active."""
    return f"{PREFIX}:sync:{digest}"


def idempotency_key(owner: str, key: str) -> str:
    digest = hashlib.sha256(f"{owner}\0{key}".encode()).hexdigest()
    return f"{PREFIX}:idem:{digest}"


def worker_key(name: str) -> str:
    return f"{PREFIX}:worker:{name}"


# ---- files and batches (jobstore/files.py, jobstore/batches.py) ----


def file_key(file_id: str) -> str:
    """Hash: a file's record (owner, filename, bytes, purpose, where its bytes are)."""
    return f"{PREFIX}:file:{file_id}"


def file_bytes_key(file_id: str) -> str:
    """String: the bytes of a file kept in Redis."""
    return f"{PREFIX}:file:{file_id}:bytes"


def batch_key(batch_id: str) -> str:
    """Hash: a batch's record (status, stamps, its job, its files, final counts)."""
    return f"{PREFIX}:batch:{batch_id}"


def batch_invalid_key(batch_id: str) -> str:
    """Hash: input line number -> the error of a line refused at validation (JSON)."""
    return f"{PREFIX}:batch:{batch_id}:invalid"


def batch_rows_key(batch_id: str) -> str:
    """Hash: chunk index -> {"lines", "custom_ids" of the chunk's rows, "bodies": their line bodies or null}."""
    return f"{PREFIX}:batch:{batch_id}:rows"


def batch_lease_key(batch_id: str) -> str:
    """Lock held while a batch is validated or finalized (a step not heard from is taken over)."""
    return f"{PREFIX}:batch:{batch_id}:lease"


def owner_index_key(kind: str, owner: str) -> str:
    """Sorted set: an owner's jobs, files or batches (`kind`), id -> creation time."""
    digest = hashlib.sha256(owner.encode()).hexdigest()[:32]
    return f"{PREFIX}:owner:{digest}:{kind}"


class JsonSerializer:
    """RQ serializer: JSON via orjson (never pickle: payloads cross trust boundaries)."""

    @staticmethod
    def dumps(obj: object) -> bytes:
        return orjson.dumps(obj)

    @staticmethod
    def loads(data: bytes) -> object:
        return orjson.loads(data)

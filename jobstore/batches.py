"""Batch records in Redis and their state machine; the Batch a client sees.

    create_batch (validating) --validated: set_job--> in_progress --job settled--> finalizing --> completed
              \\--no line to run / input gone--> failed
    validating | in_progress --cancel--> cancelling --rows settled, files written--> cancelled
    validating | in_progress --past expires_at, files written--> expired
    any status not ended --a step raised (api/batch_steps.py)--> failed

`transition` moves a batch only from the states listed for its target (WATCH/MULTI) and
stamps `<status>_at` once; a terminal status starts the retention clock (`result_ttl_s`).
While the job runs, `request_counts` and `usage` are read from it (`jobstore.records`); once
the files are written they are the batch's own. Which code runs each step: api/batch_steps.py.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import orjson
from redis import Redis
from redis.exceptions import WatchError

from contract import queues
from contract.batches import (
    COMPLETION_WINDOW_S,
    Batch,
    BatchCreate,
    BatchErrors,
    BatchList,
    BatchRequestCounts,
    BatchStatus,
    BatchUsage,
)
from contract.scoring_results import Usage
from jobstore import owner_index, records

S = BatchStatus
FROM_STATES: dict[BatchStatus, tuple[BatchStatus, ...]] = {
    S.IN_PROGRESS: (S.VALIDATING,),
    S.FAILED: (S.VALIDATING, S.IN_PROGRESS, S.FINALIZING, S.CANCELLING),  # later: a step that raised
    S.CANCELLING: (S.VALIDATING, S.IN_PROGRESS),
    S.FINALIZING: (S.IN_PROGRESS,),
    S.COMPLETED: (S.FINALIZING,),
    S.CANCELLED: (S.CANCELLING,),
    S.EXPIRED: (S.VALIDATING, S.IN_PROGRESS),
}
_JSON_FIELDS = ("metadata", "errors", "usage")


@dataclass(slots=True)
class BatchRecord:
    """The stored batch; `fields` is the Redis hash, decoded."""

    fields: dict[str, str]

    @property
    def id(self) -> str:
        return self.fields["id"]

    @property
    def status(self) -> BatchStatus:
        return BatchStatus(self.fields["status"])

    def get(self, name: str) -> str | None:
        return self.fields.get(name) or None

    def number(self, name: str) -> int | None:
        value = self.get(name)
        return int(value) if value is not None else None

    def json(self, name: str):
        value = self.get(name)
        return orjson.loads(value) if value is not None else None


def new_batch_id() -> str:
    return "batch_" + uuid.uuid4().hex


def job_id_of(batch_id: str) -> str:
    """The batch's job: one id per batch, so a validation run twice submits it once."""
    return "job-" + batch_id.removeprefix("batch_")


def create_batch(r: Redis, owner: str, body: BatchCreate, num_lines: int) -> BatchRecord:
    batch_id = new_batch_id()
    created_at = int(time.time())
    fields = {
        "id": batch_id, "owner": owner, "endpoint": body.endpoint, "input_file_id": body.input_file_id,
        "completion_window": body.completion_window, "created_at": created_at,
        "expires_at": created_at + COMPLETION_WINDOW_S, "status": S.VALIDATING.value, "num_lines": num_lines,
        "metadata": orjson.dumps(body.metadata).decode() if body.metadata is not None else "",
        "output_expires_after_s": body.output_expires_after.seconds if body.output_expires_after else "",
    }
    with r.pipeline() as pipe:
        pipe.hset(queues.batch_key(batch_id), mapping={k: str(v) for k, v in fields.items()})
        owner_index.add(r, owner_index.BATCHES, owner, batch_id, pipe=pipe)
        pipe.execute()
    return load_batch(r, batch_id)


def load_batch(r: Redis, batch_id: str, owner: str | None = None) -> BatchRecord | None:
    """None when there is no such batch (or, with `owner`, when another key owns it)."""
    raw = {k.decode(): v.decode() for k, v in r.hgetall(queues.batch_key(batch_id)).items()}
    if not raw or (owner is not None and raw["owner"] != owner):
        return None
    return BatchRecord(raw)


def update(r: Redis, batch_id: str, **fields) -> None:
    encoded = {k: orjson.dumps(v).decode() if k in _JSON_FIELDS else str(v) for k, v in fields.items()}
    r.hset(queues.batch_key(batch_id), mapping=encoded)


def transition(r: Redis, batch_id: str, to: BatchStatus, ttl_s: int, **fields) -> bool:
    """status := to (with `fields`), only from FROM_STATES[to]; True when this call moved it."""
    key = queues.batch_key(batch_id)

    def move(pipe) -> bool:
        current = pipe.hget(key, "status")
        if current is None or BatchStatus(current.decode()) not in FROM_STATES[to]:
            return False
        pipe.multi()
        encoded = {k: orjson.dumps(v).decode() if k in _JSON_FIELDS else str(v) for k, v in fields.items()}
        pipe.hset(key, mapping={"status": to.value, **encoded})
        pipe.hsetnx(key, to.stamp, int(time.time()))
        if to.is_terminal:
            for name in (key, queues.batch_invalid_key(batch_id), queues.batch_rows_key(batch_id)):
                pipe.expire(name, ttl_s)
        return True

    try:
        return r.transaction(move, key, value_from_callable=True)
    except WatchError:  # pragma: no cover - redis-py retries the callable itself
        return False


def batch_view(r: Redis, record: BatchRecord) -> Batch:
    """The Batch of the SDK: the record, with counts and usage read from its job while it runs."""
    f = record
    counts, usage = _final_counts(record)
    if counts is None:
        counts, usage = _live_counts(r, record)
    errors = f.json("errors")
    return Batch(
        id=f.id, completion_window=f.fields["completion_window"], created_at=int(f.fields["created_at"]),
        endpoint=f.fields["endpoint"], input_file_id=f.fields["input_file_id"], status=f.status,
        cancelled_at=f.number("cancelled_at"), cancelling_at=f.number("cancelling_at"),
        completed_at=f.number("completed_at"), error_file_id=f.get("error_file_id"),
        errors=BatchErrors(data=errors) if errors else None, expired_at=f.number("expired_at"),
        expires_at=f.number("expires_at"), failed_at=f.number("failed_at"), finalizing_at=f.number("finalizing_at"),
        in_progress_at=f.number("in_progress_at"), metadata=f.json("metadata"), model=f.get("model"),
        output_file_id=f.get("output_file_id"), request_counts=counts, usage=usage,
    )


def _final_counts(record: BatchRecord) -> tuple[BatchRequestCounts | None, BatchUsage | None]:
    if record.get("num_completed") is None:
        return None, None
    counts = BatchRequestCounts(total=int(record.fields["num_lines"]), completed=record.number("num_completed"),
                                failed=record.number("num_failed"))
    return counts, BatchUsage.model_validate(record.json("usage"))


def _live_counts(r: Redis, record: BatchRecord) -> tuple[BatchRequestCounts, BatchUsage]:
    total = int(record.fields["num_lines"])
    num_invalid = record.number("num_invalid") or 0
    view = records.load_view(r, record.fields["job_id"]) if record.get("job_id") else None
    if view is None:
        return BatchRequestCounts(total=total, completed=0, failed=num_invalid), batch_usage(Usage())
    progress = view.progress
    counts = BatchRequestCounts(total=total, completed=progress.done - progress.failed,
                                failed=num_invalid + progress.failed)
    return counts, batch_usage(view.usage)


def batch_usage(usage: Usage) -> BatchUsage:
    """input_tokens: every token read (content, questions, options, floors); output: slot tokens decoded."""
    num_input = usage.content_tokens + usage.question_tokens + usage.option_tokens + usage.floor_tokens
    return BatchUsage(input_tokens=num_input, output_tokens=usage.slot_tokens,
                      total_tokens=num_input + usage.slot_tokens)


def list_batches(r: Redis, owner: str, after: str | None, limit: int) -> tuple[BatchList, list[BatchRecord]]:
    """The owner's batches, newest first (and their records, for the steps a read may start)."""
    found = owner_index.page(r, owner_index.BATCHES, owner, after, limit, owner_index.records_exist(r, queues.batch_key))
    loaded = [record for batch_id in found.ids if (record := load_batch(r, batch_id)) is not None]
    return BatchList.of([batch_view(r, record) for record in loaded], found.has_more), loaded

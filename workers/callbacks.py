"""Chunks that will never run again still settle: every row gets an error row.

    RQ gives up on a chunk (worker died past `max_num_retries`, or its run kept raising)
      -> on_chunk_failure (RQ failure callback) -> DEAD_CHUNKS_KEY list in Redis
      -> a worker's maintenance -> settle_dead_chunk: error rows, summary, finalize

The callback runs inside whoever cleans RQ's registries and only touches Redis; the worker
that drains the list owns S3 and settings. No torch here.
"""

from __future__ import annotations

import orjson
from redis import Redis

from contract import queues
from contract.payloads import ChunkPayload, RowError
from contract.s3_uri import parse_s3_uri
from contract.settings import Settings
from jobstore import datasets
from jobstore.s3 import read_range
from workers.tasks import ChunkWork, RowSlot, settle_chunk

DEAD_CHUNKS_KEY = f"{queues.PREFIX}:dead_chunks"


def on_chunk_failure(job, connection: Redis, exc_type=None, exc_value=None, traceback=None) -> None:
    if job.retries_left and job.retries_left > 0:
        return  # RQ re-queues it; another worker finishes it
    payload = job.kwargs.get("payload", {})
    reason = f"the chunk failed on its last attempt ({exc_type.__name__ if exc_type else 'worker lost'})"
    connection.rpush(DEAD_CHUNKS_KEY, orjson.dumps({"payload": payload, "reason": reason}))


def drain_dead_chunks(r: Redis, s3, settings: Settings, worker_name: str) -> int:
    num_settled = 0
    while (entry := r.lindex(DEAD_CHUNKS_KEY, 0)) is not None:
        item = orjson.loads(entry)
        if "chunk_index" in item["payload"]:
            payload = ChunkPayload.model_validate(item["payload"])
            settle_dead_chunk(r, s3, settings, payload, item["reason"], worker_name)
        r.lrem(DEAD_CHUNKS_KEY, 1, entry)
        num_settled += 1
    return num_settled


def settle_dead_chunk(r: Redis, s3, settings: Settings, payload: ChunkPayload, reason: str, worker_name: str) -> None:
    """One error row per input row of a chunk that could not be scored."""
    if payload.source is None:  # inline items or batch requests
        rows = [RowSlot(item.custom_id, None) for item in payload.items or payload.requests]
    else:
        source = payload.source
        data = read_range(s3, parse_s3_uri(source.uri), source.start, source.end)
        rows = [_slot(line, raw) for line, raw in datasets.split_lines(data, source.first_line)]
    for slot in rows:
        slot.error = RowError(line=slot.line, custom_id=slot.custom_id, message=f"not scored: {reason}")
    settle_chunk(r, s3, settings, ChunkWork(payload, rows), worker_name)


def _slot(line: int, raw: bytes) -> RowSlot:
    item = datasets.parse_row(raw, line)
    return RowSlot(item.custom_id, line)

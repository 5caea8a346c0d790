"""A chunk's rows: read from its payload, written back as exactly one result row each.

    ChunkPayload --read_rows--> [RowSlot]: a ScoringRequest per good row, the RowError of a bad one
      (inline `items`, the lines of an S3 byte range through datasets.parse_row, or a batch's
      `requests`, each row its own request)
    ChunkPayload --unscored_rows(reason)--> [RowSlot]: every row an error (a chunk RQ gave up on)
    [RowSlot] (a response or an error each, pass ids)
      --write_rows--> Redis results hash (inline) | S3 results/ and errors/ objects (datasets)
      --keep_unwritten--> (S3 failed) every row an error row naming the failure, in the Redis results hash
      --summarize--> ChunkSummary    --pass_names--> "worker/pass_id" strings

No engine here: between reading and writing, the worker fills each slot's `response` or
`error` (workers.tasks.score_rows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
from redis import Redis

from contract.payloads import ChunkPayload, JobItem, RequestItem, RowError
from contract.protocol import ScoringRequest
from contract.s3_uri import S3Uri
from jobstore import datasets, records
from jobstore.records import ChunkSummary
from jobstore.s3 import delete_object, put_bytes, read_range


@dataclass(slots=True)
class RowSlot:
    custom_id: str | None
    line: int | None  # 1-based line in the input object (datasets)
    request: ScoringRequest | None = None
    error: RowError | None = None
    response: dict | None = None
    pass_ids: tuple[int, ...] = ()
    labels: list[str] | None = None  # the row's labels (a labelled job), carried into its result row
    on_scored: Callable[[], None] | None = None  # progress: told when the engine has built its response


@dataclass(slots=True)
class ChunkWork:
    payload: ChunkPayload
    rows: list[RowSlot] = field(default_factory=list)
    is_cancelled: bool = False


def read_rows(s3, payload: ChunkPayload) -> list[RowSlot]:
    """One slot per input row: with its request, or with the error that replaces its result."""
    if payload.requests is not None:  # batch rows: each line's own request, checked when the batch was validated
        return [RowSlot(row.custom_id, None, request=row.request) for row in payload.requests]
    rows = []
    for line, item in _read_items(s3, payload):
        if isinstance(item, RowError):
            rows.append(RowSlot(item.custom_id, line, error=item))
            continue
        slot = RowSlot(item.custom_id, line, labels=item.labels)
        try:
            slot.request = payload.request_for(item)
        except ValueError as error:  # pydantic's ValidationError is a ValueError
            slot.error = RowError(line=line, custom_id=item.custom_id, message=str(error))
        rows.append(slot)
    return rows


def unscored_rows(s3, payload: ChunkPayload, reason: str) -> list[RowSlot]:
    """One error row per input row of a chunk that could not be scored."""
    return [
        RowSlot(item.custom_id, line, error=RowError(line=line, custom_id=item.custom_id,
                                                     message=f"not scored: {reason}"))
        for line, item in _read_items(s3, payload)
    ]


def unread_rows(payload: ChunkPayload, reason: str) -> list[RowSlot]:
    """`num_rows` error rows for a chunk whose input cannot be read (no custom_id, no line)."""
    return [RowSlot(None, None, error=RowError(message=f"not scored: {reason}")) for _ in range(payload.num_rows)]


def keep_unwritten(r: Redis, payload: ChunkPayload, rows: list[RowSlot], reason: str) -> None:
    """A dataset chunk whose S3 objects could not be written: every row becomes an error row
    naming `reason`, stored in the Redis results hash (GET /results reads it there)."""
    for slot in rows:
        slot.response = None
        slot.error = RowError(line=slot.line, custom_id=slot.custom_id, message=f"not written: {reason}")
    records.store_results(r, payload.job_id, payload.chunk_index, datasets.to_jsonl(_row_bytes(s) for s in rows))


def _read_items(s3, payload: ChunkPayload) -> list[tuple[int | None, JobItem | RequestItem | RowError]]:
    if payload.items is not None or payload.requests is not None:  # inline items or batch requests
        return [(None, item) for item in payload.items or payload.requests]
    source = payload.source
    uri = payload.s3_access().check_read(S3Uri.from_stored(source.uri))
    data = read_range(s3, uri, source.start, source.end)
    return [(line, datasets.repeat_error(raw, line, source.repeats[line]) if line in source.repeats
             else datasets.parse_row(raw, line)) for line, raw in datasets.split_lines(data, source.first_line)]


def write_rows(r: Redis, s3, payload: ChunkPayload, rows: list[RowSlot]) -> None:
    """The chunk's result rows, in input order: in Redis for an inline job, else its S3 objects
    (a retry overwrites them)."""
    lines = [_row_bytes(slot) for slot in rows]
    if payload.output is None:
        records.store_results(r, payload.job_id, payload.chunk_index, datasets.to_jsonl(lines))
        return
    output, access = S3Uri.from_stored(payload.output), payload.s3_access()
    errors = [orjson.dumps(slot.error.model_dump(exclude_none=True)) for slot in rows if slot.error is not None]
    put_bytes(s3, access.check_write(datasets.results_uri(output, payload.chunk_index)), datasets.to_jsonl(lines))
    errors_uri = access.check_write(datasets.errors_uri(output, payload.chunk_index))
    if errors:
        put_bytes(s3, errors_uri, datasets.to_jsonl(errors))
    else:  # no errors object (an empty PUT stalls SeaweedFS's next request); a rerun's old one goes
        delete_object(s3, errors_uri)


def _row_bytes(slot: RowSlot) -> bytes:
    if slot.response is not None:
        return datasets.response_row(slot.custom_id, slot.response, slot.labels)
    return datasets.error_row(slot.custom_id, slot.error)


def summarize(rows: list[RowSlot]) -> ChunkSummary:
    usage: dict[str, int] = {}
    for slot in rows:
        for name, value in (slot.response or {}).get("usage", {}).items():
            usage[name] = usage.get(name, 0) + value
    num_failed = sum(slot.response is None for slot in rows)
    return ChunkSummary(num_rows=len(rows), num_succeeded=len(rows) - num_failed, num_failed=num_failed, usage=usage)


def pass_names(rows: list[RowSlot], worker_name: str) -> list[str]:
    """The forward passes that served these rows, named `worker/pass_id`."""
    return sorted({f"{worker_name}/{p}" for slot in rows for p in slot.pass_ids})

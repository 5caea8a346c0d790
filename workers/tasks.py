"""What a worker does with the RQ jobs it holds: load rows, score them together, settle chunks.

    ChunkPayload --load_chunk--> [RowSlot] --Engine.compile per row (the worker's count, else in
    score_rows)--> RowSlot.compiled --score_rows (one engine.score_batch for the batch)-->
    RowSlot.response | RowSlot.error --settle_chunk--> results (Redis or S3) + errors + summary
    last chunk settled --finalize_if_complete--> manifest (datasets) + job status succeeded
    PlanPayload --plan_dataset--> ChunkPayload x N on the batch queue

A bad row becomes an error row; an engine exception on a batch is retried row by row so it
costs only the rows that raise. `run_chunk` and `run_plan` are the RQ entry points (module
level, JSON payloads); the greedy loop in `workers.loop` calls the pieces below directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson
from botocore.exceptions import BotoCoreError, ClientError
from redis import Redis

from contract import queues
from contract.payloads import ChunkPayload, JobStatus, PlanPayload, RowError
from contract.protocol import ScoringRequest, ScoringResponse
from contract.s3_uri import parse_s3_uri
from contract.settings import Settings
from jobstore import datasets, records
from jobstore.s3 import get_bytes, iter_lines, list_keys, put_bytes, read_range
from jobstore.submit import enqueue_chunks

if TYPE_CHECKING:  # types only: loading a chunk needs no torch
    from engine import CompiledRequest, RequestError

PLAN_ENQUEUE_BATCH = 256  # chunk jobs per Redis round trip while planning


@dataclass(slots=True)
class RowSlot:
    custom_id: str | None
    line: int | None  # 1-based line in the input object (datasets)
    request: ScoringRequest | None = None
    compiled: CompiledRequest | RequestError | None = None  # Engine.compile(request), once compiled
    error: RowError | None = None
    response: dict | None = None
    pass_ids: tuple[int, ...] = ()


@dataclass(slots=True)
class ChunkWork:
    payload: ChunkPayload
    rows: list[RowSlot] = field(default_factory=list)
    is_cancelled: bool = False


def load_chunk(r: Redis, s3, payload: ChunkPayload) -> ChunkWork:
    record = records.load_job(r, payload.job_id)
    if record is None or records.status_of(record) == JobStatus.CANCELLED:
        return ChunkWork(payload, is_cancelled=True)
    records.mark_running(r, payload.job_id)
    if payload.items is not None:
        rows = [RowSlot(item.custom_id, None) for item in payload.items]
        items = payload.items
    else:
        source = payload.source
        data = read_range(s3, parse_s3_uri(source.uri), source.start, source.end)
        parsed = [(line, datasets.parse_row(raw, line)) for line, raw in datasets.split_lines(data, source.first_line)]
        rows = [_slot_for(line, item) for line, item in parsed]
        items = [item for _, item in parsed]
    for slot, item in zip(rows, items, strict=True):
        if slot.error is None:
            slot.request = _request_or_error(slot, item, payload)
    return ChunkWork(payload, rows)


def _slot_for(line: int, item) -> RowSlot:
    if isinstance(item, RowError):
        return RowSlot(item.custom_id, line, error=item)
    return RowSlot(item.custom_id, line)


def _request_or_error(slot: RowSlot, item, payload: ChunkPayload) -> ScoringRequest | None:
    try:
        return item.to_request(payload.scoring, payload.debug, payload.packs)
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        slot.error = RowError(line=slot.line, custom_id=slot.custom_id, message=str(error))
        return None


def score_rows(engine, rows: list[RowSlot], while_waiting=None) -> None:
    """Score every row that has a request, in one `score_batch` call when nothing raises; a
    row the worker did not count yet is compiled here. `while_waiting`: host work for the GPU
    waits of that call (Engine.score_batch)."""
    todo = [slot for slot in rows if slot.request is not None]
    if not todo:
        return
    try:
        output = engine.score_batch([_compiled(engine, slot) for slot in todo], while_waiting)
    except Exception:  # noqa: BLE001 - isolate the row that raises, keep the others
        for slot in todo:
            _score_alone(engine, slot)
        return
    for slot, result, pass_ids in zip(todo, output.results, output.pass_ids, strict=True):
        _fill(slot, result, pass_ids)


def _compiled(engine, slot: RowSlot) -> CompiledRequest | RequestError:
    if slot.compiled is None:
        slot.compiled = engine.compile(slot.request)
    return slot.compiled


def _score_alone(engine, slot: RowSlot) -> None:
    try:
        output = engine.score_batch([_compiled(engine, slot)])
    except Exception as error:  # noqa: BLE001 - one row's failure is that row's error
        slot.error = RowError(line=slot.line, custom_id=slot.custom_id, message=f"engine error: {error}")
        return
    _fill(slot, output.results[0], output.pass_ids[0])


def _fill(slot: RowSlot, result, pass_ids: tuple[int, ...]) -> None:
    slot.pass_ids = tuple(pass_ids)
    if isinstance(result, ScoringResponse):
        slot.response = result.model_dump(mode="json", exclude_none=True)
    else:  # engine.RequestError: which field, what to fix
        slot.error = RowError(line=slot.line, custom_id=slot.custom_id, field=result.field, message=result.message)


def settle_chunk(r: Redis, s3, settings: Settings, work: ChunkWork, worker_name: str) -> dict:
    """Write the chunk's rows, record its summary once, finish the job when it was the last."""
    payload = work.payload
    if work.is_cancelled:
        summary = {"num_rows": payload.num_rows, "num_succeeded": 0, "num_failed": 0, "cancelled": True}
        records.settle_chunk(r, payload.job_id, payload.chunk_index, summary)
        return summary
    lines = [_row_bytes(slot) for slot in work.rows]
    if payload.output is None:
        records.store_results(r, payload.job_id, payload.chunk_index, datasets.to_jsonl(lines))
    else:
        _write_s3_chunk(s3, payload, work.rows, lines)
    summary = _summary(work.rows)
    passes = sorted({f"{worker_name}/{p}" for slot in work.rows for p in slot.pass_ids})
    records.add_passes(r, payload.job_id, passes)
    records.settle_chunk(r, payload.job_id, payload.chunk_index, summary)
    finalize_if_complete(r, s3, settings, payload.job_id)
    return summary


def _row_bytes(slot: RowSlot) -> bytes:
    if slot.response is not None:
        return datasets.response_row(slot.custom_id, slot.response)
    return datasets.error_row(slot.custom_id, slot.error)


def _write_s3_chunk(s3, payload: ChunkPayload, rows: list[RowSlot], lines: list[bytes]) -> None:
    output = parse_s3_uri(payload.output)
    errors = [orjson.dumps(slot.error.model_dump(exclude_none=True)) for slot in rows if slot.error is not None]
    put_bytes(s3, datasets.results_uri(output, payload.chunk_index), datasets.to_jsonl(lines))
    put_bytes(s3, datasets.errors_uri(output, payload.chunk_index), datasets.to_jsonl(errors))


def _summary(rows: list[RowSlot]) -> dict:
    usage: dict[str, int] = {}
    for slot in rows:
        for name, value in (slot.response or {}).get("usage", {}).items():
            usage[name] = usage.get(name, 0) + value
    num_failed = sum(slot.response is None for slot in rows)
    return {"num_rows": len(rows), "num_succeeded": len(rows) - num_failed, "num_failed": num_failed, "usage": usage}


def finalize_if_complete(r: Redis, s3, settings: Settings, job_id: str) -> bool:
    """When every chunk settled: write the manifest (datasets), then mark the job succeeded."""
    if not records.is_complete(r, job_id):
        return False
    record = records.load_job(r, job_id)
    if record is None or records.status_of(record).is_terminal:
        return False
    if record.get("output"):
        output = parse_s3_uri(record["output"])
        manifest = datasets.build_manifest(job_id, record["input"], output, records.chunk_summaries(r, job_id))
        body = orjson.dumps(manifest, option=orjson.OPT_INDENT_2)
        put_bytes(s3, datasets.manifest_uri(output), body, "application/json")
    ttl = settings.sync_result_ttl_s if record.get("kind") == "sync" else settings.result_ttl_s
    return records.finish(r, job_id, JobStatus.SUCCEEDED, ttl)


def plan_dataset(r: Redis, s3, settings: Settings, payload: PlanPayload) -> dict:
    """List the input, cut it into chunks, enqueue them; S3 errors fail the job with a reason."""
    record = records.load_job(r, payload.job_id)
    if record is None or records.status_of(record) == JobStatus.CANCELLED:
        return {"cancelled": True}
    records.mark_running(r, payload.job_id)
    try:
        chunks, num_rows = _cut(s3, payload)
    except (ClientError, BotoCoreError) as error:
        records.finish(r, payload.job_id, JobStatus.FAILED, settings.result_ttl_s, f"reading the input: {error}")
        return {"error": str(error)}
    records.set_plan(r, payload.job_id, num_rows, len(chunks))
    # a re-run plan (its worker died) resumes after the chunks it already enqueued
    num_enqueued = int(record.get("num_enqueued") or 0)
    queue_name = queues.queue_pair(payload.model).batch
    for start in range(num_enqueued, len(chunks), PLAN_ENQUEUE_BATCH):
        enqueue_chunks(r, settings, chunks[start : start + PLAN_ENQUEUE_BATCH], queue_name)
        r.hset(queues.job_key(payload.job_id), "num_enqueued", min(start + PLAN_ENQUEUE_BATCH, len(chunks)))
    finalize_if_complete(r, s3, settings, payload.job_id)
    return {"num_rows": num_rows, "num_chunks": len(chunks)}


def _cut(s3, payload: PlanPayload) -> tuple[list[ChunkPayload], int]:
    input_prefix = parse_s3_uri(payload.input)
    keys = list_keys(s3, input_prefix)
    if not keys:
        raise ClientError({"Error": {"Code": "NoObjects", "Message": f"no objects under {payload.input}"}}, "List")
    chunks: list[ChunkPayload] = []
    for key in keys:
        uri = parse_s3_uri(f"s3://{input_prefix.bucket}/{key}")
        for source, num_rows in datasets.plan_chunks(uri, iter_lines(s3, uri), payload.chunk_num_rows):
            chunks.append(
                ChunkPayload(
                    job_id=payload.job_id, chunk_index=len(chunks), model=payload.model, scoring=payload.scoring,
                    debug=payload.debug, source=source, output=payload.output, num_rows=num_rows,
                    **({"packs": payload.packs} if payload.packs else {}),
                )
            )
    return chunks, sum(c.num_rows for c in chunks)


def read_manifest(s3, output_uri: str) -> dict:
    return orjson.loads(get_bytes(s3, datasets.manifest_uri(parse_s3_uri(output_uri))))


# ---- RQ entry points: what the job's func names; a plain `rq worker` can run them one by one ----


def run_chunk(payload: dict) -> dict:
    """Score one chunk on this process's engine (the greedy loop batches chunks instead)."""
    from rq import get_current_job

    from contract.settings import get_settings
    from jobstore.s3 import make_client
    from workers.engines import get_engine

    job = get_current_job()
    settings = get_settings()
    s3 = make_client(settings)
    work = load_chunk(job.connection, s3, ChunkPayload.model_validate(payload))
    if not work.is_cancelled:
        score_rows(get_engine(work.payload.model), work.rows)
    return settle_chunk(job.connection, s3, settings, work, job.worker_name or "rq")


def run_plan(payload: dict) -> dict:
    """List a dataset and enqueue its chunks."""
    from rq import get_current_job

    from contract.settings import get_settings
    from jobstore.s3 import make_client

    settings = get_settings()
    plan = PlanPayload.model_validate(payload)
    return plan_dataset(get_current_job().connection, make_client(settings), settings, plan)

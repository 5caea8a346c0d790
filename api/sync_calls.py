"""Synchronous scoring through the priority queue: submit one row (or attach to the identical
call's job), wait for it to settle.

    ScoringRequest + SyncCall(route, body) -> packs known? (422 naming the pack)
      -> jobstore.sync_jobs.submit_sync: the active job of an identical call (same key, route,
         model, body), else a new sync job (1 row, priority queue; 429 past max_queue)
      -> wait on the job's done list in slices under the socket timeout, until the deadline
      -> the row's response | 422 naming the engine's field | 504 with the job id
"""

from __future__ import annotations

import asyncio
import time

import orjson
from fastapi import Request
from pydantic import BaseModel

from api.errors import ApiError
from api.served import resolve_model
from contract import queues
from contract.payloads import JobCreate, JobItem, JobSpec
from contract.protocol import ScoringRequest
from contract.settings import ApiKey
from jobstore import records
from jobstore.connections import wait_for_element
from jobstore.sync_jobs import SyncCall, submit_sync
from prompt_packs.registry import PackRegistry, UnknownPackError


def sync_call(request: Request, body: BaseModel, reply_json: str = "") -> SyncCall:
    """The call being answered: its route and validated body (the attach digest), and what its reply needs."""
    return SyncCall(route=request.scope["route"].path, body_json=body.model_dump_json(), reply_json=reply_json)


async def score_sync(request: Request, key: ApiKey, body: ScoringRequest, call: SyncCall) -> dict:
    state = request.app.state
    settings = state.settings
    started = time.perf_counter()
    check_packs(state.packs, body)
    model = await asyncio.to_thread(resolve_model, state.redis, settings, body.model)
    spec = JobSpec(model=model, scoring=body.scoring, debug=body.debug, **({"packs": body.packs} if body.packs else {}))
    item = JobItem(custom_id="0", messages=body.messages)
    job_id, _ = await asyncio.to_thread(submit_sync, state.redis, settings, key.name, spec, item, call)
    settled = await wait_for_element(state.aredis, queues.done_key(job_id), settings.sync_timeout_s, settings)
    if settled is None:
        raise ApiError(504, f"not scored within {settings.sync_timeout_s}s; poll GET /v1/jobs/{job_id}, then"
                            f" GET /v1/jobs/{job_id}/results for this route's reply (the same call made again"
                            " while the job runs waits for the same job)",
                       job_id=job_id, headers={"x-should-retry": "false"})
    state.metrics.score_wait.observe(time.perf_counter() - started)
    rows = await state.aredis.hget(queues.results_key(job_id), "0")
    if rows is None:  # cancelled or expired before we read it
        record = await asyncio.to_thread(records.load_job, state.redis, job_id)
        raise ApiError(409, f"job {job_id} ended without a result ({record and record.get('status')})")
    row = orjson.loads(rows.splitlines()[0])
    if "error" in row:
        error = row["error"]
        raise ApiError(422, error["message"], param=error.get("field"), job_id=job_id)
    return row["response"]


def check_packs(registry: PackRegistry, body: ScoringRequest | JobCreate) -> None:
    """422 naming the first pack this service has not loaded (before anything is queued)."""
    for index, ref in enumerate(body.packs):
        try:
            registry.get(ref.id)
        except UnknownPackError as error:
            field = f"packs[{index}].id"
            raise ApiError(422, f"{field}: {error.message}", param=field) from None

"""Where a job's rows meet the engine, and the RQ entry points a plain `rq worker` can run.

    ChunkWork (jobstore.lifecycle.load_chunk) --Engine.compile per row (the worker's look-ahead,
      else in score_rows)--> --score_rows (one engine.score_batch for the batch)-->
      RowSlot.response | RowSlot.error --> jobstore.lifecycle.settle_chunk
    run_chunk(payload): load_chunk -> score_rows -> settle_chunk, one chunk on this process's engine
    run_plan(payload):  jobstore.lifecycle.plan_dataset

A bad row becomes an error row; an engine exception on a batch is retried row by row so it
costs only the rows that raise. `run_chunk` and `run_plan` are what the RQ jobs name
(contract/queues.py: module level, JSON payloads); the greedy loop in `workers.loop` calls
`score_rows` for the rows of many chunks at once instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING


from contract.payloads import ChunkPayload, PlanPayload, RowError
from contract.scoring_results import ScoringResponse
from jobstore import lifecycle
from jobstore.chunks import RowSlot
from workers.job_calibration import calibrate_finished_job

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # types only: the worker's command loads the engine
    from engine import CompiledRequest, RequestError


def score_rows(
    engine,
    rows: list[RowSlot],
    compiled: list[CompiledRequest | RequestError | None] | None = None,
    while_waiting=None,
    arrivals: Callable[[], list[tuple[RowSlot, CompiledRequest | RequestError]]] | None = None,
    refill: Callable[[], list[tuple[RowSlot, CompiledRequest | RequestError]]] | None = None,
) -> None:
    """Score every row that has a request, in one `score_batch` call when nothing raises.
    `compiled[i]`: row i as the worker's look-ahead compiled it (None, or no list: compiled
    here). `while_waiting`: host work for the GPU waits of that call (Engine.score_batch).
    `arrivals()`: rows that came while the batch runs (sync calls), each with its compiled
    request (`compile_row`), scored in the same call ahead of the rows not yet packed.
    `refill()`: rows to score next when none is left to pack (the worker's next jobs), the
    same way; the call goes on while it brings rows."""
    given = compiled if compiled is not None else [None] * len(rows)
    first = [(slot, done) for slot, done in zip(rows, given, strict=True) if slot.request is not None]
    if not first and arrivals is None and refill is None:
        return
    todo: list[RowSlot | None] = [slot for slot, _ in first]  # by the engine's index; None once told

    def on_result(index: int, result: ScoringResponse, pass_ids: tuple[int, ...]) -> None:
        slot = todo[index]  # filled as soon as the engine built it, then told (progress, sync)
        todo[index] = None  # let go: a call fed by `refill` may go on for hours
        _fill(slot, result, pass_ids)
        if slot.on_scored is not None:
            slot.on_scored()

    def joining(source):
        def joined() -> list[CompiledRequest | RequestError]:
            new = [(slot, done) for slot, done in source() if slot.request is not None]
            todo.extend(slot for slot, _ in new)
            return [done for _, done in new]
        return None if source is None else joined

    try:
        ready = [done if done is not None else engine.compile(slot.request) for slot, done in first]
        output = engine.score_batch(ready, while_waiting, on_result, joining(arrivals), joining(refill))
    except Exception:  # noqa: BLE001 - isolate the row that raises, keep the others
        log.exception("scoring a batch of %d rows raised: scoring the rows not yet scored one by one", len(todo))
        for slot in todo:
            if slot is not None and slot.response is None and slot.error is None:
                _score_alone(engine, slot, None)
        return
    for slot, result, pass_ids in zip(todo, output.results, output.pass_ids, strict=True):
        if slot is not None and slot.response is None and slot.error is None:  # not built before the last pass
            _fill(slot, result, pass_ids)


def compile_row(engine, slot: RowSlot) -> CompiledRequest | RequestError:
    """A row's request compiled (Engine.compile); compiling that raises is the row's error."""
    try:
        return engine.compile(slot.request)
    except Exception as error:  # noqa: BLE001 - one row's failure is that row's error
        from engine import RequestError  # the worker's command has loaded the engine

        return RequestError("messages", f"engine error: {error}")


def _score_alone(engine, slot: RowSlot, compiled: CompiledRequest | RequestError | None) -> None:
    try:
        output = engine.score_batch([compiled if compiled is not None else engine.compile(slot.request)])
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


# ---- RQ entry points: what the job's func names; a plain `rq worker` can run them one by one ----


def run_chunk(payload: dict) -> dict:
    """Score one chunk on this process's engine for its model, as the settings describe it
    (device, pass budget, prompt-pack folders); the greedy loop batches chunks instead."""
    from rq import get_current_job

    from contract.settings import get_settings
    from jobstore.s3 import make_client
    from workers.engines import engine_for

    job = get_current_job()
    settings = get_settings()
    s3 = make_client(settings)
    work = lifecycle.load_chunk(job.connection, s3, ChunkPayload.model_validate(payload))
    if not work.is_cancelled:
        score_rows(engine_for(work.payload.model, settings), work.rows)
    settled = lifecycle.settle_chunk(job.connection, s3, settings, work, job.worker_name or "rq", calibrate_finished_job)
    return settled.to_dict()


def run_plan(payload: dict) -> dict:
    """List a dataset and enqueue its chunks."""
    from rq import get_current_job

    from contract.settings import get_settings
    from jobstore.s3 import make_client

    settings = get_settings()
    plan = PlanPayload.model_validate(payload)
    return lifecycle.plan_dataset(get_current_job().connection, make_client(settings), settings, plan,
                                  calibrate_finished_job)

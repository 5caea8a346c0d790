"""The steps that move a batch, run by the API in the background under a lease.

    POST /v1/batches --> validate: read the input file once; each line -> a row of the job
                         (RequestItem) or an error line; rows submitted as one job -> in_progress
    any read (GET, list, cancel) --advance--> the step the batch waits for, when no one holds its lease:
        not yet validated                   -> validate
        past expires_at                     -> cancel its job, end as expired
        its job's rows all settled          -> finalize: output + error files -> completed | cancelled | expired
                                               (cancelled or expired: batch_p from the finished rows' priors)

A step holds `batch_lease_key` (a redis-py Lock of `step_lease_s`, extended as it goes); a
step whose API process died leaves the lease to expire and the next read starts it again.
Both steps are idempotent: the job id, the files' ids and every line id derive from the batch.

A line that cannot be checked (a body nested past what the checks can walk) is an error line
for its custom_id. A step that raises ends the batch `failed`, its job cancelled, with the
error in `errors` (`validation_failed` / `finalization_failed`), never left in its status;
only an outage (Redis unreachable, S3 unreachable or answering 5xx) leaves the step to the
next read.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import orjson
from botocore.exceptions import BotoCoreError, ClientError
from fastapi import BackgroundTasks
from redis import Redis
from redis.exceptions import LockError

from api.cancelled_results import cancelled_job_priors, with_priors
from api.errors import REDIS_UNAVAILABLE, ApiError
from api.line_endpoints import ENDPOINTS, BodyError, LineEndpoint
from api.served import resolve_model
from contract import queues
from contract.batches import BatchStatus
from contract.json_limits import MAX_JSON_DEPTH
from contract.payloads import RequestItem
from contract.protocol import ScoringRequest, ScoringSpec
from contract.settings import Settings
from jobstore import batches, files, records
from jobstore.batch_lines import LineCall, RefusedLine, parse_line, refuse
from jobstore.batch_output import write_outputs
from jobstore.batches import BatchRecord
from jobstore.lifecycle import cancel, submit_requests
from prompt_packs.registry import PackRegistry, UnknownPackError

log = logging.getLogger(__name__)
S = BatchStatus
LEASE_EVERY_LINES = 1000
MAX_SHOWN_ERRORS = 10  # line errors listed in `errors` of a batch that failed because no line could run
MAX_STEP_ERROR_CHARS = 1000  # the message of a step that raised, in `errors`


@dataclass(frozen=True, slots=True)
class Steps:
    """What the steps need of the app (its Redis, S3 client, settings and packs)."""

    r: Redis
    s3: object
    settings: Settings
    packs: PackRegistry


def steps_of(state) -> Steps:
    return Steps(state.redis, state.s3, state.settings, state.packs)


def advance(steps: Steps, record: BatchRecord, background: BackgroundTasks) -> None:
    """Start, in the background, the step this batch waits for (a read is the trigger)."""
    if record.status.is_terminal:
        return
    _expire_if_due(steps, record)
    if steps.r.exists(queues.batch_lease_key(record.id)):
        return  # a step is running (or died less than step_lease_s ago)
    if record.get("num_invalid") is None:
        background.add_task(validate, steps, record.id)
    elif _rows_settled(steps.r, batches.load_batch(steps.r, record.id)):
        background.add_task(finalize, steps, record.id)


def _expire_if_due(steps: Steps, record: BatchRecord) -> None:
    due = int(record.fields["expires_at"]) <= time.time()
    if due and record.status in (S.VALIDATING, S.IN_PROGRESS) and not record.get("ending"):
        batches.update(steps.r, record.id, ending="expired")
        if record.get("job_id"):
            cancel(steps.r, steps.settings, record.fields["job_id"])


def _rows_settled(r: Redis, record: BatchRecord) -> bool:
    if record.status not in (S.IN_PROGRESS, S.FINALIZING, S.CANCELLING) and not record.get("ending"):
        return False
    job_id = record.get("job_id")
    if job_id is None:
        return True  # cancelled or expired before its job was submitted
    job = records.load_job(r, job_id)
    return job is None or (records.status_of(job).is_terminal and records.is_complete(r, job_id))


@contextlib.contextmanager
def _lease(steps: Steps, batch_id: str):
    lock = steps.r.lock(queues.batch_lease_key(batch_id), timeout=steps.settings.step_lease_s)
    if not lock.acquire(blocking=False):
        yield None
        return
    try:
        yield lock
    finally:
        with contextlib.suppress(LockError):  # expired and taken over: the other step finishes it
            lock.release()


# ---- validation ----------------------------------------------------------------------------


class _LineChecker:
    """Line -> (call, request for the job) | RefusedLine; one model per batch (its first line's)."""

    def __init__(self, steps: Steps, endpoint: LineEndpoint) -> None:
        self.steps = steps
        self.endpoint = endpoint
        self.seen: set[str] = set()
        self.resolved: dict[str | None, str | ApiError] = {}
        self.model: str | None = None
        self.specs: dict[bytes, ScoringSpec] = {}  # a batch's lines mostly ask the same questions

    def check(self, line: int, raw: bytes) -> tuple[LineCall, ScoringRequest] | RefusedLine:
        call = parse_line(line, raw, self.endpoint.url, self.seen)
        if isinstance(call, RefusedLine):
            return call
        try:
            return self._check_call(call)
        except (RecursionError, orjson.JSONEncodeError) as error:  # a body nested past what a check walks
            return refuse(line, call.custom_id, "invalid_body", f"body: nested too deeply to check ({error});"
                          f" no field of a request nests deeper than {MAX_JSON_DEPTH} levels", "body")

    def _check_call(self, call: LineCall) -> tuple[LineCall, ScoringRequest] | RefusedLine:
        line = call.line
        try:
            request = self.endpoint.to_request(self._shared_scoring(call.body), self.steps.settings)
        except BodyError as error:
            return refuse(line, call.custom_id, "invalid_body", error.message, f"body.{error.param}")
        for index, ref in enumerate(request.packs):
            try:
                self.steps.packs.get(ref.id)
            except UnknownPackError as error:
                return refuse(line, call.custom_id, "invalid_body", error.message, f"body.packs[{index}].id")
        model = self._resolve(request.model)
        if isinstance(model, ApiError):
            return refuse(line, call.custom_id, "model_not_found", str(model.detail), "body.model")
        self.model = self.model or model
        if model != self.model:
            return refuse(line, call.custom_id, "model_mismatch",
                          f"this batch runs on {self.model!r} (its first request's model); one model per batch",
                          "body.model")
        return call, request.model_copy(update={"model": None})  # the job's queue names the model

    def _shared_scoring(self, body: dict) -> dict:
        """The body with its `scoring` as the ScoringSpec validated for an earlier line with the same
        JSON (a spec that does not validate is left for the endpoint to refuse, naming its field)."""
        spec = body.get("scoring")
        if not self.endpoint.shares_scoring or not isinstance(spec, dict):
            return body
        try:
            key = orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:  # nested past orjson's depth: the endpoint refuses it, naming the field
            return body
        if key not in self.specs:
            try:
                self.specs[key] = ScoringSpec.model_validate(spec)
            except ValueError:
                return body
        return body | {"scoring": self.specs[key]}

    def _resolve(self, name: str | None) -> str | ApiError:
        if name not in self.resolved:
            try:
                self.resolved[name] = resolve_model(self.steps.r, self.steps.settings, name)
            except ApiError as error:
                self.resolved[name] = error
        return self.resolved[name]


def validate(steps: Steps, batch_id: str) -> None:
    """Read the input once: error lines and the job's rows stored, then the job submitted."""
    with _lease(steps, batch_id) as lease:
        if lease is None:
            return
        with _failed_if_raised(steps, batch_id, "validation"):
            _validate_held(steps, batch_id, lease)


def _validate_held(steps: Steps, batch_id: str, lease) -> None:
    record = batches.load_batch(steps.r, batch_id)
    if record is None or record.status.is_terminal:
        return
    stored = files.load_file(steps.r, record.fields["input_file_id"])
    if stored is None:
        _fail(steps, record, "file_not_found", "the input file was deleted or expired before validation")
        return
    rows, num_lines = _check_lines(steps, record, stored, lease)
    if num_lines != stored.num_lines:
        _fail(steps, record, "file_changed", f"read {num_lines} of the input's {stored.num_lines} lines:"
              " the file was deleted during validation")
        return
    _start_job(steps, batches.load_batch(steps.r, batch_id), rows)


def is_outage(error: Exception) -> bool:
    """Redis unreachable, S3 unreachable or answering 5xx / throttling: the next read runs the step again."""
    if isinstance(error, (*REDIS_UNAVAILABLE, BotoCoreError)):
        return True
    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 500
        return status >= 500 or status == 429 or error.response.get("Error", {}).get("Code") == "SlowDown"
    return False


@contextlib.contextmanager
def _failed_if_raised(steps: Steps, batch_id: str, step: str):
    """A step that raises ends the batch failed, naming the error (an outage leaves it to the next read)."""
    try:
        yield
    except Exception as error:
        if is_outage(error):
            log.warning("batch %s: %s stopped by an outage, the next read runs it again: %s", batch_id, step, error)
            return
        log.exception("batch %s: %s raised; the batch ends failed", batch_id, step)
        record = batches.load_batch(steps.r, batch_id)
        if record is None or record.status.is_terminal:
            return
        if record.get("job_id"):
            cancel(steps.r, steps.settings, record.fields["job_id"])
        message = f"the batch's {step} raised {type(error).__name__}: {error}"
        errors = [{"code": f"{step}_failed", "message": message[:MAX_STEP_ERROR_CHARS]}]
        batches.transition(steps.r, batch_id, S.FAILED, steps.settings.result_ttl_s, errors=errors,
                           num_invalid=record.get("num_invalid") or 0)


def _check_lines(steps: Steps, record: BatchRecord, stored, lease) -> tuple[list[RequestItem], int]:
    endpoint = ENDPOINTS[record.fields["endpoint"]]
    checker = _LineChecker(steps, endpoint)
    invalid: dict[int, bytes] = {}
    rows: list[RequestItem] = []
    lines: list[int] = []
    bodies: list[dict] = []
    num_lines = 0
    for num_lines, (line, raw) in enumerate(files.iter_lines(steps.r, steps.s3, stored), start=1):
        if num_lines % LEASE_EVERY_LINES == 0:
            lease.extend(steps.settings.step_lease_s, replace_ttl=True)
        checked = checker.check(line, raw)
        if isinstance(checked, RefusedLine):
            invalid[line] = orjson.dumps({"custom_id": checked.custom_id,
                                          "error": checked.error.model_dump(exclude_none=True)})
            continue
        call, request = checked
        rows.append(RequestItem(custom_id=call.custom_id, request=request))
        lines.append(line)
        bodies.append(call.body)
    size = steps.settings.chunk_num_rows
    chunks = {
        str(index): orjson.dumps({"lines": lines[start : start + size],
                                  "custom_ids": [row.custom_id for row in rows[start : start + size]],
                                  "bodies": bodies[start : start + size] if endpoint.reads_body else None})
        for index, start in enumerate(range(0, len(rows), size))
    }
    with steps.r.pipeline() as pipe:
        pipe.delete(queues.batch_invalid_key(record.id), queues.batch_rows_key(record.id))
        if invalid:
            pipe.hset(queues.batch_invalid_key(record.id), mapping=invalid)
        if chunks:
            pipe.hset(queues.batch_rows_key(record.id), mapping=chunks)
        pipe.hset(queues.batch_key(record.id), mapping={"num_invalid": len(invalid), "model": checker.model or ""})
        pipe.execute()
    return rows, num_lines


def _start_job(steps: Steps, record: BatchRecord, rows: list[RequestItem]) -> None:
    if record.status is not S.VALIDATING or record.get("ending"):
        _finalize_held(steps, record)  # cancelled (or expired) while it was validated: every row not run
        return
    if not rows:
        _fail_all_refused(steps, record)
        return
    job_id = batches.job_id_of(record.id)
    batches.update(steps.r, record.id, job_id=job_id)
    if not steps.r.exists(queues.rq_ids_key(job_id)):  # a validation run twice submits once
        submit_requests(steps.r, steps.settings, record.fields["owner"], record.fields["model"], rows, job_id,
                        record.id)
    ttl = steps.settings.result_ttl_s
    if not batches.transition(steps.r, record.id, S.IN_PROGRESS, ttl):
        cancel(steps.r, steps.settings, job_id)  # cancelled between the check and the submit


def _fail(steps: Steps, record: BatchRecord, code: str, message: str) -> None:
    errors = [{"code": code, "message": message, "param": "input_file_id"}]
    batches.transition(steps.r, record.id, S.FAILED, steps.settings.result_ttl_s, errors=errors, num_invalid=0)


def _fail_all_refused(steps: Steps, record: BatchRecord) -> None:
    """No line can run: failed, with the first line errors shown and every line in the error file."""
    outputs = _write(steps, record, "batch_cancelled")
    raw = steps.r.hgetall(queues.batch_invalid_key(record.id))
    shown = [orjson.loads(raw[key])["error"] for key in sorted(raw, key=int)[:MAX_SHOWN_ERRORS]]
    batches.transition(steps.r, record.id, S.FAILED, steps.settings.result_ttl_s, errors=shown,
                       **_final_fields(outputs))


# ---- finalization --------------------------------------------------------------------------


def finalize(steps: Steps, batch_id: str) -> None:
    with _lease(steps, batch_id) as lease:
        if lease is None:
            return
        with _failed_if_raised(steps, batch_id, "finalization"):
            record = batches.load_batch(steps.r, batch_id)
            if record is not None and not record.status.is_terminal and _rows_settled(steps.r, record):
                _finalize_held(steps, record)


def _finalize_held(steps: Steps, record: BatchRecord) -> None:
    """Write the files, then end the batch: completed, cancelled or expired."""
    ttl = steps.settings.result_ttl_s
    if record.get("ending") == "expired":
        target, not_run = S.EXPIRED, "batch_expired"
    elif record.status is S.CANCELLING:
        target, not_run = S.CANCELLED, "batch_cancelled"
    else:
        batches.transition(steps.r, record.id, S.FINALIZING, ttl)
        target, not_run = S.COMPLETED, "batch_cancelled"
    outputs = _write(steps, record, not_run)
    batches.transition(steps.r, record.id, target, ttl, **_final_fields(outputs))


def _write(steps: Steps, record: BatchRecord, not_run: str):
    endpoint = ENDPOINTS[record.fields["endpoint"]]
    fields = batches.load_batch(steps.r, record.id).fields
    priors = cancelled_job_priors(steps.r, fields.get("job_id"))  # cancelled or expired: its finished rows'

    def respond(body: dict | None, response: dict) -> dict:
        return endpoint.to_body(body, with_priors(response, priors), steps.settings)

    return write_outputs(steps.r, steps.s3, steps.settings, fields, respond, not_run)


def _final_fields(outputs) -> dict:
    fields = {"num_completed": outputs.num_completed, "num_failed": outputs.num_failed,
              "usage": batches.batch_usage(outputs.usage).model_dump()}
    return fields | {name: value for name in ("output_file_id", "error_file_id")
                     if (value := getattr(outputs, name)) is not None}

"""A batch's output and error files, from its job's result rows and the lines refused at validation.

    rows hash (chunk -> input line numbers, custom_ids [+ bodies]) + job results (chunk -> JSONL rows, in order)
    + invalid hash (line -> LineError)
      --write_outputs, chunk by chunk, in input order-->
        output file: {"id", "custom_id", "response": {"status_code": 200, "request_id", "body"}, "error": null}
        error file:  refused at validation  -> "response": null, "error": {code, message, param, line}
                     refused by the engine  -> "response": {"status_code": 422, "body": {"error": ...}}
                     not run (cancel, expiry: the chunk has no results) -> "error": {code: batch_cancelled | batch_expired}

`respond(body, response)` is the endpoint's translator (api/line_endpoints.py): the job store
never imports it. Ids are derived from the batch and the line, and the files' ids from the
batch, so writing the files again (a finalization taken over) rewrites the same objects.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

import orjson
from redis import Redis

from contract import queues
from contract.batches import BatchOutputLine, LineError, LineResponse
from contract.scoring_results import Usage
from contract.settings import Settings
from jobstore import files

Respond = Callable[[dict | None, dict], dict]  # (line body or None, scoring response JSON) -> response body
SPOOL_BYTES = 8 << 20
NOT_RUN = {"batch_cancelled": "not run: the batch was cancelled first",
           "batch_expired": "not run: the batch's 24h completion window ended first"}


@dataclass(slots=True)
class Outputs:
    output_file_id: str | None
    error_file_id: str | None
    num_completed: int = 0
    num_failed: int = 0
    usage: Usage = field(default_factory=Usage)


def line_ids(batch_id: str, line: int) -> tuple[str, str]:
    """(output line id, request id) of an input line: the same on every write."""
    digest = hashlib.sha256(f"{batch_id}\0{line}".encode()).hexdigest()
    return "batch_req_" + digest[:32], "req_" + digest[32:]


class _Writer:
    """Two spooled JSONL files, the invalid lines merged into the error file in input order."""

    def __init__(self, batch_id: str, invalid: dict[int, dict], output: BinaryIO, errors: BinaryIO) -> None:
        self.batch_id = batch_id
        self.output = output
        self.errors = errors
        self.pending = sorted(invalid.items())  # (line, {custom_id, error})
        self.outputs = Outputs(None, None)

    def scored(self, line: int, custom_id: str, body: dict, usage: dict) -> None:
        self._flush_invalid(line)
        line_id, request_id = line_ids(self.batch_id, line)
        out = BatchOutputLine(id=line_id, custom_id=custom_id,
                              response=LineResponse(status_code=200, request_id=request_id, body=body))
        self.output.write(out.model_dump_json().encode() + b"\n")
        self.outputs.num_completed += 1
        for name, value in usage.items():
            setattr(self.outputs.usage, name, getattr(self.outputs.usage, name) + value)

    def failed(self, line: int, custom_id: str | None, response: LineResponse | None, error: LineError | None) -> None:
        self._flush_invalid(line)
        self._error_line(line, custom_id, response, error)

    def _error_line(self, line: int, custom_id: str | None, response: LineResponse | None, error: LineError | None):
        line_id, _ = line_ids(self.batch_id, line)
        out = BatchOutputLine(id=line_id, custom_id=custom_id, response=response, error=error)
        self.errors.write(out.model_dump_json().encode() + b"\n")
        self.outputs.num_failed += 1

    def finish(self) -> None:
        """The invalid lines after the last row."""
        self._flush_invalid(None)

    def _flush_invalid(self, before: int | None) -> None:
        while self.pending and (before is None or self.pending[0][0] < before):
            line, refused = self.pending.pop(0)
            self._error_line(line, refused["custom_id"], None, LineError.model_validate(refused["error"]))


def write_outputs(r: Redis, s3, settings: Settings, fields: dict[str, str], respond: Respond,
                  not_run_code: str = "batch_cancelled") -> Outputs:
    """Write the batch's files (each only when it has a line) and return their ids and counts."""
    batch_id = fields["id"]
    invalid = {int(k): orjson.loads(v) for k, v in r.hgetall(queues.batch_invalid_key(batch_id)).items()}
    with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as output, tempfile.SpooledTemporaryFile(SPOOL_BYTES) as errors:
        writer = _Writer(batch_id, invalid, output, errors)
        _write_rows(r, writer, fields, respond, not_run_code)
        writer.finish()
        outputs = writer.outputs
        outputs.output_file_id = _store(r, s3, settings, fields, output, "output")
        outputs.error_file_id = _store(r, s3, settings, fields, errors, "error")
    return outputs


def _write_rows(r: Redis, writer: _Writer, fields: dict[str, str], respond: Respond, not_run_code: str) -> None:
    rows = r.hgetall(queues.batch_rows_key(fields["id"]))
    job_id = fields.get("job_id") or None
    for index in range(len(rows)):
        meta = orjson.loads(rows[str(index).encode()])
        results = r.hget(queues.results_key(job_id), str(index)) if job_id else None
        if results is None:
            for line, custom_id in zip(meta["lines"], meta["custom_ids"], strict=True):
                writer.failed(line, custom_id, None, LineError(code=not_run_code, message=NOT_RUN[not_run_code]))
            continue
        bodies = meta["bodies"] or [None] * len(meta["lines"])
        for line, body, raw in zip(meta["lines"], bodies, results.splitlines(), strict=True):
            _write_row(writer, line, body, orjson.loads(raw), respond)


def _write_row(writer: _Writer, line: int, body: dict | None, row: dict, respond: Respond) -> None:
    custom_id = row["custom_id"]
    _, request_id = line_ids(writer.batch_id, line)
    if "response" in row:
        try:
            translated = respond(body, row["response"])
        except Exception as error:  # noqa: BLE001 - a translator bug costs its line, never the batch
            writer.failed(line, custom_id, None, LineError(code="internal_error", message=f"translating: {error}"))
            return
        writer.scored(line, custom_id, translated, row["response"].get("usage", {}))
        return
    error = row["error"]
    status = 422 if error.get("field") else 500  # the engine named a field to fix, or the row could not run
    kind = "invalid_request_error" if status == 422 else "api_error"
    payload = {"error": {"message": error["message"], "type": kind, "param": error.get("field"), "code": status}}
    writer.failed(line, custom_id, LineResponse(status_code=status, request_id=request_id, body=payload), None)


def _store(r: Redis, s3, settings: Settings, fields: dict[str, str], spool, kind: str) -> str | None:
    if spool.tell() == 0:
        return None
    spool.seek(0)
    batch_id = fields["id"]
    file_id = "file-" + hashlib.sha256(f"{batch_id}\0{kind}".encode()).hexdigest()[:32]
    expires_after = fields.get("output_expires_after_s") or None
    expires_at = int(time.time()) + int(expires_after) if expires_after else None  # anchor: the file's creation
    stored = files.store_file(r, s3, settings, fields["owner"], f"{batch_id}_{kind}.jsonl", "batch_output", spool,
                              expires_at=expires_at, file_id=file_id)
    return stored.object.id

"""A job's calibration when its last chunk settles: batch columns, priors, the labelled report.

    every chunk's result rows (Redis for inline jobs, S3 results/part-*.jsonl for datasets)
      --prompt_packs.job_calibration.job_priors(queries that asked "batch")--> priors
      --with_batch_columns--> the same chunks rewritten, batch_p beside p
      --> job hash field `batch_priors` (JSON: what a later call may reuse)
    rows carrying `labels` --job_report--> inline: job hash field `calibration_report` (JSON);
                                          datasets: <output>/calibration/report.{json,md} + PNGs

Runs before the job is marked succeeded, so a client never sees a finished job without its
columns; rows read while the job runs carry raw values only. A cancelled job never gets here:
the API adds its columns to the rows it returns (api/cancelled_results.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import orjson
from redis import Redis

from contract import queues
from contract.s3_uri import S3Uri
from jobstore import datasets, records
from jobstore.s3 import get_bytes, put_bytes
from prompt_packs.job_calibration import (
    job_priors,
    job_report,
    with_batch_columns,
    write_job_report,
)


def _read_chunks(r: Redis, s3, job_id: str, record: dict, num_chunks: int) -> dict[int, list[dict]]:
    chunks = {}
    kept = records.kept_chunks(r, job_id)  # inline chunks, and dataset chunks S3 could not take
    for index in range(num_chunks):
        if record.get("output") and index not in kept:
            uri = datasets.results_uri(S3Uri.from_stored(record["output"]), index)
            data = get_bytes(s3, records.s3_access_of(record).check_read_back(uri))
        else:
            data = r.hget(queues.results_key(job_id), str(index)) or b""
        chunks[index] = [orjson.loads(line) for line in data.splitlines() if line.strip()]
    return chunks


def _write_chunk(r: Redis, s3, job_id: str, record: dict, index: int, rows: list[dict]) -> None:
    body = datasets.to_jsonl(orjson.dumps(row) for row in rows)
    if record.get("output") and not r.hexists(queues.results_key(job_id), str(index)):
        uri = datasets.results_uri(S3Uri.from_stored(record["output"]), index)
        put_bytes(s3, records.s3_access_of(record).check_write(uri), body)
    else:
        r.hset(queues.results_key(job_id), str(index), body)


def calibrate_finished_job(r: Redis, s3, job_id: str, record: dict) -> None:
    num_chunks = int(record.get("num_chunks") or 0)
    chunks = _read_chunks(r, s3, job_id, record, num_chunks)
    every = [row for rows in chunks.values() for row in rows]
    priors = job_priors(every, batch_only=True)
    if priors:
        for index, rows in chunks.items():
            chunks[index] = with_batch_columns(rows, priors)
            _write_chunk(r, s3, job_id, record, index, chunks[index])
        r.hset(queues.job_key(job_id), "batch_priors", orjson.dumps(priors))
    labels = {row["custom_id"]: row["labels"] for row in every if row.get("labels") is not None}
    if labels:
        _write_report(r, s3, job_id, record, job_report(every, labels, job_priors(every)))


def _write_report(r: Redis, s3, job_id: str, record: dict, report: dict) -> None:
    with tempfile.TemporaryDirectory() as folder:
        written = write_job_report(Path(folder), report)
        if record.get("output"):
            output, access = S3Uri.from_stored(record["output"]), records.s3_access_of(record)
            for path in written:
                kind = {"json": "application/json", "md": "text/markdown", "png": "image/png"}[path.suffix[1:]]
                put_bytes(s3, access.check_write(output.join(f"calibration/{path.name}")), path.read_bytes(), kind)
        else:
            r.hset(queues.job_key(job_id), "calibration_report", written[0].read_bytes())

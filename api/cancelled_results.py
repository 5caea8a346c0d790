"""A cancelled job's finished rows, returned with `batch_p` from their own priors.

    the job's result chunks (JSONL bytes, in input order), read twice:
      pass 1 --PriorSums(batch_only)--> priors: per (query, combination) of the queries that
                                        asked calibrate "batch", the mean p over the answered rows
      pass 2 --with_batch_columns--> each row with batch_p beside p, streamed
    GET /v1/jobs/{id}/results of a cancelled job    -> `own_batch_columns`
    a cancelled or expired batch's output file      -> `cancelled_job_priors` + `with_priors`

A job that succeeds gets its columns from the worker when its last chunk settles
(workers/job_calibration.py). A cancelled job never finalizes there, and chunks that were in
a pass when it was cancelled still settle afterwards, so its columns are computed from the
rows each read returns: the priors are always those of exactly the rows in the reply. Its
stored rows (Redis, or a dataset's results/part-*.jsonl on S3) keep raw values only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import orjson
from botocore.exceptions import BotoCoreError, ClientError
from redis import Redis

from api.errors import ApiError
from contract.payloads import JobStatus
from jobstore import records
from prompt_packs.job_calibration import PriorSums, with_batch_columns

ReadChunks = Callable[[], Iterable[bytes]]  # the job's result chunks, from the start, on every call


def _rows(chunk: bytes) -> list[dict]:
    return [orjson.loads(line) for line in chunk.splitlines() if line.strip()]


def priors_of(chunks: Iterable[bytes]) -> dict[str, list[float]]:
    """Pass 1: the priors of the queries that asked calibrate "batch", over these rows."""
    sums = PriorSums(batch_only=True)
    for chunk in chunks:
        sums.add(_rows(chunk))
    return sums.priors()


def own_batch_columns(read: ReadChunks, retry_after_s: int) -> Iterator[bytes]:
    """The chunks of `read()` with batch_p from the priors of all their rows (unchanged when no
    query asked for it). Pass 1 runs before the response starts: an S3 outage is a 503."""
    try:
        priors = priors_of(read())
    except (ClientError, BotoCoreError) as error:
        raise ApiError(503, f"the results cannot be read from S3 now ({error}); try again",
                       headers={"Retry-After": str(retry_after_s)}) from None
    if not priors:
        return iter(read())
    return (b"".join(orjson.dumps(row) + b"\n" for row in with_batch_columns(_rows(chunk), priors))
            for chunk in read())


def cancelled_job_priors(r: Redis, job_id: str | None) -> dict[str, list[float]] | None:
    """The priors over a cancelled job's stored rows (a batch's job keeps them in Redis); None
    for a job that is not cancelled or whose queries asked no batch calibration."""
    record = records.load_job(r, job_id) if job_id else None
    if record is None or records.status_of(record) != JobStatus.CANCELLED:
        return None
    num_chunks = int(record.get("num_chunks") or 0)
    return priors_of(records.iter_inline_results(r, job_id, num_chunks)) or None


def with_priors(response: dict, priors: dict[str, list[float]] | None) -> dict:
    """One scoring response with batch_p from `priors` (as it is, without priors)."""
    return response if not priors else with_batch_columns([{"response": response}], priors)[0]["response"]

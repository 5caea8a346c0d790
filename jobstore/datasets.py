"""Datasets on S3: rows, chunks, deterministic output keys, errors objects, manifests.

    s3://in/ objects --plan_chunks--> [ByteRange] (chunk_num_rows rows each, never across objects)
    ByteRange bytes --split_lines--> [(line, bytes)] --parse_row--> JobItem | RowError
    chunk i --> {output}results/part-{i:05d}.jsonl  one row per input row, in input order
            --> {output}errors/part-{i:05d}.jsonl   one line per bad row (line, custom_id, message);
                                                    none for a chunk without one
    all chunks settled --> {output}manifest.json    counts and object keys

Output keys depend only on the input (sorted object keys, chunk size), never on the job id
or the attempt: a retry or a rerun overwrites the same objects instead of adding new ones.
A blank line is not a row; every other line yields exactly one output row.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import orjson
from pydantic import ValidationError

from contract.payloads import ByteRange, JobItem, RowError
from contract.s3_uri import S3Uri
from jobstore.records import ChunkSummary

MANIFEST_NAME = "manifest.json"
_CUSTOM_ID_RE = re.compile(rb'"custom_id"\s*:\s*"([^"\\]*)"')


def results_uri(output: S3Uri, chunk_index: int) -> S3Uri:
    return output.join(f"results/part-{chunk_index:05d}.jsonl")


def errors_uri(output: S3Uri, chunk_index: int) -> S3Uri:
    return output.join(f"errors/part-{chunk_index:05d}.jsonl")


def manifest_uri(output: S3Uri) -> S3Uri:
    return output.join(MANIFEST_NAME)


def plan_chunks(
    uri: S3Uri, lines: Iterable[tuple[int, bytes]], chunk_num_rows: int
) -> Iterator[tuple[ByteRange, int]]:
    """Cut one object's (offset, line) stream into ranges of `chunk_num_rows` rows each."""
    start = 0
    first_line = 1
    num_rows = 0
    end = 0
    line_number = 0
    for line_number, (offset, line) in enumerate(lines, start=1):
        end = offset + len(line)
        if line.strip():
            num_rows += 1
        if num_rows == chunk_num_rows:
            yield ByteRange(uri=str(uri), start=start, end=end, first_line=first_line), num_rows
            start, first_line, num_rows = end, line_number + 1, 0
    if num_rows:
        yield ByteRange(uri=str(uri), start=start, end=end, first_line=first_line), num_rows


def split_lines(data: bytes, first_line: int) -> list[tuple[int, bytes]]:
    """The non-blank lines of a range with their 1-based line numbers."""
    return [
        (first_line + index, line)
        for index, line in enumerate(data.split(b"\n"))
        if line.strip()
    ]


def parse_row(line: bytes, line_number: int) -> JobItem | RowError:
    """One JSONL line -> a row to score, or the error that replaces its result."""
    try:
        raw = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        found = _CUSTOM_ID_RE.search(line)  # best effort: name the row even when its JSON is broken
        custom_id = found.group(1).decode(errors="replace") if found else None
        return RowError(line=line_number, custom_id=custom_id, message=f"not valid JSON: {error}")
    custom_id = raw.get("custom_id") if isinstance(raw, dict) else None
    custom_id = custom_id if isinstance(custom_id, str) else None
    try:
        return JobItem.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or None
        return RowError(line=line_number, custom_id=custom_id, field=field, message=first["msg"])


def error_row(custom_id: str | None, error: RowError) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "error": error.model_dump(exclude_none=True)})


def response_row(custom_id: str, response: dict, labels: list[str] | None = None) -> bytes:
    row = {"custom_id": custom_id, "response": response}
    return orjson.dumps(row if labels is None else row | {"labels": labels})


def to_jsonl(rows: Iterable[bytes]) -> bytes:
    return b"".join(row + b"\n" for row in rows)


def build_manifest(job_id: str, input_uri: str, output: S3Uri, summaries: dict[int, ChunkSummary],
                   unwritten: set[int] = frozenset()) -> dict:
    """Counts and object keys; `unwritten`: chunks S3 could not take (their rows are error rows
    in the service's results)."""
    indices = sorted(summaries)
    return {
        "job_id": job_id,
        "input": input_uri,
        "output": str(output),
        "num_chunks": len(indices),
        "num_rows": sum(summaries[i].num_rows for i in indices),
        "num_succeeded": sum(summaries[i].num_succeeded for i in indices),
        "num_failed": sum(summaries[i].num_failed for i in indices),
        "results": [str(results_uri(output, i)) for i in indices if i not in unwritten],
        "errors": [str(errors_uri(output, i)) for i in indices if summaries[i].num_failed and i not in unwritten],
        "unwritten_chunks": sorted(unwritten),
    }

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

A custom_id names one row of a job. While the plan reads the input (`mark_repeats`), the first
row naming a custom_id owns it, in input order (objects by key, then lines; a broken row whose
custom_id can be read from its text counts); a later row naming it is listed in its chunk's
`ByteRange.repeats` and becomes an error row with `custom_id` null (`field` "custom_id", the
message naming the id and the row that owns it), so every custom_id appears once in the results.
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


def row_custom_id(line: bytes) -> str | None:
    """The custom_id a row names: its JSON's, or one read from the text of broken JSON."""
    try:
        raw = orjson.loads(line)
    except orjson.JSONDecodeError:
        found = _CUSTOM_ID_RE.search(line)
        return found.group(1).decode(errors="replace") if found else None
    custom_id = raw.get("custom_id") if isinstance(raw, dict) else None
    return custom_id if isinstance(custom_id, str) else None


def mark_repeats(uri: S3Uri, lines: Iterable[tuple[int, bytes]], owners: dict[str, tuple[str, int]],
                 repeats: dict[int, str]) -> Iterator[tuple[int, bytes]]:
    """`lines` (offset, line) of one object, passed through. A row naming a custom_id that an
    earlier row owns goes into `repeats` (line number -> where the owner is); any other
    custom_id becomes this row's in `owners` (custom_id -> (object URI, line number))."""
    where = str(uri)
    for number, (offset, line) in enumerate(lines, start=1):
        custom_id = row_custom_id(line) if line.strip() else None
        if custom_id is not None:
            owner = owners.setdefault(custom_id, (where, number))
            if owner != (where, number):
                repeats[number] = f"line {owner[1]} of {owner[0]}"
        yield offset, line


def with_repeats(cut: list[tuple[ByteRange, int]], repeats: dict[int, str]) -> list[tuple[ByteRange, int]]:
    """One object's chunks, each with the repeated rows among its lines."""
    if not repeats:
        return cut
    ends = [source.first_line for source, _ in cut[1:]] + [None]
    return [(source.model_copy(update={"repeats": {line: owner for line, owner in repeats.items()
                                                   if line >= source.first_line and (end is None or line < end)}}),
             num_rows) for (source, num_rows), end in zip(cut, ends, strict=True)]


def repeat_error(line: bytes, line_number: int, owner: str) -> RowError:
    return RowError(line=line_number, field="custom_id",
                    message=f"custom_id {row_custom_id(line)!r} repeats the row on {owner}; each row needs its"
                            " own custom_id")


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

"""Dataset chunking: ranges cover every row once, parse errors name the line, keys are stable."""

import orjson

from contract.payloads import JobItem, RowError
from contract.s3_uri import S3Uri
from jobstore import datasets
from jobstore.records import ChunkSummary


def _lines(data: bytes):
    offset = 0
    for line in data.splitlines(keepends=True):
        yield offset, line
        offset += len(line)


def _dataset(num_rows: int, blank_every: int = 7) -> bytes:
    out = []
    for i in range(num_rows):
        out.append(orjson.dumps({"custom_id": f"r{i}", "text": f"message {i}"}))
        if i % blank_every == 3:
            out.append(b"   ")
    return b"\n".join(out)  # no trailing newline: the last line still counts


def test_chunks_cover_every_row_exactly_once():
    data = _dataset(103)
    uri = S3Uri("bucket", "in/a.jsonl")
    chunks = list(datasets.plan_chunks(uri, _lines(data), chunk_num_rows=10))
    assert [n for _, n in chunks] == [10] * 10 + [3]
    seen = []
    for source, num_rows in chunks:
        rows = datasets.split_lines(data[source.start : source.end], source.first_line)
        assert len(rows) == num_rows
        seen += rows
    ids = [orjson.loads(line)["custom_id"] for _, line in seen]
    assert ids == [f"r{i}" for i in range(103)]
    all_lines = data.split(b"\n")
    for number, line in seen:  # line numbers point at the right line of the object
        assert all_lines[number - 1] == line


def test_parse_row_errors_name_line_and_field():
    assert isinstance(datasets.parse_row(b'{"custom_id": "a", "text": "hi"}', 1), JobItem)
    bad_json = datasets.parse_row(b'{"custom_id": "a", "text": ', 4)
    assert isinstance(bad_json, RowError) and bad_json.line == 4 and "JSON" in bad_json.message
    assert bad_json.custom_id == "a"  # recovered from the broken line
    no_text = datasets.parse_row(b'{"custom_id": "b"}', 5)
    assert isinstance(no_text, RowError) and no_text.custom_id == "b"
    both = datasets.parse_row(b'{"custom_id": "c", "text": "x", "messages": [{"role": "user", "content": "x"}]}', 6)
    assert isinstance(both, RowError)
    bad_role = datasets.parse_row(b'{"custom_id": "d", "messages": [{"role": "robot", "content": "x"}]}', 7)
    assert isinstance(bad_role, RowError) and bad_role.field.startswith("messages")
    not_object = datasets.parse_row(b"[1, 2]", 8)
    assert isinstance(not_object, RowError) and not_object.custom_id is None


def test_output_keys_depend_only_on_output_and_chunk():
    out = S3Uri("bucket", "out")
    assert str(datasets.results_uri(out, 3)) == "s3://bucket/out/results/part-00003.jsonl"
    assert str(datasets.errors_uri(out, 3)) == "s3://bucket/out/errors/part-00003.jsonl"
    assert str(datasets.manifest_uri(S3Uri("bucket", "out/"))) == "s3://bucket/out/manifest.json"


def test_manifest_counts():
    summaries = {1: ChunkSummary(num_rows=5, num_succeeded=4, num_failed=1),
                 0: ChunkSummary(num_rows=10, num_succeeded=10, num_failed=0)}
    manifest = datasets.build_manifest("job-1", "s3://b/in/", S3Uri("b", "out/"), summaries)
    assert (manifest["num_rows"], manifest["num_succeeded"], manifest["num_failed"]) == (15, 14, 1)
    assert manifest["results"][0].endswith("part-00000.jsonl")

"""S3 helpers against a real S3 server: listing, streamed lines vs ranged reads, allow-lists."""

import pytest

from contract.s3_uri import S3Uri, is_allowed, parse_s3_uri
from jobstore import datasets
from jobstore.s3 import iter_lines, list_keys, put_bytes, read_range


def test_parse_and_allow_lists():
    uri = parse_s3_uri("s3://data/team-a/in/")
    assert uri == S3Uri("data", "team-a/in/")
    assert is_allowed(uri, ["data/team-a"])
    assert is_allowed(uri, ["data"])
    assert not is_allowed(uri, ["data/team"])  # a prefix matches on "/" boundaries only
    assert not is_allowed(uri, ["other/team-a"])
    assert not is_allowed(parse_s3_uri("s3://data/team-ab/x"), ["data/team-a/"])
    for bad in ("http://x/y", "s3://ab/x", "s3://data/a/../b"):
        with pytest.raises(ValueError):
            parse_s3_uri(bad)


@pytest.mark.s3
def test_streamed_lines_match_ranged_reads(s3_server, s3_bucket):
    client = s3_server.client()
    data = b"".join(b'{"custom_id": "%d", "text": "%s"}\n' % (i, b"x" * (i % 50)) for i in range(500))
    uri = S3Uri(s3_bucket, "in/part-1.jsonl")
    put_bytes(client, uri, data)
    put_bytes(client, S3Uri(s3_bucket, "in/part-0.jsonl"), b"{}\n")
    assert list_keys(client, S3Uri(s3_bucket, "in/")) == ["in/part-0.jsonl", "in/part-1.jsonl"]
    streamed = list(iter_lines(client, uri, chunk_size=1000))  # lines straddle the read blocks
    assert b"".join(line for _, line in streamed) == data
    chunks = list(datasets.plan_chunks(uri, streamed, chunk_num_rows=64))
    rows = []
    for source, _ in chunks:
        rows += datasets.split_lines(read_range(client, uri, source.start, source.end), source.first_line)
    assert [line for _, line in rows] == data.splitlines()

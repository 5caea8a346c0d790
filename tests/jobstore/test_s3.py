"""S3 helpers against a real S3 server: listing, streamed lines vs ranged reads, allow-lists."""

import pytest

from contract.s3_uri import S3Access, S3AccessDenied, S3Uri, is_allowed, parse_s3_uri
from jobstore import datasets
from jobstore.s3 import iter_lines, list_dataset_keys, list_keys, put_bytes, read_range


def test_parse_and_allow_lists():
    uri = parse_s3_uri("s3://data/team-a/in/")
    assert uri == S3Uri("data", "team-a/in/")
    assert is_allowed(uri, ["data/team-a"])
    assert is_allowed(uri, ["data"])
    assert not is_allowed(uri, ["data/team"])  # a prefix matches on "/" boundaries only
    assert not is_allowed(uri, ["other/team-a"])
    assert not is_allowed(parse_s3_uri("s3://data/team-ab/x"), ["data/team-a/"])
    for bad in ("http://x/y", "s3://ab/x", "s3://data/a/../b", "s3://data/a?versionId=1", "s3://data/a#f",
                "s3://data/%2e%2e/b", "s3://data/a//b", "s3://data/./a", "s3://data//a", "s3://data/a\\b",
                "s3://data/a\nb"):
        with pytest.raises(ValueError):
            parse_s3_uri(bad)
    assert is_allowed(parse_s3_uri("s3://data/b"), ["data/b/"]) and is_allowed(parse_s3_uri("s3://data/b/"), ["data/b"])
    assert not is_allowed(parse_s3_uri("s3://data/b-secret/x"), ["data/b"])


def test_a_jobs_access_needs_its_grant_and_its_own_location():
    access = S3Access.for_job("s3://data/b/in/", "s3://out/b/run/", ["data/b"], ["out/b"])
    assert access.check_read(S3Uri("data", "b/in/part-0.jsonl"))
    assert access.check_write(S3Uri("out", "b/run/manifest.json"))
    for outside in (S3Uri("data", "b/other.jsonl"), S3Uri("data", "b-secret/x"), S3Uri("data", "b/in/../../x")):
        with pytest.raises(S3AccessDenied):
            access.check_read(outside)  # the grant covers data/b/other.jsonl, the job's input does not
    with pytest.raises(S3AccessDenied):
        access.check_write(S3Uri("out", "b/run-2/x"))
    assert S3Access.from_json(access.to_json()) == access
    legacy = S3Access.for_job("s3://data/b/in/", "s3://out/b/run/")  # recorded without grants: its locations
    assert legacy.read == ("data/b/in",) and legacy.write == ("out/b/run",)


@pytest.mark.s3
def test_a_bare_key_is_its_object_and_its_folder_never_a_string_prefix(s3_server, s3_bucket):
    client = s3_server.client()
    for key in ("b", "b/x.jsonl", "b/y/z.jsonl", "b-secret/s.jsonl", "bb.jsonl"):
        put_bytes(client, S3Uri(s3_bucket, key), b"{}\n")
    assert list_dataset_keys(client, S3Uri(s3_bucket, "b")) == ["b", "b/x.jsonl", "b/y/z.jsonl"]
    assert list_dataset_keys(client, S3Uri(s3_bucket, "b/")) == ["b/x.jsonl", "b/y/z.jsonl"]
    assert list_dataset_keys(client, S3Uri(s3_bucket, "b/x.jsonl")) == ["b/x.jsonl"]
    assert list_dataset_keys(client, S3Uri(s3_bucket, "b-")) == []


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

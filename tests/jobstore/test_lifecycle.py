"""A dataset job's life without an engine, on a real Redis and a real S3: plan, dead chunks
settled with an error row per input line, finalize (manifest, succeeded)."""

import orjson
import pytest
import redis
from rq.job import Job

from contract import queues
from contract.payloads import ChunkPayload, JobStatus, PlanPayload
from contract.protocol import ScoringSpec
from jobstore import lifecycle, records
from jobstore.s3 import make_client
from jobstore.submit import chunk_rq_id

pytestmark = [pytest.mark.redis, pytest.mark.s3]

SPEC = ScoringSpec.model_validate({"queries": [{"id": "q", "template": "Yes or no?{?}", "options": [" yes", " no"]}]})
LINES = [b'{"custom_id": "a", "text": "one"}', b'{"custom_id": "b", "text": "two"}', b"",
         b'{"custom_id": "broken", "text": ', b'{"custom_id": "d", "text": "four"}']


def _payload(r, rq_id: str) -> dict:
    return Job.fetch(rq_id, connection=r, serializer=queues.JsonSerializer).kwargs["payload"]


def test_dead_dataset_chunks_settle_an_error_row_per_line_and_finalize(make_settings, s3_server, s3_bucket):
    settings = make_settings(s3_bucket=s3_bucket, chunk_num_rows=2)
    r = redis.Redis.from_url(settings.redis_url)
    s3 = make_client(settings)
    s3.put_object(Bucket=s3_bucket, Key="in/part-0.jsonl", Body=b"\n".join(LINES) + b"\n")
    job_id = lifecycle.submit_dataset(r, settings, "alice", "m", SPEC, f"s3://{s3_bucket}/in/",
                                      f"s3://{s3_bucket}/out/")
    plan = PlanPayload.model_validate(_payload(r, f"{job_id}-plan"))
    assert lifecycle.plan_dataset(r, s3, settings, plan) == {"num_rows": 4, "num_chunks": 2}
    assert int(r.get(queues.QUEUED_ROWS_KEY)) == 4
    for index in (0, 1):
        lifecycle.record_dead_chunk(r, _payload(r, chunk_rq_id(job_id, index)), "worker lost")
    lifecycle.record_dead_chunk(r, plan.model_dump(mode="json"), "worker lost")  # a plan's entry is dropped
    lifecycle.record_dead_chunk(r, _payload(r, chunk_rq_id(job_id, 1)), "worker lost")  # recorded twice

    assert lifecycle.settle_dead_chunks(r, s3, settings, "w") == 4 and r.llen(queues.DEAD_CHUNKS_KEY) == 0
    view = records.load_view(r, job_id)
    assert view.status == JobStatus.SUCCEEDED and (view.progress.total, view.progress.done,
                                                   view.progress.failed) == (4, 4, 4)
    assert int(r.get(queues.QUEUED_ROWS_KEY)) == 0  # chunk 1 counted off once

    def jsonl(key: str) -> list[dict]:
        return [orjson.loads(line) for line in s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read().splitlines()]

    rows = jsonl("out/results/part-00000.jsonl") + jsonl("out/results/part-00001.jsonl")
    assert [row["custom_id"] for row in rows] == ["a", "b", "broken", "d"]  # broken JSON still names its row
    assert {row["error"]["message"] for row in rows} == {"not scored: worker lost"}
    assert [(e["line"], e["custom_id"]) for e in jsonl("out/errors/part-00001.jsonl")] == [(4, "broken"), (5, "d")]
    manifest = orjson.loads(s3.get_object(Bucket=s3_bucket, Key="out/manifest.json")["Body"].read())
    assert (manifest["num_chunks"], manifest["num_rows"], manifest["num_succeeded"], manifest["num_failed"]) == \
        (2, 4, 0, 4)


def test_a_plan_step_given_up_on_ends_its_unplanned_job_failed_and_unreadable_entries_are_dropped(make_settings, s3_server, s3_bucket):
    settings = make_settings(s3_bucket=s3_bucket)
    r = redis.Redis.from_url(settings.redis_url)
    job_id = lifecycle.submit_dataset(r, settings, "alice", "m", SPEC, f"s3://{s3_bucket}/in/",
                                      f"s3://{s3_bucket}/out/")
    r.rpush(queues.DEAD_CHUNKS_KEY, b"{not json", orjson.dumps({"payload": {"chunk_index": 0}, "reason": "x"}))
    lifecycle.record_dead_chunk(r, _payload(r, f"{job_id}-plan"), "the chunk failed on its last attempt (worker lost)")
    assert lifecycle.settle_dead_chunks(r, make_client(settings), settings, "w") == 3  # unreadable entries dropped
    assert r.llen(queues.DEAD_CHUNKS_KEY) == 0
    view = records.load_view(r, job_id)
    assert view.status == JobStatus.FAILED and view.error.startswith("planning the job failed: the chunk failed")


def test_a_repeated_custom_id_in_a_dataset_is_an_error_row_and_the_first_row_keeps_it(make_settings, s3_server,
                                                                                       s3_bucket):
    """As inline jobs refuse a repeated custom_id and batches refuse the later line: the first row
    naming one (in input order: objects by key, then lines; across chunks and objects) owns it,
    each later row is an error row with custom_id null naming the owner."""
    settings = make_settings(s3_bucket=s3_bucket, chunk_num_rows=2)
    r = redis.Redis.from_url(settings.redis_url)
    s3 = make_client(settings)
    first = [b'{"custom_id": "a", "text": "one"}', b'{"custom_id": "b", "text": "two"}',
             b'{"custom_id": "a", "text": "a again, next chunk"}', b'{"custom_id": "c", "text": ']  # broken, still c's
    second = [b'{"custom_id": "c", "text": "c again, next object"}', b'{"custom_id": "d", "text": "four"}',
              b'{"text": "five", "custom_id": "b"}']
    s3.put_object(Bucket=s3_bucket, Key="in/part-0.jsonl", Body=b"\n".join(first) + b"\n")
    s3.put_object(Bucket=s3_bucket, Key="in/part-1.jsonl", Body=b"\n".join(second))
    job_id = lifecycle.submit_dataset(r, settings, "alice", "m", SPEC, f"s3://{s3_bucket}/in/",
                                      f"s3://{s3_bucket}/out/")
    plan = PlanPayload.model_validate(_payload(r, f"{job_id}-plan"))
    assert lifecycle.plan_dataset(r, s3, settings, plan) == {"num_rows": 7, "num_chunks": 4}
    for index in range(4):
        work = lifecycle.load_chunk(r, s3, ChunkPayload.model_validate(_payload(r, chunk_rq_id(job_id, index))))
        for slot in work.rows:
            if slot.error is None:
                slot.response = {"usage": {}}  # scored (no engine here)
        lifecycle.settle_chunk(r, s3, settings, work, "w")
    assert records.load_view(r, job_id).progress.failed == 4

    def jsonl(key: str) -> list[dict]:
        return [orjson.loads(line) for line in s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read().splitlines()]

    rows = [row for index in range(4) for row in jsonl(f"out/results/part-{index:05d}.jsonl")]
    assert [row["custom_id"] for row in rows] == ["a", "b", None, "c", None, "d", None]
    repeated = [row["error"] for row in rows if row["custom_id"] is None]
    assert [(e["line"], e["field"]) for e in repeated] == [(3, "custom_id"), (1, "custom_id"), (3, "custom_id")]
    owner = f"s3://{s3_bucket}/in/part-0.jsonl"
    assert [e["message"] for e in repeated] == [
        f"custom_id 'a' repeats the row on line 1 of {owner}; each row needs its own custom_id",
        f"custom_id 'c' repeats the row on line 4 of {owner}; each row needs its own custom_id",
        f"custom_id 'b' repeats the row on line 2 of {owner}; each row needs its own custom_id"]
    assert [e["line"] for e in jsonl("out/errors/part-00002.jsonl")] == [1]  # the errors object lists it too

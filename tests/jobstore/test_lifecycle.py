"""A dataset job's life without an engine, on a real Redis and a real S3: plan, dead chunks
settled with an error row per input line, finalize (manifest, succeeded)."""

import orjson
import pytest
import redis
from rq.job import Job

from contract import queues
from contract.payloads import JobStatus, PlanPayload
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

"""The client library against a live service (uvicorn + worker thread + real Redis + tiny engine):
sync and async calls (an S3 dataset, a local file, a cancel), a 429 sent again after its Retry-After."""

import asyncio
import time

import httpx
import orjson
import pytest

from client import AsyncClient, Client, SpinfError
from contract.payloads import JobStatus

pytestmark = [pytest.mark.redis, pytest.mark.slow]

SCORING = {"queries": [{"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"]}]}
DECISION = {"state": "I was charged twice for September.", "question": "Which team should handle this?",
            "options": [{"id": "billing", "description": "Billing"}, {"id": "tech", "description": "Technical"}]}
ROWS = [{"custom_id": f"r{i}", "text": f"Customer {i}: please refund order {i}."} for i in range(5)]


@pytest.fixture
def live(make_settings, service_engine, live_service):
    return live_service(make_settings(default_model=service_engine.model_name, chunk_num_rows=2), service_engine)


def _results(live, bearer, job_id: str) -> list[dict]:
    response = httpx.get(f"{live.base_url}/v1/jobs/{job_id}/results", headers=bearer("alice"), timeout=60)
    return [orjson.loads(line) for line in response.content.splitlines() if line]


def test_sync_client(live, bearer, tmp_path, monkeypatch):
    monkeypatch.setenv("SPINF_BASE_URL", live.base_url)
    monkeypatch.setenv("SPINF_API_KEY", "sk-test-alice")
    rows_file = tmp_path / "rows.jsonl"
    rows_file.write_bytes(b"\n".join(orjson.dumps(row) for row in ROWS) + b"\n\n")
    with Client() as spinf:
        request = {"messages": [{"role": "user", "content": ROWS[0]["text"]}], "scoring": SCORING}
        scored = spinf.score(request)
        direct = httpx.post(f"{live.base_url}/v1/score", json=request, headers=bearer("alice"), timeout=60).json()
        assert scored.model_dump(mode="json", exclude_none=True)["results"] == direct["results"]
        decided = spinf.decide(DECISION)
        alone = httpx.post(f"{live.base_url}/v1/decide", json=DECISION, headers=bearer("alice"), timeout=60).json()
        assert decided["option_ids"] == ["billing", "tech"] and decided["probabilities"] == alone["probabilities"]
        job = spinf.submit_file(rows_file, SCORING)
        seen = []
        done = spinf.wait(job.id, progress=seen.append, poll_s=0.05)
        assert done.status is JobStatus.SUCCEEDED and seen[-1] == done and done.progress.done == 5
        assert list(spinf.results(job.id)) == _results(live, bearer, job.id)
        other = spinf.submit(ROWS[:2], SCORING)
        assert [view.id for view in spinf.jobs(page_size=1)] == [other.id, job.id]
        spinf.wait(other.id, poll_s=0.05)
        assert spinf.cancel(other.id).status is JobStatus.SUCCEEDED  # an ended job stays as it ended
        with pytest.raises(ValueError, match="at least 2 options"):  # checked before anything is sent
            spinf.submit(ROWS, {"queries": [{"id": "q", "template": "x{?}", "options": [" only"]}]})
        with pytest.raises(SpinfError) as refused:  # the service's 422, its field named
            spinf.submit(ROWS, SCORING, model="no-such-model")
        assert (refused.value.status_code, refused.value.param) == (422, "model")
    with Client(api_key="sk-test-bob") as bob, pytest.raises(SpinfError) as missing:
        bob.job(job.id)
    assert missing.value.status_code == 404


def test_async_client(live, bearer):
    async def run() -> tuple:
        async with AsyncClient(live.base_url, "sk-test-alice") as spinf:
            job = await spinf.submit(ROWS, SCORING)
            done = await spinf.wait(job.id, poll_s=0.05)
            rows = [row async for row in spinf.results(job.id)]
            listed = [view.id async for view in spinf.jobs(page_size=2)]
            scored = await spinf.score({"messages": [{"role": "user", "content": "hi"}], "scoring": SCORING})
            decided = await spinf.decide(DECISION)
            return job, done, rows, listed, scored, decided

    job, done, rows, listed, scored, decided = asyncio.run(run())
    assert decided["option_ids"] == ["billing", "tech"] and len(decided["probabilities"]) == 2
    assert done.status is JobStatus.SUCCEEDED and listed == [job.id]
    assert rows == _results(live, bearer, job.id) and [row["custom_id"] for row in rows] == [r["custom_id"] for r in ROWS]
    assert scored.results[0].id == "refund"


def test_a_429_is_sent_again_after_its_retry_after(make_settings, slow_engine, live_service):
    settings = make_settings(default_model="tiny-llama", max_queue=3, retry_after_s=1, chunk_num_rows=1)
    live = live_service(settings, slow_engine(0.5))
    with Client(live.base_url, "sk-test-alice", max_retries=30) as spinf:
        answers: list[tuple[int, str | None, float]] = []
        spinf.http.event_hooks["response"].append(
            lambda response: answers.append((response.status_code, response.headers.get("retry-after"), time.monotonic())))
        first = spinf.submit(ROWS[:3], SCORING)  # 3 rows queued: the next 2 do not fit until 2 have settled
        second = spinf.submit(ROWS[3:], SCORING)
        assert spinf.wait(second.id, poll_s=0.1).status is JobStatus.SUCCEEDED
        assert spinf.job(first.id).status is JobStatus.SUCCEEDED
    posts = [(status, retry, at) for status, retry, at in answers if status in (201, 429)]
    assert posts[0][0] == 201 and posts[1][:2] == (429, "1") and posts[-1][0] == 201
    refused = [at for status, _, at in posts if status == 429]
    assert posts[-1][2] - refused[-1] >= 1.0  # waited the Retry-After before sending again


def test_progress_moves_row_by_row_within_a_chunk(make_settings, slow_engine, service_engine_factory, live_service):
    """21 rows, one 64-row chunk, passes of ~3 rows: the callback sees rows settle before the chunk does."""
    engine = slow_engine(0.0, row_delay_s=0.15, engine=service_engine_factory(128))
    live = live_service(make_settings(default_model="tiny-llama"), engine)
    rows = [{"custom_id": f"r{i}", "text": f"Customer {i}: please refund order {i}."} for i in range(21)]
    with Client(live.base_url, "sk-test-alice") as spinf:
        job = spinf.submit(rows, SCORING)
        seen: list[tuple[int, int | None]] = []
        done = spinf.wait(job.id, progress=lambda view: seen.append((view.progress.done, view.progress.total)),
                          poll_s=0.05)
    assert done.status is JobStatus.SUCCEEDED and seen[-1] == (21, 21)
    between = sorted({n for n, total in seen if total == 21 and 0 < n < 21})
    assert len(between) >= 2, seen  # at least two counts between none and all
    assert [n for n, _ in seen] == sorted(n for n, _ in seen)  # never backwards


@pytest.mark.s3
def test_async_dataset_file_and_cancel(make_settings, s3_server, s3_bucket, slow_engine, live_service, bearer,
                                       tmp_path):
    """An S3 dataset, a local file and a cancel through AsyncClient; the dataset's rows are its S3 results."""
    settings = make_settings(s3_bucket=s3_bucket, default_model="tiny-llama", chunk_num_rows=2)
    live = live_service(settings, slow_engine(0.2))
    s3 = s3_server.client()
    s3.put_object(Bucket=s3_bucket, Key="in/rows.jsonl", Body=b"\n".join(orjson.dumps(row) for row in ROWS[:3]))
    rows_file = tmp_path / "rows.jsonl"
    rows_file.write_bytes(b"\n".join(orjson.dumps({"custom_id": f"f{i}", "text": f"Order {i}, refund it."})
                                     for i in range(20)))  # 10 chunks of 2 rows, 0.2 s a pass
    rows_file_bad = tmp_path / "bad.jsonl"
    rows_file_bad.write_bytes(orjson.dumps(ROWS[0]) + b"\n{broken\n")

    async def run() -> tuple:
        async with AsyncClient(live.base_url, "sk-test-alice") as spinf:
            dataset = await spinf.submit_dataset(f"s3://{s3_bucket}/in/", f"s3://{s3_bucket}/out/", SCORING)
            dataset_done = await spinf.wait(dataset.id, poll_s=0.1, timeout_s=120)
            dataset_rows = [row async for row in spinf.results(dataset.id)]
            long_job = await spinf.submit_file(rows_file, SCORING)
            cancelled = await spinf.cancel(long_job.id)
            ended = await spinf.wait(long_job.id, poll_s=0.1, timeout_s=120)
            with pytest.raises(ValueError, match="bad.jsonl:2"):  # named before anything is sent
                await spinf.submit_file(rows_file_bad, SCORING)
            listed = [view.id async for view in spinf.jobs(page_size=1)]
            return dataset, dataset_done, dataset_rows, long_job, cancelled, ended, listed

    dataset, dataset_done, dataset_rows, long_job, cancelled, ended, listed = asyncio.run(run())
    assert dataset_done.status is JobStatus.SUCCEEDED and dataset_done.progress.total == 3
    assert [row["custom_id"] for row in dataset_rows] == ["r0", "r1", "r2"]
    assert dataset_rows == _results(live, bearer, dataset.id)
    written = s3.list_objects_v2(Bucket=s3_bucket, Prefix="out/results/").get("Contents", [])
    in_s3 = [orjson.loads(line) for item in written
             for line in s3.get_object(Bucket=s3_bucket, Key=item["Key"])["Body"].read().splitlines() if line]
    assert [row["custom_id"] for row in in_s3] == ["r0", "r1", "r2"]
    assert cancelled.status is JobStatus.CANCELLED and ended.status is JobStatus.CANCELLED
    assert ended.progress.done < ended.progress.total == 20
    assert listed == [long_job.id, dataset.id]  # the refused file made no job

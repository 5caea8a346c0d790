"""The greedy worker loop on a real Redis with a real (tiny) engine."""

import orjson
import pytest
import redis
from rq import Queue
from rq.job import Job
from rq.job import JobStatus as RqStatus
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from worker_helpers import SCORING, drain_until_settled, make_worker, texts

from contract import queues
from contract.payloads import JobItem, JobStatus
from contract.protocol import ScoringRequest, ScoringSpec
from jobstore import records
from jobstore.lifecycle import cancel, submit_dataset, submit_inline
from jobstore.submit import chunk_rq_id

pytestmark = [pytest.mark.redis, pytest.mark.slow]
SPEC = ScoringSpec.model_validate(SCORING)


def _submit(r, settings, model, num_rows, prefix, is_sync=False):
    items = [JobItem.model_validate(row) for row in texts(num_rows, prefix)]
    return submit_inline(r, settings, "alice", model, SPEC, items, is_sync=is_sync)


def _rows(r, job_id):
    return [orjson.loads(line) for chunk in records.iter_inline_results(r, job_id, 10) for line in chunk.splitlines()]


def test_one_pass_packs_several_queued_jobs(make_settings, service_engine):
    settings = make_settings(chunk_num_rows=3)
    r = redis.Redis.from_url(settings.redis_url)
    model = service_engine.model_name
    job_ids = [_submit(r, settings, model, 3, "a"), _submit(r, settings, model, 2, "b"),
               _submit(r, settings, model, 1, "c", is_sync=True)]
    worker = make_worker(settings, service_engine)
    assert worker.drain_once(block_s=1)  # one greedy step takes all three jobs
    passes = [r.smembers(queues.passes_key(job_id)) for job_id in job_ids]
    assert all(records.load_view(r, job_id).status == JobStatus.SUCCEEDED for job_id in job_ids)
    shared = set.intersection(*passes)
    assert len(shared) >= 1, passes  # >= 2 jobs (here 3) were served by one forward pass
    # and packing did not change a score: each row equals the row scored alone
    alone = service_engine.score_requests([ScoringRequest(messages=[{"role": "user", "content": texts(2, "b")[1]["text"]}],
                                                       scoring=SPEC)]).results[0]
    packed = _rows(r, job_ids[1])[1]["response"]
    assert packed["results"] == alone.model_dump(mode="json", exclude_none=True)["results"]
    finished = FinishedJobRegistry(queues.queue_pair(model).batch, connection=r)
    assert chunk_rq_id(job_ids[0], 0) in finished.get_job_ids()


@pytest.mark.parametrize("batch_passes", [1, 2])
def test_sync_queue_is_drained_first_and_budget_bounds_a_step(make_settings, service_engine, service_engine_factory,
                                                              batch_passes):
    """One row fills a pass, so a step holds `worker_batch_passes` jobs: the sync one first."""
    row = ScoringRequest(messages=[{"role": "user", "content": texts(1, "sync")[0]["text"]}], scoring=SPEC)
    engine = service_engine_factory(service_engine.compile(row).num_tokens)
    settings = make_settings(chunk_num_rows=1, worker_batch_passes=batch_passes)
    r = redis.Redis.from_url(settings.redis_url)
    batch_job = _submit(r, settings, engine.model_name, 2, "batch")
    sync_job = _submit(r, settings, engine.model_name, 1, "sync", is_sync=True)
    worker = make_worker(settings, engine)
    worker.drain_once(block_s=1)
    assert records.load_view(r, sync_job).status == JobStatus.SUCCEEDED
    assert records.load_view(r, batch_job).progress.done == batch_passes - 1
    assert Queue(queues.queue_pair(engine.model_name).batch, connection=r).count == 2 - (batch_passes - 1)
    drain_until_settled(worker, [batch_job])
    assert [row["custom_id"] for row in _rows(r, batch_job)] == ["batch0", "batch1"]


def test_jobs_held_by_a_worker_are_in_the_started_registry(make_settings, service_engine):
    settings = make_settings(chunk_num_rows=2)
    r = redis.Redis.from_url(settings.redis_url)
    job_id = _submit(r, settings, service_engine.model_name, 4, "h")
    worker = make_worker(settings, service_engine)
    pair = queues.queue_pair(service_engine.model_name)
    queue = Queue(pair.batch, connection=r, serializer=queues.JsonSerializer)
    job, _ = worker._pop([queue])
    assert r.lrange(queue.intermediate_queue_key, 0, -1) == [job.id.encode()]  # popped, not yet registered
    held = worker._hold(job, queue)
    assert r.llen(queue.intermediate_queue_key) == 0
    registry = StartedJobRegistry(pair.batch, connection=r)
    assert job.id in registry.get_job_ids()
    before = r.zscore(registry.key, held.execution.composite_key)
    worker.heartbeat_held()
    assert r.zscore(registry.key, held.execution.composite_key) >= before
    worker._run(service_engine.model_name, [held])
    assert job.id not in registry.get_job_ids()
    assert records.load_view(r, job_id).progress.done == 2


def test_cancel_stops_the_remaining_chunks(make_settings, service_engine):
    settings = make_settings(chunk_num_rows=2)
    r = redis.Redis.from_url(settings.redis_url)
    job_id = _submit(r, settings, service_engine.model_name, 10, "x")
    assert cancel(r, settings, job_id)
    worker = make_worker(settings, service_engine)
    worker.drain_once(block_s=1)
    view = records.load_view(r, job_id)
    assert view.status == JobStatus.CANCELLED and view.progress.done == 0
    assert int(r.get(queues.QUEUED_ROWS_KEY)) == 0


def test_a_row_the_engine_refuses_is_an_error_row_not_a_lost_batch(make_settings, service_engine):
    settings = make_settings(chunk_num_rows=10)
    r = redis.Redis.from_url(settings.redis_url)
    rows = texts(3, "ok") + [{"custom_id": "huge", "text": "refund " * 5000}]
    job_id = submit_inline(r, settings, "alice", service_engine.model_name, SPEC,
                           [JobItem.model_validate(row) for row in rows])
    drain_until_settled(make_worker(settings, service_engine), [job_id])
    view = records.load_view(r, job_id)
    assert view.status == JobStatus.SUCCEEDED and (view.progress.done, view.progress.failed) == (4, 1)
    results = _rows(r, job_id)
    assert [row["custom_id"] for row in results] == ["ok0", "ok1", "ok2", "huge"]
    assert all("response" in row for row in results[:3])
    assert results[3]["error"]["field"] == "messages"


def test_a_chunk_rq_gives_up_on_still_settles_with_error_rows(make_settings, service_engine):
    import time

    settings = make_settings(chunk_num_rows=5, max_num_retries=0, heartbeat_ttl_s=1, maintenance_interval_s=0.1)
    r = redis.Redis.from_url(settings.redis_url)
    job_id = _submit(r, settings, service_engine.model_name, 3, "lost")
    dead = make_worker(settings, service_engine, name="dies-holding-it")
    queue = dead.queues[1]
    dead._hold(*dead._pop([queue]))  # held, then never heartbeats again
    time.sleep(2.5)
    survivor = make_worker(settings, service_engine, name="survivor")
    survivor.maintain_if_due()  # registry cleanup: no retries left -> failure callback -> error rows
    view = records.load_view(r, job_id)
    assert view.status == JobStatus.SUCCEEDED and (view.progress.done, view.progress.failed) == (3, 3)
    rows = _rows(r, job_id)
    assert [row["custom_id"] for row in rows] == ["lost0", "lost1", "lost2"]
    assert all("not scored" in row["error"]["message"] for row in rows)


def _one_row_per_step(make_settings, service_engine, service_engine_factory, passes_in_flight, prefix, num_jobs):
    """An engine whose budget one row fills, `num_jobs` one-row jobs queued, a worker whose
    passes read as in flight (so it gathers ahead) and whose batches are one pass: (engine,
    redis, job ids, worker)."""
    row = ScoringRequest(messages=[{"role": "user", "content": texts(1, prefix)[0]["text"]}], scoring=SPEC)
    engine = service_engine_factory(service_engine.compile(row).num_tokens)
    settings = make_settings(chunk_num_rows=1, worker_batch_passes=1)
    r = redis.Redis.from_url(settings.redis_url)
    job_ids = [_submit(r, settings, engine.model_name, 1, f"{prefix}{i}-") for i in range(num_jobs)]
    passes_in_flight(busy=100)
    return engine, r, job_ids, make_worker(settings, engine)


def test_the_next_batch_is_gathered_during_the_passes(make_settings, service_engine, service_engine_factory,
                                                      passes_in_flight):
    """While a batch's passes run, the worker holds and counts the next batch's jobs; the next
    step scores them; nothing is lost and no score moves."""
    engine, r, job_ids, worker = _one_row_per_step(make_settings, service_engine, service_engine_factory,
                                                   passes_in_flight, "n", 3)
    queue = Queue(queues.queue_pair(engine.model_name).batch, connection=r)
    started = StartedJobRegistry(queues.queue_pair(engine.model_name).batch, connection=r)
    assert worker.drain_once(block_s=1)
    assert records.load_view(r, job_ids[0]).status == JobStatus.SUCCEEDED
    assert queue.count == 1  # the second job was taken during the first batch's pass ...
    assert chunk_rq_id(job_ids[1], 0) in started.get_job_ids()  # ... and is held (heartbeats cover it)
    assert records.load_view(r, job_ids[1]).progress.done == 0
    assert worker.drain_once(block_s=1)  # scores the held job, gathers the third meanwhile
    assert records.load_view(r, job_ids[1]).status == JobStatus.SUCCEEDED and queue.count == 0
    drain_until_settled(worker, job_ids)
    for index, job_id in enumerate(job_ids):
        [result] = _rows(r, job_id)
        alone = engine.score_requests([ScoringRequest(messages=[{"role": "user", "content": texts(1, f"n{index}-")[0]["text"]}],
                                                   scoring=SPEC)]).results[0]
        assert result["response"]["results"] == alone.model_dump(mode="json", exclude_none=True)["results"]


def test_a_stopping_worker_scores_what_it_gathered_ahead(make_settings, service_engine, service_engine_factory,
                                                         passes_in_flight, monkeypatch):
    from workers import tasks

    _, r, job_ids, worker = _one_row_per_step(make_settings, service_engine, service_engine_factory,
                                              passes_in_flight, "s", 2)
    score_rows, scored = tasks.score_rows, []

    def score_then_stop(engine, rows, compiled=None, while_waiting=None, arrivals=None, refill=None):
        score_rows(engine, rows, compiled, while_waiting, arrivals, refill)
        scored.append([slot.custom_id for slot in rows])
        worker.stop()  # asked to stop during the first batch, with the second job held

    monkeypatch.setattr(tasks, "score_rows", score_then_stop)
    worker.run()
    assert scored == [["s0-0"], ["s1-0"]]  # the held job was scored on the way out
    assert all(records.load_view(r, job_id).status == JobStatus.SUCCEEDED for job_id in job_ids)


def test_a_stopping_worker_takes_no_new_job(make_settings, service_engine, service_engine_factory,
                                            passes_in_flight, monkeypatch):
    """On the way out only what the look-ahead already holds is scored: a sync call that comes
    in as the worker stops stays queued for another worker."""
    from workers import tasks

    engine, r, job_ids, worker = _one_row_per_step(make_settings, service_engine, service_engine_factory,
                                                   passes_in_flight, "s", 2)
    score_rows, late = tasks.score_rows, []

    def score_then_stop(engine_, rows, compiled=None, while_waiting=None, arrivals=None, refill=None):
        score_rows(engine_, rows, compiled, while_waiting, arrivals, refill)
        if not late:
            late.append(_submit(r, worker.settings, engine.model_name, 1, "late", is_sync=True))
            worker.stop()

    monkeypatch.setattr(tasks, "score_rows", score_then_stop)
    worker.run()
    assert all(records.load_view(r, job_id).status == JobStatus.SUCCEEDED for job_id in job_ids)
    assert records.load_view(r, late[0]).status == JobStatus.QUEUED


def test_a_sync_call_is_not_pushed_back_by_the_look_ahead(make_settings, service_engine, service_engine_factory,
                                                          passes_in_flight):
    """A sync job that arrives after the look-ahead filled the next batch still rides in it,
    ahead of that batch's rows."""
    engine, r, batch_jobs, worker = _one_row_per_step(make_settings, service_engine, service_engine_factory,
                                                      passes_in_flight, "q", 3)
    worker.drain_once(block_s=1)  # scores q0 (and what the stream took on); the look-ahead holds the next
    held = [item.job.id for item in worker._ahead.held] if worker._ahead is not None else []
    assert held, "the look-ahead held nothing after the first batch"
    sync_job = _submit(r, worker.settings, engine.model_name, 1, "late", is_sync=True)
    drain_until_settled(worker, [sync_job, *batch_jobs])
    sync_pass = min(_passes(r, sync_job))
    for job_id in batch_jobs:
        if chunk_rq_id(job_id, 0) in held:
            assert sync_pass < min(_passes(r, job_id)), "the sync call waited behind the batch held ahead"


def _passes(r, job_id) -> set[int]:
    return {int(p.decode().rsplit("/", 1)[1]) for p in r.smembers(queues.passes_key(job_id))}


def test_a_performed_chunk_job_keeps_its_summary_as_its_rq_result(make_settings, service_engine):
    settings = make_settings(chunk_num_rows=2)
    r = redis.Redis.from_url(settings.redis_url)
    job_id = _submit(r, settings, service_engine.model_name, 3, "res")
    drain_until_settled(make_worker(settings, service_engine), [job_id])
    summaries = records.chunk_summaries(r, job_id)
    for index in (0, 1):
        job = Job.fetch(chunk_rq_id(job_id, index), connection=r, serializer=queues.JsonSerializer)
        assert job.get_status() == RqStatus.FINISHED
        assert job.return_value() == summaries[index].to_dict()
    assert [summaries[0].num_rows, summaries[1].num_rows] == [2, 1] and summaries[0].usage["content_tokens"] > 0


def test_a_chunk_that_fails_is_retried_then_given_up_on_through_rqs_failure_callback(
        make_settings, s3_server, s3_bucket, service_engine):
    """A dataset chunk whose object vanished after planning: its load fails, RQ retries it
    (max_num_retries=1), fails it again, and its failure callback hands it to maintenance,
    which settles it with an error row per input line once the object is readable again."""
    settings = make_settings(s3_bucket=s3_bucket, chunk_num_rows=10, max_num_retries=1)
    r = redis.Redis.from_url(settings.redis_url)
    s3 = s3_server.client()
    body = b"".join(orjson.dumps({"custom_id": f"v{i}", "text": f"refund order {i}"}) + b"\n" for i in range(3))
    s3.put_object(Bucket=s3_bucket, Key="in/part-0.jsonl", Body=body)
    job_id = submit_dataset(r, settings, "alice", service_engine.model_name, SPEC, f"s3://{s3_bucket}/in/",
                            f"s3://{s3_bucket}/out/")
    worker = make_worker(settings, service_engine)
    assert worker.drain_once(block_s=1)  # the plan step: one chunk enqueued
    s3.delete_object(Bucket=s3_bucket, Key="in/part-0.jsonl")
    chunk = Job.fetch(chunk_rq_id(job_id, 0), connection=r, serializer=queues.JsonSerializer)
    assert worker.drain_once(block_s=1)  # fails, one retry left: re-queued, not given up on
    chunk.refresh()
    assert chunk.get_status() == RqStatus.QUEUED and chunk.retries_left == 0
    assert r.llen(queues.DEAD_CHUNKS_KEY) == 0
    assert worker.drain_once(block_s=1)  # fails again: RQ's failure callback records it dead
    assert chunk.get_status(refresh=True) == RqStatus.FAILED
    assert chunk.id in FailedJobRegistry(queues.queue_pair(service_engine.model_name).batch, connection=r)
    assert r.llen(queues.DEAD_CHUNKS_KEY) == 1
    assert records.load_view(r, job_id).status == JobStatus.RUNNING
    s3.put_object(Bucket=s3_bucket, Key="in/part-0.jsonl", Body=body)
    worker.maintain_if_due()
    view = records.load_view(r, job_id)
    assert view.status == JobStatus.SUCCEEDED and (view.progress.done, view.progress.failed) == (3, 3)
    rows = [orjson.loads(line) for line in s3.get_object(Bucket=s3_bucket, Key="out/results/part-00000.jsonl")
            ["Body"].read().splitlines()]
    assert [row["custom_id"] for row in rows] == ["v0", "v1", "v2"]
    assert all(row["error"]["message"] == "not scored: the chunk failed on its last attempt (NoSuchKey)"
               for row in rows)


def test_a_sync_call_rides_the_first_pass_and_settles_before_the_batch_ends(make_settings, service_engine_factory):
    """Sync first: in one batch of several passes, a sync job's rows are packed into the first
    pass and the job is performed (result written, waiter woken) as soon as that pass is
    collected, while the batch's later passes are still to run."""
    engine = service_engine_factory(256)  # a small pass budget: the batch below takes several passes
    settings = make_settings(chunk_num_rows=2)
    r = redis.Redis.from_url(settings.redis_url)
    batch_job = _submit(r, settings, engine.model_name, 6, "b")
    sync_job = _submit(r, settings, engine.model_name, 1, "s", is_sync=True)
    worker = make_worker(settings, _GathersEverything(engine))  # one batch takes every queued job
    launch, seen = engine.runner.launch, []

    def noting(batch):
        seen.append(records.load_view(r, sync_job).status)  # the sync job's status as each pass starts
        return launch(batch)

    engine.runner.launch = noting
    try:
        assert worker.drain_once(block_s=1)
    finally:
        engine.runner.launch = launch
    assert records.load_view(r, batch_job).status == JobStatus.SUCCEEDED  # the one batch held it all
    sync_passes = {int(p.decode().rsplit("/", 1)[1]) for p in r.smembers(queues.passes_key(sync_job))}
    batch_passes = {int(p.decode().rsplit("/", 1)[1]) for p in r.smembers(queues.passes_key(batch_job))}
    assert len(seen) >= 3 and min(sync_passes) == min(batch_passes | sync_passes)
    assert seen[-1] == JobStatus.SUCCEEDED, seen  # settled before the batch's last pass launched
    assert r.lrange(queues.done_key(sync_job), 0, -1) == [b"succeeded"]


class _GathersEverything:
    """An engine whose worker sees an endless pass budget (so one batch holds every queued job)
    while the engine itself packs that batch into passes of its own, smaller budget."""

    def __init__(self, engine):
        import dataclasses

        self._engine = engine
        self.config = dataclasses.replace(engine.config, max_num_batched_tokens=10**9)

    def __getattr__(self, name):
        return getattr(self._engine, name)


def test_a_sync_call_joins_the_batch_in_flight(make_settings, service_engine, service_engine_factory, monkeypatch):
    """A sync call queued while a multi-pass batch runs is taken into that batch at its next
    packed pass (Engine.score_batch's arrivals), settled before the batch's last pass, and
    scores as alone; the batch's rows are untouched."""
    row = ScoringRequest(messages=[{"role": "user", "content": texts(1, "b")[0]["text"]}], scoring=SPEC)
    engine = service_engine_factory(2 * service_engine.compile(row).num_tokens)  # two rows fill a pass
    settings = make_settings(chunk_num_rows=8, worker_batch_passes=8)
    r = redis.Redis.from_url(settings.redis_url)
    batch_job = _submit(r, settings, engine.model_name, 8, "b")
    late, batches, sync_done_before_last = [], [], []
    original = engine.score_batch

    def spying(compiled, while_waiting=None, on_result=None, arrivals=None, refill=None):
        calls = [0]

        def arrivals_spy():
            calls[0] += 1
            if calls[0] == 2:  # the batch has begun packing: a sync call comes in now
                late.append(_submit(r, settings, engine.model_name, 1, "late", is_sync=True))
            return arrivals()

        def on_result_spy(index, response, pass_ids):
            on_result(index, response, pass_ids)
            if late and index == len(compiled):  # the arrival's response: its job is settled now
                sync_done_before_last.append(records.load_view(r, late[0]).status)

        output = original(compiled, while_waiting, on_result_spy, arrivals_spy, refill)
        batches.append((len(compiled), len(output.results), output.pass_ids))
        return output

    monkeypatch.setattr(engine, "score_batch", spying)
    worker = make_worker(settings, engine)
    assert worker.drain_once(block_s=1)
    [(num_given, num_results, pass_ids)] = batches
    assert (num_given, num_results) == (8, 9), "the sync row was not scored in the batch in flight"
    assert max(pass_ids[8]) < max(max(ids) for ids in pass_ids[:8]), "the sync row waited for the batch's end"
    assert sync_done_before_last == [JobStatus.SUCCEEDED]
    assert records.load_view(r, batch_job).status == JobStatus.SUCCEEDED
    [result] = _rows(r, late[0])
    monkeypatch.undo()
    alone = engine.score_requests([ScoringRequest(messages=[{"role": "user", "content": texts(1, "late")[0]["text"]}],
                                                  scoring=SPEC)]).results[0]
    assert result["response"]["results"] == alone.model_dump(mode="json", exclude_none=True)["results"]
    assert len(_rows(r, batch_job)) == 8


def test_the_look_ahead_leaves_sync_calls_to_the_stream_in_flight(make_settings, service_engine):
    """Stepped in the GPU waits, the look-ahead takes batch jobs only: a sync call queued then
    is the running stream's next arrival, not a row of the batch after it (held there, it
    waited until the stream ran out of rows). At the batch boundary it is taken first."""
    settings = make_settings(chunk_num_rows=1)
    r = redis.Redis.from_url(settings.redis_url)
    model = service_engine.model_name
    batch_job = _submit(r, settings, model, 2, "b")
    sync_job = _submit(r, settings, model, 1, "s", is_sync=True)
    worker = make_worker(settings, service_engine)
    step = worker._look_ahead()
    for _ in range(20):
        if not step():
            break
    held = [item.job.id for item in worker._ahead.held]
    assert held and all(job_id.startswith(f"{batch_job}-c") for job_id in held), held
    assert chunk_rq_id(sync_job, 0) not in held
    assert Queue(queues.queue_pair(model).sync, connection=r).count == 1  # still queued for arrivals
    finished = worker._finish_ahead()
    assert chunk_rq_id(sync_job, 0) in [item.job.id for item in finished.held]

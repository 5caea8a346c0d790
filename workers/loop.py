"""The GPU worker: our own greedy loop on RQ's queues, jobs and registries.

    (start: Engine.warm_up, one pass of every padded size on CUDA)
    block for the first job (sync queues first) -> LookAhead: take more of that model's jobs
    without blocking until `worker_batch_passes` full pass budgets of rows are held -> one
    stream of passes for them (workers.stream: one engine.score_batch), during which
      sync calls queued meanwhile join it at its next packed pass
      when it runs out of rows, the jobs the next LookAhead holds ready join it, so the passes
      go on without a break while there is work
      each job is performed as soon as its last row is scored, while the next pass runs:
      settled (jobstore.lifecycle) and ended in RQ as RQ's perform_job does
    -> the jobs whose rows did not all get a response early (slots) are performed after

While a batch's passes are on the GPU, the waits between them step a new LookAhead (hold and
load a job, or compile one row: its tokenization and tree), never blocking; the next step
scores what it holds, after finishing it. On CPU nothing waits, and the next batch is
gathered after this one, as without the look-ahead.

RQ's own workers run one job at a time (and `Worker` forks), so this subclasses
`SimpleWorker` for its bookkeeping (birth/death, heartbeats, success/failure handling) and
replaces the loop. Every job held is in the StartedJobRegistry under an Execution whose
heartbeat a background thread refreshes; a worker killed mid-pass stops heartbeating, its
executions expire after `heartbeat_ttl_s`, and any live worker's registry cleanup re-queues
the jobs (RQ `Retry`), so another worker finishes them. Never forks.

`stop()` (SIGINT, the embedded service) finishes the batch in hand, then leaves;
`request_hand_back()` (SIGTERM: a pod being stopped) leaves at the next row instead and hands
every held job back to its queue (workers.hand_back). The worker's check-in (its heartbeat,
every `heartbeat_interval_s`) publishes its name, device, models and recent rates
(workers.worker_rates) for GET /health and /metrics.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial

import orjson
from redis import Redis
from rq import Queue, SimpleWorker
from rq.executions import Execution
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.timeouts import TimerDeathPenalty
from rq.utils import now
from rq.worker import WorkerStatus

from contract import queues
from contract.payloads import ChunkPayload, PlanPayload
from contract.settings import Settings
from jobstore import lifecycle
from workers.hand_back import HandBack, hand_back
from workers.job_calibration import calibrate_finished_job
from workers.lookahead import HeldJob, LookAhead
from workers.queue_reader import QueueReader, clean_registries
from workers.worker_info import describe_model, device_of
from workers.stream import StreamRunner
from workers.worker_rates import WorkerRates

log = logging.getLogger(__name__)


class GreedyWorker(StreamRunner, QueueReader, SimpleWorker):
    death_penalty_class = TimerDeathPenalty  # works off the main thread (embedded serve, tests)

    def __init__(self, connection: Redis, engines: dict, settings: Settings, s3=None, name: str | None = None,
                 device: str | None = None):
        self.engines = engines  # served model name -> Engine
        self.device = device or device_of(engines, settings)  # "cuda:0", "cpu": what /health shows
        self.settings = settings
        self.s3 = s3
        self.model_of_queue: dict[str, str] = {}
        self._sync_queue_names: set[str] = set()
        sync_queues, batch_queues = [], []
        for model in engines:
            pair = queues.queue_pair(model)
            self.model_of_queue |= {pair.sync: model, pair.batch: model}
            self._sync_queue_names.add(pair.sync)
            sync_queues.append(self._queue(connection, pair.sync))
            batch_queues.append(self._queue(connection, pair.batch))
        name = name or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        super().__init__(
            sync_queues + batch_queues, name=name, connection=connection, serializer=queues.JsonSerializer,
            worker_ttl=settings.worker_ttl_s,
        )
        self._held: list[HeldJob] = []
        self._held_lock = threading.Lock()
        self._stop = threading.Event()
        self._hand_back = threading.Event()
        self.rates = WorkerRates()
        self._last_maintenance = 0.0
        self._ahead: LookAhead | None = None  # the next batch, begun during GPU waits

    @staticmethod
    def _queue(connection: Redis, name: str) -> Queue:
        return Queue(
            name, connection=connection, serializer=queues.JsonSerializer, death_penalty_class=TimerDeathPenalty
        )

    # ---- lifecycle ----------------------------------------------------------------------

    def run(self, burst: bool = False) -> None:
        """Serve until `stop()` (or, with burst, until the queues are empty)."""
        for engine in self.engines.values():
            if (num_passes := engine.warm_up()):
                log.info("warmed up %s: %d passes, one per padded size", engine.model_name, num_passes)
        self.register_birth()
        self.publish()
        beat = threading.Thread(target=self._heartbeat_forever, name=f"{self.name}-heartbeat", daemon=True)
        beat.start()
        try:
            while not self._stop.is_set():
                self.maintain_if_due()
                if not self.drain_once(block_s=max(1, int(self.settings.maintenance_interval_s))) and burst:
                    break
        except HandBack:
            pass  # the held jobs go back below
        finally:
            self._stop.set()
            self._leave(beat)

    def _leave(self, beat: threading.Thread) -> None:
        try:
            ahead, self._ahead = self._ahead, None  # on the way out it takes no more
            if ahead is not None and ahead.held and not self._hand_back.is_set():
                self._run(ahead.model, ahead.held)  # held jobs are scored, not left to expire
        except (Exception, HandBack):  # the worker still unregisters; what it holds goes back
            log.exception("scoring the jobs held on the way out failed")
        beat.join(timeout=max(5.0, 2 * self.settings.heartbeat_interval_s))  # no beat after the hand-back
        with self._held_lock:
            held, self._held = list(self._held), []
        if held:
            log.warning("worker %s hands back %d held jobs", self.name, len(held))
            hand_back(self.connection, held)
        self.unpublish()
        self.register_death()

    def stop(self) -> None:
        """Finish the batch in hand, then leave."""
        self._stop.set()

    def request_hand_back(self) -> None:
        """Leave at the next row built and queue every held job again (a signal handler may call it)."""
        self._hand_back.set()
        self._stop.set()

    def _check_hand_back(self) -> None:
        if self._hand_back.is_set():
            raise HandBack()

    def publish(self) -> None:
        """Tell the API which models this worker serves (and their limits)."""
        info = {"name": self.name, "device": self.device, "heartbeat": time.time(),
                "models": [describe_model(name, engine) for name, engine in self.engines.items()], **self.rates.snapshot()}
        with self.connection.pipeline() as pipe:
            pipe.set(queues.worker_key(self.name), orjson.dumps(info), ex=self.settings.worker_ttl_s)
            pipe.zadd(queues.WORKERS_KEY, {self.name: time.time()})
            pipe.execute()

    def unpublish(self) -> None:
        with self.connection.pipeline() as pipe:
            pipe.delete(queues.worker_key(self.name))
            pipe.zrem(queues.WORKERS_KEY, self.name)
            pipe.execute()

    def maintain_if_due(self) -> None:
        if time.monotonic() - self._last_maintenance < self.settings.maintenance_interval_s:
            return
        self._last_maintenance = time.monotonic()
        for queue in self.queues:
            clean_registries(queue)
            IntermediateQueue(queue.key, self.connection).cleanup(self, queue)  # popped, never registered
        lifecycle.settle_dead_chunks(self.connection, self.s3, self.settings, self.name, calibrate_finished_job)

    def _heartbeat_forever(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_interval_s):
            try:
                self.heartbeat_held()
                self.publish()
            except Exception:  # a missed beat must not kill the beater
                log.exception("heartbeat failed")

    def heartbeat_held(self) -> None:
        ttl = self.settings.heartbeat_ttl_s
        with self._held_lock:
            held = list(self._held)
        with self.connection.pipeline() as pipe:
            self.heartbeat(pipeline=pipe)
            for item in held:
                item.execution.heartbeat(item.queue.started_job_registry, ttl, pipeline=pipe)
                item.job.heartbeat(now(), ttl, pipeline=pipe, xx=True)
            pipe.execute()

    # ---- one greedy step ----------------------------------------------------------------

    def drain_once(self, block_s: float = 1.0) -> bool:
        """Score one greedy batch: the one gathered during the last batch's GPU waits, else
        wait for a job and take more. False when idle."""
        batch = self._finish_ahead() or self._gather(block_s)
        if batch is None:
            return False
        self._run(batch.model, batch.held)
        return True

    def _gather(self, block_s: float) -> LookAhead | None:
        first = self._wait_for_job(block_s)
        if first is None:
            return None
        batch = LookAhead(self.engines, self._take, self.settings.worker_batch_passes)
        batch.add(self._hold(*first))
        batch.finish()
        return batch

    def _finish_ahead(self) -> LookAhead | None:
        """The batch begun during the last batch's GPU waits, finished now (None if it holds
        nothing), with the sync jobs of its model that came after it was full: a sync call
        waits for the batch in hand, as without the look-ahead, never for one more."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        ahead.finish()
        if not ahead.held:
            return None
        while (item := self._take(ahead.model, sync_only=True)) is not None:
            ahead.add(item)
        ahead.count_rows()
        return ahead

    def _look_ahead(self) -> Callable[[], bool] | None:
        """Begin the next batch; the returned step runs in the engine's GPU waits."""
        if self._stop.is_set():
            return None
        self._ahead = ahead = LookAhead(self.engines, partial(self._take, batch_only=True),
                                        self.settings.worker_batch_passes)

        def step() -> bool:
            self._check_hand_back()
            try:
                more = ahead.step()
            except Exception:  # ends the look-ahead only; what it holds is scored next
                log.exception("gathering the next batch during a pass failed")
                ahead.close()
                return False
            return more and not self._stop.is_set()

        return step

    def _take(self, model: str | None, sync_only: bool = False, batch_only: bool = False) -> HeldJob | None:
        """Hold the first job queued for `model` (any model when None), sync queues first;
        never blocks. The look-ahead takes batch jobs only (`batch_only`): a sync call that
        comes while a stream runs is the stream's next arrival, not a row of the batch after it."""
        in_order = [q for q in self.queues if (model is None or self.model_of_queue[q.name] == model)
                    and (not sync_only or q.name in self._sync_queue_names)
                    and (not batch_only or q.name not in self._sync_queue_names)]
        taken = self._pop(in_order)
        return None if taken is None else self._hold(*taken)

    def _hold(self, job: Job, queue: Queue) -> HeldJob:
        """Register the job as ours (started registry + execution), then load its rows."""
        with self.connection.pipeline() as pipe:
            execution = Execution.create(job, self.settings.heartbeat_ttl_s, pipeline=pipe, worker_name=self.name)
            self.set_state(WorkerStatus.BUSY, pipeline=pipe)
            pipe.execute()
        self.prepare_job_execution(job, remove_from_intermediate_queue=True)
        item = HeldJob(job, queue, execution, self.model_of_queue[queue.name])
        with self._held_lock:
            self._held.append(item)
        if job.func_name == queues.CHUNK_FUNC:
            self._load(item)
        return item

    def _load(self, item: HeldJob) -> None:
        """The chunk's rows (LookAhead counts their tokens, a row a step)."""
        try:
            payload = ChunkPayload.model_validate(item.job.kwargs["payload"])
            item.work = lifecycle.load_chunk(self.connection, self.s3, payload)
        except Exception as error:  # noqa: BLE001 - fails this job only (_perform); RQ retries it
            item.load_error = error

    def _perform(self, item: HeldJob) -> None:
        """End a held job as RQ's `perform_job` ends one after calling its function, with
        `_settle` as that function: its return value becomes the job's result (success
        callback, FinishedJobRegistry); an exception fails it (failure callback
        `on_chunk_failure`, then a retry or the FailedJobRegistry)."""
        try:
            try:
                result = self._settle(item)
            except Exception:  # noqa: BLE001 - recorded on the RQ job; RQ retries it
                self._finalize_failure(item.job, item.queue, item.execution, sys.exc_info())
            else:
                self._finalize_success(item.job, item.queue, item.execution, result)
        finally:
            with self._held_lock:
                self._held.remove(item)

    def _settle(self, item: HeldJob) -> dict:
        if item.job.func_name == queues.PLAN_FUNC:
            payload = PlanPayload.model_validate(item.job.kwargs["payload"])
            return lifecycle.plan_dataset(self.connection, self.s3, self.settings, payload, calibrate_finished_job)
        if item.load_error is not None:
            raise item.load_error
        settled = lifecycle.settle_chunk(self.connection, self.s3, self.settings, item.work, self.name,
                                         calibrate_finished_job)
        return settled.to_dict()

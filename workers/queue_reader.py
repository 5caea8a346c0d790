"""How the worker takes jobs off RQ's queues without losing one (a mixin of GreedyWorker).

    _wait_for_job(block_s): block server-side on the first sync queue (BLMOVE, WAIT_SLICE_S
      slices) until any queue has a job -> (Job, Queue) | None
    _pop(queues in order): LMOVE the first job found onto its queue's intermediate list
    _fetch(queue, id): the RQ job, or None (and its id dropped) when it was deleted while queued
    clean_registries(queue): RQ's registry cleanup (a dead worker's jobs re-queued or failed)

The worker using it has `connection`, `queues` (sync queues first) and `_stop`.
"""

from __future__ import annotations

import threading
import time

from redis import Redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.timeouts import TimerDeathPenalty

from contract import queues

WAIT_SLICE_S = 0.05  # an idle worker looks at its batch queues this often (sync wakes it at once)


class QueueReader:
    connection: Redis
    queues: list[Queue]
    _stop: threading.Event

    def _wait_for_job(self, block_s: float) -> tuple[Job, Queue] | None:
        """Block (server-side, on the first sync queue) until any queue has a job."""
        deadline = time.monotonic() + block_s
        while not self._stop.is_set():
            if (taken := self._pop(self.queues)) is not None:
                return taken
            if time.monotonic() >= deadline:
                return None
            # wakes at once for a sync call; batch queues are looked at every WAIT_SLICE_S
            sync = self.queues[0]
            job_id = self.connection.blmove(sync.key, sync.intermediate_queue_key, WAIT_SLICE_S, "LEFT", "RIGHT")
            if job_id is not None and (job := self._fetch(sync, job_id)) is not None:
                return job, sync
        return None

    def _pop(self, queues_in_order: list[Queue]) -> tuple[Job, Queue] | None:
        """Move the first job found (in queue order) to its queue's intermediate list: a worker
        killed between this move and the started registry leaves it there, where RQ's
        intermediate-queue cleanup finds it; a plain LPOP would lose it."""
        for queue in queues_in_order:
            while (job_id := self.connection.lmove(queue.key, queue.intermediate_queue_key, "LEFT", "RIGHT")):
                if (job := self._fetch(queue, job_id)) is not None:
                    return job, queue
        return None

    def _fetch(self, queue: Queue, job_id: bytes) -> Job | None:
        try:
            return Job.fetch(job_id.decode(), connection=self.connection, serializer=queues.JsonSerializer)
        except NoSuchJobError:  # deleted while queued (expired, cancelled)
            self.connection.lrem(queue.intermediate_queue_key, 1, job_id)
            return None


def clean_registries(queue: Queue) -> None:
    """RQ's registry cleanup: re-queue (or fail) jobs whose worker stopped heartbeating."""
    args = {"queue": queue, "death_penalty_class": TimerDeathPenalty}
    StartedJobRegistry(**args).cleanup()
    FinishedJobRegistry(**args).cleanup()
    FailedJobRegistry(**args).cleanup()

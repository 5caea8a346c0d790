"""SIGTERM on a worker: the chunks it holds go back to the front of their queues, at once.

    SIGTERM -> GreedyWorker.request_hand_back(): a flag, nothing else in the handler
    next safe point (a row's response built, a look-ahead step, the start of a batch)
      -> raise HandBack (a BaseException: the per-row retry of workers.tasks lets it through)
    GreedyWorker.run's exit -> hand_back(held): in one MULTI/EXEC, each held job's execution
      leaves the StartedJobRegistry and the job is queued again at the front of its queue

A job settled before the signal is no longer held, so nothing settles twice; a held job was
not settled (settling happens only between safe points), so nothing is lost. No retry is
spent: the job did not fail. Another worker takes the chunks as soon as they are queued.
"""

from __future__ import annotations

from redis import Redis

from workers.lookahead import HeldJob


class HandBack(BaseException):
    """Unwinds the batch in hand so its jobs can be handed back (not an error of any row)."""


def hand_back(connection: Redis, held: list[HeldJob]) -> list[str]:
    """Queue every held job again, first held first; returns their RQ ids."""
    with connection.pipeline(transaction=True) as pipe:
        for item in reversed(held):  # each goes to the front: the first held ends up first
            item.execution.delete(job=item.job, pipeline=pipe)
            # RQ's enqueue without its dependency step (which opens its own MULTI); chunks have none
            item.queue._enqueue_job(item.job, pipeline=pipe, at_front=True)
        pipe.execute()
    return [item.job.id for item in held]

"""RQ's failure callback for chunk and plan jobs: a chunk that will never run again still settles.

    RQ gives up on a chunk (worker died past `max_num_retries`, or its run kept raising)
      -> on_chunk_failure (the RQ jobs name it: contract/queues.py FAILURE_CALLBACK)
      -> jobstore.lifecycle.record_dead_chunk -> DEAD_CHUNKS_KEY list in Redis
      -> a worker's maintenance -> jobstore.lifecycle.settle_dead_chunks: error rows, summary, finalize

The callback runs inside whoever cleans RQ's registries and only touches Redis; the worker
that drains the list owns S3 and settings. No torch here.
"""

from __future__ import annotations

from redis import Redis

from jobstore.lifecycle import record_dead_chunk


def on_chunk_failure(job, connection: Redis, exc_type=None, exc_value=None, traceback=None) -> None:
    if job.retries_left and job.retries_left > 0:
        return  # RQ re-queues it; another worker finishes it
    reason = f"the chunk failed on its last attempt ({exc_type.__name__ if exc_type else 'worker lost'})"
    record_dead_chunk(connection, job.kwargs.get("payload", {}), reason)

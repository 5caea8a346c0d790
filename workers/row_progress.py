"""Progress of the chunks in a batch's passes: rows counted as the engine builds their responses.

    RowProgress(r, chunks): partial_key(job)[chunk] := 0 for each chunk taken (a retried chunk restarts)
      engine builds row i's response --RowSlot.on_scored--> count for its chunk
      --at most every FLUSH_S--> HSET partial_key(job)[chunk] = rows scored so far
    drop(chunk): once settled, it is no longer counted (a batch fed for hours writes only open chunks)
    records.load_view: done = rows of settled chunks + partial counts of the others

Counts are written, never added, so a count is never doubled; the chunk's settle supersedes it.
"""

from __future__ import annotations

import time
from functools import partial

from redis import Redis

from contract import queues
from jobstore.chunks import ChunkWork

FLUSH_S = 0.5


class RowProgress:
    def __init__(self, r: Redis, chunks: list[ChunkWork]) -> None:
        self.r = r
        self.counts: dict[tuple[str, int], int] = {}
        self.flushed_at = time.monotonic()
        self.add(chunks)

    def add(self, chunks: list[ChunkWork]) -> None:
        """Count these chunks' rows too (chunks that joined the batch while it runs)."""
        for work in chunks:
            key = (work.payload.job_id, work.payload.chunk_index)
            self.counts[key] = 0
            for slot in work.rows:
                slot.on_scored = partial(self._count, key)
        self.flush()

    def drop(self, work: ChunkWork) -> None:
        """Stop counting a settled chunk (its settle supersedes the count)."""
        self.counts.pop((work.payload.job_id, work.payload.chunk_index), None)

    def _count(self, key: tuple[str, int]) -> None:
        self.counts[key] += 1
        if time.monotonic() - self.flushed_at >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        self.flushed_at = time.monotonic()
        if not self.counts:
            return
        with self.r.pipeline(transaction=False) as pipe:
            for (job_id, chunk_index), count in self.counts.items():
                pipe.hset(queues.partial_key(job_id), str(chunk_index), count)
            pipe.execute()

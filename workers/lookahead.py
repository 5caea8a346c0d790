"""The worker's next batch, gathered a step at a time: the jobs it holds, their tokens, full or not.

    LookAhead.step(): compile one row of a held job (its tokenization and tree, kept for scoring)
                      | take and hold one more job of its model (Redis; S3 for a chunk stored there)
      -> held [HeldJob] (the first fixes `model`), num_tokens, is_full (num_tokens >= num_passes
         x the model's max_num_batched_tokens), is_drained (its queues were empty), is_closed
    GreedyWorker: steps it in the GPU waits of the batch on the GPU; when that batch runs out of
      rows, take_ready() hands it the jobs counted so far (the passes go on); what is left when
      the batch ends is finished and scored next

Never blocks: taking a job pops it without waiting (`take`, the worker's). One step does one
thing, so a GPU wait runs at most one step of host work past the pass it waits for.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rq import Queue
from rq.executions import Execution
from rq.job import Job

from jobstore.chunks import ChunkWork

from engine import RequestError

if TYPE_CHECKING:
    from engine import CompiledRequest, Engine


@dataclass(slots=True)
class HeldJob:
    """An RQ job this worker holds (started registry, heartbeated) until it is performed."""

    job: Job
    queue: Queue
    execution: Execution
    model: str  # the served model whose queue it came from
    work: ChunkWork | None = None  # None for plan steps and chunks that failed to load
    load_error: Exception | None = None  # why the chunk did not load; its job fails with it
    num_tokens: int = 0  # of its rows counted so far
    # row i of `work.rows` as Engine.compile made it when counted (None: not counted yet); the
    # engine's types stay here, in the worker: the job store's rows know no engine
    compiled: list[CompiledRequest | RequestError | None] = field(default_factory=list)


TakeJob = Callable[[str | None], HeldJob | None]
"""Hold the next queued job of this model (of any model when None); None when there is none.
Never blocks. The worker's take for its look-ahead skips the sync queues: a sync call that
comes while a stream runs joins the stream's next pass (Engine.score_batch's `arrivals`)."""


class LookAhead:
    """One model's next batch. A step holds one job or counts one row; every row of a job is
    counted before the next job is taken, and no job is taken once the batch is full."""

    def __init__(self, engines: Mapping[str, Engine], take: TakeJob, num_passes: int = 1):
        self.model: str | None = None  # fixed by the first job held
        self.num_passes = num_passes  # full passes' worth of tokens it gathers
        self.held: list[HeldJob] = []
        self.num_tokens = 0
        self.is_drained = False  # the last look at its queues found nothing
        self.is_closed = False  # no more steps (a step raised, or the worker is stopping)
        self._engines = engines
        self._take = take
        self._uncounted: deque[tuple[HeldJob, int]] = deque()  # (job, index of one of its rows)

    @property
    def is_full(self) -> bool:
        if self.model is None:
            return False
        return self.num_tokens >= self.num_passes * self._engines[self.model].config.max_num_batched_tokens

    @property
    def is_done(self) -> bool:
        """Nothing left to do: closed, or every held row counted and either full or drained."""
        return self.is_closed or (not self._uncounted and (self.is_full or self.is_drained))

    def step(self) -> bool:
        """Do one step; False when there was nothing left to do (`is_done`)."""
        if self.is_done:
            return False
        if self._uncounted:
            self._count_next()
            return True
        item = self._take(self.model)
        if item is None:
            self.is_drained = True
            return False
        self.add(item)
        return True

    def finish(self) -> None:
        while self.step():
            pass

    def add(self, item: HeldJob) -> None:
        """Put a held job in this batch; its rows wait to be counted."""
        if self.model is None:
            self.model = item.model
        self.held.append(item)
        rows = item.work.rows if item.work is not None else []
        item.compiled = [None] * len(rows)
        self._uncounted.extend((item, index) for index, slot in enumerate(rows) if slot.request is not None)

    def count_rows(self) -> None:
        """Count every row still uncounted (jobs added after the batch was full)."""
        while self._uncounted:
            self._count_next()

    def take_ready(self) -> list[HeldJob]:
        """Hand over the held jobs whose rows are all counted (to the batch on the GPU, which
        ran out of rows), in the order taken; the others stay. It looks at its queues again."""
        counting = {id(item) for item, _ in self._uncounted}
        ready = [item for item in self.held if id(item) not in counting]
        self.held = [item for item in self.held if id(item) in counting]
        self.num_tokens -= sum(item.num_tokens for item in ready)
        self.is_drained = False
        return ready

    def close(self) -> None:
        self.is_closed = True

    def _count_next(self) -> None:
        item, index = self._uncounted.popleft()
        item.compiled[index] = _compile(self._engines[self.model], item.work.rows[index].request)
        num_tokens = 0 if item.compiled[index] is None or isinstance(item.compiled[index], RequestError) \
            else item.compiled[index].num_tokens
        item.num_tokens += num_tokens
        self.num_tokens += num_tokens


def _compile(engine, request) -> CompiledRequest | RequestError | None:
    """The row compiled (Engine.compile: its tokens and tree); None when compiling raised, so
    score_rows compiles it again and reports that row's error."""
    try:
        return engine.compile(request)
    except Exception:  # noqa: BLE001 - score_rows reports the row's error
        return None

"""One stream of passes on one model's engine, fed while it runs (a mixin of GreedyWorker).

    _run(model, held jobs) -> Stream: the jobs joined (sync calls first), their rows told to
      RowProgress and each job performed as soon as its last row is scored
      --workers.tasks.score_rows: one Engine.score_batch, asked as it packs for
        arrivals(): sync calls queued since the last look: on CUDA scored at once in the engine's
                    sync lane beside the pass in flight; on CPU packed into the next pass first
        refill():   when no row is left to pack, the jobs the look-ahead holds ready (every
                    row compiled in the GPU waits), so the passes go on without a break
      --> each job performed (settled, ended in RQ), counted in the worker's rates, let go
    -> what was not performed early (a slot row, an error the batch raised) performed at its end

A stream ends when the engine runs out of rows and the look-ahead holds none ready (always so
on CPU, where a pass is done when launched and nothing is gathered during it), or once a row
with extraction slots is in (slots are decoded after the last pass); the worker then scores
what the look-ahead holds, or waits for its next job. A job that needs no scoring (a plan step, a chunk that
did not load, a cancelled chunk) is performed as it joins.

The worker using it has `engines`, `connection`, `rates`, `_ahead`, `_stop`, `_take`,
`_perform`, `_check_hand_back` and `_sync_queue_names`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

from rq.worker import WorkerStatus

from contract import queues
from jobstore.chunks import RowSlot
from workers import tasks
from workers.lookahead import HeldJob
from workers.row_progress import RowProgress


@dataclass(slots=True)
class Stream:
    model: str
    progress: RowProgress
    held: dict[int, HeldJob] = field(default_factory=dict)  # id -> joined, not performed yet
    pass_ids: set[int] = field(default_factory=set)  # passes already counted in the rates


class StreamRunner:
    def _run(self, model: str, held: list[HeldJob]) -> None:
        self._check_hand_back()
        stream = Stream(model, RowProgress(self.connection, []))
        rows = self._join(stream, sorted(held, key=lambda h: not self._is_sync(h)))  # sync calls first
        tasks.score_rows(self.engines[model], [slot for _, slot, _ in rows], [done for _, _, done in rows],
                         self._look_ahead(), partial(self._sync_arrivals, stream), partial(self._refill, stream))
        for item in list(stream.held.values()):
            self._perform_in(stream, item)
        self.set_state(WorkerStatus.IDLE)

    def _join(self, stream: Stream, items: list[HeldJob]) -> list[tuple[HeldJob, RowSlot, object]]:
        """Join these held jobs to the stream: (job, row, its compiled request or None) of each
        row to score. Each job is performed when its last row is scored; one with none, at once."""
        rows = []
        for item in items:
            stream.held[id(item)] = item
            pending = [] if item.work is None or item.work.is_cancelled else \
                [index for index, slot in enumerate(item.work.rows) if slot.request is not None]
            if not pending:
                self._perform_in(stream, item)
                continue
            stream.progress.add([item.work])
            self._perform_when_scored(stream, item)
            self._check_hand_back_before_telling(item.work.rows)
            compiled = item.compiled or [None] * len(item.work.rows)
            rows += [(item, item.work.rows[index], compiled[index]) for index in pending]
        return rows

    def _sync_arrivals(self, stream: Stream) -> list[tuple[RowSlot, object]]:
        """Sync calls queued since the last look, held and compiled now: the engine scores them
        in its sync lane, or packs them into its next pass (Engine.score_batch's `arrivals`)."""
        if self._stop.is_set():
            return []
        taken = []
        while (item := self._take(stream.model, sync_only=True)) is not None:
            taken.append(item)
        return self._compiled(stream, self._join(stream, taken))

    def _refill(self, stream: Stream) -> list[tuple[RowSlot, object]]:
        """The look-ahead's jobs whose rows are all compiled (it steps in the GPU waits), for the
        engine that ran out of rows (Engine.score_batch's `refill`); none, and the stream ends,
        when it holds none of this model (on CPU nothing waits, so nothing is ever ready)."""
        ahead = self._ahead
        if self._stop.is_set() or ahead is None or ahead.model != stream.model:
            return []
        return self._compiled(stream, self._join(stream, ahead.take_ready()))

    def _compiled(self, stream: Stream, rows: list[tuple[HeldJob, RowSlot, object]]) -> list[tuple[RowSlot, object]]:
        """Each row with its compiled request, compiling the rows nobody compiled yet."""
        engine = self.engines[stream.model]
        out = []
        for item, slot, done in rows:
            if done is None:
                done = tasks.compile_row(engine, slot)
                item.num_tokens += getattr(done, "num_tokens", 0)
            out.append((slot, done))
        return out

    def _is_sync(self, item: HeldJob) -> bool:
        return item.queue.name in self._sync_queue_names

    def _check_hand_back_before_telling(self, rows: list) -> None:
        """The safe point of a hand-back: before a built row is told (progress, settle)."""
        for slot in rows:
            slot.on_scored = partial(self._checked, slot.on_scored)

    def _checked(self, then) -> None:
        self._check_hand_back()
        if then is not None:
            then()

    def _perform_when_scored(self, stream: Stream, item: HeldJob) -> None:
        """Perform the job as soon as the engine has built its last row's response, between
        passes while the next one runs (a sync call is answered then; a chunk is written while
        the device works)."""
        pending = [slot for slot in item.work.rows if slot.request is not None]
        remaining = [len(pending)]
        for slot in pending:
            slot.on_scored = partial(self._row_scored, stream, item, remaining, slot.on_scored)

    def _row_scored(self, stream: Stream, item: HeldJob, remaining: list[int], then) -> None:
        if then is not None:
            then()  # the row's progress count
        remaining[0] -= 1
        if remaining[0] == 0:
            self._perform_in(stream, item)

    def _perform_in(self, stream: Stream, item: HeldJob) -> None:
        """Perform a joined job, count it in the rates, and let it go."""
        if stream.held.pop(id(item), None) is None:
            return
        self._perform(item)
        if item.work is not None:
            stream.progress.drop(item.work)
        self._record_stats(stream, item)

    def _record_stats(self, stream: Stream, item: HeldJob) -> None:
        """A performed job's rows, tokens and the passes first seen with it: the service-wide
        counters (GET /metrics) and this worker's rates (GET /health)."""
        rows = [] if item.work is None or item.work.is_cancelled else item.work.rows
        new_passes = {p for slot in rows for p in slot.pass_ids} - stream.pass_ids
        stream.pass_ids |= new_passes
        budget = self.engines[stream.model].config.max_num_batched_tokens
        with self.connection.pipeline() as pipe:
            pipe.hincrby(queues.STATS_KEY, "rows_total", len(rows))
            pipe.hincrby(queues.STATS_KEY, "rows_failed_total", sum(slot.response is None for slot in rows))
            pipe.hincrby(queues.STATS_KEY, "passes_total", len(new_passes))
            pipe.hincrby(queues.STATS_KEY, "pass_tokens_total", item.num_tokens)
            pipe.hincrby(queues.STATS_KEY, "pass_budget_tokens_total", budget * len(new_passes))
            pipe.execute()
        self.rates.record(len(rows), item.num_tokens, budget * len(new_passes))

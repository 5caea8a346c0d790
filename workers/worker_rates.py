"""A worker's own recent rates, published with its heartbeat (GET /health, /metrics).

    each scored batch -> WorkerRates.record(rows, tokens packed, token budget of its passes)
    snapshot() -> {"rows_total", "rows_per_s", "pass_fill", "rate_window_s"}

rows_per_s: rows of the batches that ended in the last RATE_WINDOW_S seconds, divided by that
window (or by the worker's age, when it is younger). pass_fill: tokens packed / pass budget
(max_num_batched_tokens x passes) over those same batches; None when it ran no pass in the
window. The service-wide counters behind spinf_rows_total and spinf_pass_*_tokens_total are
the same numbers summed over every worker since the start.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

RATE_WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class BatchDone:
    ended_at: float  # clock()
    rows: int
    tokens: int
    budget_tokens: int


class WorkerRates:
    def __init__(self, clock: Callable[[], float] = time.monotonic, window_s: float = RATE_WINDOW_S) -> None:
        self.clock = clock
        self.window_s = window_s
        self.started_at = clock()
        self.rows_total = 0
        self._recent: deque[BatchDone] = deque()

    def record(self, rows: int, tokens: int, budget_tokens: int) -> None:
        self.rows_total += rows
        self._recent.append(BatchDone(self.clock(), rows, tokens, budget_tokens))

    def snapshot(self) -> dict:
        clock = self.clock()
        while self._recent and self._recent[0].ended_at < clock - self.window_s:
            self._recent.popleft()
        span = min(self.window_s, max(clock - self.started_at, 1e-9))
        budget = sum(batch.budget_tokens for batch in self._recent)
        return {
            "rows_total": self.rows_total,
            "rows_per_s": round(sum(batch.rows for batch in self._recent) / span, 6),
            "pass_fill": round(sum(batch.tokens for batch in self._recent) / budget, 6) if budget else None,
            "rate_window_s": self.window_s,
        }

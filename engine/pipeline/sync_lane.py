"""Sync calls' own passes, beside the batch's passes (what `Engine.score_batch`'s `arrivals` bring).

    ModelRunner.run_all(lane=SyncLane), while a batch pass runs on the device:
      every POLL_S: source() -> the arrivals, packed into passes of their own
        --launch on a high-priority CUDA stream--> queued beside the batch pass (the device
          gives the lane's blocks the SMs first as the batch pass's blocks end)
      a lane pass done -> yielded at once (its responses are built and told while the batch
        pass still runs)
    after the batch's last pass: drain() -> no more arrivals taken; the lane's passes finish

A sync call then waits for its own small pass, run beside the pass in flight, instead of the
rest of that pass and a whole batch pass after it. Every kernel is row-local (batch
invariant), so its scores are the bits it gets alone or packed. On CPU a pass runs inside its
launch: the lane looks for arrivals once per batch pass, and runs them before the next is read.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch

from engine.pipeline.stages import PackedBatch, RunnerOutput

if TYPE_CHECKING:  # a type only: the runner drives the lane (engine/pipeline/runner.py imports this)
    from engine.pipeline.runner import _Launched

POLL_S = 0.002  # how often the lane asks for arrivals while a batch pass runs
SLEEP_S = 0.0005  # the wait between looks when the host has nothing else to do
HIGH_PRIORITY = -1  # torch.cuda.Stream's priority: lower is higher, the default stream's is 0


class SyncLane:
    def __init__(self, source: Callable[[], list[PackedBatch]], launch: Callable[[PackedBatch], _Launched],
                 device: torch.device) -> None:
        self.source = source  # the arrivals since the last look, packed (the engine admits them)
        self.launch = launch  # ModelRunner.launch: queue one pass on the current stream
        self.stream = torch.cuda.Stream(device, priority=HIGH_PRIORITY) if device.type == "cuda" else None
        self.in_flight: deque[_Launched] = deque()
        self.num_passes = 0  # lane passes launched
        self._next_look = 0.0
        self._open = True

    def serve_until(self, is_done: Callable[[], bool],
                    while_waiting: Callable[[], bool] | None = None) -> Iterator[tuple[PackedBatch, RunnerOutput]]:
        """Until `is_done()` (the batch pass in flight has ended): look for arrivals and launch
        them, yield each lane pass as it ends, and run `while_waiting` steps (the batch's host
        work) while it returns True, short sleeps after."""
        has_work = while_waiting is not None
        self._look(now=True)
        while True:
            yield from self._finished()
            if is_done():
                return
            if has_work:
                has_work = while_waiting()
            else:
                time.sleep(SLEEP_S)
            self._look()

    def drain(self) -> Iterator[tuple[PackedBatch, RunnerOutput]]:
        """The batch has no pass left: take no more arrivals; the lane's passes in order."""
        self._open = False
        while self.in_flight:
            launched = self.in_flight.popleft()
            yield launched.batch, launched.wait()

    def _look(self, now: bool = False) -> None:
        clock = time.perf_counter()
        if not self._open or (not now and clock < self._next_look):
            return
        self._next_look = clock + POLL_S
        batches = self.source()
        with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
            for batch in batches:
                self.in_flight.append(self.launch(batch))
                self.num_passes += 1

    def _finished(self) -> Iterator[tuple[PackedBatch, RunnerOutput]]:
        while self.in_flight and self.in_flight[0].is_done():
            launched = self.in_flight.popleft()
            yield launched.batch, launched.wait()

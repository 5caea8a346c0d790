"""Sync calls' own passes, beside the batch's passes (what `Engine.score_batch`'s `arrivals` bring).

    ModelRunner.run_all(lane=SyncLane), while a batch pass runs on the device:
      every POLL_S: source() -> the arrivals, packed into passes of their own
        --launch on a high-priority CUDA stream--> queued beside the batch pass (the device
          gives the lane's blocks the SMs first as the batch pass's blocks end)
      a lane pass done -> yielded at once (its responses are built and told while the batch
        pass still runs)
    after the batch's last pass: drain() -> no more arrivals taken; the lane's passes finish,
      then what the batch left of the requests too large for the lane (leftover())

LaneIntake(builder, arrivals, pack, floor_trees, budget) is the lane's source: every arrival is
admitted to the batch in order (its index next); the floors nobody asked for and each request of
at most MAX_LANE_SHARE of the budget are packed for the lane; a larger request is left to the
batch's passes (`take_overflow`, packed ahead of the rest at the next pass), so the lane never
holds more than a fraction of a pass's memory beside the batch pass. What the batch did not take
before it ended runs in the lane's drain, in passes of the whole budget.

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

from engine.pipeline.packer import split_tree
from engine.pipeline.stages import CompiledRequest, FloorKey, PackedBatch, RequestError, RunnerOutput, TokenTree, TreeOwner

if TYPE_CHECKING:  # types only: the runner drives the lane (engine/pipeline/runner.py imports this)
    from engine.pipeline.responses import ResponseBuilder
    from engine.pipeline.runner import _Launched

PackFn = Callable[..., Iterator[PackedBatch]]  # pack_trees(items, max_num_tokens)

MAX_LANE_SHARE = 4  # a request past budget / 4 tokens rides the batch's passes, not the lane
POLL_S = 0.002  # how often the lane asks for arrivals while a batch pass runs
SLEEP_S = 0.0005  # the wait between looks when the host has nothing else to do
HIGH_PRIORITY = -1  # torch.cuda.Stream's priority: lower is higher, the default stream's is 0


class SyncLane:
    def __init__(self, source: Callable[[], list[PackedBatch]], launch: Callable[[PackedBatch], _Launched],
                 device: torch.device, leftover: Callable[[], list[PackedBatch]] | None = None) -> None:
        self.source = source  # the arrivals since the last look, packed (LaneIntake.batches)
        self.launch = launch  # ModelRunner.launch: queue one pass on the current stream
        self.leftover = leftover  # after the batch: what it left for the lane (LaneIntake.leftover)
        self.stream = torch.cuda.Stream(device, priority=HIGH_PRIORITY) if device.type == "cuda" else None
        self.in_flight: deque[_Launched] = deque()
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
        """The batch has no pass left: take no more arrivals; the lane's passes in order, then
        the requests the batch left to it."""
        self._open = False
        self._launch_all(self.leftover() if self.leftover is not None else [])
        while self.in_flight:
            launched = self.in_flight.popleft()
            yield launched.batch, launched.wait()

    def _look(self, now: bool = False) -> None:
        clock = time.perf_counter()
        if not self._open or (not now and clock < self._next_look):
            return
        self._next_look = clock + POLL_S
        self._launch_all(self.source())

    def _launch_all(self, batches: list[PackedBatch]) -> None:
        with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
            for batch in batches:
                self.in_flight.append(self.launch(batch))

    def _finished(self) -> Iterator[tuple[PackedBatch, RunnerOutput]]:
        while self.in_flight and self.in_flight[0].is_done():
            launched = self.in_flight.popleft()
            yield launched.batch, launched.wait()


class LaneIntake:
    def __init__(self, builder: ResponseBuilder, arrivals: Callable[[], list[CompiledRequest | RequestError]],
                 pack: PackFn, floor_trees: Callable[[list[FloorKey]], Iterator[tuple[TreeOwner, TokenTree]]],
                 budget: int) -> None:
        self.builder = builder  # the batch's: arrivals are admitted to it, in order
        self.arrivals = arrivals
        self.pack = pack
        self.floor_trees = floor_trees  # floor keys -> their trees (Engine._floor_trees)
        self.budget = budget  # the pass budget (max_num_batched_tokens)
        self.lane_tokens = budget // MAX_LANE_SHARE  # the most a request may hold to ride the lane
        self.overflow: deque[int] = deque()  # admitted, too large for the lane, not taken by the batch yet

    def batches(self) -> list[PackedBatch]:
        """The arrivals since the last look, admitted; the lane's share packed on its own: the
        floors nobody asked for, then each small request's trees."""
        arrived = self.arrivals()
        if not arrived:
            return []
        first = len(self.builder.compiled)
        trees = list(self.floor_trees(self.builder.admit(arrived)))
        for index in range(first, len(self.builder.compiled)):
            request = self.builder.compiled[index]
            if not isinstance(request, CompiledRequest):
                continue
            if request.num_tokens > self.lane_tokens:
                self.overflow.append(index)
            else:
                trees += self._trees_of(index, request)
        return list(self.pack(iter(trees), self.lane_tokens)) if trees else []

    def take_overflow(self) -> list[int]:
        """The large arrivals for the batch's next pass (their indices, in order of arrival)."""
        taken = list(self.overflow)
        self.overflow.clear()
        return taken

    def leftover(self) -> list[PackedBatch]:
        """The large arrivals the batch ended before taking, packed in passes of the whole budget."""
        trees = [tree for index in self.take_overflow() for tree in self._trees_of(index, self.builder.compiled[index])]
        return list(self.pack(iter(trees), self.budget)) if trees else []

    def _trees_of(self, index: int, request: CompiledRequest) -> list[tuple[TreeOwner, TokenTree]]:
        return [(TreeOwner(index), tree) for tree in split_tree(request.tree, self.budget)]

"""CUDA graphs of decoding passes: a pass with the shape of one before it is replayed, not launched.

    DecodeBatch --pass_shape--> (rows, scored rows, per attention group: its arena's tensors by
        address, the entries attended, rows per entry, index lengths)
    first pass of a shape: eager (it also compiles any kernel these shapes need, and notes
        which attention masks the model asks for)
    second pass of that shape: captured once into a CUDA graph over static device inputs (ids,
        positions, scored rows, each group's index tensors and masks), then replayed
    every later pass of that shape: its host inputs copied into the static ones, one replay

A decoding pass of a 48-layer model is a few thousand kernel launches; a replay is one. It runs
the same kernels on the same shapes and inputs as the eager pass, so its log-probs are the same
bits (tests/engine/extraction/test_gpu_slots.py). Extraction keeps a pass's shape from step to
step by holding finished slots in place (engine/extraction/decoding.py).

The graphs of one decoding run share a memory pool and live as long as the run's K/V (the
arenas they read by address); a pass over MAX_GRAPH_ROWS rows runs eagerly (it is bound by the
device, and a graph would keep its [S, V] log-probs for the whole run).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.layers.decode_attention import DecodeGroup, DecodeMetadata
from engine.layers.ops import to_device

if TYPE_CHECKING:  # types only: extraction builds the batches (it imports the runner, which imports this)
    from engine.extraction.decoding import DecodeBatch

logger = logging.getLogger(__name__)

MAX_GRAPH_ROWS = 2048  # scored rows of the largest pass captured ([S, V] float32 log-probs kept: 2 GiB at V = 262k)

DecodeForward = Callable[[torch.Tensor, torch.Tensor, DecodeMetadata, torch.Tensor], torch.Tensor]
# (input ids [T], positions [T], decode metadata, scored rows [S], all on the device) -> log-probs [S, V]


def device_inputs(batch: DecodeBatch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pass's input ids [T], positions [T] and scored rows [S] on `device` (pinned, non-blocking)."""
    return tuple(to_device(t, device) for t in (batch.input_ids, batch.positions, batch.scored_index))


def pass_shape(batch: DecodeBatch) -> tuple:
    """Everything a graph of this pass bakes in besides its inputs' values."""
    return (batch.input_ids.shape[0], batch.scored_index.shape[0], tuple(g.shape() for g in batch.decode.groups))


@dataclass(slots=True)
class _StaticInputs:
    """A captured pass's device inputs: refilled from a new batch's host tensors before a replay."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    scored_index: torch.Tensor  # [S]: always arange(S) (engine/extraction/decoding.py), never refilled
    indices: list[tuple[torch.Tensor, ...]]  # per group: (query_rows, rows, write_rows, out_rows)
    masks: list[dict[tuple, torch.Tensor]]  # per group: (sliding_window, device, G) -> [B, 1, G * n, C]

    def refill(self, batch: DecodeBatch) -> None:
        """Copy the batch's host inputs in, pinned and non-blocking (the host allocator keeps a
        pinned block until the copy that reads it has run, as for `ops.to_device`)."""
        pairs = [(self.input_ids, batch.input_ids), (self.positions, batch.positions)]
        for group, indices, masks in zip(batch.decode.groups, self.indices, self.masks, strict=True):
            pairs += zip(indices, group.host_indices(), strict=True)
            pairs += [(static, group.host_mask(window, num_groups)) for (window, _, num_groups), static in masks.items()]
        for static, host in pairs:
            static.copy_(host.pin_memory(), non_blocking=True)


@dataclass(slots=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: _StaticInputs
    logprobs: torch.Tensor  # [S, V] float32, written by each replay


@dataclass(slots=True)
class DecodeGraphs:
    """The graphs of one decoding run (engine/extraction/decoding.py `_decode`), by pass shape.
    `capture=False` (CPU): every pass eager; the run still holds finished slots in place."""

    device: torch.device
    capture: bool = True
    max_rows: int = MAX_GRAPH_ROWS  # scored rows of the largest pass captured
    graphs: dict[tuple, _Graph] = field(default_factory=dict, repr=False)
    seen: dict[tuple, list[list[tuple]]] = field(default_factory=dict, repr=False)  # shape -> the masks its eager pass made, per group
    pool: tuple | None = field(default=None, repr=False)  # the memory pool the run's graphs share (their replays never overlap)
    num_eager: int = 0  # passes launched kernel by kernel
    num_captured: int = 0
    num_replayed: int = 0  # passes run as a replay (a captured pass's included)
    capture_error: str | None = None  # why a capture failed (the run's later passes are eager)
    eager_seconds: float = 0.0  # host time launching the eager passes (with any wait for a full launch queue)
    capture_seconds: float = 0.0  # host time capturing (the device idles unless work is queued)

    def logprobs(self, batch: DecodeBatch, forward: DecodeForward) -> torch.Tensor:
        """[S, V] log-probs of the batch's pass on the device: replayed, captured or eager."""
        shape = pass_shape(batch)
        if shape in self.graphs:
            return self._replay(self.graphs[shape], batch)
        if self.capture and shape in self.seen and batch.scored_index.shape[0] <= self.max_rows:
            began = time.perf_counter()
            try:
                self.graphs[shape] = self._capture(batch, forward, self.seen[shape])
            except RuntimeError as error:  # an op that cannot be captured: this run goes on eagerly
                self.capture, self.capture_error = False, f"{type(error).__name__}: {error}"
                logger.warning("decoding passes run eagerly: capturing a CUDA graph failed (%s)", self.capture_error)
            else:
                self.capture_seconds += time.perf_counter() - began
                return self._replay(self.graphs[shape], batch)
        began = time.perf_counter()
        input_ids, positions, scored_index = device_inputs(batch, self.device)
        out = forward(input_ids, positions, batch.decode, scored_index)
        self.seen[shape] = [group.mask_keys() for group in batch.decode.groups]
        self.num_eager += 1
        self.eager_seconds += time.perf_counter() - began
        return out

    def new_layout(self) -> None:
        """The run's passes take new shapes: the graphs of the old ones are let go (their
        memory goes back to the pool for the next captures)."""
        self.graphs.clear()
        self.seen.clear()

    def _capture(self, batch: DecodeBatch, forward: DecodeForward, mask_keys: list[list[tuple]]) -> _Graph:
        """The pass's inputs put on the device first (the groups' caches hold them, so the
        attention finds them there and copies nothing while captured), then one capture."""
        inputs = _StaticInputs(*device_inputs(batch, self.device), [], [])
        for group, keys in zip(batch.decode.groups, mask_keys, strict=True):
            inputs.indices.append(_cached_indices(group, keys))
            inputs.masks.append({key: group.attention_mask(*key) for key in keys})
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                logprobs = forward(inputs.input_ids, inputs.positions, batch.decode, inputs.scored_index)
            finally:
                graph.capture_end()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.num_captured += 1
        return _Graph(graph, inputs, logprobs)

    def _replay(self, entry: _Graph, batch: DecodeBatch) -> torch.Tensor:
        entry.inputs.refill(batch)
        entry.graph.replay()
        self.num_replayed += 1
        return entry.logprobs


def _cached_indices(group: DecodeGroup, mask_keys: list[tuple]) -> tuple[torch.Tensor, ...]:
    """The group's index tensors on the device the attention will ask for them on (the device
    of its masks' keys: `cuda:0`, not `cuda`)."""
    devices = {device for _, device, _ in mask_keys}
    if len(devices) != 1:
        raise ValueError(f"decode graph: the pass's masks were made on {len(devices)} devices, expected 1")
    return group.indices(devices.pop())

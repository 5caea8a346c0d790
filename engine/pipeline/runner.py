"""Run one packed pass through the model and read the scored tokens' log-probabilities.

    PackedBatch (CPU tensors) --prepare--> device tensors --model--> logits [S, V]
        --log-softmax (row log-sum-exp kernel on CUDA)--> RunnerOutput(target_logprobs [S])

The LM head runs only at the scored rows (inside the model). The log-softmax of a row never
depends on how many rows the pass has: one program per row with fixed V chunks on CUDA,
fixed SCORE_CHUNK-row blocks on CPU. On CPU the LM head itself runs block by block
(`cpu_scored_logprobs`: hidden [S, D] -> per block [SCORE_CHUNK, V]), so no [S, V] is held.
A pass with extraction slots also returns their whole next-token distributions and the K/V
of their prompts (kept for decoding); `decode` runs a decoding pass over that K/V:

    DecodeBatch (engine/extraction/decoding.py) --model--> logits [S, V] --log-softmax--> [S, V]
        --select.select (on the device)--> each row's top k+1 candidates and END mass
    (on CUDA a pass with the shape of one before it is a graph's replay: decode_graphs.py)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.kernels.logprobs import option_logprobs, row_logsumexp
from engine.kernels.matmul import BLAS_BLOCK_ROWS
from engine.layers.attention import AttentionMetadata
from engine.layers.decode_attention import DecodeMetadata, decoding_attention
from engine.layers.ops import ROW_CHUNK, SCORE_CHUNK, decoding_matmuls, to_device
from engine.pipeline.decode_graphs import DecodeGraphs, device_inputs
from engine.pipeline.launch_clock import LaunchClock
from engine.pipeline.stages import PackedBatch, RunnerOutput
from engine.pipeline.sync_lane import SyncLane

if TYPE_CHECKING:  # types only: extraction drives this runner (engine/extraction/decoding.py imports it)
    from engine.extraction.select import Candidates
    from engine.extraction.decoding import DecodeBatch


@dataclass(slots=True)
class _Launched:
    batch: PackedBatch
    output: RunnerOutput  # host tensors that fill in when `done` fires
    done: torch.cuda.Event | None  # recorded after the copies (None on CPU)
    started: torch.cuda.Event | None = None  # recorded before the pass's kernels (None on CPU)
    started_at: float = 0.0  # host clock: when the pass began on the device, as far as the host saw

    def wait(self, while_waiting: Callable[[], bool] | None = None) -> RunnerOutput:
        """The pass's outputs. Until the pass is done, `while_waiting()` (a short piece of host
        work that overlaps the GPU) runs again and again while it returns True."""
        if self.done is not None:
            while while_waiting is not None and not self.done.query() and while_waiting():
                pass
            self.done.synchronize()
        return self.output

    def is_done(self) -> bool:
        return self.done is None or self.done.query()

    def device_s(self) -> float:
        """Seconds the pass took on the device (after `wait`)."""
        return self.started.elapsed_time(self.done) / 1e3 if self.started is not None else 0.0


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A non-blocking copy into pinned host memory on CUDA (read it after the pass's event)."""
    if tensor.device.type == "cpu":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor, non_blocking=True)


def _record_event(device: torch.device) -> torch.cuda.Event | None:
    if device.type != "cuda":
        return None
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


class ModelRunner:
    def __init__(self, model: torch.nn.Module, device: torch.device, use_decode_graphs: bool | None = None) -> None:
        self.model = model
        self.device = device
        self.num_passes = 0
        # decoding runs keep their passes' shapes and replay them as CUDA graphs (None: on CUDA)
        self.use_decode_graphs = device.type == "cuda" if use_decode_graphs is None else use_decode_graphs
        # the kernel of the decoding passes' bf16 projections (ops.DECODING_MATMULS; docs/extraction.md, Cost)
        self.decoding_matmul = "blas"
        # how the decoding passes' attention runs on CUDA (decode_attention.DECODING_ATTENTION)
        self.decoding_attention = "triton"

    def run_all(
        self, batches: Iterable[PackedBatch], while_waiting: Callable[[], bool] | None = None,
        clock: LaunchClock | None = None, lane: SyncLane | None = None,
    ) -> Iterator[tuple[PackedBatch, RunnerOutput]]:
        """The passes in order. The next batch is packed on the CPU (the iterator's work) while
        the GPU runs the pass in flight; a pass's outputs are read once the next is launched.
        `while_waiting`: host work for the waits (see _Launched.wait); CUDA only (on CPU a pass
        is done when launched). Every wait but the last has the next pass queued behind it.
        `clock` (CUDA): pack each pass late, near the end of the pass before it, so that it
        takes what arrived meanwhile (engine/pipeline/launch_clock.py); without it, at once.
        `lane`: the waits look for sync arrivals and run them in passes of their own beside the
        batch's (engine/pipeline/sync_lane.py), yielded as they end, the last after the batch's."""
        clock = clock if self.device.type == "cuda" else None
        batches = iter(batches)
        in_flight: _Launched | None = None
        while True:
            if clock is not None and in_flight is not None:
                clock.wait_until(clock.pack_at(in_flight.started_at, in_flight.batch.num_tokens), in_flight.is_done,
                                 while_waiting)
            began = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                break
            launched = self.launch(batch)
            launched.started_at = began
            if clock is not None:
                clock.launched(time.perf_counter() - began)
            if in_flight is not None:
                if lane is not None:
                    yield from lane.serve_until(in_flight.is_done, while_waiting)
                output = in_flight.wait(while_waiting)
                launched.started_at = max(began, time.perf_counter())  # it runs once the one before ends
                if clock is not None:
                    clock.observe(in_flight.batch.num_tokens, in_flight.device_s())
                yield in_flight.batch, output
            in_flight = launched
        if in_flight is not None:
            if lane is not None:
                yield from lane.serve_until(in_flight.is_done, while_waiting)
            yield in_flight.batch, in_flight.wait(while_waiting)
        if lane is not None:
            yield from lane.drain()

    def run(self, batch: PackedBatch) -> RunnerOutput:
        return self.launch(batch).wait()

    @torch.inference_mode()
    def launch(self, batch: PackedBatch) -> _Launched:
        """Queue one pass on the device; its outputs start copying to the host when it ends."""
        attention = self.prepare_attention(batch.attention)
        started = _record_event(self.device)
        attention.capture = batch.attention.capture  # whatever prepare built, slots keep their K/V
        inputs = (to_device(batch.input_ids, self.device), to_device(batch.positions, self.device), attention,
                  to_device(batch.scored_index, self.device))
        if self.device.type == "cpu":
            target_logprobs, slot_logprobs = cpu_scored_logprobs(self.model, self.model.scored_hidden(*inputs), batch)
        else:
            logits = self.model(*inputs)  # [S, V] float32
            target_logprobs = gather_logprobs(logits, to_device(batch.scored_targets, self.device))
            slot_logprobs = None
            if batch.slot_index is not None:
                slot_logprobs = _to_host(chunked_log_softmax(logits[to_device(batch.slot_index, self.device)]))
        self.num_passes += 1
        output = RunnerOutput(pass_id=self.num_passes, target_logprobs=_to_host(target_logprobs))
        output.slot_logprobs = slot_logprobs
        if batch.slot_index is not None:
            output.slot_kv = batch.attention.capture.split()
        return _Launched(batch, output, _record_event(self.device), started)

    def decoding_row_multiple(self) -> int:
        """What a decoding pass's rows are padded to a multiple of: the row block of the
        "blas" decoding matmul on CUDA (so no projection pads its input again), else ROW_CHUNK."""
        if self.device.type == "cuda" and self.decoding_matmul == "blas":
            return BLAS_BLOCK_ROWS
        return ROW_CHUNK

    def decode_graphs(self) -> DecodeGraphs | None:
        """A decoding run's graphs (engine/pipeline/decode_graphs.py), when `use_decode_graphs`:
        captured on CUDA; on CPU none are captured, but the run still holds finished slots."""
        if not self.use_decode_graphs:
            return None
        return DecodeGraphs(self.device, capture=self.device.type == "cuda")

    @torch.inference_mode()
    def decode(self, batch: DecodeBatch, graphs: DecodeGraphs | None = None) -> list[Candidates | None]:
        """One decoding pass (engine/extraction/decoding.py) -> per scored row, the Candidates
        its hypothesis asked for (None for padding). The log-softmax ([S, V], row by row as in
        `chunked_log_softmax`), the masks and the top-k stay on the device: only [S, k]
        log-probs and ids, END masses and sampled rows reach the host (engine/extraction/select.py).
        With `graphs`, a pass of a shape seen before is a CUDA graph's replay."""
        if graphs is None:
            input_ids, positions, scored_index = device_inputs(batch, self.device)
            logprobs = self._decode_logprobs(input_ids, positions, batch.decode, scored_index)
        else:
            logprobs = graphs.logprobs(batch, self._decode_logprobs)
        self.num_passes += 1
        return batch.select(logprobs)

    def _decode_logprobs(self, input_ids: torch.Tensor, positions: torch.Tensor, decode: DecodeMetadata,
                         scored_index: torch.Tensor) -> torch.Tensor:
        """Device inputs of a decoding pass -> [S, V] float32 log-probs (no host sync: a CUDA graph captures it)."""
        with decoding_matmuls(self.decoding_matmul), decoding_attention(self.decoding_attention):
            logits = self.model(input_ids, positions, AttentionMetadata(spans=[], decode=decode), scored_index)  # [S, V]
        return chunked_log_softmax(logits, out=logits)  # in place: no second [S, V]

    def prepare_attention(self, meta: AttentionMetadata) -> AttentionMetadata:
        """CPU: the span masks as they are. CUDA: a flex_attention block mask built from them."""
        if self.device.type == "cpu":
            return meta
        from engine.layers.attention_cuda import prepare_cuda_attention

        return prepare_cuda_attention(meta, self.device)


def cpu_scored_logprobs(model, hidden: torch.Tensor, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """CPU: the LM head and its log-softmax SCORE_CHUNK rows at a time, so a pass never holds
    [S, V] logits (16,384 scored rows of a 49k vocabulary held 3.2 GB): per block, each row's
    target log-prob, and the whole log-softmax row of the slots' rows. The same matmuls and
    row-wise log-softmax as `gather_logprobs` / `chunked_log_softmax` over the full logits,
    so the same bits."""
    targets = batch.scored_targets
    out = torch.empty(hidden.shape[0], dtype=torch.float32)
    slot_rows = set(batch.slot_index.tolist()) if batch.slot_index is not None else set()
    slot_logprobs = {}
    for start in range(0, hidden.shape[0], SCORE_CHUNK):
        rows = slice(start, start + SCORE_CHUNK)
        logprobs = torch.log_softmax(model.head_logits(hidden[rows]), dim=-1)  # [SCORE_CHUNK, V]
        out[rows] = logprobs.gather(1, targets[rows, None])[:, 0]
        for row in slot_rows.intersection(range(start, start + SCORE_CHUNK)):
            slot_logprobs[row] = logprobs[row - start]
    if batch.slot_index is None:
        return out, None
    return out, torch.stack([slot_logprobs[row] for row in batch.slot_index.tolist()])


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits: [S, V], targets: [S] -> [S] log-softmax(logits)[row, target]. CUDA: one Triton
    launch (a row's log-sum-exp in fixed V chunks, engine/kernels/logprobs.py); CPU: torch's
    log-softmax per SCORE_CHUNK rows. Either way a row's value depends on that row alone."""
    if logits.is_cuda:
        return option_logprobs(logits, torch.arange(logits.shape[0], device=logits.device), targets)
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for start in range(0, logits.shape[0], SCORE_CHUNK):
        rows = slice(start, start + SCORE_CHUNK)
        logprobs = torch.log_softmax(logits[rows].float(), dim=-1)
        out[rows] = logprobs.gather(1, targets[rows, None])[:, 0]
    return out


def chunked_log_softmax(logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """[S, V] -> [S, V] float32 log-softmax, a row's value never depending on how many rows the
    pass has (CUDA: logits - the row log-sum-exp kernel; CPU: SCORE_CHUNK-row blocks).
    `out=logits` (float32) works in place."""
    if out is None:
        out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    if logits.is_cuda:
        return torch.sub(logits.float(), row_logsumexp(logits)[:, None], out=out)
    for start in range(0, logits.shape[0], SCORE_CHUNK):
        rows = slice(start, start + SCORE_CHUNK)
        out[rows] = torch.log_softmax(logits[rows].float(), dim=-1)
    return out

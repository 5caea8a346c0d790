"""The scoring engine: many requests in, one response each, in as few passes as fit.

    ScoringRequest --Engine.compile--> CompiledRequest (its TokenTree, num_tokens) | RequestError
    [CompiledRequest | RequestError] --Engine.score_batch: split_tree (+ floor trees)
        --pack_trees--> PackedBatch --runner.run_all--> RunnerOutput --ResponseBuilder-->
        BatchOutput(results=[ScoringResponse | RequestError])

`compile` is where a request is admitted (or answered with what to fix) and what it costs a
pass is known: a worker compiles the rows it takes while the GPU runs the batch before, and
fills its pass budget with their `num_tokens`; `score_requests` does both steps for callers
that hold requests. The stages' hand-overs are engine/pipeline/stages.py.
A request naming prompt packs is expanded while compiling (engine/pipeline/pack_requests.py): the
packs' questions become queries of the same tree, and the response splits them back out
into `packs` (questions, categories, decisions).

The loop itself is three lines (see `score_batch`): pack, run, collect. Everything around
it is bookkeeping: which tree answers which request, which floors are cached. Extraction
slots are read in the same passes (their prompt K/V kept), then decoded together in later
passes over that K/V (engine/extraction/decoding.py).
"""

from __future__ import annotations

import gc
import hashlib
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import orjson
import torch

from contract.protocol import ScoringRequest
from contract.scoring_results import ScoringResponse
from contract.settings import DEFAULT_MAX_NUM_BATCHED_TOKENS, LIMITS
from engine.extraction.decoder import BeamDecoder
from engine.extraction.decoding import Extraction, SlotJob
from engine.extraction.slots import SlotVocab
from engine.layers.ops import ROW_CHUNK, SCORE_CHUNK
from engine.loading.loader import LoadedCheckpoint, load_checkpoint
from engine.loading.model_registry import DEFAULT_MODEL
from engine.loading.quantization import QUANTIZATION_RECIPES, quantize
from engine.pipeline.compiler import compile_floor, compile_request
from engine.pipeline.floors import DEFAULT_FLOOR_CACHE_SIZE, FloorCache
from engine.pipeline.launch_clock import LaunchClock
from engine.pipeline.pack_requests import PackRequestError, expand_request
from engine.pipeline.packer import (
    leaky_tree_mask,
    pack_trees,
    split_tree,
    tree_mask,
)
from engine.pipeline.prompts import PromptError, PromptRenderer
from engine.pipeline.responses import ResponseBuilder
from engine.pipeline.runner import ModelRunner
from engine.pipeline.sync_lane import LaneIntake, SyncLane
from engine.pipeline.stages import (
    BatchOutput,
    CompiledRequest,
    FloorKey,
    RequestError,
    TokenTree,
    TreeOwner,
)
from engine.pipeline.token_budget import TokenBudget
from engine.pipeline.tokenize import Tokenize
from engine.pipeline.tree import build_tree
from engine.pipeline.warm_up import warm_up_batches
from prompt_packs.registry import PackRegistry

# CUDA only. The GPU waits for the first pass's packing (~35 ms for 16k tokens), so the first
# pass is smaller; but the next pass is packed only after this one is launched (~0.06-0.11 s of
# CPU for 48 layers), so the first pass must keep the GPU busy for longer than that launch plus
# the next packing. H200 timelines (docs/performance.md): 2,048 and, for fp8, 4,096 tokens left
# the GPU waiting (65 and 59 ms idle); 8,192 is ~0.18 s of fp8 GPU work.
FIRST_PASS_TOKENS = 8192
ENGINE_VERSION = "0.3.0"  # bump when a change can move any score (0.2.0: tree nodes in preorder; 0.3.0: siblings in order of first appearance)
# the CUDA numerics: batch-invariant Triton matmul/norm kernels + flex_attention with 64-token tiles
# + the row log-sum-exp kernel for log-softmax at the scored rows; extraction slots' decoding passes:
# projections on cuBLAS in 384-row calls, attention in the Triton decoding kernel (ModelRunner's
# defaults: its decoding_matmul / decoding_attention switches are for benchmarks' same-run comparisons)
CUDA_KERNELS = "triton-invariant-v1+flex64+lse-kernel+gated-act+norm-fp8+decode-blas384+decode-attn-triton64"


@contextmanager
def cyclic_gc_deferred() -> Iterator[None]:
    """No cyclic garbage collection inside a batch; reference counting still frees its objects.

    A batch's objects are freed by reference counting (it makes no cyclic garbage), but their
    allocation triggers collections, and a full one walks every tracked object of the process
    (tokenizer tables, caches, the model's modules: ~4x10^5 objects) while the GPU drains the
    one pass queued ahead of it. `benchmarks/gc_pauses.py` measures the collector's time with
    and without this. The collector's state is restored after, on error too."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str = DEFAULT_MODEL  # served name or a local HF folder
    device: str = "auto"  # "cpu" | "cuda" | "auto"
    dtype: str = "auto"  # float32 on CPU, bfloat16 on CUDA
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS  # tokens per forward pass
    floor_cache_size: int = DEFAULT_FLOOR_CACHE_SIZE
    quantization: str = "none"  # "none" | "fp8" (Hopper) | "int8" (weights only); see quantizations/
    pack_dirs: tuple[str, ...] = ()  # prompt-pack folders loaded on top of the official packs/
    sync_lane: bool | None = None  # arrivals in passes of their own (engine/pipeline/sync_lane.py); None: on CUDA
    decode_graphs: bool | None = None  # decoding passes replayed as CUDA graphs (engine/pipeline/decode_graphs.py); None: on CUDA


class Engine:
    def __init__(self, config: EngineConfig = EngineConfig(), checkpoint: LoadedCheckpoint | None = None) -> None:
        """Loads `config.model`, or serves an already loaded `checkpoint` (benchmarks, tests)."""
        self.config = config
        device = torch.device(_resolve_device(config.device))
        dtype = _resolve_dtype(config.dtype, device)
        if checkpoint is None:
            checkpoint = load_checkpoint(config.model, dtype=dtype, device=str(device))
        checkpoint.model = quantize(checkpoint.model, config.quantization)
        self.model_name = checkpoint.served_name
        self.max_context_tokens = checkpoint.max_context_tokens
        self.tokenizer = checkpoint.tokenizer
        self.renderer = PromptRenderer(checkpoint.tokenizer, checkpoint.has_chat_template)
        self.tokenize = Tokenize(checkpoint.tokenizer, add_special_tokens=not checkpoint.has_chat_template)
        self.runner = ModelRunner(checkpoint.model, device, config.decode_graphs)
        # CUDA: a small first pass, so the device starts while the CPU packs the next (full) one
        self.first_pass_tokens = FIRST_PASS_TOKENS if device.type == "cuda" else None
        self.launch_clock = LaunchClock()  # when to pack a pass that arrivals may join (CUDA)
        self._warmed_up = False  # warm_up has run
        self.dense_masks = False  # attention reads the trees' subtree ends (CPU: mask rows made per block)
        self.floors = FloorCache(config.floor_cache_size)
        self.checkpoint_path = checkpoint.path
        self.system_fingerprint = fingerprint(checkpoint.weights_sha256, dtype, device, config.quantization)
        self.dtype_name = str(dtype).removeprefix("torch.")  # "float32", "bfloat16"
        self.mask_fn = tree_mask
        self.beam = BeamDecoder()  # mode "extract"; parity's negative control swaps in a greedy one
        self._slot_vocab: SlotVocab | None = None
        self._packs: PackRegistry | None = None

    def leak_sibling_for_negative_control(self) -> None:
        """Break the tree mask on purpose (parity's negative control); marks the fingerprint."""
        self.mask_fn = leaky_tree_mask
        self.system_fingerprint += "-leaky"

    def score(self, request: ScoringRequest) -> ScoringResponse:
        """One request; raises PromptError (with .field) when it cannot be served."""
        [result] = self.score_requests([request]).results
        if isinstance(result, RequestError):
            raise PromptError(result.field, result.message)
        return result

    def score_requests(
        self, requests: list[ScoringRequest], while_waiting: Callable[[], bool] | None = None,
        on_result: Callable[[int, ScoringResponse, tuple[int, ...]], None] | None = None,
    ) -> BatchOutput:
        """`compile` each request, then `score_batch` them (the collector deferred for both)."""
        with cyclic_gc_deferred():
            return self.score_batch([self.compile(request) for request in requests], while_waiting, on_result)

    def warm_up(self) -> int:
        """CUDA: run one pass of each padded size the pass budget allows (engine/pipeline/
        warm_up.py), so no live pass pays for compiling a kernel; returns the passes run (0 on
        CPU, where nothing compiles, and once warmed up)."""
        if self.runner.device.type != "cuda" or self._warmed_up:
            return 0
        self._warmed_up = True
        from engine.layers.attention_cuda import BUCKET

        pack = partial(pack_trees, mask_fn=self.mask_fn, dense_masks=self.dense_masks)
        batches = list(warm_up_batches(pack, self.config.max_num_batched_tokens, BUCKET, self.max_context_tokens))
        for batch in batches:
            self.runner.run(batch)
        return len(batches)

    def compile(self, request: ScoringRequest) -> CompiledRequest | RequestError:
        """The request as the passes read it, or what to fix. The one admission of a request:
        the model it names, its packs, its templates as rendered and tokenized, the slot kinds
        this tokenizer can decode and the model's context length are checked here, and its tree
        is built here, so `num_tokens` (what it adds to a pass) is known before it is scored."""
        if request.model not in (None, self.model_name):
            return RequestError("model", f"unknown model {request.model!r}; this engine serves {self.model_name!r}")
        try:
            expanded, packs = expand_request(request, self.packs)
            budget = TokenBudget(LIMITS.max_tokenized_tokens, LIMITS.max_held_tokens)
            compiled = compile_request(expanded, self.renderer, self.tokenize, packs, budget)
            for branch in compiled.branches:
                if branch.slot is not None:
                    self.slot_vocab().check_serves(branch.slot.kind)
        except (PromptError, PackRequestError) as error:
            return RequestError(error.field, str(error))
        if compiled.max_num_tokens > self.max_context_tokens:
            return RequestError(
                "messages",
                f"the content with its longest question and option is {compiled.max_num_tokens} tokens;"
                f" this model reads at most {self.max_context_tokens}: shorten the content",
            )
        num_read = len(compiled.tree.token_ids)
        if num_read > LIMITS.max_read_tokens:
            return RequestError(
                "scoring.queries",
                f"the request reads {num_read} tokens (its content once, every question and option past it); the"
                f" limit max_read_tokens is {LIMITS.max_read_tokens}: ask fewer or shorter questions, or split the request",
            )
        num_floor_tokens = self._max_floor_tokens(compiled)
        if num_floor_tokens > self.max_context_tokens:
            return RequestError(
                "messages.floor_content",
                f"the floor prompt (floor_content) with its longest question and option is up to {num_floor_tokens}"
                f" tokens; this model reads at most {self.max_context_tokens}: shorten floor_content",
            )
        return compiled

    def _max_floor_tokens(self, compiled: CompiledRequest) -> int:
        """A bound on the longest floor sequence: its prefix's tokens and the longest branch past the
        trunk. A prefix of fewer UTF-8 bytes than the context needs no tokenizer (a token is at
        least one byte), which is every floor without a long floor_content."""
        prefixes = {key.empty_prefix for key in compiled.floor_keys}
        past_trunk = compiled.max_num_tokens - compiled.tree.num_trunk_tokens
        longest = 0
        for prefix in prefixes:
            num_bytes = len(prefix.encode("utf-8"))
            if num_bytes + past_trunk <= self.max_context_tokens:
                longest = max(longest, num_bytes + past_trunk)
                continue
            longest = max(longest, len(self.tokenize([prefix])[0]) + past_trunk)
        return longest

    def score_batch(
        self, compiled: list[CompiledRequest | RequestError], while_waiting: Callable[[], bool] | None = None,
        on_result: Callable[[int, ScoringResponse | RequestError, tuple[int, ...]], None] | None = None,
        arrivals: Callable[[], list[CompiledRequest | RequestError]] | None = None,
        refill: Callable[[], list[CompiledRequest | RequestError]] | None = None,
    ) -> BatchOutput:
        """One result per item of `compile`, in order: a response, or the item's RequestError as
        it is. A compiled request is not changed, so it may be scored again. `while_waiting`: a
        step of host work (e.g. a worker gathering its next jobs) run while a pass is on the
        GPU, again while it returns True and the pass is not done; the next launch waits for the
        step in progress, so steps should be short. It must not score on this engine. Not
        called on CPU. `on_result(i, response, pass_ids)`: item i's response is built (every
        pass it needed has run), before the batch's last pass: a worker settles a sync call
        there, while the next pass runs, and counts a job's rows as they are scored; a response
        told so is not kept (None in the output: a batch fed by `refill` may go on for hours).
        `arrivals()`: requests that arrived since it was last called (a worker's sync calls);
        they get the indices after the ones before them, in `on_result` and in the output.
        With the sync lane (`uses_sync_lane`: CUDA by default) it is asked every few
        milliseconds while a pass runs, and what it brings runs at once in passes of its own
        beside the batch's (engine/pipeline/sync_lane.py); without it, it is asked each time
        the packer is about to take the next request, and what it brings is packed before the
        rest (so it rides the next pass). `refill()`: asked when no request is
        left to pack; what it returns is packed next, after the same rule's indices, so the
        passes go on without a break (an empty list ends the batch; it is not asked once a
        request with extraction slots is in, since slots are decoded after the last pass).
        A RequestError is told through `on_result` as it is admitted. Without the lane, with
        either, on CUDA each pass is packed late, near the end of the pass before it
        (engine/pipeline/launch_clock.py), so that an arrival rides the pass after the one in flight."""
        with cyclic_gc_deferred():
            return self._score_batch(list(compiled), while_waiting, on_result, arrivals, refill)

    def _score_batch(self, compiled: list[CompiledRequest | RequestError], while_waiting, on_result=None,
                     arrivals=None, refill=None) -> BatchOutput:
        builder = self._response_builder(compiled, on_result)
        pack = partial(pack_trees, mask_fn=self.mask_fn, dense_masks=self.dense_masks)
        extraction = Extraction(self.slot_vocab, self.beam, partial(self._slot_floor_prompt, compiled), pack)
        lane = intake = None
        if arrivals is not None and self.uses_sync_lane:
            intake = LaneIntake(builder, arrivals, pack, self._floor_trees, self.config.max_num_batched_tokens)
            lane = SyncLane(intake.batches, self.runner.launch, self.runner.device, intake.leftover)
            arrivals = None  # the lane takes them (one too large for it joins the batch's passes)
        batches = pack(self._trees(builder, arrivals, refill, intake), self.config.max_num_batched_tokens,
                       first_max_num_tokens=self.first_pass_tokens)
        clock = self.launch_clock if lane is None and (arrivals is not None or refill is not None) else None
        for batch, output in self.runner.run_all(batches, while_waiting, clock, lane):
            builder.collect(batch, output)
            extraction.collect(batch, output)
        extraction.run(self.runner, self.config.max_num_batched_tokens)
        builder.collect_slots(extraction.jobs)
        return builder.finish()

    @property
    def uses_sync_lane(self) -> bool:
        """Whether arrivals ride passes of their own beside the batch's (`config.sync_lane`)."""
        lane = self.config.sync_lane
        return self.runner.device.type == "cuda" if lane is None else lane

    def _response_builder(self, compiled: list[CompiledRequest | RequestError], on_result=None) -> ResponseBuilder:
        """What the responses need of this engine: its floor cache, name, fingerprint, tokenizer."""
        return ResponseBuilder(compiled, self.floors, self.model_name, self.system_fingerprint, self.tokenizer,
                               on_result)

    def slot_vocab(self) -> SlotVocab:
        """The tokenizer as extraction slots see it (built on the first slot: ~5 s for 150k tokens)."""
        if self._slot_vocab is None:
            vocab_size = self.runner.model.lm_head_weight.shape[0]
            self._slot_vocab = SlotVocab.build(self.tokenizer, vocab_size)
        return self._slot_vocab

    def _slot_floor_prompt(self, compiled: list[CompiledRequest | RequestError], job: SlotJob) -> list[int]:
        """A `floor` slot's prompt with user contents emptied, as floors are for {?}: its tokens."""
        request = compiled[job.request_index].request
        query = request.scoring.queries[job.query_index]
        prefix = self.renderer.render_prefix(request.messages, query.answer_in, is_floor=True)
        [ids] = self.tokenize.continuations(prefix, [query.parsed_template.fill(job.values)])
        return ids

    @property
    def packs(self) -> PackRegistry:
        """The official packs plus `config.pack_dirs` (loaded on first use; a bad file raises)."""
        if self._packs is None:
            self._packs = PackRegistry.load(list(self.config.pack_dirs))
        return self._packs

    def _trees(
        self, builder: ResponseBuilder, arrivals: Callable[[], list[CompiledRequest | RequestError]] | None = None,
        refill: Callable[[], list[CompiledRequest | RequestError]] | None = None, intake: LaneIntake | None = None,
    ) -> Iterator[tuple[TreeOwner, TokenTree]]:
        """Floors first (small; every request waits for its floors), then each request's tree;
        before each request, what `arrivals` brings (or the sync lane left for these passes):
        its floors, then its trees, ahead of the rest; when none is left, what `refill` brings,
        the same way."""
        yield from self._floor_trees(builder.missing_floors())
        budget = self.config.max_num_batched_tokens
        waiting = deque(range(len(builder.compiled)))
        while True:
            if intake is not None:
                waiting.extendleft(reversed(intake.take_overflow()))
            if arrivals is not None and (arrived := arrivals()):
                yield from self._admit(builder, arrived, waiting)
            if not waiting and refill is not None and not builder.has_slots and (more := refill()):
                yield from self._admit(builder, more, waiting)
            if not waiting:
                return
            index = waiting.popleft()
            request = builder.compiled[index]
            if isinstance(request, RequestError):
                continue
            for tree in split_tree(request.tree, budget):
                yield TreeOwner(index), tree

    def _admit(self, builder: ResponseBuilder, arrived: list[CompiledRequest | RequestError],
               waiting: deque[int]) -> Iterator[tuple[TreeOwner, TokenTree]]:
        """Requests handed in during the batch: their floors now, their indices next in line."""
        first = len(builder.compiled)
        yield from self._floor_trees(builder.admit(arrived))
        waiting.extendleft(reversed(range(first, first + len(arrived))))

    def _floor_trees(self, keys: list[FloorKey]) -> Iterator[tuple[TreeOwner, TokenTree]]:
        for key in keys:
            yield TreeOwner(-1, key), build_tree([compile_floor(key, self.tokenize)])


def fingerprint(weights_sha256: str, dtype: torch.dtype, device: torch.device, quantization: str = "none") -> str:
    """Changes when anything that can move a score changes, and only then."""
    numerics = {
        "weights": weights_sha256,
        "dtype": str(dtype),
        "device": device.type,
        "quantization": QUANTIZATION_RECIPES[quantization],
        "kernels": CUDA_KERNELS if device.type == "cuda" else "torch-cpu",
        "engine": ENGINE_VERSION,
        "row_chunk": ROW_CHUNK,
        "score_chunk": SCORE_CHUNK,
        "torch": torch.__version__.split("+")[0],
    }
    return "fp_" + hashlib.sha256(orjson.dumps(numerics, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def _resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)

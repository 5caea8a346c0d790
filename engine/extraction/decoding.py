"""Decode the extraction slots after the read: batched passes over the kept K/V.

    packed pass (RunnerOutput.slot_logprobs, .slot_kv) --Extraction.collect--> SlotJob per slot,
        first decoder step already taken from the read's distribution
    live SlotJobs --prepare_decode_batch--> DecodeBatch (one span per slot: its live
        hypotheses' last tokens; one RowNeed per row; the slots' K/V in the KVStore's arenas,
        the spans grouped for one SDPA per layer and group) --runner.decode--> log-probs [S, V]
        on the device --select.select--> Candidates per row (k best, END) on the host
        --decoder.advance--> next hypotheses
    finished SlotJobs --decoder.answers--> answers, residual (engine/pipeline/responses.py)
    slots asking `floor`: floor prompt (user contents emptied) read as a slot of its own tree
        --ForcedDecoder over the listed answers' paths--> each path's floor log-probability

Every step serves all live slots of all requests together, in as few passes as the token
budget allows. A slot's rows start at a multiple of SCORE_CHUNK and attend only to its own
K/V, through an attention problem whose shapes depend only on that slot (engine/extraction/kv_cache.py),
so its answers do not depend on what else is decoded beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from engine.extraction.decoder import (
    BeamDecoder,
    DecodeState,
    ForcedDecoder,
    GenerateDecoder,
    Hypothesis,
    answers,
    decoder_for,
    start_state,
)
from engine.extraction.select import Candidates, RowNeed, select
from engine.extraction.kv_cache import KVStore, SlotKV
from engine.extraction.slots import SlotSpec, SlotVocab
from engine.layers.decode_attention import DecodeMetadata, DecodeSpan, decode_mask, held_span
from engine.layers.ops import ROW_CHUNK, SCORE_CHUNK
from engine.pipeline.compiler import slot_branch
from engine.pipeline.packer import PAD_TOKEN_ID, pack_trees, padded
from engine.pipeline.runner import ModelRunner
from engine.pipeline.stages import PackedBatch, RunnerOutput, TokenTree, TreeOwner
from engine.pipeline.tree import build_tree

HELD_ROWS_WORTH_COMPACTING = 512  # a layout of this many rows or more is packed again once half of them are held (0: every layout)

PackFn = Callable[[Iterable[tuple[TreeOwner, TokenTree]], int], Iterator[PackedBatch]]  # (items, max_num_tokens) -> passes


@dataclass(slots=True)
class SlotJob:
    """One slot of one (request, query, combination) being decoded."""

    request_index: int
    query_index: int
    combination_index: int
    spec: SlotSpec
    num_prompt_tokens: int  # the first answer token sits at this position
    kv: SlotKV
    state: DecodeState
    decoder: BeamDecoder | GenerateDecoder | ForcedDecoder
    num_decoded_tokens: int = 0  # rows this slot added to decoding passes (usage.slot_tokens)
    pass_ids: set[int] = field(default_factory=set)  # the decoding passes that served it
    values: dict[str, str] = field(default_factory=dict)  # the combination's placeholder values
    floor_logprobs: dict[tuple[int, ...], float] | None = None  # spec.floor: path ids -> floor log-prob
    num_floor_tokens: int = 0  # floor prompt tokens read + rows decoded for the floor (usage.floor_tokens)


@dataclass(slots=True)
class DecodeBatch:
    jobs: list[SlotJob]
    input_ids: torch.Tensor  # [T] long, T a multiple of ROW_CHUNK: each live hypothesis's last token
    positions: torch.Tensor  # [T] long
    decode: DecodeMetadata  # one span per job, grouped for attention
    scored_index: torch.Tensor  # [S] long: every span row (S a multiple of SCORE_CHUNK)
    needs: list[RowNeed | None]  # [S] what each row's hypothesis needs (None: padding)
    vocab: SlotVocab

    def select(self, logprobs: torch.Tensor) -> list[Candidates | None]:
        """The runner's [S, V] log-probs (on its device) -> each row's Candidates on the host."""
        return select(logprobs, self.needs, self.vocab)


@dataclass(slots=True)
class Extraction:
    vocab_fn: Callable[[], SlotVocab]  # the vocabulary, built on first use (it decodes every token)
    beam: BeamDecoder  # the mode-"extract" decoder (parity swaps in a greedy one as its control)
    floor_prompt: Callable[[SlotJob], list[int]] | None = None  # token ids of a job's prompt, user contents emptied
    pack: PackFn = pack_trees  # packs the slot floors' trees as the engine packs its passes
    jobs: list[SlotJob] = field(default_factory=list)  # one per slot read, in the order read

    def collect(self, batch: PackedBatch, output: RunnerOutput) -> None:
        """Start a job for every slot read in this pass; take its first step from the read."""
        jobs: dict[int, SlotJob] = {}  # row of output.slot_logprobs -> its slot's job
        for packed in batch.trees:
            request_index = packed.owner.request_index
            for offset, branch_index in enumerate(packed.tree.slot_branch):
                slot = packed.slot_start + offset
                branch = packed.tree.branches[branch_index]
                jobs[slot] = SlotJob(request_index, branch.query_index, branch.combination_index, branch.slot,
                                     branch.branch_point, output.slot_kv[slot], start_state(branch.slot),
                                     decoder_for(branch.slot, self.beam), values=branch.values)
        if jobs:
            _first_step(jobs, output.slot_logprobs, self.vocab_fn())
            self.jobs += jobs.values()

    def run(self, runner: ModelRunner, max_num_rows: int) -> None:
        """Decoding passes until every slot is finished; then the floors the slots asked for."""
        _decode(self.jobs, runner, max_num_rows, self.vocab_fn() if self.jobs else None)
        self._floors(runner, max_num_rows)

    def _floors(self, runner: ModelRunner, max_num_rows: int) -> None:
        """Each `floor` slot's floor prompt is read as a slot of its own tree (batch invariant,
        as a slot), then the listed answers' paths are fed through it (ForcedDecoder)."""
        asked = [job for job in self.jobs if job.spec.floor]
        items: list[tuple[TreeOwner, TokenTree]] = []
        floors: list[tuple[SlotJob, list[tuple[int, ...]]]] = []  # TreeOwner.slot_floor -> (job, its paths)
        for job in asked:
            job.floor_logprobs = {}
            listed, _ = answers(job.state)
            paths = list(dict.fromkeys(tuple(path.ids) for answer in listed for path in answer.paths))
            if paths:
                branch = slot_branch(job.query_index, job.combination_index, job.values, "", self.floor_prompt(job),
                                     job.spec)
                items.append((TreeOwner(job.request_index, slot_floor=len(floors)), build_tree([branch])))
                floors.append((job, paths))
        if not items:
            return
        vocab = self.vocab_fn()
        floor_jobs: list[tuple[SlotJob, SlotJob]] = []  # (the slot, its floor's forced job)
        for batch, output in runner.run_all(self.pack(items, max_num_rows)):
            started: dict[int, SlotJob] = {}  # row of output.slot_logprobs -> the floor's forced job
            for packed in batch.trees:
                job, paths = floors[packed.owner.slot_floor]
                state = DecodeState(job.spec, [Hypothesis([], 0.0, "")])
                started[packed.slot_start] = SlotJob(
                    job.request_index, job.query_index, job.combination_index, job.spec,
                    packed.tree.branches[0].branch_point, output.slot_kv[packed.slot_start], state,
                    ForcedDecoder(paths), pass_ids={output.pass_id})
                job.num_floor_tokens += packed.tree.num_tokens
                floor_jobs.append((job, started[packed.slot_start]))
            _first_step(started, output.slot_logprobs, vocab)
        _decode([forced for _, forced in floor_jobs], runner, max_num_rows, vocab)
        for job, forced in floor_jobs:
            job.floor_logprobs = forced.decoder.logprobs
            job.num_floor_tokens += forced.num_decoded_tokens
            job.pass_ids |= forced.pass_ids


def _first_step(jobs: dict[int, SlotJob], slot_logprobs: torch.Tensor, vocab: SlotVocab) -> None:
    """Each job's first decoder step, from its row of the read's slot distributions."""
    needs: list[RowNeed | None] = [None] * slot_logprobs.shape[0]
    for row, job in jobs.items():
        [needs[row]] = job.decoder.needs(job.state, vocab)
    candidates = select(slot_logprobs, needs, vocab)
    for row, job in jobs.items():
        job.decoder.advance(job.state, [candidates[row]], vocab)


def _decode(jobs: list[SlotJob], runner: ModelRunner, max_num_rows: int, vocab: SlotVocab | None) -> None:
    """Decoding passes over the jobs' kept K/V until every one is done. With decode graphs
    (CUDA) the passes keep one layout while it is worth it: a finished slot is held in place
    (padding rows), so each pass has the shape of the one before and replays its graph."""
    store = KVStore()  # the jobs' K/V while they are decoded
    graphs = runner.decode_graphs()  # None: each step's passes packed from the live slots alone
    layout: list[list[SlotJob]] = []
    try:
        while live := [job for job in jobs if not job.state.is_done]:
            if graphs is None or _wants_new_layout(layout, live, max_num_rows, graphs.max_rows):
                if graphs is not None and layout:  # the finished slots' entries freed, the live ones side by side
                    store.pack_front([job.kv for job in live])
                layout = _groups(live, max_num_rows)
                if graphs is not None:
                    graphs.new_layout()
                _reserve(live, store)  # every arena sized before the first pass of the layout
            for group in layout:
                if all(job.state.is_done for job in group):
                    continue
                batch = prepare_decode_batch(group, vocab, store, runner.decoding_row_multiple())
                candidates = runner.decode(batch, graphs)
                for job, span in zip(batch.jobs, batch.decode.spans, strict=True):
                    if span.num_real:  # not a held (finished) slot
                        job.pass_ids.add(runner.num_passes)
                        _advance(job, span, candidates[span.start : span.start + span.num_real], vocab)
                    if job.state.is_done and graphs is None:
                        store.release(job.kv)
    finally:
        for job in jobs:
            store.release(job.kv)


def _wants_new_layout(layout: list[list[SlotJob]], live: list[SlotJob], max_num_rows: int, max_graph_rows: int) -> bool:
    """A layout is kept until a pass would pass the budget (a slot's live rows grew) or be too
    large to be a graph (then it is packed from the live slots at every step), or its held
    rows are half of a layout of HELD_ROWS_WORTH_COMPACTING rows or more (a new layout costs an
    eager pass and a capture; under that the held rows stay)."""
    if not layout:
        return True
    rows = [sum(_span_rows(job) for job in group) for group in layout]
    if any(padded(n, ROW_CHUNK) > max_num_rows or n > max_graph_rows for n in rows):
        return True
    live_rows = sum(_span_rows(job) for job in live)
    return sum(rows) >= HELD_ROWS_WORTH_COMPACTING and 2 * live_rows <= sum(rows)


def _span_rows(job: SlotJob) -> int:
    """The rows a job's span takes in a pass: its live hypotheses padded (held: SCORE_CHUNK)."""
    return SCORE_CHUNK if job.state.is_done else padded(len(job.state.live), SCORE_CHUNK)


def _reserve(jobs: list[SlotJob], store: KVStore) -> None:
    """Room in `store` for each live job's next rows (a job enters an arena with its decoder's headroom)."""
    store.reserve([job.kv for job in jobs], [_span_rows(job) for job in jobs],
                  [job.decoder.max_rows(job.spec) for job in jobs])


def _advance(job: SlotJob, span: DecodeSpan, candidates: list[Candidates], vocab: SlotVocab) -> None:
    """The pass appended the new rows' K/V; record them, then let the decoder choose."""
    first_row = job.kv.num_rows
    job.kv.positions = torch.cat((job.kv.positions, span.positions[: span.num_real]))
    for row, hyp in enumerate(job.state.live):
        hyp.rows.append(first_row + row)
    job.num_decoded_tokens += span.num_real
    job.decoder.advance(job.state, candidates, vocab)


def _groups(jobs: list[SlotJob], max_num_rows: int) -> list[list[SlotJob]]:
    groups: list[list[SlotJob]] = [[]]
    used = 0
    for job in jobs:
        size = _span_rows(job)
        if groups[-1] and padded(used + size, ROW_CHUNK) > max_num_rows:
            groups.append([])
            used = 0
        groups[-1].append(job)
        used += size
    return groups


def prepare_decode_batch(jobs: list[SlotJob], vocab: SlotVocab, store: KVStore, row_multiple: int = ROW_CHUNK) -> DecodeBatch:
    """The jobs' next rows (padded to a multiple of `row_multiple`: the runner's
    `decoding_row_multiple`); each live job's K/V gets room for them in `store` first (a
    finished job in the list is held in place: padding rows in its arena entry)."""
    _reserve([job for job in jobs if not job.state.is_done], store)
    spans, input_ids, positions = decode_rows(jobs, row_multiple)
    needs = [need for job, span in zip(jobs, spans, strict=True)
             for need in (job.decoder.needs(job.state, vocab) if span.num_real else [])
             + [None] * (span.num_rows - span.num_real)]
    return DecodeBatch(
        jobs=jobs, input_ids=input_ids, positions=positions, decode=DecodeMetadata(spans),
        scored_index=torch.arange(len(needs)), needs=needs, vocab=vocab,
    )


def decode_rows(jobs: list[SlotJob], row_multiple: int = ROW_CHUNK) -> tuple[list[DecodeSpan], torch.Tensor, torch.Tensor]:
    """Each job's live hypotheses as the next rows (its last token at its next position), a span
    of SCORE_CHUNK-padded rows per job (a finished job: a held span of padding) -> (spans,
    input ids [T], positions [T]), T padded to a multiple of `row_multiple` (itself one of ROW_CHUNK)."""
    input_ids: list[int] = []
    positions: list[int] = []
    spans: list[DecodeSpan] = []
    for job in jobs:
        start, num_rows = len(input_ids), _span_rows(job)
        if job.state.is_done:
            spans.append(held_span(start, num_rows, job.kv))
            input_ids += [PAD_TOKEN_ID] * num_rows
            positions += [0] * num_rows
            continue
        live = job.state.live
        num_pad = num_rows - len(live)
        new_positions = [job.num_prompt_tokens + len(hyp.ids) - 1 for hyp in live] + [0] * num_pad
        input_ids += [hyp.ids[-1] for hyp in live] + [PAD_TOKEN_ID] * num_pad
        positions += new_positions
        mask = decode_mask(job.kv, [hyp.rows for hyp in live], num_rows)
        spans.append(DecodeSpan(start, num_rows, len(live), job.kv, mask, torch.tensor(new_positions, dtype=torch.long),
                                job.kv.num_rows))
    num_pad = padded(len(input_ids), row_multiple) - len(input_ids)
    return (spans, torch.tensor(input_ids + [PAD_TOKEN_ID] * num_pad, dtype=torch.long),
            torch.tensor(positions + [0] * num_pad, dtype=torch.long))

"""Collect pass outputs per request and build the scoring responses.

    [CompiledRequest | RequestError] + FloorCache --ResponseBuilder--> the floors still to read
    (PackedBatch, RunnerOutput)* --collect--> logprobs per (request, query, combination)
        + floors (cache) --> a request's response as soon as it is complete
        --finish--> BatchOutput(results, pass_ids) (the rest built here: slots, the last pass)
    decoded SlotJobs (engine/extraction/decoding.py) --collect_slots--> answers per (request, query, combination)

The builder knows the engine only through what it is given: the floor cache (read here,
filled as floors are read), the served model name and fingerprint (written into every
response) and the tokenizer (the token strings of `debug`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from contract.probability import reweight
from contract.scoring_results import Combination, CombinationDebug, OptionDebug, OptionScore, QueryResult, ScoringResponse, SlotAnswer, Usage
from engine.extraction.decoder import answers, floor_p
from engine.extraction.decoding import SlotJob
from engine.pipeline.floors import FloorCache
from engine.pipeline.pack_requests import split_response
from engine.pipeline.scorer import normalise, option_logprobs, residual
from engine.pipeline.stages import (
    BatchOutput,
    Branch,
    CompiledRequest,
    FloorKey,
    PackedBatch,
    RequestError,
    RunnerOutput,
)

if TYPE_CHECKING:  # a type only (transformers is loaded by engine/loading, not here)
    from transformers import PreTrainedTokenizerBase


class ResponseBuilder:
    def __init__(
        self,
        compiled: list[CompiledRequest | RequestError],
        floor_cache: FloorCache,
        model_name: str,
        system_fingerprint: str,
        tokenizer: PreTrainedTokenizerBase,
        on_done: Callable[[int, ScoringResponse | RequestError, tuple[int, ...]], None] | None = None,
    ) -> None:
        self.compiled = compiled  # the batch's list: `admit` appends the requests that arrive during it;
        # None where a response was told through `on_done` (let go)
        self.floor_cache = floor_cache  # the engine's: floors read in this batch are put in it
        self.model_name = model_name
        self.system_fingerprint = system_fingerprint
        self.tokenizer = tokenizer
        self.on_done = on_done  # told (index, response, pass ids) of each response built early, then let go;
        # a RequestError is told as it is admitted (no pass ids)
        self.logprobs: dict[tuple[int, int, int], list[float]] = {}  # (request, query, combination)
        self.pass_ids: list[set[int]] = []
        self.usage: list[Usage] = []
        self._floor_first_user: dict[FloorKey, int] = {}
        self.floor_p: dict[FloorKey, tuple[float, ...]] = {}  # held here: the cache may evict
        self.slot_answers: dict[tuple[int, int, int], tuple[list[SlotAnswer], float]] = {}
        self._done: dict[int, ScoringResponse] = {}  # responses built as soon as their last score came in
        self.has_slots = False  # a request with extraction slots is in (decoded after the last pass)
        self._count_floors(0)

    def admit(self, arrived: list[CompiledRequest | RequestError]) -> list[FloorKey]:
        """Requests that arrived while the batch runs (a worker's sync calls), appended to it;
        returns the floors they need that nobody in the batch has read or asked for yet."""
        first = len(self.compiled)
        known = set(self._floor_first_user)
        self.compiled.extend(arrived)
        self._count_floors(first)
        return [key for key in self._floor_first_user if key not in known]

    def _count_floors(self, first: int) -> None:
        """Usage and floor bookkeeping of requests `first`.. : a floor is cached, read by the
        first request that needs it, or shared with that one."""
        for index in range(first, len(self.compiled)):
            request = self.compiled[index]
            self.pass_ids.append(set())
            self.usage.append(Usage())
            if isinstance(request, RequestError):
                if self.on_done is not None:  # nothing to score: told at once
                    self.on_done(index, request, ())
                continue
            self.has_slots |= any(branch.slot is not None for branch in request.branches)
            for key in request.floor_keys:
                cached = self.floor_cache.get(key)
                if cached is not None:
                    self.floor_p[key] = cached
                    self.usage[index].floors_cached += 1
                elif key not in self._floor_first_user:
                    self._floor_first_user[key] = index
                    self.usage[index].floors_computed += 1
                else:
                    self.usage[index].floors_cached += 1

    def missing_floors(self) -> list[FloorKey]:
        return list(self._floor_first_user)

    def collect(self, batch: PackedBatch, output: RunnerOutput) -> None:
        """Take one pass's scores; then build the responses it completed (while the next pass
        runs on the device, so that only the last pass's responses are built after the GPU ends)."""
        touched = {packed.owner.request_index for packed in batch.trees}
        self._collect_trees(batch, output)
        self._finish_ready(range(len(self.compiled)) if -1 in touched else touched)

    def _finish_ready(self, indices) -> None:
        for index in indices:
            request = self.compiled[index]
            if index in self._done or not isinstance(request, CompiledRequest):
                continue
            if all(
                branch.slot is None
                and (index, branch.query_index, branch.combination_index) in self.logprobs
                and branch.floor_key in self.floor_p
                for branch in request.branches
            ):
                response = self._response(index, request)
                if self.on_done is None:
                    self._done[index] = response
                    continue
                self.on_done(index, response, tuple(sorted(self.pass_ids[index])))
                self._let_go(index, request)

    def _let_go(self, index: int, request: CompiledRequest) -> None:
        """A response told through `on_done` is not kept, nor what built it: its result in
        `finish` is None (the caller has it), so a batch fed for hours holds only what is open."""
        for branch in request.branches:
            self.logprobs.pop((index, branch.query_index, branch.combination_index), None)
        self.compiled[index] = None

    def _collect_trees(self, batch: PackedBatch, output: RunnerOutput) -> None:
        for packed in batch.trees:
            sums = option_logprobs(packed, output.target_logprobs)
            owner = packed.owner
            tree = packed.tree
            if owner.floor_key is not None:
                self.floor_p[owner.floor_key] = tuple(normalise(sums[0]))
                self.floor_cache.put(owner.floor_key, self.floor_p[owner.floor_key])
                user = self._floor_first_user[owner.floor_key]
                self.usage[user].floor_tokens += tree.num_tokens
                continue
            index = owner.request_index
            self.pass_ids[index].add(output.pass_id)
            usage = self.usage[index]
            usage.content_tokens += tree.num_trunk_tokens
            usage.question_tokens += tree.num_question_tokens
            usage.option_tokens += tree.num_option_tokens
            for branch, branch_sums in zip(tree.branches, sums, strict=True):
                self.logprobs[index, branch.query_index, branch.combination_index] = branch_sums

    def collect_slots(self, jobs: list[SlotJob]) -> None:
        """Answers and residual of every decoded slot; its decoding passes count for its request."""
        for job in jobs:
            listed, residual = answers(job.state)
            self.slot_answers[job.request_index, job.query_index, job.combination_index] = (
                [SlotAnswer(text=a.text, value=a.value, p=a.p, finish_reason=a.finish_reason,
                            floor_p=floor_p(a, job.floor_logprobs)) for a in listed],
                residual,
            )
            self.usage[job.request_index].slot_tokens += job.num_decoded_tokens
            self.usage[job.request_index].floor_tokens += job.num_floor_tokens
            self.pass_ids[job.request_index].update(job.pass_ids)

    def finish(self) -> BatchOutput:
        """Every request's result in order: its response, its RequestError, or None for a
        response already told through `on_done`."""
        results = [
            request if not isinstance(request, CompiledRequest) else self._done.get(index) or self._response(index, request)
            for index, request in enumerate(self.compiled)
        ]
        return BatchOutput(results=results, pass_ids=[tuple(sorted(ids)) for ids in self.pass_ids])

    def _response(self, index: int, compiled: CompiledRequest) -> ScoringResponse:
        request = compiled.request
        results = [QueryResult(id=query.id, combinations=[], calibrate=query.calibrate)
                   for query in request.scoring.queries]
        for branch in compiled.branches:
            key = (index, branch.query_index, branch.combination_index)
            if branch.slot is not None:
                combination = self._slot_combination(branch, *self.slot_answers[key], request.debug)
            else:
                calibrate = request.scoring.queries[branch.query_index].calibrate
                combination = self._combination(branch, self.logprobs[key], request.debug, calibrate)
            results[branch.query_index].combinations.append(combination)
        own, packs = split_response(results, compiled.packs)
        return ScoringResponse(
            id=response_id(self.system_fingerprint, request.model_dump_json()),
            model=self.model_name,
            system_fingerprint=self.system_fingerprint,
            results=own,
            usage=self.usage[index],
            packs=packs,
        )

    def _combination(self, branch: Branch, logprobs: list[float], debug: bool,
                     calibrate: str | None = None) -> Combination:
        query_options = list(branch.floor_key.options)
        p = normalise(logprobs)
        floor_p = self.floor_p[branch.floor_key]
        contextual = reweight(p, floor_p) if calibrate == "contextual" else [None] * len(p)
        options = [
            OptionScore(text=text, logprob=lp, p=pi, floor_p=fp, contextual_p=cp)
            for text, lp, pi, fp, cp in zip(query_options, logprobs, p, floor_p, contextual, strict=True)
        ]
        return Combination(
            values=branch.values,
            options=options,
            residual=residual(logprobs),
            debug=self._debug(branch, query_options) if debug else None,
        )

    def _slot_combination(
        self, branch: Branch, slot_answers: list[SlotAnswer], residual: float, debug: bool
    ) -> Combination:
        debug_info = CombinationDebug(rendered=branch.prompt_text, branch_point=branch.branch_point, options=[])
        return Combination(values=branch.values, answers=slot_answers, residual=residual,
                           debug=debug_info if debug else None)

    def _debug(self, branch: Branch, texts: list[str]) -> CombinationDebug:
        tokenizer = self.tokenizer
        options = []
        for text, ids in zip(texts, branch.option_ids, strict=True):
            scored = ids[branch.branch_point :]
            options.append(OptionDebug(text=text, token_ids=scored, tokens=tokenizer.convert_ids_to_tokens(scored)))
        return CombinationDebug(rendered=branch.prompt_text, branch_point=branch.branch_point, options=options)


def response_id(system_fingerprint: str, request_json: str) -> str:
    """Content-addressed: the same request on the same numerics gets the same id."""
    digest = hashlib.sha256(f"{system_fingerprint}\n{request_json}".encode()).hexdigest()
    return f"score-{digest[:24]}"

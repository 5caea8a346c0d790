"""Extraction slots for the benchmark workloads (issue 6, point 3: the GPU row is measured there).

    load_workload("news").requests(...) --with_slots(requests, load_slot_queries("news"))-->
        the same requests, each also asking the slot queries of fixtures/benchmarks/news-slots.json

The engine reads the slots' prompts in the same packed passes as the option queries, then
decodes them in later passes; `slot_token_share` turns the responses' usage into the cost
of the slots in scoring-token equivalents (tokens fed to the model for slots, per token
read for the option queries). Time the two phases apart with the runner's `run` / `decode`.
`run_slots` times spinf_bf16 with the slots added (benchmarks/throughput.py --slots N), all
of them and each kind alone (search, generate), and one more run by part (`decode_breakdown`).
On CUDA, in the same run, the variants SLOT_VARIANTS names (throughput.py --slot-variants):
eager decoding, no CUDA graphs (`eager_decode_row`); the decoding projections on each other
kernel of ops.DECODING_MATMULS and the attention on each other of
decode_attention.DECODING_ATTENTION (`setting_row`); the other SHARED_TRUNKS setting
(`trunks_row`); the other HELD_ROWS_WORTH_COMPACTING setting (`compaction_row`); both of the
last two at once (`trunks_compaction_row`).
"""

from __future__ import annotations

import json

from benchmarks.workloads import FIXTURES
from contract.protocol import ScoringRequest
from engine.layers.decode_attention import DECODING_ATTENTION
from engine.layers.ops import DECODING_MATMULS

DECODING_SETTINGS = {"decoding_matmul": DECODING_MATMULS,  # ModelRunner attribute -> its choices
                     "decoding_attention": DECODING_ATTENTION}
SLOT_VARIANTS = ("eager", "kernels", "trunks", "compact", "trunks-compact")  # throughput.py --slot-variants: the rows timed beside the default


def load_slot_queries(name: str, num_slots: int | None = None) -> list[dict]:
    return json.loads((FIXTURES / f"{name}-slots.json").read_text())["queries"][:num_slots]


def with_slots(requests: list[dict], slot_queries: list[dict]) -> list[dict]:
    """Each request with the slot queries appended (ids must not clash with the workload's)."""
    return [r | {"scoring": {"queries": r["scoring"]["queries"] + slot_queries}} for r in requests]


def slot_token_share(responses) -> dict[str, float]:
    """Tokens the model read for option queries vs fed while decoding slots (prompts of the
    slots are read with the options: they are in `question_tokens`)."""
    read = sum(r.usage.content_tokens + r.usage.question_tokens + r.usage.option_tokens for r in responses)
    decoded = sum(r.usage.slot_tokens for r in responses)
    return {"read_tokens": read, "slot_tokens": decoded, "slot_tokens_per_read_token": decoded / max(1, read)}


def run_slots(run_spinf, system_row, engine, workload, args, bf16_row: dict, num_questions: int, params: int, peak: float) -> dict:
    """spinf_bf16 on the same requests with extraction slots added: the slots' cost in
    scoring-token equivalents = extra seconds x spinf_bf16's tokens/s (what the same time
    would have scored), also per slot answer, and per kind of slot (`by_kind`). `run_spinf`
    and `system_row` are benchmarks/throughput.py's."""
    slot_queries = load_slot_queries(args.workload, args.slots)
    plain = workload.requests(engine.model_name, args.num_texts)
    requests = [ScoringRequest.model_validate(r) for r in with_slots(plain, slot_queries)]
    engine.slot_vocab()  # built once per engine, on the first slot: not tokenization time
    made = []  # every decoding run's DecodeGraphs (None where graphs are off)
    decode_graphs = engine.runner.decode_graphs
    engine.runner.decode_graphs = lambda: made.append(decode_graphs()) or made[-1]
    try:
        stats, results, _ = run_spinf(engine, requests, args.repeats)
    finally:
        del engine.runner.decode_graphs  # the method again
    row = system_row(stats, num_questions, params, peak, **slot_token_share(results))
    extra_seconds = stats["seconds"] - bf16_row["seconds"]
    num_slot_answers = len(requests) * len(slot_queries)
    row |= {"num_slot_queries": len(slot_queries), "slot_answers": num_slot_answers,
            "slot_extra_seconds": extra_seconds,
            "slot_scoring_token_equivalents": extra_seconds * bf16_row["tokens_per_s"],
            "slot_scoring_token_equivalents_per_answer": extra_seconds * bf16_row["tokens_per_s"] / num_slot_answers,
            "mean_answers_per_slot": sum(len(q.combinations[0].answers or []) for r in results for q in r.results
                                         if q.combinations[0].answers is not None) / num_slot_answers}
    row["one_run"] = decode_breakdown(engine, requests)
    graphs = [g for g in made if g is not None]
    row["decoding_passes_per_run"] = {kind: sum(getattr(g, f"num_{kind}") for g in graphs) / len(made)
                                      for kind in ("eager", "captured", "replayed")} if graphs else None
    if graphs:  # host seconds per run launching eager passes and capturing graphs
        row["decoding_passes_per_run"] |= {f"{kind}_seconds": sum(getattr(g, f"{kind}_seconds") for g in graphs) / len(made)
                                           for kind in ("eager", "capture")}
    row["by_kind"] = {kind: slot_kind_row(run_spinf, engine, plain, chosen, args.repeats, bf16_row)
                      for kind, chosen in slot_kinds(slot_queries).items()}
    variants = getattr(args, "slot_variants", set(SLOT_VARIANTS)) if engine.runner.use_decode_graphs else set()
    same_run = (run_spinf, engine, requests, args.repeats, bf16_row, num_slot_answers)
    if "eager" in variants:
        row["eager_decode"] = eager_decode_row(*same_run)
    if "kernels" in variants:
        for setting in DECODING_SETTINGS:
            row[setting] = getattr(engine.runner, setting)
            row[f"other_{setting}"] = {}
        for setting, choice in other_decoding_settings(engine.runner):
            row[f"other_{setting}"][choice] = setting_row(*same_run, setting, choice)
    if "trunks" in variants:
        row["other_trunks"] = trunks_row(*same_run)
    if "compact" in variants:
        row["other_compaction"] = compaction_row(*same_run)
    if "trunks-compact" in variants:
        row["other_trunks_compaction"] = trunks_compaction_row(*same_run)
    return row


def other_compaction(on: bool) -> None:
    """The other setting of engine/extraction/decoding.py HELD_ROWS_WORTH_COMPACTING (the
    layouts packed again once half their rows are held; `on` False: the default)."""
    from engine.extraction import decoding

    decoding.HELD_ROWS_WORTH_COMPACTING = _other_compaction() if on else _DEFAULTS["held_rows_worth_compacting"]


def _other_compaction() -> int:
    """0 (every layout) against any other default; 512 against a default of 0."""
    return 512 if _DEFAULTS["held_rows_worth_compacting"] == 0 else 0


def other_trunks(on: bool) -> None:
    """The other setting of engine/layers/decode_attention.py SHARED_TRUNKS (`on` False: the default)."""
    from engine.layers import decode_attention

    decode_attention.SHARED_TRUNKS = not _DEFAULTS["shared_trunks"] if on else _DEFAULTS["shared_trunks"]


def _defaults() -> dict:
    from engine.extraction import decoding
    from engine.layers import decode_attention

    return {"held_rows_worth_compacting": decoding.HELD_ROWS_WORTH_COMPACTING,
            "shared_trunks": decode_attention.SHARED_TRUNKS}


_DEFAULTS = _defaults()  # the engine's settings as imported, which the variants switch back to


def compaction_row(run_spinf, engine, requests: list[ScoringRequest], repeats: int, bf16_row: dict,
                   num_slot_answers: int) -> dict:
    """The same requests with the other compaction setting: with 0, every layout is packed again
    once half its rows are held (fewer rows and entries per pass after slots finish, for a new
    eager pass and capture each time); with 512, only layouts of 512 rows or more."""
    return variant_row(run_spinf, engine, requests, repeats, bf16_row, num_slot_answers, other_compaction) | {
        "held_rows_worth_compacting": _other_compaction()}


def trunks_row(run_spinf, engine, requests: list[ScoringRequest], repeats: int, bf16_row: dict,
               num_slot_answers: int) -> dict:
    """The same requests with the other SHARED_TRUNKS setting: the slots of one content reading
    the prompt rows they share from one sibling's arena entry, or each from its own copy."""
    return variant_row(run_spinf, engine, requests, repeats, bf16_row, num_slot_answers, other_trunks) | {
        "shared_trunks": not _DEFAULTS["shared_trunks"]}


def trunks_compaction_row(run_spinf, engine, requests: list[ScoringRequest], repeats: int, bf16_row: dict,
                          num_slot_answers: int) -> dict:
    """The same requests with both the other SHARED_TRUNKS and the other compaction setting."""
    def both(on: bool) -> None:
        other_trunks(on)
        other_compaction(on)

    return variant_row(run_spinf, engine, requests, repeats, bf16_row, num_slot_answers, both) | {
        "shared_trunks": not _DEFAULTS["shared_trunks"], "held_rows_worth_compacting": _other_compaction()}


def eager_decode_row(run_spinf, engine, requests: list[ScoringRequest], repeats: int, bf16_row: dict,
                     num_slot_answers: int) -> dict:
    """The same requests with every decoding pass launched kernel by kernel (no CUDA graphs:
    engine/pipeline/decode_graphs.py), the baseline of the graphs in the same run."""
    def eager(on: bool) -> None:
        engine.runner.use_decode_graphs = not on

    return variant_row(run_spinf, engine, requests, repeats, bf16_row, num_slot_answers, eager)


def other_decoding_settings(runner) -> list[tuple[str, str]]:
    """(setting, choice) for every choice of DECODING_SETTINGS other than the runner's own."""
    return [(setting, choice) for setting, choices in DECODING_SETTINGS.items() for choice in choices
            if choice != getattr(runner, setting)]


def setting_row(run_spinf, engine, requests: list[ScoringRequest], repeats: int, bf16_row: dict,
                num_slot_answers: int, setting: str, choice: str) -> dict:
    """The same requests with the runner's `setting` (a key of DECODING_SETTINGS) at `choice`."""
    chosen = getattr(engine.runner, setting)

    def use(on: bool) -> None:
        setattr(engine.runner, setting, choice if on else chosen)

    return variant_row(run_spinf, engine, requests, repeats, bf16_row, num_slot_answers, use)


def variant_row(run_spinf, engine, requests: list[ScoringRequest], repeats: int, bf16_row: dict,
                num_slot_answers: int, switch) -> dict:
    """The requests run with `switch(True)` in effect (then `switch(False)`): seconds, extra
    seconds over spinf_bf16 and scoring-token equivalents per slot answer."""
    switch(True)
    try:
        stats, _, _ = run_spinf(engine, requests, repeats)
    finally:
        switch(False)
    extra = stats["seconds"] - bf16_row["seconds"]
    return {"seconds": stats["seconds"], "slot_extra_seconds": extra,
            "slot_scoring_token_equivalents_per_answer": extra * bf16_row["tokens_per_s"] / num_slot_answers}


def slot_kinds(slot_queries: list[dict]) -> dict[str, list[dict]]:
    """The slot queries by kind: `search` (the answers a beam finds) and `generate` (one text
    written token by token), each kind present."""
    kinds: dict[str, list[dict]] = {}
    for query in slot_queries:
        kinds.setdefault("generate" if query.get("mode") == "generate" else "search", []).append(query)
    return kinds


def slot_kind_row(run_spinf, engine, plain: list[dict], chosen: list[dict], repeats: int, bf16_row: dict) -> dict:
    """spinf_bf16 with only this kind's slots added: its extra seconds in scoring-token
    equivalents per answer, the decoding rows per answer and the tokens of the answers written
    (the top answer's, through the engine's tokenizer)."""
    requests = [ScoringRequest.model_validate(r) for r in with_slots(plain, chosen)]
    stats, results, _ = run_spinf(engine, requests, repeats)
    ids = {query["id"] for query in chosen}
    answers = [q.combinations[0].answers or [] for r in results for q in r.results if q.id in ids]
    written = [len(engine.tokenizer(a[0].text, add_special_tokens=False)["input_ids"]) for a in answers if a]
    extra = stats["seconds"] - bf16_row["seconds"]
    num_answers = len(requests) * len(chosen)
    return {"slot_ids": sorted(ids), "slot_answers": num_answers, "seconds": stats["seconds"], "slot_extra_seconds": extra,
            "slot_scoring_token_equivalents_per_answer": extra * bf16_row["tokens_per_s"] / num_answers,
            "decoding_rows_per_answer": sum(r.usage.slot_tokens for r in results) / num_answers,
            "tokens_written_per_answer": sum(written) / max(1, len(written)),
            "empty_answers": num_answers - len(written)}


def decode_breakdown(engine, requests: list[ScoringRequest]) -> dict:
    """One more run of the requests, timed by part: the whole run, the decoding (after the read
    passes), the decoding passes' calls (the pass, its selection and the copies) and, on CUDA,
    the passes on the device (events around each forward or replay, host-to-device input
    copies included). What is left of the decoding is the host's: batches built, beams advanced."""
    import time

    import torch

    from engine.extraction import decoding
    from engine.extraction.decoding import Extraction
    from engine.pipeline.decode_graphs import DecodeGraphs

    events, seconds = [], {"decode_calls": 0.0, "decoding": 0.0, "prepare": 0.0, "advance": 0.0}
    logprobs, decode, run = DecodeGraphs.logprobs, engine.runner.decode, Extraction.run
    prepare, advance = decoding.prepare_decode_batch, decoding._advance

    on_gpu = engine.runner.device.type == "cuda"

    def timed_logprobs(self, batch, forward):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = logprobs(self, batch, forward)
        end.record()
        events.append((start, end))
        return out

    def sync():
        if on_gpu:
            torch.cuda.synchronize()

    def timed(key, fn):
        def call(*args):
            began = time.perf_counter()
            out = fn(*args)
            seconds[key] += time.perf_counter() - began
            return out
        return call

    compiled = [engine.compile(r) for r in requests]
    if on_gpu:
        DecodeGraphs.logprobs = timed_logprobs
    engine.runner.decode, Extraction.run = timed("decode_calls", decode), timed("decoding", run)
    decoding.prepare_decode_batch, decoding._advance = timed("prepare", prepare), timed("advance", advance)
    try:
        sync()
        began = time.perf_counter()
        engine.score_batch(compiled)
        sync()
        total = time.perf_counter() - began
    finally:
        DecodeGraphs.logprobs, Extraction.run = logprobs, run
        decoding.prepare_decode_batch, decoding._advance = prepare, advance
        del engine.runner.decode  # the method again
    device = sum(start.elapsed_time(end) for start, end in events) / 1e3 if on_gpu else None
    return {"seconds": total, "read_seconds": total - seconds["decoding"], "decoding_seconds": seconds["decoding"],
            "decoding_passes": len(events) if on_gpu else None, "pass_device_seconds": device,
            "decode_call_seconds": seconds["decode_calls"],
            "decoding_host_seconds": seconds["decoding"] - seconds["decode_calls"],
            "prepare_seconds": seconds["prepare"], "advance_seconds": seconds["advance"]}

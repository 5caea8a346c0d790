"""Per-op GPU time (torch profiler) for benchmarks/throughput.py --profile.

    profile_pass: one score_batch --> the system's section of
        benchmarks/results/profile-<model>-<workload>.txt
    profile_slots: the decoding of one run with extraction slots (passes eager) --> the
        spinf_bf16_slots section of the same file
    write_profile: one section replaced, the other systems' sections kept (each names its commit)
"""

from __future__ import annotations

import time

import torch
from result_files import result_path
from slot_workload import DECODING_SETTINGS, load_slot_queries, with_slots

from contract.protocol import ScoringRequest

SECTION = "### "  # a profile file's section header: "### <system>"


def write_profile(result: dict, system: str, text: str) -> None:
    """`system`'s section of profile-<model>-<workload>.txt replaced by `text` (its first line
    names what was profiled and the commit); the other systems' sections are kept as they are."""
    path = result_path("profile", result["model"], result["workload"], suffix=".txt")
    sections = {}
    if path.is_file():
        for part in path.read_text().split("\n" + SECTION)[1:]:
            name, _, body = part.partition("\n")
            sections[name] = body
    sections[system] = text
    path.write_text("Per-op GPU time (torch profiler) of benchmarks/throughput.py --profile, one section per system.\n"
                    + "".join(f"\n{SECTION}{name}\n{body.rstrip()}\n" for name, body in sections.items()))


def profile_pass(engine, compiled, result: dict, system: str) -> str:
    """Per-op GPU time of one score_batch (torch profiler), as `system`'s section of
    profile-<model>-<workload>.txt."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.score_batch(compiled)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    head = (f"{system}: one score_batch of {result['workload']} ({result['num_texts']} texts) on random-weight"
            f" {result['model']}, {result['gpu']}; commit {result['commit']}, {result['date']}, torch {result['torch']}\n\n")
    write_profile(result, system, head + table)
    return table


def profile_slots(engine, workload, args, result: dict, setting: tuple[str, str] | None = None) -> str:
    """Per-op GPU time of the decoding of one run with the slots (the profiler runs around
    Extraction.run only; decoding passes launched eagerly, each kernel under its op: a replayed
    graph runs the same kernels), as the spinf_bf16_slots section of profile-<model>-<workload>.txt
    (setting: (runner attribute, value), e.g. ("decoding_matmul", "split_k"), in place of the
    runner's own; section spinf_bf16_slots_<value>)."""
    from torch.profiler import ProfilerActivity, profile

    from engine.extraction.decoding import Extraction

    slot_queries = load_slot_queries(args.workload, args.slots)
    plain = workload.requests(engine.model_name, args.num_texts)
    compiled = [engine.compile(ScoringRequest.model_validate(r)) for r in with_slots(plain, slot_queries)]
    run, profiles = Extraction.run, []

    def profiled(self, runner, max_num_rows):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            began = time.perf_counter()
            run(self, runner, max_num_rows)
            torch.cuda.synchronize()
        profiles.append((prof, time.perf_counter() - began))

    name, value = setting or ("decoding_matmul", engine.runner.decoding_matmul)
    chosen = getattr(engine.runner, name)
    engine.runner.use_decode_graphs, Extraction.run = False, profiled
    setattr(engine.runner, name, value)
    settings = {key: getattr(engine.runner, key) for key in DECODING_SETTINGS}  # as profiled
    try:
        engine.score_batch(compiled)
    finally:
        engine.runner.use_decode_graphs, Extraction.run = True, run
        setattr(engine.runner, name, chosen)
    prof, seconds = profiles[0]
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
    system = f"spinf_bf16_slots_{value}" if setting else "spinf_bf16_slots"
    head = (f"{system}: the decoding of one score_batch of {result['workload']} ({result['num_texts']} texts,"
            f" {len(slot_queries)} slots each) on random-weight {result['model']}, {result['gpu']}; decoding passes"
            f" eager, {', '.join(f'{key} {v}' for key, v in settings.items())}, {seconds:.3f} s under the profiler; commit {result['commit']}, {result['date']}, torch {result['torch']}\n\n")
    write_profile(result, system, head + table)
    return table

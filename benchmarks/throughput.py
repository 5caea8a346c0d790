"""Throughput, side by side, in ONE process on one GPU: hf_naive, hf_prefix, spinf_bf16, spinf_fp8.

    python3 benchmarks/throughput.py --model gemma-3-12b --workload news [--sweeps]
      1. matmul peaks: cuBLAS bf16 8192^3 and torch._scaled_mm fp8 8192^3 (MFU denominators)
      2. random-weight model (benchmarks/random_models.py), real tokenizer, the workload's requests
      3. per system: warm-up, then >= 5 timed repeats (wall clock around synchronised GPU work), median
      4. checks: spinf alone-vs-packed bit identity, agreement with hf_prefix, fp8 drift vs bf16
      5. benchmarks/results/throughput-<model>-<workload>[-slots][-sweeps][-<tag>].json + .md (the
         commit inside); with --profile, per-op tables profile-<model>-<workload>[-fp8].txt

MFU = 2 x non-embedding parameters x non-padding tokens processed / seconds / peak (bf16
peak for bf16 systems, fp8 peak for spinf_fp8); attention FLOPs are not counted for anyone.
Every system scores the same (content, question, option) items; the baselines get their
inputs pre-tokenized (their tokenization is not timed), spinf gets its requests compiled
(Engine.compile: tokens and trees, timed apart as `tokenize_seconds`); its timing includes
its packing and scoring on the CPU.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hf_baselines  # noqa: E402
import random_models  # noqa: E402
from gc_pauses import CollectionLog  # noqa: E402
from kernel_bench import peak_tflops  # noqa: E402
from result_files import git_commit, result_path, write_pair  # noqa: E402
from slot_workload import load_slot_queries, slot_token_share, with_slots  # noqa: E402
from timeline import brief, timeline  # noqa: E402
from workloads import load_workload  # noqa: E402

from contract.protocol import ScoringRequest  # noqa: E402
from engine.loading.quantization import quantize_linears_fp8  # noqa: E402


def timed(fn, repeats: int, warmup: int = 1) -> tuple[float, list[float], object]:
    """(median seconds, all timings, last result) of fn() after warm-up."""
    result = None
    for _ in range(warmup):
        result = fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times, result


class TokenCounter:
    """Counts the non-padding tokens and passes of every pass the engine's runner launches,
    and the CPU time spent launching them (block masks, H2D copies, kernel launches). No
    extra synchronisation: the runner overlaps packing the next pass with the one in flight."""

    def __init__(self, engine) -> None:
        self.num_tokens = 0
        self.num_passes = 0
        self.runner_seconds = 0.0
        # wrap the runner's own method, not an earlier counter's wrapper (run_spinf may run twice)
        launch = getattr(engine.runner, "_uncounted_launch", engine.runner.launch)
        engine.runner._uncounted_launch = launch

        def counted(batch):
            self.num_tokens += batch.num_real_tokens
            self.num_passes += 1
            start = time.perf_counter()
            launched = launch(batch)
            self.runner_seconds += time.perf_counter() - start
            return launched

        engine.runner.launch = counted


def precompile(engine, requests) -> tuple[list, float]:
    """Every request compiled once (Engine.compile: tokenization and its tree), so the timed
    runs start from compiled requests, as the baselines start from tokenized ones; and the
    seconds compiling took (recorded as `tokenize_seconds`)."""
    start = time.perf_counter()
    compiled = [engine.compile(request) for request in requests]
    return compiled, time.perf_counter() - start


def spinf_logprobs(responses) -> list[list[float]]:
    """[request][query*option] logprobs in request order (first combination of each query)."""
    return [[o.logprob for q in r.results for o in q.combinations[0].options] for r in responses]


def run_spinf(engine, requests, repeats: int) -> tuple[dict, list, list]:
    """(stats, responses, the compiled requests the runs scored)."""
    counter = TokenCounter(engine)
    compiled, compile_seconds = precompile(engine, requests)
    # Two warm-ups: the first compiles kernels and fills the floor cache; the second compiles
    # for the pass shapes of a warm floor cache. Counted: the timed runs only.
    for _ in range(2):
        engine.score_batch(compiled)
    counter.num_tokens = counter.num_passes = 0
    counter.runner_seconds = 0.0
    torch.cuda.reset_peak_memory_stats()
    collections = CollectionLog()  # the collector's seconds over the timed runs, between them too
    collections.phase = "timed"
    seconds, times, output = timed(lambda: engine.score_batch(compiled), repeats, warmup=0)
    collections.close()
    num_runs = repeats
    stats = {"seconds": seconds, "times": times, "tokens": counter.num_tokens // num_runs,
             "passes": counter.num_passes // num_runs, "runner_seconds": counter.runner_seconds / num_runs,
             "tokenize_seconds": compile_seconds, "gc_seconds": collections.seconds("timed") / num_runs,
             "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30}
    stats["seconds_with_tokenize"] = seconds + stats["tokenize_seconds"]
    return stats, output.results, compiled


def profile_pass(engine, compiled, result: dict, system: str) -> str:
    """Per-op GPU time of one score_batch (torch profiler), as a table in profile-<model>-<workload>[-fp8].txt."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.score_batch(compiled)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    head = (f"{system}: one score_batch of {result['workload']} ({result['num_texts']} texts) on random-weight"
            f" {result['model']}, {result['gpu']}; commit {result['commit']}, {result['date']}, torch {result['torch']}\n\n")
    variant = "fp8" if system.endswith("fp8") else ""
    result_path("profile", result["model"], result["workload"], variant, suffix=".txt").write_text(head + table)
    return table


def check_invariance(engine, compiled, packed_results, indices=(0, 7)) -> bool:
    """Each chosen content alone must give bit-identical responses to the packed run."""
    for index in indices:
        alone = engine.score_batch([compiled[index]]).results[0]
        if spinf_logprobs([alone]) != spinf_logprobs([packed_results[index]]):
            return False
        if [o.floor_p for q in alone.results for o in q.combinations[0].options] != [
            o.floor_p for q in packed_results[index].results for o in q.combinations[0].options
        ]:
            return False
    return True


def diff_stats(a: list[list[float]], b: list[list[float]]) -> dict:
    diffs = [abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    return {"mean_abs": statistics.fmean(diffs), "max_abs": max(diffs), "items": len(diffs)}


def system_row(stats: dict, num_questions: int, params: int, peak: float, **extra) -> dict:
    seconds = stats["seconds"]
    return {
        "questions_per_s": num_questions / seconds,
        "tokens_per_s": stats["tokens"] / seconds,
        "seconds": seconds,
        "mfu": 2 * params * stats["tokens"] / seconds / (peak * 1e12),
        "tokens": stats["tokens"],
        "questions": num_questions,
        "timings": stats["times"],
        **{k: v for k, v in stats.items() if k not in ("seconds", "times", "tokens")},
        **extra,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gemma-3-12b", choices=sorted(random_models.ARCHS))
    parser.add_argument("--workload", default="news")
    parser.add_argument("--num-texts", type=int, default=None, help="first N texts (default: all)")
    parser.add_argument("--naive-texts", type=int, default=2, help="hf_naive runs on the first N texts only")
    parser.add_argument("--prefix-texts", type=int, default=None,
                        help="hf_prefix runs on the first N texts only (default: all; its rate does not depend on N)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", type=int, default=16384, help="spinf max_num_batched_tokens")
    parser.add_argument("--sweeps", action="store_true")
    parser.add_argument("--skip", default="", help="comma list of systems to skip")
    parser.add_argument("--commit", default=None, help="commit hash to record (the device copy has no .git)")
    parser.add_argument("--layer-std", type=float, default=0.5, help="random_models.fill_random_weights")
    parser.add_argument("--tag", default="", help="what else this run varies, ending the file name (e.g. budget8192)")
    parser.add_argument("--slots", type=int, default=0,
                        help="also time spinf_bf16 with the first N extraction slots of fixtures/benchmarks/<workload>-slots.json")
    parser.add_argument("--profile", action="store_true", help="write a per-op table of one run of each spinf system")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    torch.backends.cuda.matmul.allow_tf32 = False

    result = {"commit": args.commit or git_commit(), "gpu": torch.cuda.get_device_name(), "model": args.model,
              "workload": args.workload, "date": datetime.date.today().isoformat(), "repeats": args.repeats,
              "torch": torch.__version__, "budget_tokens": args.budget,
              "variant": "-".join(filter(None, ["slots" if args.slots else "", "sweeps" if args.sweeps else "", args.tag]))}
    result["peak_tflops"] = {"bf16": peak_tflops("bf16"), "fp8": peak_tflops("fp8")}
    print("peaks", result["peak_tflops"], flush=True)

    tokenizer = random_models.tokenizer_for(args.model)
    hf = random_models.make_hf_model(args.model, torch.bfloat16, layer_std=args.layer_std)
    result["layer_std"] = args.layer_std
    params = random_models.non_embedding_params(hf)
    result["non_embedding_params"] = params
    engine = random_models.random_engine(hf, args.model, args.budget)
    workload = load_workload(args.workload)
    requests = [ScoringRequest.model_validate(r) for r in workload.requests(engine.model_name, args.num_texts)]
    items = hf_baselines.items_from_engine(engine, requests)
    num_questions = sum(len(i.questions) for i in items)
    result["num_texts"], result["num_questions"] = len(requests), num_questions
    peaks = result["peak_tflops"]
    systems = result["systems"] = {}

    stats, bf16_results, compiled = run_spinf(engine, requests, args.repeats)
    systems["spinf_bf16"] = system_row(stats, num_questions, params, peaks["bf16"])
    systems["spinf_bf16"]["batch_invariant"] = check_invariance(engine, compiled, bf16_results)
    systems["spinf_bf16"]["timeline"] = timeline(engine, compiled)
    print("spinf_bf16", _brief(systems["spinf_bf16"]), "\n  timeline", brief(systems["spinf_bf16"]["timeline"]), flush=True)
    write_result(result, final=False)  # after every system: a run cut short keeps the rows it finished
    if args.profile:
        print(profile_pass(engine, compiled, result, "spinf_bf16"), flush=True)
    if args.slots:
        systems["spinf_bf16_slots"] = run_slots(engine, workload, args, systems["spinf_bf16"], num_questions, params,
                                                peaks["bf16"])
        print("spinf_bf16_slots", _brief(systems["spinf_bf16_slots"]), flush=True)
        write_result(result, final=False)

    if "hf_prefix" not in skip:
        prefix_items = items[: args.prefix_texts]
        stats, prefix_lp = hf_baselines.run_prefix(hf, prefix_items, args.repeats, timed)
        extra = {"measured_on_texts": len(prefix_items)} if len(prefix_items) < len(items) else {}
        systems["hf_prefix"] = system_row(stats, sum(len(i.questions) for i in prefix_items), params, peaks["bf16"],
                                          batch_invariant=False, **extra)
        result["spinf_bf16_vs_hf_prefix"] = diff_stats(spinf_logprobs(bf16_results)[: len(prefix_items)], prefix_lp)
        print("hf_prefix", _brief(systems["hf_prefix"]), result["spinf_bf16_vs_hf_prefix"], flush=True)
        write_result(result, final=False)
    if "hf_naive" not in skip:
        subset = items[: args.naive_texts]
        stats, naive_lp = hf_baselines.run_naive(hf, subset, args.repeats, timed)
        systems["hf_naive"] = system_row(stats, sum(len(i.questions) for i in subset), params, peaks["bf16"],
                                         batch_invariant=False, measured_on_texts=len(subset))
        if "hf_prefix" in systems:  # two bf16 transformers runs of the same items: the bf16 noise floor
            flat = [t.tolist() for t in naive_lp]
            naive_rows = [[x for q in flat[i * len(it.questions) : (i + 1) * len(it.questions)] for x in q]
                          for i, it in enumerate(subset)]
            shared = min(len(naive_rows), len(prefix_lp))  # texts both were measured on
            result["hf_naive_vs_hf_prefix"] = diff_stats(naive_rows[:shared], prefix_lp[:shared])
        print("hf_naive", _brief(systems["hf_naive"]), result.get("hf_naive_vs_hf_prefix"), flush=True)
        write_result(result, final=False)
    if "spinf_fp8" not in skip:
        fp8_model = quantize_linears_fp8(random_models.engine_model(hf))
        engine8 = random_models.make_engine(fp8_model, tokenizer, args.model, f"random-seed0-{args.model}-fp8", args.budget)
        stats, fp8_results, compiled8 = run_spinf(engine8, requests, args.repeats)
        systems["spinf_fp8"] = system_row(stats, num_questions, params, peaks["fp8"],
                                          mfu_vs_bf16_peak=2 * params * stats["tokens"] / stats["seconds"] / (peaks["bf16"] * 1e12))
        systems["spinf_fp8"]["batch_invariant"] = check_invariance(engine8, compiled8, fp8_results)
        systems["spinf_fp8"]["timeline"] = timeline(engine8, compiled8)
        print("  fp8 timeline", brief(systems["spinf_fp8"]["timeline"]), flush=True)
        if args.profile:
            print(profile_pass(engine8, compiled8, result, "spinf_fp8"), flush=True)
        result["fp8_vs_bf16_drift"] = diff_stats(spinf_logprobs(fp8_results), spinf_logprobs(bf16_results))
        print("spinf_fp8", _brief(systems["spinf_fp8"]), result["fp8_vs_bf16_drift"], flush=True)
        del engine8, fp8_model
        write_result(result, final=False)
    if args.sweeps:
        import sweeps

        result["sweeps"] = sweeps.run_sweeps(engine, hf, workload, timed)
    write_result(result)


def run_slots(engine, workload, args, bf16_row: dict, num_questions: int, params: int, peak: float) -> dict:
    """spinf_bf16 on the same requests with extraction slots added: the slots' cost in
    scoring-token equivalents = extra seconds x spinf_bf16's tokens/s (what the same time
    would have scored), also per slot answer."""
    slot_queries = load_slot_queries(args.workload, args.slots)
    plain = workload.requests(engine.model_name, args.num_texts)
    requests = [ScoringRequest.model_validate(r) for r in with_slots(plain, slot_queries)]
    engine.slot_vocab()  # built once per engine, on the first slot: not tokenization time
    stats, results, _ = run_spinf(engine, requests, args.repeats)
    row = system_row(stats, num_questions, params, peak, **slot_token_share(results))
    extra_seconds = stats["seconds"] - bf16_row["seconds"]
    num_slot_answers = len(requests) * len(slot_queries)
    row |= {"num_slot_queries": len(slot_queries), "slot_answers": num_slot_answers,
            "slot_extra_seconds": extra_seconds,
            "slot_scoring_token_equivalents": extra_seconds * bf16_row["tokens_per_s"],
            "slot_scoring_token_equivalents_per_answer": extra_seconds * bf16_row["tokens_per_s"] / num_slot_answers,
            "mean_answers_per_slot": sum(len(q.combinations[0].answers or []) for r in results for q in r.results
                                         if q.combinations[0].answers is not None) / num_slot_answers}
    return row


def _brief(row: dict) -> str:
    extra = {k: round(row[k], 3) for k in ("runner_seconds", "tokenize_seconds", "gc_seconds", "passes", "batch_invariant") if k in row}
    return f"{row['questions_per_s']:.1f} q/s {row['tokens_per_s']:.0f} tok/s mfu {row['mfu']:.3f} ({row['seconds']:.3f} s) {extra}"


def write_result(result: dict, final: bool = True) -> None:
    """The JSON + Markdown pair; `complete` is false until every asked-for system has run."""
    result["complete"] = final
    write_pair(result, markdown(result), "throughput", result["model"], result["workload"], result["variant"])
    if final:
        print(markdown(result))


def markdown(result: dict) -> str:
    peaks = result["peak_tflops"]
    lines = [
        f"# {result['workload']} on random-weight {result['model']} ({result['gpu']})",
        "",
        f"commit `{result['commit'][:12]}`, {result['date']}, torch {result['torch']}, {result['num_texts']} texts,"
        f" {result['num_questions']} questions, median of {result['repeats']} timed repeats after warm-up.",
        f"Peaks measured in this run: bf16 {peaks['bf16']:.0f} TFLOP/s, fp8 {peaks['fp8']:.0f} TFLOP/s (8192^3).",
        *([] if result.get("complete", True) else ["", "**Incomplete: the run stopped before every system had run.**"]),
        "",
        "| system | questions/s | tokens/s | seconds | MFU | batch invariant |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, row in result["systems"].items():
        note = f" (on {row['measured_on_texts']} texts)" if "measured_on_texts" in row else ""
        lines.append(f"| {name}{note} | {row['questions_per_s']:.1f} | {row['tokens_per_s']:.0f} | {row['seconds']:.3f} |"
                     f" {row['mfu']:.1%} | {row.get('batch_invariant')} |")
    for name, row in result["systems"].items():
        if "runner_seconds" in row:
            lines.append(f"\n{name}: {row['passes']} passes; launch (block masks, copies, kernel launches, and any wait for the GPU inside them) {row['runner_seconds']:.3f} s of"
                         f" {row['seconds']:.3f} s; tokenization {row['tokenize_seconds']:.3f} s more (not in the table:"
                         f" the baselines get tokenized input too)"
                         + (f"; garbage collector {row['gc_seconds']:.3f} s per run" if "gc_seconds" in row else ""))
        if "timeline" in row:
            lines.append(f"\n{name} timeline of one more run (benchmarks/timeline.py): {brief(row['timeline'])}")
    if "spinf_bf16_slots" in result["systems"]:
        row = result["systems"]["spinf_bf16_slots"]
        lines.append(f"\nspinf_bf16_slots: the same requests plus {row['num_slot_queries']} extraction slots each"
                     f" ({row['slot_answers']} slot answers): +{row['slot_extra_seconds']:.3f} s ="
                     f" {row['slot_scoring_token_equivalents']:.0f} scoring-token equivalents"
                     f" ({row['slot_scoring_token_equivalents_per_answer']:.1f} per slot answer);"
                     f" {row['slot_tokens']} decoding rows vs {row['read_tokens']} tokens read;"
                     f" questions/s counts the option questions only")
    for key in ("spinf_bf16_vs_hf_prefix", "hf_naive_vs_hf_prefix", "fp8_vs_bf16_drift"):
        if key in result:
            d = result[key]
            lines.append(f"\n{key}: mean |Δlogprob| {d['mean_abs']:.4f}, max {d['max_abs']:.4f} nats over {d['items']} items")
    if "sweeps" in result:
        lines += ["", "## Sweeps (spinf_bf16 vs hf_prefix, seconds per content)", "",
                  "| sweep | value | spinf_bf16 s | hf_prefix s | tokens per content |", "|---|---:|---:|---:|---:|"]
        for row in result["sweeps"]:
            lines.append(f"| {row['sweep']} | {row['value']} | {row['spinf_s']:.4f} | {row['hf_prefix_s']:.4f} | {row['tokens']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

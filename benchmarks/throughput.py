"""Throughput, side by side, in ONE process on one GPU: spinf_bf16, hf_prefix, hf_prefix_batched,
hf_naive, spinf_fp8 (--skip any but spinf_bf16); on a GPU also spinf_fp8_gate_up_<other>, the fp8 engine
again with the other setting of ops.FP8_GATE_UP (act(gate) * up in the gate_up matmul's epilogue or in its
own kernel; --no-fp8-variants skips it).

    python3 benchmarks/throughput.py --model gemma-3-12b --workload news [--sweeps]
      1. matmul peaks: cuBLAS bf16 8192^3 and torch._scaled_mm fp8 8192^3 (MFU denominators)
      2. random-weight model (benchmarks/random_models.py), real tokenizer, the workload's requests
      3. per system: warm-up, then >= 5 timed repeats (wall clock around synchronised GPU work), median;
         hf_prefix_batched once per (question-row chunk, group size) point of its sweep
         (benchmarks/prefix_batched.py), its fastest point in the table
      4. checks: spinf alone-vs-packed bit identity, agreement with hf_prefix, fp8 drift vs bf16
      5. benchmarks/results/throughput-<model>-<workload>[-slots][-sweeps][-<tag>].json + .md (the
         commit inside; benchmarks/throughput_report.py); with --profile, per-op tables (op_profiles.py) in
         profile-<model>-<workload>.txt, a section per system (spinf_bf16, the decoding of
         spinf_bf16_slots, spinf_fp8), each naming its commit
    --device cpu --model tiny-gemma3_text: the same code path in fp32 on a CPU, in minutes
        (tests/benchmarks/test_throughput_cpu.py), e.g. before a GPU run

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
import prefix_batched  # noqa: E402
import random_models  # noqa: E402
import result_files  # noqa: E402
from gc_pauses import CollectionLog  # noqa: E402
from kernel_bench import peak_tflops  # noqa: E402
from op_profiles import profile_pass, profile_slots  # noqa: E402
from result_files import git_commit  # noqa: E402
from slot_workload import SLOT_VARIANTS, other_decoding_settings, run_slots  # noqa: E402
from throughput_report import speedups, write_result  # noqa: E402
from timeline import brief, timeline  # noqa: E402
from workloads import load_workload  # noqa: E402

from contract.protocol import ScoringRequest  # noqa: E402
from engine.layers import ops  # noqa: E402
from engine.loading.quantization import quantize_linears_fp8  # noqa: E402


def synchronize() -> None:
    """Wait for the GPU's queued work (nothing to wait for on a CPU-only machine)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_memory_gib() -> float | None:
    """The GPU's peak allocated memory since the last call, which resets it (None without a GPU)."""
    if not torch.cuda.is_available():
        return None
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return peak


def timed(fn, repeats: int, warmup: int = 1) -> tuple[float, list[float], object]:
    """(median seconds, all timings, last result) of fn() after warm-up."""
    result = None
    for _ in range(warmup):
        result = fn()
    synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        synchronize()
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
    peak_memory_gib()  # resets the peak
    collections = CollectionLog()  # the collector's seconds over the timed runs, between them too
    collections.phase = "timed"
    seconds, times, output = timed(lambda: engine.score_batch(compiled), repeats, warmup=0)
    collections.close()
    num_runs = repeats
    stats = {"seconds": seconds, "times": times, "tokens": counter.num_tokens // num_runs,
             "passes": counter.num_passes // num_runs, "runner_seconds": counter.runner_seconds / num_runs,
             "tokenize_seconds": compile_seconds, "gc_seconds": collections.seconds("timed") / num_runs,
             "peak_gpu_gib": peak_memory_gib()}
    stats["seconds_with_tokenize"] = seconds + stats["tokenize_seconds"]
    return stats, output.results, compiled


def check_invariance(engine, compiled, packed_results, indices=(0, 7)) -> bool:
    """Each chosen content alone must give bit-identical responses to the packed run."""
    for index in (i for i in indices if i < len(compiled)):
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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gemma-3-12b", choices=random_models.model_names())
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: fp32, a tiny-<family> model, the same code path (a check, not a measurement)")
    parser.add_argument("--workload", default="news")
    parser.add_argument("--num-texts", type=int, default=None, help="first N texts (default: all)")
    parser.add_argument("--naive-texts", type=int, default=2, help="hf_naive runs on the first N texts only")
    parser.add_argument("--prefix-texts", type=int, default=None,
                        help="hf_prefix and hf_prefix_batched run on the first N texts only (default: all)")
    parser.add_argument("--prefix-batched-chunks", default="128",
                        help="comma list of question rows per hf_prefix_batched question forward (0: all of a group's)")
    parser.add_argument("--prefix-batched-groups", default="",
                        help="comma list of hf_prefix_batched group sizes (default: 1, 2, 4, ... up to all texts)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", type=int, default=16384, help="spinf max_num_batched_tokens")
    parser.add_argument("--sweeps", action="store_true")
    parser.add_argument("--skip", default="", help="comma list of systems to skip: hf_prefix, hf_prefix_batched, hf_naive, spinf_fp8")
    parser.add_argument("--commit", default=None, help="commit hash to record (the device copy has no .git)")
    parser.add_argument("--layer-std", type=float, default=0.5, help="random_models.fill_random_weights")
    parser.add_argument("--tag", default="", help="what else this run varies, ending the file name (e.g. budget8192)")
    parser.add_argument("--slots", type=int, default=0,
                        help="also time spinf_bf16 with the first N extraction slots of fixtures/benchmarks/<workload>-slots.json")
    parser.add_argument("--slot-variants", default=",".join(SLOT_VARIANTS),
                        help=f"with --slots: the same-run variants to time, a comma list of {', '.join(SLOT_VARIANTS)}")
    parser.add_argument("--no-slot-variants", dest="slot_variants", action="store_const", const="",
                        help="with --slots: time none of the same-run variants")
    parser.add_argument("--no-fp8-variants", dest="fp8_variants", action="store_false",
                        help="skip spinf_fp8_gate_up_<other> (spinf_fp8 with the other ops.FP8_GATE_UP, same run)")
    parser.add_argument("--profile", action="store_true", help="write a per-op table of one run of each spinf system")
    parser.add_argument("--results-dir", default=None, help="write the result pair here, not in benchmarks/results/")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    args.slot_variants = set(filter(None, args.slot_variants.split(",")))
    if args.slot_variants - set(SLOT_VARIANTS):
        sys.exit(f"--slot-variants: unknown {sorted(args.slot_variants - set(SLOT_VARIANTS))}; known: {SLOT_VARIANTS}")
    skip = set(filter(None, args.skip.split(",")))
    if args.results_dir:
        result_files.RESULTS = Path(args.results_dir)
    torch.backends.cuda.matmul.allow_tf32 = False
    on_gpu = args.device == "cuda"
    dtype = torch.bfloat16 if on_gpu else torch.float32

    result = {"commit": args.commit or git_commit(), "gpu": torch.cuda.get_device_name() if on_gpu else "cpu",
              "model": args.model, "workload": args.workload, "date": datetime.date.today().isoformat(),
              "repeats": args.repeats, "torch": torch.__version__, "budget_tokens": args.budget, "device": args.device,
              "variant": "-".join(filter(None, ["slots" if args.slots else "", "sweeps" if args.sweeps else "", args.tag]))}
    result["peak_method"], result["peak_tflops"] = measure_peaks(on_gpu)
    print("peaks", result["peak_tflops"], flush=True)
    peak_bf16 = result["peak_tflops"]["bf16" if on_gpu else "fp32"]

    tokenizer = random_models.tokenizer_for(args.model)
    hf = random_models.make_hf_model(args.model, dtype, layer_std=args.layer_std, device=args.device)
    result["layer_std"] = args.layer_std
    params = random_models.non_embedding_params(hf)
    result["non_embedding_params"] = params
    engine = random_models.random_engine(hf, args.model, args.budget, dtype, args.device)
    workload = load_workload(args.workload)
    requests = [ScoringRequest.model_validate(r) for r in workload.requests(engine.model_name, args.num_texts)]
    items = hf_baselines.items_from_engine(engine, requests)
    num_questions = sum(len(i.questions) for i in items)
    result["num_texts"], result["num_questions"] = len(requests), num_questions
    systems = result["systems"] = {}

    stats, bf16_results, compiled = run_spinf(engine, requests, args.repeats)
    systems["spinf_bf16"] = system_row(stats, num_questions, params, peak_bf16)
    systems["spinf_bf16"]["batch_invariant"] = check_invariance(engine, compiled, bf16_results)
    if on_gpu:
        systems["spinf_bf16"]["timeline"] = timeline(engine, compiled)
        print("  timeline", brief(systems["spinf_bf16"]["timeline"]), flush=True)
    print("spinf_bf16", _brief(systems["spinf_bf16"]), flush=True)
    write_result(result, final=False)  # after every system: a run cut short keeps the rows it finished
    if args.profile:
        print(profile_pass(engine, compiled, result, "spinf_bf16"), flush=True)
    if args.slots:
        systems["spinf_bf16_slots"] = run_slots(run_spinf, system_row, engine, workload, args, systems["spinf_bf16"], num_questions, params,
                                                peak_bf16)
        print("spinf_bf16_slots", _brief(systems["spinf_bf16_slots"]), flush=True)
        write_result(result, final=False)
        if args.profile:
            for setting in (None, *other_decoding_settings(engine.runner)):
                print(profile_slots(engine, workload, args, result, setting), flush=True)

    prefix_items = items[: args.prefix_texts]
    prefix_lp = None
    if "hf_prefix" not in skip:
        stats, prefix_lp = hf_baselines.run_prefix(hf, prefix_items, args.repeats, timed)
        extra = {"measured_on_texts": len(prefix_items)} if len(prefix_items) < len(items) else {}
        systems["hf_prefix"] = system_row(stats, sum(len(i.questions) for i in prefix_items), params, peak_bf16,
                                          batch_invariant=False, **extra)
        result["spinf_bf16_vs_hf_prefix"] = diff_stats(spinf_logprobs(bf16_results)[: len(prefix_items)], prefix_lp)
        print("hf_prefix", _brief(systems["hf_prefix"]), result["spinf_bf16_vs_hf_prefix"], flush=True)
        write_result(result, final=False)
    if "hf_naive" not in skip:
        subset = items[: args.naive_texts]
        stats, naive_lp = hf_baselines.run_naive(hf, subset, args.repeats, timed)
        systems["hf_naive"] = system_row(stats, sum(len(i.questions) for i in subset), params, peak_bf16,
                                         batch_invariant=False, measured_on_texts=len(subset))
        if prefix_lp is not None:  # two transformers runs of the same items: the noise floor of the dtype
            flat = [t.tolist() for t in naive_lp]
            naive_rows = [[x for q in flat[i * len(it.questions) : (i + 1) * len(it.questions)] for x in q]
                          for i, it in enumerate(subset)]
            shared = min(len(naive_rows), len(prefix_lp))  # texts both were measured on
            result["hf_naive_vs_hf_prefix"] = diff_stats(naive_rows[:shared], prefix_lp[:shared])
        print("hf_naive", _brief(systems["hf_naive"]), result.get("hf_naive_vs_hf_prefix"), flush=True)
        write_result(result, final=False)
    if "spinf_fp8" not in skip:
        run_fp8(result, hf, tokenizer, requests, bf16_results, args, params, num_questions)
        write_result(result, final=False)
    if "hf_prefix_batched" not in skip:  # last of the systems: its sweep is the longest
        run_prefix_batched(result, hf, prefix_items, args, params, peak_bf16, prefix_lp, len(items))
        write_result(result, final=False)
    if args.sweeps:
        import sweeps

        result["sweeps"] = sweeps.run_sweeps(engine, hf, workload, timed)
    result["speedups"] = speedups(result)
    write_result(result)


def measure_peaks(on_gpu: bool) -> tuple[str, dict]:
    """(how, {kind: TFLOP/s}): the MFU denominators; on a CPU one fp32 matmul, for the code path."""
    if on_gpu:
        return "cuBLAS bf16 and torch._scaled_mm fp8, 8192^3", {"bf16": peak_tflops("bf16"), "fp8": peak_tflops("fp8")}
    a = torch.randn(1024, 1024)
    seconds, _, _ = timed(lambda: a @ a, 5)
    return "torch fp32 1024^3 on the CPU", {"fp32": 2 * 1024**3 / seconds / 1e12}


def run_prefix_batched(result: dict, hf, items, args, params: int, peak: float, prefix_lp, num_texts: int) -> None:
    """hf_prefix_batched's sweep (benchmarks/prefix_batched.py) into result["hf_prefix_batched_sweep"]
    (written after every point), its fastest point as the system's row, and that point's
    agreement with hf_prefix."""
    chunks = [int(c) for c in args.prefix_batched_chunks.split(",")]
    groups = ([int(g) for g in args.prefix_batched_groups.split(",")] if args.prefix_batched_groups
              else prefix_batched.group_sizes(len(items)))
    num_questions = sum(len(i.questions) for i in items)

    def record(points: list[dict]) -> None:
        result["hf_prefix_batched_sweep"] = [p if p.get("oom") else system_row(p, num_questions, params, peak) for p in points]
        write_result(result, final=False)

    _, best_lp = prefix_batched.sweep(hf, items, chunks, groups, args.repeats, timed, peak_memory_gib, record)
    measured = [row for row in result["hf_prefix_batched_sweep"] if row.get("finite")]
    if not measured:
        return
    best = min(measured, key=lambda row: row["seconds"])
    extra = {"measured_on_texts": len(items)} if len(items) < num_texts else {}
    result["systems"]["hf_prefix_batched"] = {**best, "batch_invariant": False, **extra}
    if prefix_lp is not None:
        result["hf_prefix_batched_vs_hf_prefix"] = diff_stats(best_lp, prefix_lp)
    print("hf_prefix_batched", _brief(best), result.get("hf_prefix_batched_vs_hf_prefix"), flush=True)


def run_fp8(result: dict, hf, tokenizer, requests, bf16_results, args, params: int, num_questions: int) -> None:
    peaks, on_gpu = result["peak_tflops"], args.device == "cuda"
    fp8_model = quantize_linears_fp8(random_models.engine_model(hf))
    engine8 = random_models.make_engine(fp8_model, tokenizer, args.model, f"random-seed0-{args.model}-fp8", args.budget,
                                        hf.dtype, args.device)
    stats, fp8_results, compiled8 = run_spinf(engine8, requests, args.repeats)
    peak = peaks["fp8"] if on_gpu else peaks["fp32"]
    row = result["systems"]["spinf_fp8"] = system_row(stats, num_questions, params, peak)
    if on_gpu:
        row["mfu_vs_bf16_peak"] = 2 * params * stats["tokens"] / stats["seconds"] / (peaks["bf16"] * 1e12)
        row["timeline"] = timeline(engine8, compiled8)
        print("  fp8 timeline", brief(row["timeline"]), flush=True)
    row["batch_invariant"] = check_invariance(engine8, compiled8, fp8_results)
    if args.profile:
        print(profile_pass(engine8, compiled8, result, "spinf_fp8"), flush=True)
    result["fp8_vs_bf16_drift"] = diff_stats(spinf_logprobs(fp8_results), spinf_logprobs(bf16_results))
    print("spinf_fp8", _brief(row), result["fp8_vs_bf16_drift"], flush=True)
    if on_gpu and args.fp8_variants:
        other = next(mode for mode in ops.FP8_GATE_UPS if mode != ops.FP8_GATE_UP)
        with ops.fp8_gate_ups(other):
            stats, other_results, _ = run_spinf(engine8, requests, args.repeats)
        name = f"spinf_fp8_gate_up_{other}"
        row = result["systems"][name] = system_row(stats, num_questions, params, peak)
        row["same_bits_as_spinf_fp8"] = spinf_logprobs(other_results) == spinf_logprobs(fp8_results)
        print(name, _brief(row), row["same_bits_as_spinf_fp8"], flush=True)


def _brief(row: dict) -> str:
    extra = {k: round(row[k], 3) for k in ("runner_seconds", "tokenize_seconds", "gc_seconds", "passes", "batch_invariant") if k in row}
    return f"{row['questions_per_s']:.1f} q/s {row['tokens_per_s']:.0f} tok/s mfu {row['mfu']:.3f} ({row['seconds']:.3f} s) {extra}"

if __name__ == "__main__":
    main()

"""Tokenization speed, CPU only: whole strings vs Tokenize.continuations (prefix once, short tails).

    python3 benchmarks/tokenize_speed.py [--workload news] [--num-texts N] [--repeats 5] [--models name,folder,...]
      1. the workload's texts (benchmarks/make_news_workload.py; seeded synthetic text when the
         texts file is missing) rendered as the engine renders them (chat template, answer_in),
         x every question x (prompt + each option): the suffixes compile_request passes
      2. per registry tokenizer: one warm-up, then the median of --repeats timings of
         (a) whole: every prefix + suffix in one batched call per text (continuations before the cut)
         (b) prefix cut: Tokenize.continuations without suffix cuts (one cut per text, each
             prefix tail + suffix tokenized)
         (c) suffix cuts, cold: a new Tokenize per repeat (each distinct suffix cut and its tail
             tokenized once in the run, then shared by every text)
         (d) suffix cuts, warm: one Tokenize across repeats (as an engine serving batch after batch)
         all must give the same token ids, else the script fails
      3. benchmarks/results/tokenize-speed-<workload>.json + .md with the command, machine and commit
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from result_files import git_commit, write_pair  # noqa: E402
from workloads import FIXTURES, load_workload  # noqa: E402

from contract.protocol import ScoringRequest  # noqa: E402
from engine.loading.loader import registry_tokenizer_dir  # noqa: E402
from engine.pipeline.prompts import PromptRenderer  # noqa: E402
from engine.pipeline.tokenize import Tokenize  # noqa: E402

MODELS = ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m")
SYNTHETIC_WORDS = (
    "the government said on Monday that the market had risen by 5% after the firm's results were "
    "published in London and analysts expected further gains this year while the minister warned "
    "that growth could slow if prices kept rising across Europe"
).split()


def load_texts(name: str) -> tuple[list[str], dict, str]:
    """(texts, workload spec, source): the workload's texts, else seeded synthetic articles."""
    spec = json.loads((FIXTURES / f"{name}.json").read_text())
    try:
        return load_workload(name).texts, spec, f"{name} workload texts"
    except FileNotFoundError:
        rng = random.Random(0)
        texts = [" ".join(rng.choice(SYNTHETIC_WORDS) for _ in range(350)) + "." for _ in range(24)]
        return texts, spec, "synthetic (workload texts missing)"


def prompts(tokenizer, texts: list[str], spec: dict) -> list[tuple[str, list[str]]]:
    """(prefix, suffixes) per text, as compile_request builds them."""
    renderer = PromptRenderer(tokenizer, bool(tokenizer.chat_template))
    field = "article" if "{article}" in spec["message_template"] else "message"
    cases = []
    for text in texts:
        payload = {"messages": [{"role": "user", "content": spec["message_template"].format(**{field: text})}],
                   "scoring": {"queries": spec["queries"]}}
        request = ScoringRequest.model_validate(payload)
        by_answer_in: dict[str, list[str]] = {}
        for query in request.scoring.queries:
            filled = query.parsed_template.fill({})
            by_answer_in.setdefault(query.answer_in, []).extend([filled, *(filled + o for o in query.options)])
        for answer_in, suffixes in by_answer_in.items():
            cases.append((renderer.render_prefix(request.messages, answer_in), suffixes))
    return cases


def timed(fn, repeats: int) -> tuple[float, list[float], object]:
    result = fn()  # warm-up (and Gemma's one-time vocab scan)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times, result


def measure(name: str, texts: list[str], spec: dict, repeats: int) -> dict:
    from transformers import AutoTokenizer

    folder = Path(name) if Path(name).is_dir() else registry_tokenizer_dir(name)  # a folder, or a served name
    tokenizer = AutoTokenizer.from_pretrained(folder)
    add_special_tokens = not tokenizer.chat_template
    start = time.perf_counter()
    tokenize = Tokenize(tokenizer, add_special_tokens=add_special_tokens)
    setup_s = time.perf_counter() - start
    prefix_only = Tokenize(tokenizer, add_special_tokens=add_special_tokens, cut_suffixes=False)
    cases = prompts(tokenizer, texts, spec)

    def cold() -> list:
        fresh = Tokenize(tokenizer, add_special_tokens=add_special_tokens)
        return [fresh.continuations(p, sfx) for p, sfx in cases]

    whole_s, whole_times, whole = timed(lambda: [tokenize([p + s for s in sfx]) for p, sfx in cases], repeats)
    fast_s, fast_times, fast = timed(lambda: [prefix_only.continuations(p, sfx) for p, sfx in cases], repeats)
    cold_s, cold_times, cold_ids = timed(cold, repeats)
    warm_s, warm_times, warm_ids = timed(lambda: [tokenize.continuations(p, sfx) for p, sfx in cases], repeats)
    if not whole == fast == cold_ids == warm_ids:
        raise SystemExit(f"{name}: continuations differ from whole-string tokenization")
    suffixes = {x for _, sfx in cases for x in sfx}
    num_suffix_cuts = sum(tokenize.suffix_cut(x) is not None for x in suffixes)
    cuts = [tokenize.find_cut(p) for p, _ in cases]
    made = [(len(p) - c.start) for (p, _), c in zip(cases, cuts, strict=True) if c is not None]
    return {
        "model": name,
        "num_prefixes": len(cases),
        "num_strings": sum(len(s) for _, s in cases),
        "mean_prefix_chars": statistics.mean(len(p) for p, _ in cases),
        "mean_suffix_chars": statistics.mean(len(x) for _, s in cases for x in s),
        "mean_tokens": statistics.mean(len(ids) for group in whole for ids in group),
        "num_cut": len(made),
        "mean_tail_chars": statistics.mean(made) if made else None,
        "setup_s": setup_s,
        "whole_s": whole_s,
        "fast_s": fast_s,
        "speedup": whole_s / fast_s,
        "suffix_cold_s": cold_s,
        "suffix_warm_s": warm_s,
        "num_suffixes": len(suffixes),
        "num_suffix_cuts": num_suffix_cuts,
        "whole_times": whole_times,
        "fast_times": fast_times,
        "suffix_cold_times": cold_times,
        "suffix_warm_times": warm_times,
        "is_equal": True,
    }


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "")
    import tokenizers
    import transformers

    return {"platform": platform.platform(), "cpu": cpu, "num_cpus": os.cpu_count(),
            "python": platform.python_version(), "tokenizers": tokenizers.__version__, "transformers": transformers.__version__,
            "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM")}


def _cpuinfo() -> list[str]:
    path = Path("/proc/cpuinfo")
    return path.read_text().splitlines() if path.exists() else []


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"# Tokenization: whole strings vs continuations ({result['workload']})",
        "",
        f"commit `{result['commit'][:12]}`, {result['date']}, `{result['command']}`",
        f"machine: {m['cpu']} ({m['num_cpus']} CPUs), {m['platform']}, tokenizers {m['tokenizers']},"
        f" transformers {m['transformers']}; texts: {result['texts_source']};"
        f" median of {result['repeats']} repeats after a warm-up.",
        "",
        "| tokenizer | strings | mean tokens | whole s | prefix cut s | suffix cuts, cold s | suffix cuts, warm s"
        " | whole / warm | prefixes cut | mean tail chars | suffixes cut |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["models"]:
        tail = f"{r['mean_tail_chars']:.1f}" if r["mean_tail_chars"] is not None else "-"
        lines.append(
            f"| {r['model']} | {r['num_strings']} | {r['mean_tokens']:.0f} | {r['whole_s']:.3f} | {r['fast_s']:.3f}"
            f" | {r['suffix_cold_s']:.3f} | {r['suffix_warm_s']:.3f} | {r['whole_s'] / r['suffix_warm_s']:.1f}x"
            f" | {r['num_cut']}/{r['num_prefixes']} | {tail} | {r['num_suffix_cuts']}/{r['num_suffixes']} |"
        )
    lines += ["", "All four columns give identical token ids (checked by the script). One-time setup per"
              " Tokenize (rules; Gemma's vocab scan happens on the first cut, inside the warm-up):"
              + ", ".join(f" {r['model']} {r['setup_s'] * 1000:.0f} ms" for r in result["models"]) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="news")
    parser.add_argument("--num-texts", type=int, default=None, help="the first N texts (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default=",".join(MODELS), help="registry names or tokenizer folders (.tok/qwen3)")
    parser.add_argument("--commit", default=None, help="commit hash to record (a copy without .git)")
    args = parser.parse_args()
    texts, spec, source = load_texts(args.workload)
    texts = texts[: args.num_texts]
    models = [measure(name, texts, spec, args.repeats) for name in args.models.split(",")]
    date = datetime.date.today().isoformat()
    result = {"command": "python3 " + " ".join(sys.argv), "date": date, "commit": args.commit or git_commit(("engine/pipeline/tokenize.py",)),
              "machine": machine(), "workload": args.workload, "texts_source": source, "num_texts": len(texts),
              "repeats": args.repeats, "models": models}
    write_pair(result, markdown(result), "tokenize-speed", args.workload)
    print(markdown(result))


if __name__ == "__main__":
    main()

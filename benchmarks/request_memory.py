"""How much memory the largest requests the default limits admit add to a worker (CPU).

    python3 benchmarks/request_memory.py [--family llama] [--context 8192] [--cases a,b,...] [--case-timeout-s 1200]
      a tiny random checkpoint of `family` (engine/testing/tiny.py: the family's real tokenizer and
      vocabulary; a `--context`-token context, 8192 as SmolLM2-135M, whose tokenizer the llama family uses),
      the worker's default pass budget (SPINF_MAX_NUM_BATCHED_TOKENS); per case, in a FRESH
      process: load the engine, run one small request (so that what any first request allocates
      is not charged to the case), read VmRSS, reset the peak (/proc/self/clear_refs), score the
      case's request and serialise its response as a worker writes it (orjson), read VmHWM:
        added = peak RSS during the request - RSS before it
      --> benchmarks/results/request-memory-<family>.{json,md}: per case its size (queries,
          scored options, question characters, tokens read), seconds, added MiB, and whether
          the worker refused it (an error row: e.g. content past the model's context); a case still
          running after --case-timeout-s is stopped and reported with the peak it had reached

Each case sits AT a default limit of contract.settings.RequestLimits (the test
tests/benchmarks/test_request_memory_cases.py checks that each validates and that one more
unit is refused). The model is tiny, so what is measured is what the request itself costs
(token lists, the packed tree, per-option results), not a real model's per-pass activations,
which are bounded by the pass budget and the same for every full pass.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from result_files import new_result, write_pair  # noqa: E402

from contract.settings import DEFAULT_MAX_NUM_BATCHED_TOKENS, LIMITS  # noqa: E402

WORDS = ("refund", "order", "billing", "charged", "twice", "account", "delivery", "late", "please", "help")
CASE_NAMES = ("max_content", "max_messages", "max_scored_options", "max_question_chars_words",
              "max_question_chars_adversarial", "max_request_combinations",
              "max_read_tokens", "max_tokenized_tokens", "max_held_tokens")
# the worker's token limits (RequestLimits.max_read/tokenized/held_tokens), each case sized with
# SmolLM2's tokenizer (the llama family's) to sit just under its limit: checked by
# tests/benchmarks/test_request_memory_cases.py
TOKEN_CASES = {"max_read_tokens": (3_450, 2), "max_tokenized_tokens": (1_000, 42)}  # chars per question, options
HELD_CONTENT_CHARS = 53_000  # max_held_tokens: a content near the 8,192-token context, 1,024 x 3 options
SEVEN_OPTIONS = [" yes", " no", " maybe", " never", " always", " often", " rarely"]


def _words(num_chars: int, rng: random.Random) -> str:
    text = ""
    while len(text) < num_chars:
        text += " " + rng.choice(WORDS)
    return text[:num_chars]


def _adversarial(num_chars: int, rng: random.Random) -> str:
    """Rare CJK characters, one after another: about one token per character or more."""
    return "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(num_chars))


def _query(index: int, template: str, options: list[str], **extra) -> dict:
    return {"id": f"q{index}", "template": template + "{?}", "options": options, **extra}


def case_body(name: str) -> dict:
    """The request body of a case: a ScoringRequest at one of the default limits."""
    rng = random.Random(0)
    message = {"role": "user", "content": "I was charged twice for September, please refund me."}
    yes_no = [" yes", " no"]
    if name == "max_content":  # every character the content may have: past any model's context
        content = _words(LIMITS.max_content_chars, rng)
        return {"messages": [{"role": "user", "content": content}], "scoring": {"queries": [_query(0, "\nRefund?", yes_no)]}}
    if name == "max_messages":
        per = LIMITS.max_content_chars // LIMITS.max_messages // 8  # a conversation that fits a 32k context
        messages = [{"role": ("user", "assistant")[i % 2], "content": _words(per, rng)} for i in range(LIMITS.max_messages)]
        return {"messages": messages, "scoring": {"queries": [_query(0, "\nRefund?", yes_no)]}}
    if name == "max_scored_options":  # queries x options at the limit (a 400-question decision is 102,000)
        per_query = LIMITS.max_scored_options // LIMITS.max_queries
        queries = [_query(i, f"\nQuestion {i}: which one?", [f" option {j}" for j in range(per_query)])
                   for i in range(LIMITS.max_queries)]
        return {"messages": [message], "scoring": {"queries": queries}}
    if name.startswith("max_question_chars"):  # every query as long as the character budget allows
        per_query = LIMITS.max_question_chars // LIMITS.max_queries
        text = _words if name.endswith("words") else _adversarial
        queries = [_query(i, "\n" + text(per_query - 1 - sum(map(len, yes_no)) - len("{?}"), rng), yes_no)
                   for i in range(LIMITS.max_queries)]
        return {"messages": [message], "scoring": {"queries": queries}}
    if name == "max_request_combinations":  # grids of values: queries x combinations at the limit
        side = int(LIMITS.max_combinations ** 0.5)
        num_queries = LIMITS.max_request_combinations // (side * side)
        options = [f" label {j}" for j in range(LIMITS.max_scored_options // LIMITS.max_request_combinations)]
        queries = [_query(i, "\nIs {a} about {b}?", options,
                          values={"a": [f"topic {k}" for k in range(side)], "b": [f"area {k}" for k in range(side)]})
                   for i in range(num_queries)]
        return {"messages": [message], "scoring": {"queries": queries}}
    if name in TOKEN_CASES:  # many long questions: what the passes read, what the tokenizer returns
        num_chars, num_options = TOKEN_CASES[name]
        options = SEVEN_OPTIONS[:num_options] + [f" option {j}" for j in range(num_options - len(SEVEN_OPTIONS))]
        queries = [_query(i, "\n" + _words(num_chars, rng), options) for i in range(LIMITS.max_queries)]
        return {"messages": [message], "scoring": {"queries": queries}}
    if name == "max_held_tokens":  # a long content under every question's every option
        content = _words(HELD_CONTENT_CHARS, rng)
        queries = [_query(i, f"\nQuestion {i}?", SEVEN_OPTIONS[:3]) for i in range(LIMITS.max_queries)]
        return {"messages": [{"role": "user", "content": content}], "scoring": {"queries": queries}}
    raise ValueError(f"unknown case {name!r}; cases: {', '.join(CASE_NAMES)}")


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _measure(name: str, family: str, context: int, out) -> None:
    import gc

    import orjson

    from contract.protocol import ScoringRequest
    from engine.engine import Engine, EngineConfig
    from engine.testing.tiny import make_tiny_checkpoint
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        checkpoint = make_tiny_checkpoint(family, Path(folder) / family)
        config_file = checkpoint / "config.json"
        config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"max_position_embeddings": context}))
        engine = Engine(EngineConfig(model=str(checkpoint), device="cpu", dtype="float32",
                                     max_num_batched_tokens=DEFAULT_MAX_NUM_BATCHED_TOKENS))
    engine.score(ScoringRequest.model_validate(case_body("max_messages") | {"messages": [{"role": "user", "content": "hi"}]}))
    budgets = _watch_budgets()
    request = ScoringRequest.model_validate(case_body(name))
    gc.collect()
    before = _rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) restarts from the current RSS
    out.put({"case": name, "rss_before_mib": before / 1024, **case_size(request)})  # for a case that times out
    started = time.perf_counter()
    refused, num_tokens = None, None
    try:
        response = engine.score(request)
        orjson.dumps(response.model_dump(mode="json"))
        usage = response.usage
        num_tokens = usage.content_tokens + usage.question_tokens + usage.option_tokens
    except ValueError as error:  # what the worker writes as the row's error
        refused = str(error)[:200]
    seconds = time.perf_counter() - started
    spent = {"tokens_tokenized": budgets[-1].num_tokenized, "tokens_held": budgets[-1].num_held} if budgets else {}
    out.put({"case": name, "rss_before_mib": before / 1024, "added_mib": (_rss_kib("VmHWM") - before) / 1024,
             "seconds": seconds, "refused": refused, "timed_out_after_s": None, "tokens_read": num_tokens,
             **spent, **case_size(request)})


def _watch_budgets() -> list:
    """The TokenBudget of each request the engine compiles from now on (what it counted)."""
    from engine import engine as engine_module

    budgets: list = []
    made = engine_module.TokenBudget

    def watched(*limits):
        budgets.append(made(*limits))
        return budgets[-1]

    engine_module.TokenBudget = watched
    return budgets


def case_size(request) -> dict:
    queries = request.scoring.queries
    grids = [max(1, _grid(q)) for q in queries]
    return {"num_queries": len(queries), "num_messages": len(request.messages),
            "content_chars": sum(len(m.content) for m in request.messages),
            "scored_options": sum(g * len(q.options) for g, q in zip(grids, queries)),
            "question_chars": sum(g * (len(q.template) + sum(map(len, q.options))) for g, q in zip(grids, queries)),
            "combinations": sum(grids)}


def _grid(query) -> int:
    size = 1
    for items in query.values.values():
        size *= len(items)
    return size


def _result_of(proc, out, name: str, timeout_s: float) -> dict:
    """The case's row; past `timeout_s` the process is stopped and the row says so, with the
    peak RSS it had reached (a request that holds a worker that long is a finding too)."""
    import queue

    started, row = time.monotonic(), None
    while True:
        try:
            got = out.get(timeout=5)
            if row is None:
                row = got  # what the case is, sent before it is scored
                continue
            proc.join()
            return got
        except queue.Empty:
            if not proc.is_alive():
                raise RuntimeError(f"case {name}: the measuring process died (exit code {proc.exitcode})") from None
            if row is not None and time.monotonic() - started > timeout_s:
                peak = int(next(line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                                if line.startswith("VmHWM:")).split()[1])
                proc.kill()
                proc.join()
                return row | {"added_mib": peak / 1024 - row["rss_before_mib"], "seconds": None, "refused": None,
                              "tokens_read": None, "timed_out_after_s": timeout_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="llama")
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--cases", default=",".join(CASE_NAMES))
    parser.add_argument("--case-timeout-s", type=float, default=1200.0, help="stop a case that runs longer")
    args = parser.parse_args(argv)
    rows = []
    context = multiprocessing.get_context("spawn")
    for name in args.cases.split(","):
        out = context.Queue()
        proc = context.Process(target=_measure, args=(name, args.family, args.context, out))
        proc.start()
        rows.append(_result_of(proc, out, name, args.case_timeout_s))
        print(json.dumps(rows[-1]), flush=True)
    result = new_result(benchmark="request-memory", family=args.family, context_tokens=args.context,
                        max_num_batched_tokens=DEFAULT_MAX_NUM_BATCHED_TOKENS, limits=LIMITS.model_dump(),
                        command="python3 benchmarks/request_memory.py " + " ".join(argv or sys.argv[1:]), cases=rows)
    write_pair(result, markdown(result), "request-memory", args.family)
    return 0


def markdown(result: dict) -> str:
    lines = [f"# Memory a request adds to a worker, at the default limits ({result['family']}, tiny random)", "",
             f"commit {result['commit']}, {result['date']}; `{result['command']}`; context {result['context_tokens']}"
             f" tokens, pass budget {result['max_num_batched_tokens']} tokens", "",
             "| case | queries | messages | scored options | question chars | tokens tokenized | tokens held"
             " | tokens read | seconds | added MiB | refused |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in result["cases"]:
        lines.append(f"| {row['case']} | {row['num_queries']} | {row['num_messages']} | {row['scored_options']:,} |"
                     f" {row['question_chars']:,} | {_count(row.get('tokens_tokenized'))} | {_count(row.get('tokens_held'))} |"
                     f" {_count(row['tokens_read'])} | {_seconds(row)} | {row['added_mib']:.0f} | {(row['refused'] or '')[:100]} |")
    return "\n".join(lines) + "\n"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _seconds(row: dict) -> str:
    if row["timed_out_after_s"] is not None:
        return f"stopped after {row['timed_out_after_s']:.0f}"
    return f"{row['seconds']:.1f}"


if __name__ == "__main__":
    sys.exit(main())

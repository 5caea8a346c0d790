"""A digest of every token id the engine compiles for the benchmark workloads (CPU).

    python3 benchmarks/compiled_ids_digest.py [--models gemma-3-12b,qwen3-8b] [--workloads news,moderation]
      per (model's real tokenizer, workload): compile_request on every request (as the engine
      does: chat template, answer_in, Tokenize.continuations), then sha256 over every branch's
      option ids --> benchmarks/results/compiled-ids.{json,md} (the commit inside)

Run at two commits: equal digests mean a change to tokenization or compilation left every pass
the GPU benchmarks run unchanged (the same tokens in, so their measurements carry over).
Needs .tok/ and .data/ (docs/performance.md, "How to run it").
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import random_models  # noqa: E402
from result_files import git_commit, write_pair  # noqa: E402
from workloads import load_workload  # noqa: E402

from contract.protocol import ScoringRequest  # noqa: E402
from engine.pipeline.compiler import compile_request  # noqa: E402
from engine.pipeline.prompts import PromptRenderer  # noqa: E402
from engine.pipeline.tokenize import Tokenize  # noqa: E402


def digest(model: str, workload: str) -> dict:
    tokenizer = random_models.tokenizer_for(model)
    has_template = bool(tokenizer.chat_template)
    renderer, tokenize = PromptRenderer(tokenizer, has_template), Tokenize(tokenizer, not has_template)
    requests = [ScoringRequest.model_validate(r) for r in load_workload(workload).requests(None)]
    ids = [[branch.option_ids for branch in compile_request(r, renderer, tokenize).branches] for r in requests]
    return {"model": model, "workload": workload, "num_requests": len(requests),
            "num_sequences": sum(len(b) for branches in ids for b in branches),
            "sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gemma-3-12b,qwen3-8b")
    parser.add_argument("--workloads", default="news,moderation")
    args = parser.parse_args()
    commit = git_commit()
    rows = [digest(m, w) for m in args.models.split(",") for w in args.workloads.split(",")]
    result = {"commit": commit, "date": datetime.date.today().isoformat(), "rows": rows}
    lines = [f"# Compiled token ids, commit `{commit[:7]}`", "",
             f"`python3 benchmarks/compiled_ids_digest.py {' '.join(sys.argv[1:])}`".replace(" `", "`"), "",
             "| tokenizer | workload | requests | sequences | sha256 |", "|---|---|---:|---:|---|"]
    lines += [f"| {r['model']} | {r['workload']} | {r['num_requests']} | {r['num_sequences']} | `{r['sha256'][:16]}` |"
              for r in rows]
    print("\n".join(lines))
    write_pair(result, "\n".join(lines) + "\n", "compiled-ids")


if __name__ == "__main__":
    main()

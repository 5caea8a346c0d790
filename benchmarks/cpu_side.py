"""Time the engine's CPU side on the news workload: compile (tokens and tree), pack_trees.

    python3 benchmarks/make_news_workload.py   # once: draws the texts into .data/
    python3 benchmarks/cpu_side.py [--model qwen2.5-coder-0.5b-instruct]

Prints seconds per stage for the 24 articles x 56 questions (no model forward is run).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import AutoTokenizer  # noqa: E402

from benchmarks.workloads import load_workload  # noqa: E402
from contract.protocol import ScoringRequest  # noqa: E402
from engine.loading.loader import registry_tokenizer_dir  # noqa: E402
from engine.pipeline.compiler import compile_request  # noqa: E402
from engine.pipeline.packer import pack_trees  # noqa: E402
from engine.pipeline.prompts import PromptRenderer  # noqa: E402
from engine.pipeline.stages import TreeOwner  # noqa: E402
from engine.pipeline.tokenize import Tokenize  # noqa: E402
from engine.pipeline.tree import build_tree  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="registry name whose tokenizer to use")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(registry_tokenizer_dir(args.model))
    has_template = bool(tokenizer.chat_template)
    renderer, tokenize = PromptRenderer(tokenizer, has_template), Tokenize(tokenizer, not has_template)
    requests = [ScoringRequest.model_validate(r) for r in load_workload("news").requests(None)]
    start = time.perf_counter()
    compiled = [compile_request(r, renderer, tokenize) for r in requests]  # its tree built too
    compiled_at = time.perf_counter()
    trees = [build_tree(c.branches) for c in compiled]  # again, timed alone
    built_at = time.perf_counter()
    batches = list(pack_trees([(TreeOwner(i), c.tree) for i, c in enumerate(compiled)], 16384))
    packed_at = time.perf_counter()
    print(f"compile {compiled_at - start:.3f} s (of which build_tree {built_at - compiled_at:.3f} s), "
          f"pack_trees {packed_at - built_at:.3f} s; {sum(t.num_tokens for t in trees)} tokens, {len(batches)} passes")


if __name__ == "__main__":
    main()

"""Python's garbage collector around Engine.score_requests, three ways side by side (CPU).

    python3 benchmarks/gc_pauses.py [--family qwen3] [--workload moderation] [--num-texts 40] [--repeats 5]
      a tiny random checkpoint of `family` (engine/testing/tiny.py, the family's real tokenizer), the
      workload's first N texts with every question; in ONE process, per mode: a warm-up batch,
      then `repeats` rounds of (score_requests, then serialise every response as a worker does),
      every collection timed through gc.callbacks (--modes picks them and their order):
        collector        the engine's deferral switched off: collections run inside the batch
        deferred         Engine.score_requests as shipped (engine.engine.cyclic_gc_deferred)
        deferred+frozen  also gc.freeze() after loading, as workers/service.load_engines does
      --> benchmarks/results/gc-pauses-<family>-<workload>.{json,md}: per mode the median
          round, and the collector's seconds inside batches and after them (deferred work lands
          after the batch: the total is the honest figure); and how many unreachable objects
          one batch leaves (the cyclic garbage that deferring holds until the batch ends)

Needs .data/benchmarks/<workload>-texts.json (benchmarks/make_<workload>_workload.py).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from result_files import git_commit, write_pair  # noqa: E402
from workloads import load_workload  # noqa: E402

import engine.engine as engine_module  # noqa: E402
from contract.protocol import ScoringRequest  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.testing.tiny import tiny_cpu_engine  # noqa: E402

MODES = ("collector", "deferred", "deferred+frozen")


class CollectionLog:
    """Every collection's generation and seconds, tagged with the phase it ran in."""

    def __init__(self):
        self.phase = "idle"
        self.records: list[tuple[str, int, float]] = []
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, event: str, info: dict) -> None:
        if event == "start":
            self._started = time.perf_counter()
        else:
            self.records.append((self.phase, info["generation"], time.perf_counter() - self._started))

    def close(self) -> None:
        gc.callbacks.remove(self._callback)

    def seconds(self, phase: str) -> float:
        return sum(s for p, _, s in self.records if p == phase)

    def count(self, phase: str, generation: int | None = None) -> int:
        return sum(1 for p, g, _ in self.records if p == phase and generation in (None, g))


def run_mode(engine: Engine, requests: list[ScoringRequest], mode: str, repeats: int, log: CollectionLog) -> dict:
    deferral = engine_module.cyclic_gc_deferred
    if mode == "collector":
        engine_module.cyclic_gc_deferred = contextlib.nullcontext
    if mode == "deferred+frozen":
        gc.freeze()
    try:
        engine.score_requests(requests)  # warm-up: compiles and caches, as a worker's first batch
        log.records.clear()
        rounds = []
        for _ in range(repeats):
            start = time.perf_counter()
            log.phase = "batch"
            output = engine.score_requests(requests)
            log.phase = "after"  # what a worker does next: one JSON document per response
            documents = [response.model_dump_json() for response in output.results]
            log.phase = "idle"
            rounds.append(time.perf_counter() - start)
            del output, documents
        return {
            "mode": mode, "round_seconds_median": statistics.median(rounds), "rounds": rounds,
            "gc_seconds_in_batches": log.seconds("batch") / repeats, "gc_seconds_after": log.seconds("after") / repeats,
            "collections_in_batches": log.count("batch") / repeats, "collections_after": log.count("after") / repeats,
            "full_collections": (log.count("batch", 2) + log.count("after", 2)) / repeats,
            "tracked_objects": len(gc.get_objects()), "frozen_objects": gc.get_freeze_count(),
        }
    finally:
        engine_module.cyclic_gc_deferred = deferral
        gc.unfreeze()


def markdown(result: dict) -> str:
    lines = [
        f"# Garbage-collector pauses: {result['workload']} x {result['num_texts']} texts on tiny {result['family']} (CPU)",
        "",
        f"commit `{result['commit']}`, {result['date']}, Python {result['python']}, `{result['command']}`.",
        f"{result['num_questions']} questions per batch; per round (median of {result['repeats']}): score_requests, then every"
        " response serialised to JSON. Collector seconds are per round, inside the batch and after it.",
        f"Unreachable objects a batch leaves (gc.collect() after one): {result['cyclic_garbage_after_a_batch']}.",
        "",
        "| mode | round s | GC s in batch | GC s after | GC s total | collections in batch | after | full collections | tracked objects |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["modes"]:
        total = row["gc_seconds_in_batches"] + row["gc_seconds_after"]
        lines.append(f"| {row['mode']} | {row['round_seconds_median']:.3f} | {row['gc_seconds_in_batches']:.3f} |"
                     f" {row['gc_seconds_after']:.3f} | {total:.3f} | {row['collections_in_batches']:.0f} |"
                     f" {row['collections_after']:.0f} | {row['full_collections']:.1f} | {row['tracked_objects']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="qwen3")
    parser.add_argument("--workload", default="moderation")
    parser.add_argument("--num-texts", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES), help="comma list, in the order to run them")
    args = parser.parse_args()

    engine = tiny_cpu_engine(args.family)
    workload = load_workload(args.workload)
    requests = [ScoringRequest.model_validate(r) for r in workload.requests(engine.model_name, args.num_texts)]
    log = CollectionLog()
    modes = [run_mode(engine, requests, mode, args.repeats, log) for mode in args.modes.split(",")]
    gc.collect()
    engine.score_requests(requests)
    cyclic_garbage = gc.collect()  # unreachable objects a batch left: what deferring can hold back
    commit = git_commit()
    result = {
        "commit": commit, "date": datetime.date.today().isoformat(), "python": sys.version.split()[0],
        "command": "python3 benchmarks/gc_pauses.py " + " ".join(sys.argv[1:]), "family": args.family,
        "workload": args.workload, "num_texts": len(requests), "repeats": args.repeats,
        "num_questions": sum(len(r.scoring.queries) for r in requests), "modes": modes,
        "cyclic_garbage_after_a_batch": cyclic_garbage,
    }
    write_pair(result, markdown(result), "gc-pauses", args.family, args.workload)
    print(markdown(result))


if __name__ == "__main__":
    main()

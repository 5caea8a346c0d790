"""GET /health (open) and GET /metrics (Prometheus text; the scrape token, api/deps.py).

    /health: 200 {"status": "ok", ...} when every model the service must serve has a live
    worker (api.served.health_problems, the one definition); else 503 {"status": "unavailable",
    "problems": [why], ...}. Either way: models with their workers per device (pass fill,
    rows/s, heartbeat age), queue depths, versions, limits.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

import rq
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import RedisDep, ScraperDep, SettingsDep
from api.served import health_problems, live_workers, served_models
from contract import queues

router = APIRouter()


def _package_version() -> str:
    try:
        return version("spinf-jobs")
    except PackageNotFoundError:
        return "source"


UNHEALTHY = {503: {"description": "A model the service must serve has no live worker: `problems` says which",
                   "content": {"application/json": {"schema": {"type": "object", "required": ["status", "problems"]}}}}}


@router.get("/health", responses=UNHEALTHY)
def health(r: RedisDep, settings: SettingsDep) -> JSONResponse:
    """Open: status (503 when a model has no live worker), versions, models (fingerprints,
    limits, workers per device), queue depths, workers."""
    models = served_models(r, settings)
    problems = health_problems(models, settings)
    depths = {}
    for model in models:
        pair = queues.queue_pair(model)
        depths[model] = {"sync": r.llen(f"rq:queue:{pair.sync}"), "batch": r.llen(f"rq:queue:{pair.batch}")}
    body = {
        "status": "unavailable" if problems else "ok",
        "problems": problems,
        "versions": {"spinf_jobs": _package_version(), "python": platform.python_version(), "rq": rq.__version__,
                     "redis": r.info("server").get("redis_version")},
        "default_model": settings.default_model,
        "models": [{"id": m.id, **m.info, "workers": m.workers, "devices": m.devices} for m in models.values()],
        "limits": {"max_queue": settings.max_queue, "max_body_bytes": settings.max_body_bytes,
                   "max_num_inline_items": settings.max_num_inline_items, "chunk_num_rows": settings.chunk_num_rows,
                   "sync_timeout_s": settings.sync_timeout_s, "result_ttl_s": settings.result_ttl_s},
        "queues": depths,
        "queued_rows": int(r.get(queues.QUEUED_ROWS_KEY) or 0),
        "workers": sorted(w["name"] for w in live_workers(r, settings)),
    }
    return JSONResponse(body, status_code=503 if problems else 200)


@router.get("/metrics")
def metrics(request: Request, scraper: ScraperDep) -> Response:
    """Prometheus exposition of this API process and the service's Redis state: service-wide
    numbers only, no label names a key, a job or a row. The scrape token when one is set."""
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
